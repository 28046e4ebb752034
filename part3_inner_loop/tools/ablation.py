"""Part 3's ablation: part 2's kernel, then part 3's changes added one at a time, all timed in one run.

    python -m part3_inner_loop.tools.ablation            # GPU: results/<gpu>/part3_ablation.csv
    python -m part3_inner_loop.tools.ablation --show 3   # print step 3's kernel source (any machine)

Each step is a kernel file: part 2's flash_attention.py with the patches in steps/ applied in order
(common/steps.py), one change per patch (read them: each is that change and nothing else). Applying all of them gives
part 3's flash_attention.py exactly; tests/test_part3_tools.py checks it, so the steps cannot drift
from the kernel a reader sees (after editing the kernel, `python -m common.steps --part 3 --refresh`
rewrites the last patch). Every step is checked against the float64 reference on the inputs
it is timed on, then timed like the benchmark (do_bench median, and CUDA-graph replay).
"""

import argparse
import sys

from common import parts, steps
from lab import results, study

LABELS = ["part 2", "+ causal skip", "+ exp2", "+ masks only where needed", "+ work balance", "+ retuned tiles"]
SEQ_LENS = (1024, 4096, 16384)
FIELDS = ["step", "label", *results.SHAPE_FIELDS, "ms", "tflops", "graph_ms", "graph_tflops", "config", "check"]
FIELDS += results.PROVENANCE


def step_sources():
    """[part 2's kernel source, + step 1, ..., + every step (part 3's kernel)]"""
    return steps.sources(3)


def load_step(i, source):
    """Import one step's source as a module of its own (it registers its own torch.library ops)."""
    return parts.load_source(f"part3_step{i}", source)


def run(seq_lens, save=None):
    modules = {LABELS[i]: load_step(i, s) for i, s in enumerate(step_sources())}
    return study.time_forwards(
        {label: module.flash_forward for label, module in modules.items()},
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
    args = ap.parse_args(argv)
    if args.show is not None:
        print(step_sources()[args.show], end="")
        return 0
    if not study.on_gpu("The ablation times compiled kernels (`--show N` prints a step's kernel anywhere)"):
        return 0
    seq_lens = (4096,) if args.quick else SEQ_LENS
    return results.write_as_measured("part3_ablation.csv", FIELDS, lambda save: run(seq_lens, save))


if __name__ == "__main__":
    sys.exit(main())
