"""Part 3's ablation: part 2's kernel, then part 3's changes added one at a time, all timed in one run.

    python -m part3_inner_loop.ablation            # GPU: results/<gpu>/part3_ablation.csv
    python -m part3_inner_loop.ablation --show 3   # print step 3's kernel source (any machine)
    python -m part3_inner_loop.ablation --refresh  # after editing part 3's kernel: rewrite the last patch

Each step is a kernel file: part 2's flash_attention.py with the patches in steps/ applied in order,
one change per patch (read them: each is that change and nothing else). Applying all of them gives
part 3's flash_attention.py exactly; tests/test_part3_tools.py checks it, so the steps cannot drift
from the kernel a reader sees. Every step is checked against the float64 reference on the inputs
it is timed on, then timed like the benchmark (do_bench median, and CUDA-graph replay).
"""

import argparse
import difflib
import re
import sys
from pathlib import Path

from common import parts, results, study

STEPS_DIR = Path(__file__).resolve().parent / "steps"
LABELS = ["part 2", "+ causal skip", "+ exp2", "+ masks only where needed", "+ work balance", "+ retuned tiles"]
SEQ_LENS = (1024, 4096, 16384)
FIELDS = [
    "step",
    "label",
    *results.SHAPE_FIELDS,
    "ms",
    "tflops",
    "graph_ms",
    "graph_tflops",
    "config",
    "check",
    *results.PROVENANCE,
]
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


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
        start = int(m.group(1)) - (m.group(2) != "0")  # 0-based first old line ("-5,0": after line 5)
        if start < at:
            raise ValueError(f"hunks out of order at line {start + 1}")
        new += old[at:start]
        at, n_old, n_new = start, int(m.group(2) or 1), int(m.group(4) or 1)
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


def step_sources():
    """[part 2's kernel source, + step 1, ..., + every step (part 3's kernel)]"""
    sources = [parts.path(2).read_text()]
    for patch in sorted(STEPS_DIR.glob("*.diff")):
        sources.append(apply_patch(sources[-1], patch.read_text()))
    return sources


def refresh_last_step():
    """Rewrite the last patch so that the steps end at part 3's kernel as it is now."""
    last = sorted(STEPS_DIR.glob("*.diff"))[-1]
    before = step_sources()[-2].splitlines(keepends=True)
    after = parts.path(3).read_text().splitlines(keepends=True)
    n = len(LABELS) - 1
    diff = difflib.unified_diff(before, after, fromfile=f"step {n - 1}", tofile=f"step {n}: {last.stem}", n=2)
    last.write_text("".join(diff))
    return last


def load_step(i, source):
    """Import one step's source as a module of its own (it registers its own torch.library ops)."""
    return parts.load_source(f"part3_step{i}", source)


def run(seq_lens, save=None):
    modules = {LABELS[i]: load_step(i, s) for i, s in enumerate(step_sources())}
    forwards = {label: module.flash_forward for label, module in modules.items()}
    return study.time_forwards(
        forwards,
        lambda label, causal: dict(step=LABELS.index(label), label=label),
        seq_lens,
        save=save,
        config=lambda label: parts.forward_config(modules[label]),
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--show", type=int, choices=range(len(LABELS)), help="print the kernel after this many steps (0: part 2)"
    )
    ap.add_argument("--quick", action="store_true", help="N = 4096 only")
    ap.add_argument("--refresh", action="store_true", help="rewrite the last patch to end at part 3's kernel")
    args = ap.parse_args(argv)
    if args.refresh:
        print(f"rewrote {refresh_last_step()}")
        return 0
    if args.show is not None:
        print(step_sources()[args.show], end="")
        return 0
    if not study.on_gpu("The ablation times compiled kernels (`--show N` prints a step's kernel anywhere)"):
        return 0
    seq_lens = (4096,) if args.quick else SEQ_LENS
    return results.write_as_measured("part3_ablation.csv", FIELDS, lambda save: run(seq_lens, save))


if __name__ == "__main__":
    sys.exit(main())
