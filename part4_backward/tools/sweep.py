"""Part 4's sweep: lab/sweep.py (part 2's sweep) run on the two backward kernels.

    python -m part4_backward.tools.sweep --kernel dkdv   # the dK/dV kernel: results/<gpu>/part4_dkdv_sweep.csv
    python -m part4_backward.tools.sweep --kernel dq     # the dQ kernel:    results/<gpu>/part4_dq_sweep.csv

Each backward kernel holds two tiles for its whole loop and streams two others (bwd_smem_bytes in
flash_attention.py), and keeps two float32 accumulators of its held tile plus two score-sized tiles
(S and dP) in registers: its own budget. Each configuration is checked on dQ, dK and dV against
the float64 reference (the other kernel's gradient comes from part 4's flash_backward) and timed
alone. The inputs it needs from the forward (O, L, and D = rowsum(dO * O)) come from PyTorch's
float32 attention, so the sweep does not depend on any Triton kernel but the one it measures.
"""

import sys

import torch

from common import runtime
from common.check import check_slices
from common.inputs import Shape, make_inputs
from common.reference import attention_reference
from lab import sweep


class Backward(sweep.SweepTarget):
    """What both backward kernels share: the inputs, the budget, the FLOPs, the check."""

    part = 4
    mode = "bwd"
    blocks, warps, stages = (32, 64, 128), (4, 8), (2, 3, 4)
    products = 5  # of the backward's 5 matrix products, how many the kernel does (its share of the FLOPs)

    def tensors(self, d, causal):
        q, k, v, do = make_inputs(
            Shape((self.B, self.H), self.N, self.N, d), self.dtype, runtime.DEVICE, seed=d + causal
        )
        o, lse = attention_reference(q, k, v, causal, dtype=torch.float32)
        o = o.to(self.dtype)
        delta = (do.float() * o.float()).sum(-1)  # D_i = rowsum(dO_i * O_i)
        grads = {name: torch.empty_like(t) for name, t in (("DQ", q), ("DK", k), ("DV", v))}
        return dict(Q=q, K=k, V=v, O=o, L=lse, DO=do, DELTA=delta, **grads)

    def budget(self, config):
        """Shared memory: the held tile once and num_stages buffers of the streamed one
        (bwd_smem_bytes); registers: a float32 accumulator of the held tile per gradient it writes,
        and two score-sized tiles (S and dP)."""
        held, streamed = config[self.held], config["BLOCK_N" if self.held == "BLOCK_M" else "BLOCK_M"]
        smem = self.module().bwd_smem_bytes(held, streamed, config["D"], self.dtype.itemsize, config["num_stages"])
        return smem, (len(self.outputs) * held * config["D"] + 2 * held * streamed) / (32 * config["num_warps"])

    def flops(self, d, causal):
        return super().flops(d, causal) * self.products / 5

    def check(self, t, causal):
        """dQ, dK and dV against the float64 reference; the gradient this kernel does not write comes
        from part 4's own backward (computed once per group)."""
        if "ref_grads" not in t:
            t["ref_grads"] = self.module().flash_backward(t["Q"], t["K"], t["V"], t["O"], t["L"], t["DO"], causal)
        grads = dict(zip(("dQ", "dK", "dV"), t["ref_grads"]))
        grads.update({"d" + name[1:]: t[name] for name in self.outputs})  # "DK" -> "dK"
        return check_slices({"O": t["O"], "L": t["L"], **grads}, t["Q"], t["K"], t["V"], causal, t["DO"])


class DKDV(Backward):
    """_attn_bwd_dkdv: holds K_j, V_j (BLOCK_N rows) and their dK_j, dV_j, streams Q_i, dO_i
    (BLOCK_M rows); 4 of the backward's 5 matrix products (S^T again, dV, dP^T, dK)."""

    name = "part4_dkdv"
    kernel_name = "_attn_bwd_dkdv"
    outputs = ("DK", "DV")
    held = "BLOCK_N"
    products = 4


class DQ(Backward):
    """_attn_bwd_dq: holds Q_i, dO_i (BLOCK_M rows) and their dQ_i, streams K_j, V_j (BLOCK_N rows);
    3 matrix products (S again, dP, dQ)."""

    name = "part4_dq"
    kernel_name = "_attn_bwd_dq"
    outputs = ("DQ",)
    products = 3


if __name__ == "__main__":
    sys.exit(sweep.main({"dkdv": DKDV(), "dq": DQ()}, __doc__))
