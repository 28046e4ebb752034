"""Part 3's sweep: part 2's sweep (part2_tile_tuning/sweep.py) run on part 3's kernel.

    python -m part3_inner_loop.sweep               # D 64 and 128, causal and not, bf16, B=4, H=8, N=4096

The best tiles change once the inner loop changes: causal programs now stop at the diagonal, and
interior tiles carry no masks. Only the launch differs from part 2's (one grid axis, N_SEQS), and
the space is narrowed to what part 2's sweep showed can win on a Hopper GPU: tiles of 32 to 256
rows, 4 or 8 warps, 2 to 4 stages. Writes results/<gpu>/part3_sweep.csv, part3_device.json and
part3_heatmaps.png, and prints the winners as triton.Config lines for TUNED.
"""

import sys

import triton

from part2_tile_tuning import sweep


class Forward(sweep.Forward):
    """Part 3's _attn_fwd: part 2's arguments plus N_SEQS, one program per (query tile, sequence)."""

    part = 3
    blocks, warps, stages = (32, 64, 128, 256), (4, 8), (2, 3, 4)

    def launch(self, t, config):
        args, constexprs = super().launch(t, config)
        n_seqs = self.B * self.H
        return (*args[:7], n_seqs, *args[7:]), constexprs  # N_SEQS comes after N_QUERIES and N_KEYS

    def grid(self, t, config):
        return (triton.cdiv(self.N, config["BLOCK_M"]) * self.B * self.H,)


if __name__ == "__main__":
    sys.exit(sweep.main(target=Forward(), description=__doc__))
