"""Part 2's sweep: tile shapes, warp counts and pipeline depths of its forward, each measured on the GPU.

    python -m part2_tile_tuning.sweep              # D 64 and 128, causal and not, bf16, B=4, H=8, N=4096
    python -m part2_tile_tuning.sweep --d 64 --causal 0 --max-minutes 3

BLOCK_M and BLOCK_N in {16 ... 256}, num_warps in {2, 4, 8}, num_stages in {1 ... 5}: plan (the
shared-memory and register budget prunes what cannot work), compile (in parallel processes),
measure (poisoned outputs, checked against the float64 reference, then timed), write
(results/<gpu>/part2_sweep.csv, part2_device.json and part2_heatmaps.png). The steps are
common/sweep.py's; Forward below is what they need to know of part 2's kernel. Parts 3 and 4 run the
same sweep on their own kernels.
"""

import sys

import torch
import triton

from common import launch, sweep


class Forward(sweep.ForwardTarget):
    """Part 2's forward kernel, _attn_fwd, launched the way flash_forward launches it."""

    part = 2

    def kernel(self):
        return self.module()._attn_fwd

    def budget(self, config):
        bm, bn, d = config["BLOCK_M"], config["BLOCK_N"], config["D"]
        smem = self.module().smem_bytes(bm, bn, d, self.dtype.itemsize, config["num_stages"])
        return smem, sweep.regs_estimate(bm, bn, d, config["num_warps"])

    def launch(self, t, config):
        q, k, v, o = (t[name].flatten(0, 1) for name in "QKVO")  # (B*H, N, D): one sequence per program row
        n_q, n_k, d = q.shape[1], k.shape[1], config["D"]
        args = (q, k, v, o, t["L"].flatten(0, 1), n_q, n_k, launch.n_bucket(n_q, n_k), d**-0.5)
        precision = "ieee" if self.dtype == torch.float32 else "tf32"  # as flash_forward: IEEE products for float32
        return args, dict(
            D=d,
            IS_CAUSAL=bool(config["causal"]),
            DOT_PRECISION=precision,
            BLOCK_M=config["BLOCK_M"],
            BLOCK_N=config["BLOCK_N"],
        )

    def grid(self, t, config):
        return (triton.cdiv(self.N, config["BLOCK_M"]), self.B * self.H)


if __name__ == "__main__":
    sys.exit(sweep.main(Forward(), __doc__))
