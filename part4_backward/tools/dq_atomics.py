"""dQ two ways: the deterministic second pass (part 4's) against FlashAttention-2's atomics.

    python -m part4_backward.tools.dq_atomics    # GPU: results/<gpu>/part4_dq_atomics.csv

The atomics are a patch on part 4's kernel, tools/variants/atomic_dq.diff: the dK/dV kernel adds
each dS_ij K_j into a float32 dQ with atomics (ATOMIC_DQ), and the dQ kernel is not launched;
flash_backward(..., atomic_dq=False) of the patched file is part 4's backward (tests/test_backward.py
checks both). For each shape (B=4, H=8, bf16): check both against the float64 reference, time the
backward alone (flash_backward from the saved O and L: the three or two launches), and run each five
times on the same inputs to see whether dQ comes out bit for bit the same.
"""

import functools
import sys

import torch

from common import steps
from common.check import check_slices
from lab import results, study
from lab.bench import each_shape
from lab.timing import attention_flops, tflops, time_ms

B, H = 4, 8
SEQ_LENS = (1024, 4096)
REPEATS = 5
FIELDS = ["variant", *results.SHAPE_FIELDS, "ms", "tflops", "bitwise_repeatable", "max_run_to_run", "check"]
FIELDS += results.PROVENANCE


def main(argv=None):
    study.arguments(__doc__, argv)
    if not study.on_gpu("Timing the two dQ variants (tests/test_backward.py checks both anywhere)"):
        return 0
    module = steps.load_variant(4, "atomic_dq")
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in each_shape(SEQ_LENS, b=B, h=H):
        o, lse = module.flash_forward(q, k, v, causal)
        flops = attention_flops(B, H, n, n, d, causal, "bwd")
        for variant, atomic in (("second pass (default)", False), ("atomics", True)):
            backward = functools.partial(module.flash_backward, q, k, v, o, lse, do, causal, atomic_dq=atomic)
            runs = [backward()[0] for _ in range(REPEATS)]
            dq, dk, dv = backward()
            report = check_slices({"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}, q, k, v, causal, do)
            ms = time_ms(backward)
            diff = max((r.float() - runs[0].float()).abs().max().item() for r in runs)
            repeatable = int(all(torch.equal(r, runs[0]) for r in runs))
            row = dict(variant=variant, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), ms=f"{ms:.4f}", **meta)
            row.update(tflops=tflops(flops, ms), bitwise_repeatable=repeatable, max_run_to_run=f"{diff:.3e}")
            rows.append(dict(row, check=study.checked(report)))
            print(
                f"{variant:<22} D={d} causal={causal:d} N={n:>5} {row['tflops']:>7} TFLOP/s  repeatable="
                f"{repeatable} (max diff {row['max_run_to_run']})  {rows[-1]['check'][:30]}",
                flush=True,
            )
    path = results.write_csv(results.results_dir() / "part4_dq_atomics.csv", rows, FIELDS)
    print(f"wrote {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
