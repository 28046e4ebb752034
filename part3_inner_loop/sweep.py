"""Part 3's sweep: common/sweep.py (part 2's sweep) run on part 3's forward.

    python -m part3_inner_loop.sweep               # D 64 and 128, causal and not, bf16, B=4, H=8, N=4096

The best tiles change once the inner loop changes: causal programs now stop at the diagonal, and
interior tiles carry no masks. Only the launch differs from part 2's (one grid axis, N_SEQS), and
the space is narrowed to what part 2's sweep showed can win on a Hopper GPU: tiles of 32 to 256
rows, 4 or 8 warps, 2 to 4 stages. Writes results/<gpu>/part3_sweep.csv, part3_device.json and
part3_heatmaps.png, and prints the winners as triton.Config lines for TUNED.
"""

import sys

import torch
import triton

from common import launch, sweep


class Forward(sweep.ForwardTarget):
    """Part 3's forward kernel, _attn_fwd, launched the way flash_forward launches it: one program
    per (query tile, sequence) on one grid axis."""

    part = 3
    blocks, warps, stages = (32, 64, 128, 256), (4, 8), (2, 3, 4)

    def kernel(self):
        return self.module()._attn_fwd

    def budget(self, config):
        bm, bn, d = config["BLOCK_M"], config["BLOCK_N"], config["D"]
        smem = self.module().smem_bytes(bm, bn, d, self.dtype.itemsize, config["num_stages"])
        return smem, sweep.regs_estimate(bm, bn, d, config["num_warps"])

    def launch(self, t, config):
        q, k, v, o = (t[name].flatten(0, 1) for name in "QKVO")  # (B*H, N, D): one sequence per program row
        n_q, n_k, d = q.shape[1], k.shape[1], config["D"]
        n_seqs = q.shape[0]
        args = (q, k, v, o, t["L"].flatten(0, 1), n_q, n_k, n_seqs, launch.n_bucket(n_q, n_k), d**-0.5)
        precision = "ieee" if self.dtype == torch.float32 else "tf32"  # as flash_forward: IEEE products for float32
        constexprs = dict(D=d, IS_CAUSAL=bool(config["causal"]), DOT_PRECISION=precision)
        return args, dict(constexprs, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"])

    def grid(self, t, config):
        return (triton.cdiv(self.N, config["BLOCK_M"]) * self.B * self.H,)


if __name__ == "__main__":
    sys.exit(sweep.main(Forward(), __doc__))
