"""The READMEs as lessons, by the rules CONTRIBUTING.md writes down (its headings and word budgets are
read from it): every part's README in one shape, the idea shown as code extracted from the part's own
files, a figure, a word budget; the top README carries the progression. The rules are checked on small
sample READMEs first, so that a rule that cannot fail (or cannot pass) is caught here; then on the real
READMEs."""

import re

import pytest

from common import ROOT, parts
from lab import report

RULES = (ROOT / "CONTRIBUTING.md").read_text()
HEADINGS = re.findall(r"^- `(## [^`]+)`$", RULES, re.M)  # the lesson's headings, in order
BUDGETS = dict(re.findall(r"^\| (.+?) \| (\d+) \|$", RULES, re.M))  # README -> the most words it may have
WORDS = {"top": int(BUDGETS["`README.md`"]), 5: int(BUDGETS["`part5_profiling/README.md`"])}
WORDS["parts"] = int(BUDGETS["every other `part*/README.md`"])
OWN_FILES = {5: ("flash_attention.py", "gluon_attention.py", "gluon_backward.py")}  # default: any file of the folder
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def _outside_fences(text):
    """The lines of a markdown text that are not inside a ``` fence (a `## ` there is code, not a heading)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return kept


def heading_problems(text):
    """The lesson's second-level headings, in this order (others may sit between them)."""
    found = [line.rstrip() for line in _outside_fences(text) if line.startswith("## ")]
    at = 0
    for line in found:
        if at < len(HEADINGS) and line == HEADINGS[at]:
            at += 1
    return [] if at == len(HEADINGS) else [f"no {HEADINGS[at]!r} after {HEADINGS[at - 1] if at else 'the title'!r}"]


def code_problems(text, folder, own=None):
    """At least one ```python block inside a code block that names a file of the part's own folder
    (or, where `own` lists them, one of those files)."""
    for m in report.CODE.finditer(text):
        path = m.group(2).split(":", 1)[0]
        mine = path.startswith(f"{folder}/") and (own is None or path.removeprefix(f"{folder}/") in own)
        if mine and "```python\n" in m.group(3):
            return []
    which = f"one of {', '.join(own)}" if own else f"a file of {folder}/"
    return [f"no ```python block inside a <!-- code:... --> block naming {which}"]


def figure_problems(text, readme):
    """At least one markdown image of a .png that exists, relative to the README."""
    images = IMAGE.findall(text)
    if any((readme.parent / image).is_file() for image in images):
        return []
    return [f"no image of an existing .png (links: {', '.join(images) or 'none'})"]


def words(text):
    return len(text.split())


def budget_problems(text, budget):
    n = words(text)
    return [] if n <= budget else [f"{n} words, over the budget of {budget}"]


def part_problems(readme, n):
    """Everything a part's README must have, as a list of problems (empty: it is a lesson)."""
    text = readme.read_text()
    return (
        heading_problems(text)
        + code_problems(text, readme.parent.name, OWN_FILES.get(n))
        + figure_problems(text, readme)
        + budget_problems(text, WORDS.get(n, WORDS["parts"]))
    )


def top_problems(readme):
    text = readme.read_text()
    block = re.search(r"<!-- results:progression -->\n.*?<!-- /results:progression -->", text, re.S)
    return budget_problems(text, WORDS["top"]) + ([] if block else ["no <!-- results:progression --> block"])


# ------------------------------------------------------------------------------------ the rules, on samples
def _lesson(
    code="<!-- code:part9_demo/kernel.py:f -->\n```python\ndef f():\n    pass\n```\n<!-- /code:part9_demo/kernel.py:f -->",
):
    return "\n\n".join(
        [
            "# Part 9: demo",
            "## The idea\n\nOne paragraph.",
            f"## The code\n\n{code}",
            "## The picture\n\n![tiles](tiles.png)",
            "## An aside\n\nOther headings may sit between.",
            "## The number\n\nA table.",
            "## Try it\n\nSomething.",
            "## Where it comes from\n\nThe paper.",
        ]
    )


