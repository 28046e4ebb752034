"""Ladders of steps: a kernel built one idea at a time, each idea a patch a reader can diff.

    python -m common.steps --part 5 --list                     # every ladder of part 5 and its steps
    python -m common.steps --part 5 --show fwd3                # the kernel file after step fwd3
    python -m common.steps --part 3 --refresh                  # after editing the shipped kernel

A part's steps/ folder holds one ladder or several. A step is a file named <ladder><n>_<idea>:
`2_exp2.diff` is step 2 of part 3's one ladder (its ladder's name is empty), `fwd3_products_in_flight.diff`
step 3 of part 5's forward ladder. A step is a unified diff on the step before it, its headers
naming the file it patches; a ladder's first step is either a diff on the part before's
flash_attention.py (part 3) or a whole new file, `.py` (part 5's Gluon kernels).

A ladder ends at its file (TARGETS), which the tests check byte for byte, so a step cannot drift
from the kernel a reader runs, unless the part also has a model ladder (MODEL, part 5): then the
lesson's ladders end where that one starts, and it takes their files, with the part before's
flash_attention.py, on to the shipped files, a step being a patch of one file or several (the
features a model needs that are not the lesson's idea: grouped heads, the host path, ...).

A study that needs a changed kernel (a stage done twice, a candidate change) keeps the change as a
patch too, in tools/variants/ beside the study: variant() applies it to the shipped kernel file.
Needs only the standard library (`make diff`), but load_variant (torch, triton).
"""

import argparse
import difflib
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, parts

# The file each ladder ends at, by the ladder's name.
TARGETS = {"": "flash_attention.py", "fwd": "gluon_attention.py", "bwd": "gluon_backward.py"}
MODEL = "model"  # the ladder, after the lesson's, whose steps may patch several of TARGETS' files
NAME = re.compile(r"([a-z]*)(\d+)_(\w+)\.(diff|py)")
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
HEADER = re.compile(r"--- (\S+).*\n\+\+\+ (\S+).*\n")  # a file's section of a patch: its two header lines


@dataclass(frozen=True)
class Step:
    ladder: str  # "" (a part's one ladder), "fwd", "bwd", "model"
    number: int
    idea: str  # the file name's words: "products_in_flight"
    path: Path

    @property
    def name(self):
        """What a reader types: "2", "fwd3"."""
        return f"{self.ladder}{self.number}"

    @property
    def label(self):
        return self.idea.replace("_", " ")


def ladders(folder):
    """{ladder name: [Step, ...] in order} for the steps/ folder of a part folder (empty if none),
    the lesson's first, the model ladder last. Steps sort by number, not as text: fwd10 after fwd9."""
    found = {}
    for path in sorted((Path(folder) / "steps").glob("*")):
        m = NAME.fullmatch(path.name)
        if m:
            found.setdefault(m[1], []).append(Step(m[1], int(m[2]), m[3], path))
    for name, steps in found.items():
        steps.sort(key=lambda s: s.number)
        numbers = [s.number for s in steps]
        if numbers != list(range(1, len(steps) + 1)):
            raise ValueError(f"{folder}/steps: ladder {name!r} has steps {numbers}, not 1..{len(steps)}")
        if any(s.path.suffix == ".py" for s in steps[1:]) or (name == MODEL and steps[0].path.suffix == ".py"):
            raise ValueError(f"{folder}/steps: only a lesson ladder's first step may be a whole file (.py)")
    order = [*TARGETS, MODEL]
    return {name: found[name] for name in sorted(found, key=lambda n: (order.index(n) if n in order else 99, n))}


def find(n, name):
    """Part n's step called `name` ("3", "fwd3"): (its ladder's steps, its index there). ValueError
    naming the steps there are otherwise."""
    for steps in ladders(parts.folder(n)).values():
        for i, step in enumerate(steps):
            if step.name == name:
                return steps, i
    every = [s.name for steps in ladders(parts.folder(n)).values() for s in steps]
    raise ValueError(f"part {n} has no step {name!r}; its steps: {', '.join(every) or 'none'}")


def steps_of(n, ladder=""):
    """Part n's ladder called `ladder`: its steps in order. ValueError if it has none such."""
    found = ladders(parts.folder(n))
    if ladder not in found:
        raise ValueError(f"part {n} has no ladder {ladder!r}; its ladders: {list(found) or 'none'}")
    return found[ladder]


