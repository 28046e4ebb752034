"""Part 3's sweep: lab/sweep.py (part 2's sweep) run on part 3's forward.

    python -m part3_inner_loop.tools.sweep               # D 64 and 128, causal and not, bf16, B=4, H=8, N=4096

The best tiles change once the inner loop changes: causal programs now stop at the diagonal, and
interior tiles carry no masks. Only the launch differs from part 2's (one grid axis, N_SEQS), and
the space is narrowed to what part 2's sweep showed can win on a Hopper GPU: tiles of 32 to 256
rows, 4 or 8 warps, 2 to 4 stages. Writes results/<gpu>/part3_sweep.csv, part3_device.json and
part3_heatmaps.png, and prints the winners as triton.Config lines for TUNED.
"""

import sys

from lab import sweep


class Forward(sweep.ForwardTarget):
    """Part 3's forward kernel, _attn_fwd, launched the way flash_forward launches it: one program
    per (query tile, sequence) on one grid axis."""

    part = 3
    blocks, warps, stages = (32, 64, 128, 256), (4, 8), (2, 3, 4)


if __name__ == "__main__":
    sys.exit(sweep.main(Forward(), __doc__))
