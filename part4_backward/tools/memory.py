"""Peak GPU memory of one forward + backward against N: FlashAttention's O(N) memory, measured.

    python -m part4_backward.tools.memory        # GPU: results/<gpu>/part4_memory.csv

For each implementation and N, from an empty allocator: make q, k, v and dO (B=4, H=8, D=64, bf16),
run the forward and the backward once (compiling and autotuning), reset the peak, run them again,
and record the peak memory allocated minus what the inputs themselves hold. Materialising
attention needs B*H*N^2 scores (and their gradient): quadratic. FlashAttention keeps O, L and the
gradients: linear in N. An implementation that runs out of memory (or refuses the shape) is
recorded as such.
"""

import sys

import torch

from common import parts
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE
from lab import impls, results, study

B, H, D = 4, 8, 64
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
FIELDS = ["impl", "B", "H", "N", "D", "dtype", "peak_mib", "inputs_mib", "status", *results.PROVENANCE]


def peak_mib(impl, n):
    """Peak MiB allocated by one fwd+bwd beyond its inputs, and the inputs' own MiB."""
    torch.cuda.empty_cache()
    q, k, v, do = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, DEVICE, seed=n)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    with impl.context():
        # Once first, unmeasured: a new N makes the autotuner time its configurations, and its timer
        # allocates a 256 MB buffer to flush L2 between runs; that is tuning, not the attention.
        torch.autograd.grad(impl.attention(*leaves, False), leaves, do)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.autograd.grad(impl.attention(*leaves, False), leaves, do)
        torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20, base / 2**20


def main(argv=None):
    study.arguments(__doc__, argv)
    if not study.on_gpu("Peak GPU memory is measured on the GPU"):
        return 0
    compared = [impls.part_impl(n) for n in parts.available() if n >= 4] + [
        impls.sdpa_impl(b) for b in ("flash", "cudnn", "efficient", "math")
    ]
    meta, rows = results.provenance(), []
    for impl in compared:
        for n in SEQ_LENS:
            row = dict(impl=impl.name, B=B, H=H, N=n, D=D, dtype="bf16", **meta)
            try:
                peak, inputs = peak_mib(impl, n)
                row.update(peak_mib=f"{peak:.1f}", inputs_mib=f"{inputs:.1f}", status="ok")
            except torch.cuda.OutOfMemoryError:
                row["status"] = "out of memory"
            except RuntimeError as e:  # a backend that refuses the shape
                row["status"] = f"error: {str(e).strip().splitlines()[0][:100]}"
            rows.append(row)
            print(f"{impl.name:>16} N={n:>6}  {row.get('peak_mib', '-'):>10} MiB  {row['status']}", flush=True)
    path = results.write_csv(results.results_dir() / "part4_memory.csv", rows, FIELDS)
    print(f"wrote {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