def has_model(n):
    """Whether part n takes its lesson's files on to the shipped ones by a model ladder."""
    return MODEL in ladders(parts.folder(n))


def shipped(n, ladder=""):
    """The file on disk that part n's ladder ends at, or (MODEL) every file it may patch: {name: Path}."""
    names = TARGETS.values() if ladder == MODEL else [TARGETS[ladder]]
    return {name: parts.folder(n) / name for name in names if (parts.folder(n) / name).exists()}


def start(n, steps):
    """What a ladder's first step applies to: nothing for a whole file, else the part before's kernel."""
    return "" if steps[0].path.suffix == ".py" else parts.path(n - 1).read_text()


def sources(n, ladder=""):
    """[the start, after step 1, ..., after the last step] for part n's one-file ladder: the last is
    the file the ladder ends at (the shipped file, or with a model ladder the lesson's)."""
    steps = steps_of(n, ladder)
    if ladder == MODEL:
        raise ValueError(f"part {n}'s {MODEL} ladder patches several files: use states({n})")
    texts = [start(n, steps)]
    for step in steps:
        body = step.path.read_text()
        texts.append(body if step.path.suffix == ".py" else apply_patch(texts[-1], body))
    return texts


def lesson(n):
    """{file name: text} where part n's lesson ends: each lesson ladder's last text, and the part
    before's flash_attention.py (the model ladder's first step routes its calls)."""
    files = {TARGETS[""]: parts.path(n - 1).read_text()}
    for ladder in ladders(parts.folder(n)):
        if ladder != MODEL:
            files[TARGETS[ladder]] = sources(n, ladder)[-1]
    return files


def states(n):
    """[the lesson's files, after model step 1, ..., after the last] for part n's model ladder: each
    a {file name: text}; a step changes the files its patch names."""
    texts = [lesson(n)]
    for step in steps_of(n, MODEL):
        files = dict(texts[-1])
        for name, section in split_patch(step.path.read_text()).items():
            files[name] = apply_patch(files[name], section)
        texts.append(files)
    return texts


def split_patch(patch):
    """{file name: its section} of a patch that names its files in its headers (the path's last part).
    Headers are looked for between hunks only: inside one, a removed '-- x' line prints as '--- x'."""
    lines = patch.splitlines(keepends=True)
    sections, name, i = {}, None, 0
    while i < len(lines):
        head = HEADER.match("".join(lines[i : i + 2]))
        if head:
            name = Path(head[2]).name
            sections[name] = lines[i] + lines[i + 1]
            i += 2
            continue
        m = HUNK.match(lines[i])
        if name is None or not m:
            raise ValueError(f"patch line {i + 1} is neither a file's header nor a hunk: {lines[i]!r}")
        n_old, n_new = int(m.group(2) or 1), int(m.group(4) or 1)
        hunk = [lines[i]]
        i += 1
        while n_old or n_new:
            kind = lines[i][0]
            n_old -= kind in " -"
            n_new -= kind in " +"
            hunk.append(lines[i])
            i += 1
        sections[name] += "".join(hunk)
    return sections


def apply_patch(text, patch):
    """Apply a unified diff (as difflib writes it) to text. Each hunk header says where it starts and
    how many old and new lines it spans; every context and removed line must match the text."""
    old, new, at = text.splitlines(keepends=True), [], 0
    lines = patch.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = HUNK.match(lines[i])
        i += 1
        if not m:
            continue
        begin = int(m.group(1)) - (m.group(2) != "0")  # 0-based first old line ("-5,0": after line 5)
        if begin < at:
            raise ValueError(f"hunks out of order at line {begin + 1}")
        new += old[at:begin]
        at, n_old, n_new = begin, int(m.group(2) or 1), int(m.group(4) or 1)
        while n_old or n_new:
            body = lines[i]
            i += 1
            kind, line = body[0], body[1:]
            if kind in " -":
                if at >= len(old) or old[at] != line:
                    found = repr(old[at]) if at < len(old) else "the end of the text"
                    raise ValueError(f"patch does not apply at line {at + 1}: {found} != {line!r}")
                at, n_old = at + 1, n_old - 1
            if kind in " +":
                new.append(line)
                n_new -= 1
    return "".join(new + old[at:])


def patch_text(before, after, old_name, new_name):
    """A step's patch: the unified diff from before to after, two lines of context."""
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=old_name, tofile=new_name, n=2
    )
    return "".join(diff)


