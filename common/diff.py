"""What part N changes in part N-1: the lesson of part N, as a unified diff.

    python -m common.diff --part 2        (or: make diff PART=2)

Only the kernel file is compared line by line; files a part adds (a sweep script, a profiler)
are listed. Needs nothing beyond the Python standard library.
"""

import argparse
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {0: "part0_pytorch_reference", 1: "part1_triton_baseline", 2: "part2_tile_tuning",
           3: "part3_inner_loop", 4: "part4_backward", 5: "part5_profiling"}  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, required=False)
    n = ap.parse_args(argv).part
    if n is None or n not in FOLDERS or n == 0:
        print("usage: make diff PART=N, with N in 1..5: shows what part N changes in part N-1's kernel")
        return 2
    old, new = ROOT / FOLDERS[n - 1], ROOT / FOLDERS[n]
    for folder in (old, new):
        if not (folder / "flash_attention.py").exists():
            print(f"Part {n if folder == new else n - 1} ({folder.name}) has no kernel yet, so there is nothing to diff. "
                  f"Its README.md says what is coming.")  # fmt: skip
            return 0
    a, b = (p / "flash_attention.py" for p in (old, new))
    diff = difflib.unified_diff(a.read_text().splitlines(keepends=True), b.read_text().splitlines(keepends=True),
                                fromfile=str(a.relative_to(ROOT)), tofile=str(b.relative_to(ROOT)))  # fmt: skip
    sys.stdout.writelines(diff)
    added = sorted(p.name for p in new.glob("*.py") if not (old / p.name).exists())
    if added:
        print(f"\nPart {n} also adds: {', '.join(added)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
