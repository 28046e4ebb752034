"""Part 2's sweep: tile shapes, warp counts and pipeline depths of its forward, each measured on the GPU.

    python -m part2_tile_tuning.tools.sweep              # D 64 and 128, causal and not, bf16, B=4, H=8, N=4096
    python -m part2_tile_tuning.tools.sweep --d 64 --causal 0 --max-minutes 3

BLOCK_M and BLOCK_N in {16 ... 256}, num_warps in {2, 4, 8}, num_stages in {1 ... 5}: plan (the
shared-memory and register budget prunes what cannot work), compile (in parallel processes),
measure (poisoned outputs, checked against the float64 reference, then timed), write
(results/<gpu>/part2_sweep.csv, part2_device.json and part2_heatmaps.png). The steps are
lab/sweep.py's; Forward below is what they need to know of part 2's kernel. Parts 3 and 4 run the
same sweep on their own kernels.
"""

import sys

import triton

from lab import sweep


class Forward(sweep.ForwardTarget):
    """Part 2's forward kernel, _attn_fwd, launched the way flash_forward launches it: one program
    per (query tile, sequence) on two grid axes."""

    part = 2

    def grid(self, t, config):
        return (triton.cdiv(self.N, config["BLOCK_M"]), self.B * self.H)


if __name__ == "__main__":
    sys.exit(sweep.main(Forward(), __doc__))
