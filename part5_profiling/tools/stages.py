"""Where the forward's time goes, measured without counters: time the kernel with one stage of its
inner loop done twice, or left out, and take differences.

    python -m part5_profiling.tools.stages     # GPU: results/<gpu>/part5_stages.csv

The kernel is part 4's forward (part 3's, unchanged), as part 5 keeps it, with one patch of
tools/variants/ applied (STAGES): a second Q K^T product, a second P V product, a second exp2 per
score, or no exp2 at all (candidates.load, common/steps.py's variant()). A
variant's time minus the original's is what that stage costs when it is added to the loop as it
runs, overlap with the other stages included: a stage that hides entirely behind another costs
nothing here. The variants compute something else on purpose, so they are timed, not checked (the
original is checked first). Shapes: B=4, H=8, N=4096, D 64 and 128, bf16, causal and not, CUDA-graph
replay, median; each variant is autotuned for itself, and the CSV says which tiles it ran.
"""

import functools
import sys

import torch

from common import parts
from common.check import check_slices
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE
from lab import results, study
from lab.timing import attention_flops, graph_time_ms, tflops
from part5_profiling.tools.candidates import load

B, H, N = 4, 8, 4096
HEAD_DIMS = (64, 128)
FIELDS = [
    "variant",
    *results.SHAPE_FIELDS,
    "graph_ms",
    "graph_tflops",
    "delta_us",
    "config",
    "check",
    *results.PROVENANCE,
]
KEY = ("variant", "D", "causal")  # a run of some shapes keeps the other rows
# name -> its patch in tools/variants/ (None: the kernel as shipped)
STAGES = {"original": None, "Q K^T twice": "qk_twice", "P V twice": "pv_twice", "exp2 twice": "exp2_twice"}
STAGES["no exp2"] = "no_exp2"


def time_variant(stage, q, k, v, causal):
    """(CUDA-graph milliseconds, check) of one variant's forward; only the original is checked."""
    fn = functools.partial(load(stage).flash_forward, q, k, v, causal)
    with torch.no_grad():
        if stage is None:
            o, lse = fn()
            check = study.checked(check_slices({"O": o, "L": lse}, q, k, v, causal))
        else:
            fn()
            check = "not checked: computes something else on purpose"
        return graph_time_ms(fn), check


def run(head_dims=HEAD_DIMS, masks=(False, True), save=None):
    meta = results.provenance()
    rows = []
    for d in head_dims:
        for causal in masks:
            q, k, v, _ = make_inputs(Shape((B, H), N, N, d), torch.bfloat16, DEVICE, seed=d + causal)
            flops = attention_flops(B, H, N, N, d, causal)
            base_ms = None
            for name, stage in STAGES.items():
                row = dict(variant=name, B=B, H=H, N=N, D=d, dtype="bf16", causal=int(causal), **meta)
                try:
                    ms, check = time_variant(stage, q, k, v, causal)
                except Exception as e:  # a variant the compiler refuses: say why, go on
                    rows.append(dict(row, check=f"error: {results.why(e)}"))
                    print(f"D={d:<3} causal={causal:d} {name:<12} error: {results.why(e)}", flush=True)
                    continue
                base_ms = ms if name == "original" else base_ms
                delta = "" if base_ms is None else f"{(ms - base_ms) * 1e3:.1f}"
                rows.append(
                    dict(
                        row,
                        graph_ms=f"{ms:.4f}",
                        graph_tflops=tflops(flops, ms),
                        delta_us=delta,
                        config=parts.forward_config(load(stage)),
                        check=check,
                    )
                )
                print(
                    f"D={d:<3} causal={causal:d} {name:<12} {ms * 1e3:8.1f} us  {delta or '-':>8} us  {parts.forward_config(load(stage))}",
                    flush=True,
                )
            torch.cuda.empty_cache()
            if save is not None:
                save(rows)
    return rows


def main(argv=None):
    args = study.arguments(__doc__, argv, d=HEAD_DIMS, causal=True)
    if not study.on_gpu("The stage timings time compiled kernels"):
        return 0
    failed = lambda r: r["check"].startswith(("FAIL", "error"))  # noqa: E731  (the variants are not checked)
    return results.write_as_measured(
        "part5_stages.csv", FIELDS, lambda save: run(args.d, args.causal, save), key=KEY, failed=failed
    )


if __name__ == "__main__":
    sys.exit(main())