def _readme(tmp_path, text, png=True):
    folder = tmp_path / "part9_demo"
    folder.mkdir(exist_ok=True)
    if png:
        (folder / "tiles.png").write_bytes(b"\x89PNG")
    (folder / "README.md").write_text(text)
    return folder / "README.md"


def test_a_lesson_passes_every_rule(tmp_path):
    assert part_problems(_readme(tmp_path, _lesson()), 9) == []


def test_headings_must_all_be_there_in_order():
    assert heading_problems(_lesson()) == []
    swapped = (
        _lesson()
        .replace("## The idea", "## TMP")
        .replace("## The code", "## The idea")
        .replace("## TMP", "## The code")
    )
    assert heading_problems(swapped) == ["no '## The code' after '## The idea'"]
    assert heading_problems(_lesson().replace("## Try it", "## Try this")) == ["no '## Try it' after '## The number'"]
    # A heading inside a fenced block is code, not a heading.
    fenced = _lesson().replace("## Try it", "```\n## Try it\n```")
    assert heading_problems(fenced) == ["no '## Try it' after '## The number'"]


def test_the_code_must_come_from_the_parts_own_files():
    assert code_problems(_lesson(), "part9_demo") == []
    # From another folder, or a block that is empty (make report has not filled it), does not count.
    other = _lesson().replace("part9_demo/kernel.py", "common/backward.py")
    assert code_problems(other, "part9_demo") == [
        "no ```python block inside a <!-- code:... --> block naming a file of part9_demo/"
    ]
    empty = _lesson("<!-- code:part9_demo/kernel.py:f -->\n<!-- /code:part9_demo/kernel.py:f -->")
    assert code_problems(empty, "part9_demo") != []
    # A plain ```python block, typed by hand, is not extracted code.
    assert code_problems(_lesson("```python\ndef f():\n    pass\n```"), "part9_demo") != []
    # Where the part names its files, only those count.
    assert code_problems(_lesson(), "part9_demo", ("gluon_attention.py",)) != []
    assert code_problems(_lesson(), "part9_demo", ("kernel.py",)) == []


def test_a_figure_must_be_a_png_that_exists(tmp_path):
    assert figure_problems(_lesson(), _readme(tmp_path, _lesson())) == []
    missing = tmp_path / "nowhere" / "README.md"
    assert figure_problems(_lesson(), missing) == ["no image of an existing .png (links: tiles.png)"]
    assert figure_problems(_lesson().replace("![tiles](tiles.png)", "A picture."), missing) != []


def test_the_rules_are_read_from_contributing():
    assert len(HEADINGS) == 6 and HEADINGS[0] == "## The idea" and set(WORDS) == {"top", 5, "parts"}


def test_word_budget():
    assert words("one  two\nthree\tfour") == 4
    assert budget_problems("word " * 2500, 2500) == []
    assert budget_problems("word " * 2501, 2500) == ["2501 words, over the budget of 2500"]


def test_top_readme_needs_the_progression_block_and_its_budget(tmp_path):
    top = tmp_path / "README.md"
    top.write_text("# Title\n\n<!-- results:progression -->\ntable\n<!-- /results:progression -->\n")
    assert top_problems(top) == []
    top.write_text("# Title\n\nThe `<!-- results:progression -->` marker, mentioned.\n" + "word " * 1500)
    # 1500 words and 8 more ("#", "Title" and the sentence's six); a marker mentioned inline is not a block.
    assert top_problems(top) == ["1508 words, over the budget of 1500", "no <!-- results:progression --> block"]


# ------------------------------------------------------------------------------------ the READMEs
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5])
def test_part_readme_is_a_lesson(n):
    assert part_problems(parts.folder(n) / "README.md", n) == []


def test_top_readme_carries_the_progression():
    assert top_problems(ROOT / "README.md") == []
