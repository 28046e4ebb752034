"""What casting P costs: the kernel rounds P_ij to the input dtype before P_ij V_j (tensor cores
multiply 16-bit operands). Kept in float32 instead, V must be widened and the product runs as TF32
(P keeps 10 mantissa bits, as in float16) or as IEEE float32 (no rounding, no tensor cores).

    python -m part3_inner_loop.p_cast      # GPU: results/<gpu>/part3_p_cast.csv

The three variants are part 3's kernel as it ships and with each of two patches, tools/variants/
p_float32_tf32.diff and p_float32_ieee.diff (applied by common.steps.variant). Accuracy:
max |O - O_ref| against the float64 reference, bf16 and fp16 inputs, several N and score sizes
(q and k scaled so the scores S have standard deviation 1 or 4), beside PyTorch's own attention in
the input dtype (the baseline of the tests' tolerance rule). Speed: each variant timed at
N = 4096 (IEEE at D = 64 only).
"""

import functools
import sys

import torch

from common import parts, results, study
from common.inputs import Shape, make_inputs
from common.reference import attention_reference
from common.runtime import DEVICE
from common.timing import attention_flops, tflops, time_ms

P_PRODUCTS = {  # the study's names -> their patches in tools/variants/ (None: part 3's kernel as it ships)
    "P cast to the input dtype (part 3)": None,
    "P float32, TF32 product": "p_float32_tf32",
    "P float32, IEEE product": "p_float32_ieee",
}
SEQ_LENS = (512, 2048, 4096)
SCORE_STDS = (1.0, 4.0)
FIELDS = ["variant", "what", "dtype", "B", "H", "N", "D", "score_std", "err", "ms", "tflops", *results.PROVENANCE]


def variant_forward(patch):
    """flash_forward of part 3's kernel with the patch applied (None: as it ships)."""
    return (parts.load(3) if patch is None else parts.load_variant(3, patch)).flash_forward


def accuracy_rows(forwards, meta):
    rows = []
    d, b, h = 64, 1, 4
    for dtype, dname in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for std in SCORE_STDS:
            for n in SEQ_LENS:
                # q, k ~ N(0, s^2) with s^2 = std: S = q.k / sqrt(D) has standard deviation std.
                q, k, v, _ = make_inputs(Shape((b, h), n, n, d), dtype, DEVICE, seed=n, scale=std**0.5)
                ref, _ = attention_reference(q, k, v)
                torch_same_dtype, _ = attention_reference(q, k, v, dtype=dtype)
                outs = {"PyTorch attention in the input dtype": torch_same_dtype}
                with torch.no_grad():
                    outs.update({name: forward(q, k, v, False)[0] for name, forward in forwards.items()})
                for name, o in outs.items():
                    err = (o.double() - ref).abs().max().item()
                    rows.append(
                        dict(
                            variant=name,
                            what="accuracy",
                            dtype=dname,
                            B=b,
                            H=h,
                            N=n,
                            D=d,
                            score_std=std,
                            err=f"{err:.3e}",
                            **meta,
                        )
                    )
                    print(f"{dname} std={std:<4} N={n:>5} {name:<40} max|O - ref| = {err:.2e}", flush=True)
    return rows


def speed_rows(forwards, meta):
    rows = []
    b, h, n = 4, 8, 4096
    for d in (64, 128):
        q, k, v, _ = make_inputs(Shape((b, h), n, n, d), torch.bfloat16, DEVICE, seed=d)
        flops = attention_flops(b, h, n, n, d, False)
        for name, forward in forwards.items():
            if "IEEE" in name and d > 64:
                # No tensor cores: the product compiles to scalar multiply-adds, unrolled over the
                # whole tile, and compiling D = 128's tiles takes minutes. D = 64 shows the cost.
                continue
            with torch.no_grad():
                ms = time_ms(functools.partial(forward, q, k, v, False))
            rows.append(
                dict(
                    variant=name,
                    what="speed",
                    dtype="bf16",
                    B=b,
                    H=h,
                    N=n,
                    D=d,
                    ms=f"{ms:.4f}",
                    tflops=tflops(flops, ms),
                    **meta,
                )
            )
            print(f"speed D={d} {name:<40} {flops / ms * 1e-9:7.1f} TFLOP/s", flush=True)
    return rows


def main(argv=None):
    study.arguments(__doc__, argv)
    if not study.on_gpu("This study times compiled kernels in bf16"):
        return 0
    forwards = {name: variant_forward(patch) for name, patch in P_PRODUCTS.items()}
    meta = results.provenance()
    path = results.results_dir() / "part3_p_cast.csv"
    rows = accuracy_rows(forwards, meta)
    results.write_csv(path, rows, FIELDS)  # written twice: the accuracy rows survive a cut-short speed run
    rows += speed_rows(forwards, meta)
    results.write_csv(path, rows, FIELDS)
    print(f"wrote {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
