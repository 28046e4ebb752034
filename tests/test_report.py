"""The report as a reader relies on it: every README and results-log table regenerates exactly from the
committed CSVs and carries its provenance line, every table a part defines is shown somewhere, every
code excerpt is its file's code and a broken marker stops the report loudly; and results.py, the one
writer and reader of the CSVs."""

import re
import shutil
import types

import pytest

from common import ROOT
from lab import report, results

H200 = ROOT / "results" / "h200"
PROVENANCE = re.compile(r"^_.+; torch .+; Triton .+; commit .+\. Regenerate: `.+`\._$", re.M)


def _documents():
    """The READMEs and the results logs: every file the report fills."""
    return report.readmes() + sorted(H200.glob("part*_log.md"))


# ------------------------------------------------------------------------------------ the committed tree
def test_committed_readmes_and_logs_are_the_reports_output():
    """`make report` on the committed tree changes nothing: every README and log is its own output."""
    tables = report.all_tables(report.part_reports())
    for path in _documents():
        assert report.fill(path.read_text(), tables, H200) == path.read_text(), path


def test_every_table_carries_its_provenance_line():
    """Every block holding a markdown table names, before the table, the GPU, versions, commits and
    dates of its rows and the command that regenerates them."""
    tables = report.all_tables(report.part_reports())
    blocks = [report.render(tables[m[1]], H200) for p in _documents() for m in report.MARKER.findall(p.read_text())]
    with_table = [b for b in blocks if re.search(r"^\| -+:? \|", b, re.M)]
    assert len(with_table) > 40
    for block in with_table:
        before = block[: block.index("\n|")]
        assert PROVENANCE.search(before) or "Regenerate: `make report`" in before, block[:300]


def test_every_table_is_shown_and_every_log_section_has_its_sentence():
    """A part's TABLES entry is named by a marker of a README or a results log (nothing is computed for
    no one); each log section says in prose what its table measured."""
    markers = {m[1] for p in _documents() for m in report.MARKER.findall(p.read_text())}
    for module in report.part_reports():
        assert not set(module.TABLES) - markers, module.__name__
    for path in sorted(H200.glob("part*_log.md")):
        for section in path.read_text().split("\n## ")[1:]:
            assert re.match(r"[^\n]+\n\n[A-Z][^<\n]+", section), (path.name, section[:80])


def test_report_runs_end_to_end_and_is_idempotent(tmp_path, monkeypatch, capsys):
    """main() on copies of the committed results (plots left out) and READMEs draws every plot and
    changes no README or log: they are already its output."""
    for gpu in (H200, H200.parent / "h100"):  # part 5's ladder ran on an H100
        shutil.copytree(gpu, tmp_path / "results" / gpu.name, ignore=shutil.ignore_patterns("*.png", "*.log"))
    copies = [
        shutil.copy(path, tmp_path / path.relative_to(ROOT).as_posix().replace("/", "_")) for path in report.readmes()
    ]
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "readmes", lambda: [tmp_path / c for c in copies])
    assert report.main([]) == 0
    assert "updated" not in capsys.readouterr().out
    drawn = ["progression.png", "part2_heatmaps.png", "part4_memory.png"]
    for png in drawn:
        assert (tmp_path / "results" / "h200" / png).exists(), png
    ladder = next(H200.parent.glob("*/part5_ladder.csv"), None)  # the ladder's figure beside its run's CSV
    if ladder is not None:
        assert (tmp_path / "results" / ladder.parent.name / "part5_ladder.png").exists()


# ------------------------------------------------------------------------------------ a broken report stops
def _setup(tmp_path, monkeypatch, text):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SOURCE)
    readme = tmp_path / "README.md"
    readme.write_text(text)
    monkeypatch.setattr(report, "readmes", lambda: [readme])
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "LESSONS_GPU", "fake")
    (tmp_path / "results" / "fake").mkdir(parents=True)
    return readme


