"""Where the forward's time goes, measured without counters: time the kernel with one stage of its
inner loop done twice, or left out, and take differences.

    python -m part5_profiling.stages       # GPU: results/<gpu>/part5_stages.csv

The kernel is part 4's forward (part 3's, unchanged). Each variant changes one line of
_attn_fwd_inner (VARIANTS below): a second Q K^T product, a second P V product, a second exp2 per
score, or no exp2 at all. A variant's time minus the original's is what that stage costs when it is
added to the loop as it runs, overlap with the other stages included: a stage that hides entirely
behind another costs nothing here. The variants compute something else on purpose, so they are
timed, not checked (the original is checked first). Shapes: B=4, H=8, N=4096, D 64 and 128, bf16,
causal and not, CUDA-graph replay, median; each variant is autotuned for itself, and the CSV says
which tiles it ran.
"""

import argparse
import functools
import sys

import torch

from common import bench, parts, results, runtime, variants
from common.inputs import Shape, make_inputs

PART = 4
B, H, N = 4, 8, 4096
HEAD_DIMS = (64, 128)
QK = "        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) Q_i K_j^T, float32\n"
PV = "        acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)  # acc += P_ij V_j, float32 accumulate\n"
EXP = "        p = tl.exp2(s * qk_scale - m_sub[:, None])  # (BLOCK_M, BLOCK_N) P_ij, one FMA and one exp2 each\n"
VARIANTS = {
    "original": [],
    "Q K^T twice": [(QK, QK + "        s = tl.dot(q, tl.trans(k), s, input_precision=DOT_PRECISION)\n")],
    "P V twice": [(PV, PV + "        acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)\n")],
    "exp2 twice": [
        (EXP, "        p = tl.exp2(s * qk_scale - m_sub[:, None]) + tl.exp2(s * qk_scale - m_sub[:, None] - 64.0)\n")
    ],
    "no exp2": [(EXP, "        p = tl.maximum(s * qk_scale - m_sub[:, None], -1.0)  # finite where masked\n")],
}
FIELDS = ["variant", "B", "H", "N", "D", "dtype", "causal", "graph_ms", "graph_tflops", "delta_us", "config", "check",
          *results.PROVENANCE]  # fmt: skip
KEY = ("variant", "D", "causal")  # a run of some shapes keeps the other rows


def variant_source(name):
    return variants.apply(parts.path(PART).read_text(), VARIANTS[name], f"part {PART}'s kernel")


def time_variant(name, module, q, k, v, causal):
    """(CUDA-graph milliseconds, check) of one variant's forward; only the original is checked."""
    fn = functools.partial(module.flash_forward, q, k, v, causal)
    with torch.no_grad():
        if name == "original":
            o, lse = fn()
            report = bench.check_slices({"O": o, "L": lse}, q, k, v, causal)
            check = ("ok " if report.ok else "FAIL ") + str(report)
        else:
            fn()
            check = "not checked: computes something else on purpose"
        return bench.graph_time_ms(fn), check


def run(head_dims=HEAD_DIMS, masks=(False, True), save=None):
    modules = {name: parts.load_source(f"part5_stage{i}", variant_source(name)) for i, name in enumerate(VARIANTS)}
    meta = results.provenance()
    rows = []
    for d in head_dims:
        for causal in masks:
            q, k, v, _ = make_inputs(Shape((B, H), N, N, d), torch.bfloat16, runtime.DEVICE, seed=d + causal)
            flops = bench.attention_flops(B, H, N, N, d, causal)
            base_ms = None
            for name, module in modules.items():
                row = dict(variant=name, B=B, H=H, N=N, D=d, dtype="bf16", causal=int(causal), **meta)
                try:
                    ms, check = time_variant(name, module, q, k, v, causal)
                except Exception as e:  # a variant the compiler refuses: say why, go on
                    rows.append(dict(row, check=f"error: {bench.why(e)}"))
                    print(f"D={d:<3} causal={causal:d} {name:<12} error: {bench.why(e)}", flush=True)
                    continue
                base_ms = ms if name == "original" else base_ms
                delta = "" if base_ms is None else f"{(ms - base_ms) * 1e3:.1f}"
                rows.append(dict(row, graph_ms=f"{ms:.4f}", graph_tflops=f"{flops / ms * 1e-9:.1f}", delta_us=delta,
                                 config=bench.chosen_config(module), check=check))  # fmt: skip
                print(f"D={d:<3} causal={causal:d} {name:<12} {ms * 1e3:8.1f} us  {delta or '-':>8} us  "
                      f"{bench.chosen_config(module)}", flush=True)  # fmt: skip
            torch.cuda.empty_cache()
            if save is not None:
                save(rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--d", type=int, action="append", choices=HEAD_DIMS, help="head dimension (repeatable); default: both"
    )
    ap.add_argument("--causal", type=int, action="append", choices=(0, 1), help="0 or 1 (repeatable); default: both")
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The stage timings need a CUDA GPU.")
        return 0
    failed = lambda r: r["check"].startswith(("FAIL", "error"))  # noqa: E731  (the variants are not checked)
    masks = [bool(c) for c in args.causal] if args.causal else (False, True)
    run_them = lambda save: run(args.d or HEAD_DIMS, masks, save)  # noqa: E731
    return results.write_as_measured("part5_stages.csv", FIELDS, run_them, failed, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
