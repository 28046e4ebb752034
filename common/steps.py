"""Ladders of steps: a kernel built one idea at a time, each idea a patch a reader can diff.

    python -m common.steps --part 5 --list                     # every ladder of part 5 and its steps
    python -m common.steps --part 5 --show fwd3                # the kernel file after step fwd3
    python -m common.steps --part 3 --refresh                  # after editing the shipped kernel

A part's steps/ folder holds one ladder or several. A step is a file named <ladder><n>_<idea>:
`2_exp2.diff` is step 2 of part 3's one ladder (its ladder's name is empty), `fwd3_two_products.diff`
step 3 of part 5's forward ladder. A step is a unified diff on the step before it; a ladder's first
step is either a diff on the part before's flash_attention.py (part 3) or a whole new file, `.py`
(part 5's Gluon kernels). Applying every step of a ladder in order gives the file it ends at
(TARGETS) exactly, which the tests check, so a step cannot drift from the kernel a reader runs.

A study that needs a changed kernel (a stage done twice, a candidate change) keeps the change as a
patch too, in tools/variants/ beside the study: variant() applies it to the shipped kernel file.
Needs only the standard library (`make diff`).
"""

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, parts

# The file each ladder ends at, by the ladder's name.
TARGETS = {"": "flash_attention.py", "fwd": "gluon_attention.py", "bwd": "gluon_backward.py"}
NAME = re.compile(r"([a-z]*)(\d+)_(\w+)\.(diff|py)")
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Step:
    ladder: str  # "" (a part's one ladder), "fwd", "bwd"
    number: int
    idea: str  # the file name's words: "two_products"
    path: Path

    @property
    def name(self):
        """What a reader types: "2", "fwd3"."""
        return f"{self.ladder}{self.number}"

    @property
    def label(self):
        return self.idea.replace("_", " ")


def ladders(folder):
    """{ladder name: [Step, ...] in order} for the steps/ folder of a part folder (empty if none).
    Steps sort by number, not as text: fwd10 comes after fwd9."""
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
        if any(s.path.suffix == ".py" for s in steps[1:]):
            raise ValueError(f"{folder}/steps: only a ladder's first step may be a whole file (.py)")
    return {
        name: found[name] for name in sorted(found, key=lambda n: (list(TARGETS).index(n) if n in TARGETS else 99, n))
    }


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


def target(n, ladder):
    """The file part n's ladder ends at."""
    return parts.folder(n) / TARGETS[ladder]


def start(n, steps):
    """What a ladder's first step applies to: nothing for a whole file, else the part before's kernel."""
    return "" if steps[0].path.suffix == ".py" else parts.path(n - 1).read_text()


def sources(n, ladder=""):
    """[the start, after step 1, ..., after the last step (the target's text)] for part n's ladder."""
    steps = steps_of(n, ladder)
    texts = [start(n, steps)]
    for step in steps:
        body = step.path.read_text()
        texts.append(body if step.path.suffix == ".py" else apply_patch(texts[-1], body))
    return texts


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


def write(n, ladder, texts):
    """Write part n's ladder from its sources ([start, step 1, ..., last]): a .py first step as the
    file, every other step as the patch from the step before. Returns the steps rewritten."""
    steps = steps_of(n, ladder)
    written = []
    for i, step in enumerate(steps, 1):
        names = (f"step {steps[i - 2].name}" if i > 1 else "step 0", f"step {step.name}: {step.path.stem}")
        body = texts[i] if step.path.suffix == ".py" else patch_text(texts[i - 1], texts[i], *names)
        if step.path.read_text() != body:
            step.path.write_text(body)
            written.append(step)
    return written


def refresh(n, ladder=""):
    """After editing the file a ladder ends at: its last step's patch written again to end there."""
    return write(n, ladder, sources(n, ladder)[:-1] + [target(n, ladder).read_text()])


def variant(n, name):
    """Part n's flash_attention.py with the study patch tools/variants/<name>.diff applied: a study
    that needs a changed kernel patches the shipped one (a switch is a patch), never copies it."""
    return apply_patch(parts.path(n).read_text(), (parts.folder(n) / "tools" / "variants" / f"{name}.diff").read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, required=True)
    ap.add_argument("--list", action="store_true", help="every ladder of the part and its steps")
    ap.add_argument("--show", metavar="STEP", help="print the kernel file after this step")
    ap.add_argument("--refresh", nargs="?", const="", metavar="LADDER", help="rewrite the last patch (after an edit)")
    args = ap.parse_args(argv)
    try:
        if args.show:
            steps, i = find(args.part, args.show)
            sys.stdout.write(sources(args.part, steps[0].ladder)[i + 1])
        elif args.refresh is not None:
            done = refresh(args.part, args.refresh)
            print("rewrote " + (", ".join(str(s.path.relative_to(ROOT)) for s in done) or "nothing"))
        else:
            for ladder, steps in ladders(parts.folder(args.part)).items():
                print(f"{TARGETS[ladder]}: " + ", ".join(f"{s.name} {s.label}" for s in steps))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
