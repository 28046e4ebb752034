"""What part N changes in part N-1: the lesson of part N, as a unified diff.

    python -m common.diff --part 2            (or: make diff PART=2)
    python -m common.diff --part 3 --step 2   (or: make diff PART=3 STEP=2): one idea of part 3's

Only the kernel file is compared line by line; files a part adds (a sweep script, a profiler)
are listed. A part that makes several changes at once keeps them as one patch each in its steps/
folder, applied in order to the part before's kernel: --step N prints the N-th. Needs nothing
beyond the Python standard library.
"""

import argparse
import difflib
import sys

from common import ROOT, parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, required=False)
    ap.add_argument("--step", type=int, help="the part's N-th change alone (a part with a steps/ folder)")
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
    steps = sorted((parts.folder(n) / "steps").glob("*.diff"))
    if args.step is not None:
        if not 1 <= args.step <= len(steps):
            which = f"1..{len(steps)}" if steps else "none: it makes one change"
            print(f"part {n} has no step {args.step}; its steps: {which}")
            return 2
        sys.stdout.write(steps[args.step - 1].read_text())
        return 0
    old, new = parts.folder(n - 1), parts.folder(n)
    a, b = parts.path(n - 1), parts.path(n)
    diff = difflib.unified_diff(
        a.read_text().splitlines(keepends=True),
        b.read_text().splitlines(keepends=True),
        fromfile=str(a.relative_to(ROOT)),
        tofile=str(b.relative_to(ROOT)),
    )
    try:
        sys.stdout.writelines(diff)
    except BrokenPipeError:  # `make diff PART=3 | head`: the reader has seen enough
        sys.stderr.close()
        return 0
    skip = {"__pycache__", "README.md"}
    added = sorted(
        p.name + "/" * p.is_dir() for p in new.iterdir() if p.name not in skip and not (old / p.name).exists()
    )
    if added:
        print(f"\nPart {n} also adds: {', '.join(added)}")
    if steps:
        names = ", ".join(f"{i} {p.stem.split('_', 1)[-1].replace('_', ' ')}" for i, p in enumerate(steps, 1))
        print(f"Part {n} makes {len(steps)} changes; one at a time: make diff PART={n} STEP=N ({names})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
