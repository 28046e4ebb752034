"""The roofline's ceilings, measured on this GPU: how fast it multiplies bf16 matrices and how fast
it moves bytes, beside the datasheet.

    python -m part5_profiling.tools.ceilings     # GPU: results/<gpu>/part5_ceilings.csv

Matrix products (torch.matmul, bf16 in, bf16 out, float32 accumulation): the two products of
attention at the benchmark's shapes, batched over B*H = 32 sequences (S = Q K^T: (N x D)(D x N);
O = P V: (N x N)(N x D)), and one large square product (8192^3), the usual way to find the peak.
Memory: a device-to-device copy of 4 GiB, counting the bytes read and the bytes written.
Timing: CUDA-graph replay, median (the GPU's time alone). Random inputs (zeros run faster: the
tensor cores draw less power on them and the clock stays higher).
"""

import sys

import torch

from common.runtime import DEVICE
from lab import results, study
from lab.timing import graph_time_ms

B, H, N = 4, 8, 4096
HEAD_DIMS = (64, 128)
SQUARE = 8192
COPY_BYTES = 4 * 2**30
# The H200 SXM's datasheet: 989 TFLOP/s dense bf16 (1,979 with 2:4 sparsity), 4.8 TB/s of HBM3e.
DATASHEET = {"NVIDIA H200": {"bf16 tensor TFLOP/s": 989.0, "memory TB/s": 4.8}}
FIELDS = ["ceiling", "shape", "value", "unit", "method", *results.PROVENANCE]


def matmul_rows(meta):
    rows = []
    shapes = [(f"S = Q K^T, {B * H} x ({N} x {d})({d} x {N})", (B * H, N, d), (B * H, d, N)) for d in HEAD_DIMS]
    shapes += [(f"O = P V, {B * H} x ({N} x {N})({N} x {d})", (B * H, N, N), (B * H, N, d)) for d in HEAD_DIMS]
    shapes += [(f"square, ({SQUARE} x {SQUARE})({SQUARE} x {SQUARE})", (SQUARE, SQUARE), (SQUARE, SQUARE))]
    for label, a_shape, b_shape in shapes:
        a = torch.randn(a_shape, dtype=torch.bfloat16, device=DEVICE)
        b = torch.randn(b_shape, dtype=torch.bfloat16, device=DEVICE)
        flops = 2 * a.numel() * b.shape[-1]  # 2 * batch * M * K * N
        ms = graph_time_ms(lambda a=a, b=b: torch.matmul(a, b))
        rows.append(
            dict(
                ceiling="bf16 matmul",
                shape=label,
                value=f"{flops / ms * 1e-9:.1f}",
                unit="TFLOP/s",
                method="measured: torch.matmul, CUDA-graph replay, median",
                **meta,
            )
        )
        print(f"{label:<48} {flops / ms * 1e-9:8.1f} TFLOP/s", flush=True)
        del a, b
    return rows


def copy_rows(meta):
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    ms = graph_time_ms(lambda: dst.copy_(src))
    tbs = 2 * COPY_BYTES / ms * 1e-9  # bytes read + bytes written, per second, in TB/s
    print(f"{'copy, 4 GiB':<48} {tbs:8.2f} TB/s (read + written)", flush=True)
    return [
        dict(
            ceiling="memory bandwidth",
            shape="copy of 4 GiB",
            value=f"{tbs:.2f}",
            unit="TB/s",
            method="measured: device-to-device copy, bytes read + written, CUDA-graph replay, median",
            **meta,
        )
    ]


def datasheet_rows(meta):
    sheet = DATASHEET.get(meta["gpu"], {})
    return [
        dict(
            ceiling="bf16 matmul" if "TFLOP" in what else "memory bandwidth",
            shape="datasheet",
            value=value,
            unit=what.split()[-1],
            method="datasheet",
            **meta,
        )
        for what, value in sheet.items()
    ]


def main(argv=None):
    study.arguments(__doc__, argv)
    if not study.on_gpu("The ceilings are measured on the GPU (the committed results/ hold the H200's)"):
        return 0
    meta = results.provenance()
    rows = matmul_rows(meta) + copy_rows(meta) + datasheet_rows(meta)
    path = results.write_csv(results.results_dir() / "part5_ceilings.csv", rows, FIELDS)
    print(f"wrote {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