@pytest.mark.parametrize(
    "marker, says",
    [
        ("<!-- results:prat2 -->\nold\n<!-- /results:prat2 -->\n", "no table for <!-- results:prat2 -->"),
        (
            "<!-- code:pkg/mod.py:kernel_v2 -->\nold\n<!-- /code:pkg/mod.py:kernel_v2 -->\n",
            "no function or class kernel_v2",
        ),
        ("<!-- code:pkg/mod.py:kernel:from=while -->\nx\n<!-- /code:pkg/mod.py:kernel:from=while -->\n", "on no line"),
        ("<!-- code:pkg/mod.py:kernel -->\nold\n", "no closing <!-- /code:pkg/mod.py:kernel -->"),
    ],
)
def test_a_broken_marker_stops_the_report_before_it_writes_anything(tmp_path, monkeypatch, capsys, marker, says):
    readme = _setup(tmp_path, monkeypatch, "# Title\n\n" + marker)
    assert report.main(["--gpu", "fake"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("README.md: ") and says in err, err
    assert readme.read_text() == "# Title\n\n" + marker
    assert not list((tmp_path / "results" / "fake").iterdir())  # no log, no plot


def test_a_missing_results_folder_or_a_table_name_taken_twice_is_an_error(capsys):
    assert report.main(["--gpu", "a100"]) == 2
    assert "there is no results/a100/" in capsys.readouterr().err
    mine = types.SimpleNamespace(__name__="part8_x.report", TABLES={"part8-sweep": str})
    with pytest.raises(report.CodeError, match="part9_y.report: table part8-sweep is taken already"):
        report.all_tables([mine, types.SimpleNamespace(__name__="part9_y.report", TABLES={"part8-sweep": str})])


# ------------------------------------------------------------------------------------ code excerpts
SOURCE = '''"""A module."""

import functools


@functools.cache
def kernel(a, b):
    """What kernel does."""

    # the bounds
    lo = 0
    if a:
        hi = b
    else:
        hi = a
    total = combine(
        lo,
        hi,
    )
    return total


if HAVE_GLUON:

    class Outer:
        def inner(self):
            """Doc."""
            return 2
'''


def test_code_excerpt_is_the_code_of_its_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SOURCE)
    lines = SOURCE.splitlines()
    whole = report.code_excerpt("pkg/mod.py:kernel", tmp_path)  # decorators in, docstring out
    assert whole.splitlines() == lines[5:7] + lines[9:20]
    assert report.code_excerpt("pkg/mod.py:Outer", tmp_path) == "\n".join(line[4:] for line in lines[24:])
    # An anchor stands for its statement: "if a:" brings its block and else, "lo," the whole call.
    assert report.code_excerpt("pkg/mod.py:kernel:from=if a:,to=lo,", tmp_path).splitlines() == [
        line[4:] for line in lines[11:19]
    ]
    assert report.code_excerpt("pkg/mod.py:kernel:from=return total", tmp_path) == "return total"
    assert report.code_excerpt("pkg/mod.py:kernel:to=def kernel", tmp_path) == "@functools.cache\ndef kernel(a, b):"
    for spec, problem in [
        ("pkg/mod.py:kernel:from=hi = ", "the from text 'hi = ' is on 2 lines of kernel (lines 13, 15)"),
        ("pkg/other.py:kernel", "there is no file pkg/other.py"),
        ("pkg/mod.py:kernel:start=lo", "expected PATH:NAME or PATH:NAME:from=TEXT,to=TEXT"),
    ]:
        with pytest.raises(report.CodeError, match=re.escape(problem)):
            report.code_excerpt(spec, tmp_path)


def test_every_code_marker_in_the_readmes_names_code_that_exists():
    """Every excerpt a README shows is found (a renamed function fails here and in `make report`)."""
    specs = [m[2] for p in report.readmes() for m in report.CODE.finditer(p.read_text())]
    assert len(specs) > 15
    for spec in specs:
        assert report.code_excerpt(spec).strip(), spec


# ------------------------------------------------------------------------------------ results.py
def test_read_csv_types_cells_and_write_csv_merges_by_key(tmp_path):
    path = tmp_path / "x.csv"
    results.write_csv(path, [dict(a=1, b="1.50", commit="1234567"), dict(a=2, b="", commit="x")], ["a", "b", "commit"])
    assert results.read_csv(path) == [dict(a=1, b=1.5, commit="1234567"), dict(a=2, b=None, commit="x")]
    results.write_csv(path, [dict(a=2, b=7, commit="y")], ["a", "b", "commit"], key=["a"])
    assert results.read_csv(path) == [dict(a=1, b=1.5, commit="1234567"), dict(a=2, b=7, commit="y")]


def test_write_as_measured_saves_each_shape_and_reports_failures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    seen = []

    def run(save):
        save([dict(x=1, check="ok O=1e-3")])
        seen.append(len(results.read_csv(tmp_path / "study.csv")))
        return [dict(x=1, check="ok O=1e-3"), dict(x=2, check="FAIL O=1")]

    assert results.write_as_measured("study.csv", ["x", "check"], run) == 1
    assert seen == [1] and "wrote 2 rows" in capsys.readouterr().out
    assert (
        results.write_as_measured(
            "study.csv", ["x", "check"], lambda save: [dict(x=3, check="not checked: on purpose")]
        )
        == 0
    )


def test_provenance_line_names_every_commit_and_day(monkeypatch):
    rows = [
        dict(gpu="G", torch="2", triton="3", commit=c, date=d)
        for c, d in [("b", "2026-12-01T07:00:00Z"), ("a", "2026-11-30T20:00:00Z"), ("a", "2026-11-30T21:00:00Z")]
    ]
    line = results.provenance_line(rows, "make report")
    assert line == "_G; torch 2; Triton 3; commit a, b; 2026-11-30, 2026-12-01. Regenerate: `make report`._"
    monkeypatch.setenv("GIT_COMMIT", "11eddd900b98851b55d8f2179e50fdb3811d5f78")
    assert results.commit() == "11eddd9"


def test_common_imports_no_particular_part():
    """Parts are found by folder pattern (common/parts.py); nothing in common/ imports one by name."""
    loads = r"^\s*(?:from|import)\s+part\d|import_module\(f?[\"']part\d|parts\.(?:load|folder|path)\(\d"
    for path in (ROOT / "common").glob("*.py"):
        assert not re.findall(loads, path.read_text(), re.M), path.name


def test_another_gpu_gets_its_own_page_and_leaves_the_lessons_alone(tmp_path, monkeypatch, capsys):
    """make report GPU=<another>: results/<gpu>/summary.md with that GPU's progression, each part's
    table (links to the parts two folders up) and part 2's sweep, drawn again the same; no README is touched."""
    (tmp_path / "results" / "other").mkdir(parents=True)
    for name in ("bench.csv", "part2_sweep.csv", "part2_device.json"):  # what make bench and make sweep write
        shutil.copy(H200 / name, tmp_path / "results" / "other" / name)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:progression -->\nold\n<!-- /results:progression -->\n")
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "readmes", lambda: [readme])
    assert report.main(["--gpu", "other"]) == 0
    page = (tmp_path / "results" / "other" / "summary.md").read_text()
    assert "make report GPU=other" in page and "](../../part1_triton_baseline/README.md)" in page
    assert all(f"<!-- results:part{n} -->\n_NVIDIA H200" in page for n in range(1, 6)), page[:2000]
    assert "<!-- results:part2-sweep -->\n_NVIDIA H200" in page
    assert all((tmp_path / "results" / "other" / png).exists() for png in ("progression.png", "part2_heatmaps.png"))
    assert readme.read_text() == "<!-- results:progression -->\nold\n<!-- /results:progression -->\n"
    capsys.readouterr()
    assert report.main(["--gpu", "other"]) == 0 and "updated" not in capsys.readouterr().out


def test_the_progression_comes_from_the_newest_complete_run(tmp_path):
    """The top README's progression: the folder whose bench.csv last timed parts 1-5 and cuDNN at its shape in
    both modes; a newer run of part 5 alone does not move it; another GPU's summary keeps its own folder."""
    rows = results.read_csv(H200 / "bench.csv")
    for name, day in (("h200", "2026-01-01"), ("h100", "2026-01-02"), ("part5_only", "2026-01-03")):
        (tmp_path / name).mkdir()
        mine = [dict(r, date=f"{day}T00:00:00Z") for r in rows if name != "part5_only" or r["impl"] == "part5"]
        results.write_csv(tmp_path / name / "bench.csv", mine, list(rows[0]))
    assert report.progression_dir(tmp_path / "h200") == tmp_path / "h100"
    assert report.progression_dir(tmp_path / "part5_only") == tmp_path / "part5_only"


def test_the_top_readme_shows_the_chart_of_its_table():
    folder = report.progression_dir(H200)
    assert f"](results/{folder.name}/progression.png)" in (ROOT / "README.md").read_text()