def _heading(n, name, step):
    """A patch header: the file's path in the repository and which step (and idea) its text is after;
    step None: the part before's file."""
    if step is None:
        return f"{parts.folder(n - 1).name}/{name}"
    return f"{parts.folder(n).name}/{name} (step {step.name}: {step.label})"


def _before(n, name, step):
    """The step a model step's patch of file `name` starts from: the model step before, or for the
    first, the lesson ladder that ends at the file (None: flash_attention.py, the part before's)."""
    if step is not None:
        return step
    ladder = next(k for k, v in TARGETS.items() if v == name)
    found = ladders(parts.folder(n))
    return found[ladder][-1] if ladder in found else None


def write(n, ladder, texts):
    """Write part n's ladder from its texts ([start, after step 1, ..., last]; for MODEL, {file:
    text} dicts): a .py first step as the file, every other step as the patch from the step before,
    headed by the file it patches. Returns the steps rewritten."""
    steps = steps_of(n, ladder)
    written = []
    for i, step in enumerate(steps, 1):
        before_step = steps[i - 2] if i > 1 else None
        if ladder == MODEL:
            before, after = texts[i - 1], texts[i]
            body = "".join(
                patch_text(before[f], after[f], _heading(n, f, _before(n, f, before_step)), _heading(n, f, step))
                for f in TARGETS.values()
                if f in after and before[f] != after[f]
            )
        elif step.path.suffix == ".py":
            body = texts[i]
        else:
            name = TARGETS[ladder]
            body = patch_text(texts[i - 1], texts[i], _heading(n, name, before_step), _heading(n, name, step))
        if step.path.read_text() != body:
            step.path.write_text(body)
            written.append(step)
    return written


def refresh(n, ladder=None):
    """After editing the files a part's ladders end at: the last step written again to end there (by
    default the ladder that ends at the shipped files: the model ladder where there is one)."""
    ladder = (MODEL if has_model(n) else "") if ladder is None else ladder
    if ladder == MODEL:
        texts = states(n)
        ends = {name: path.read_text() for name, path in shipped(n, MODEL).items()}
        return write(n, MODEL, texts[:-1] + [{**texts[-1], **ends}])
    if has_model(n):
        raise ValueError(f"part {n}'s {ladder!r} ladder ends where its {MODEL} ladder starts: refresh {MODEL!r}")
    return write(n, ladder, sources(n, ladder)[:-1] + [shipped(n, ladder)[TARGETS[ladder]].read_text()])


def variant(n, name):
    """The kernel file that the study patch tools/variants/<name>.diff names in its first header (part
    n's flash_attention.py, or one of part 5's Gluon files), with the patch applied: a study that
    needs a changed kernel patches the shipped one (a switch is a patch), never copies it."""
    patch = (parts.folder(n) / "tools" / "variants" / f"{name}.diff").read_text()
    target = parts.folder(n) / Path(patch.split(maxsplit=2)[1]).name  # "--- part5_profiling/<file>"
    return apply_patch(target.read_text(), patch)


@functools.cache
def load_variant(n, name):
    """Part n's kernel file with the study patch tools/variants/<name>.diff applied, imported as a
    module of its own (once)."""
    return parts.load_source(f"part{n}_variant_{name}", variant(n, name))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, required=True)
    ap.add_argument("--list", action="store_true", help="every ladder of the part and its steps")
    ap.add_argument("--show", metavar="STEP", help="print the kernel file after this step (a model step: its files)")
    ap.add_argument("--refresh", nargs="?", const=None, default=False, metavar="LADDER", help="rewrite the last patch")
    args = ap.parse_args(argv)
    try:
        if args.show:
            steps, i = find(args.part, args.show)
            if steps[0].ladder == MODEL:
                files = states(args.part)[i + 1]
                changed = split_patch(steps[i].path.read_text())
                sys.stdout.write("".join(f"# ---- {name}\n{files[name]}" for name in changed))
            else:
                sys.stdout.write(sources(args.part, steps[0].ladder)[i + 1])
        elif args.refresh is not False:
            done = refresh(args.part, args.refresh)
            print("rewrote " + (", ".join(str(s.path.relative_to(ROOT)) for s in done) or "nothing"))
        else:
            for ladder, steps in ladders(parts.folder(args.part)).items():
                ends = "several files" if ladder == MODEL else TARGETS[ladder]
                print(f"{ladder or 'steps'} ({ends}): " + ", ".join(f"{s.name} {s.label}" for s in steps))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
