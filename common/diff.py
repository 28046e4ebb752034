"""What part N changes in part N-1: the lesson of part N, as a unified diff.

    python -m common.diff --part 2            (or: make diff PART=2)
    python -m common.diff --part 3 --step 2      (or: make diff PART=3 STEP=2): one idea of part 3's
    python -m common.diff --part 5 --step fwd3   (or: make diff PART=5 STEP=fwd3): step 3 of part 5's forward

Only the kernel file is compared line by line; files a part adds (a sweep script, a profiler)
are listed. A part that makes several changes keeps them as ladders of steps in its steps/ folder
(common/steps.py), one idea a patch: --step prints one, and the plain diff lists them all. Where a
part's lesson is followed by a model ladder (part 5), the plain diff is its kernel file as the
lesson leaves it: the model ladder's first step. Needs nothing beyond the Python standard library.
"""

import argparse
import difflib
import sys

from common import ROOT, parts, steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int)
    ap.add_argument("--step", help="one step of the part's ladders alone: 2, fwd3 (a part with a steps/ folder)")
    args = ap.parse_args(argv)
    n = args.part
    numbers = list(parts.folders())
    if n is None or n not in numbers or n - 1 not in numbers:
        print(
            f"usage: make diff PART=N, with N in {numbers[1]}..{numbers[-1]}: what part N changes in part N-1's kernel"
        )
        return 2
    missing = [m for m in (n - 1, n) if m not in parts.available()]
    if missing:
        print(
            f"part {missing[0]} ({parts.folder(missing[0]).name}) has no kernel yet, so there is nothing to diff; "
            "its README.md says what is coming"
        )
        return 2
    if args.step is not None:
        try:
            ladder, i = steps.find(n, args.step)
        except ValueError as e:
            print(e)
            return 2
        path = ladder[i].path
        if path.suffix == ".py":  # a ladder's first step, a whole new file: every line is added
            sys.stdout.write(steps.patch_text("", path.read_text(), "/dev/null", str(path.relative_to(ROOT))))
        else:
            sys.stdout.write(path.read_text())
        return 0
    old, new = parts.folder(n - 1), parts.folder(n)
    a, b = parts.path(n - 1), parts.path(n)
    found = steps.ladders(new)
    if steps.MODEL in found:  # the kernel file as the lesson leaves it: the model ladder's first step
        sys.stdout.write(steps.split_patch(found[steps.MODEL][0].path.read_text())[b.name])
    else:
        diff = difflib.unified_diff(
            a.read_text().splitlines(keepends=True),
            b.read_text().splitlines(keepends=True),
            fromfile=str(a.relative_to(ROOT)),
            tofile=str(b.relative_to(ROOT)),
        )
        sys.stdout.write("".join(diff))
    skip = {"__pycache__", "README.md"}
    added = sorted(
        p.name + "/" * p.is_dir() for p in new.iterdir() if p.name not in skip and not (old / p.name).exists()
    )
    if added:
        print(f"\nPart {n} also adds: {', '.join(added)}")
    for ladder, found_steps in found.items():
        names = ", ".join(f"{s.name} {s.label}" for s in found_steps)
        if ladder == steps.MODEL:
            what = f"then takes what a model needs in {len(found_steps)} steps (the first is the diff above)"
        elif ladder:
            what = f"builds {steps.TARGETS[ladder]} in {len(found_steps)} steps"
        else:
            what = f"makes {len(found_steps)} changes"
        print(f"Part {n} {what}; one at a time: make diff PART={n} STEP=<step> ({names})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader closed the pipe (`make diff PART=3 | head`: seen enough)
        sys.stderr.close()  # and Python's complaint about it, at exit, with it
