"""Part 4's sweep: common/sweep.py (part 2's sweep) run on the two backward kernels.

    python -m part4_backward.sweep --kernel dkdv   # the dK/dV kernel: results/<gpu>/part4_dkdv_sweep.csv
    python -m part4_backward.sweep --kernel dq     # the dQ kernel:    results/<gpu>/part4_dq_sweep.csv

Each backward kernel holds two tiles for its whole loop and streams two others (bwd_smem_bytes in
flash_attention.py), and keeps two float32 accumulators of its held tile plus two score-sized tiles
(S and dP) in registers: its own budget. Each configuration is checked on dQ, dK and dV against
the float64 reference (the other kernel's gradient comes from part 4's flash_backward) and timed
alone. The inputs it needs from the forward (O, L, and D = rowsum(dO * O)) come from PyTorch's
float32 attention, so the sweep does not depend on any Triton kernel but the one it measures.
"""

import argparse
import sys

import torch
import triton

from common import launch, runtime, sweep
from common.check import check_slices
from common.inputs import Shape, make_inputs
from common.reference import attention_reference
from common.timing import attention_flops


class Backward(sweep.SweepTarget):
    """What both backward kernels share: the inputs, the launch arguments, the check."""

    part = 4
    mode = "bwd"
    blocks, warps, stages = (32, 64, 128), (4, 8), (2, 3, 4)

    def tensors(self, d, causal):
        q, k, v, do = make_inputs(
            Shape((self.B, self.H), self.N, self.N, d), self.dtype, runtime.DEVICE, seed=d + causal
        )
        o, lse = attention_reference(q, k, v, causal, dtype=torch.float32)
        o = o.to(self.dtype)
        delta = (do.float() * o.float()).sum(-1)  # D_i = rowsum(dO_i * O_i)
        grads = {name: torch.empty_like(t) for name, t in (("DQ", q), ("DK", k), ("DV", v))}
        return dict(Q=q, K=k, V=v, O=o, L=lse, DO=do, DELTA=delta, **grads)

    def args(self, t):
        """The flattened (B*H, N, D) tensors, in the kernels' order, and the scalar arguments after them."""
        q, k, v, do, dq, dk, dv = (t[name].flatten(0, 1) for name in ("Q", "K", "V", "DO", "DQ", "DK", "DV"))
        lse, delta = t["L"].flatten(0, 1), t["DELTA"].flatten(0, 1)
        n = self.N
        scalars = (n, n, self.B * self.H, launch.n_bucket(n, n), q.shape[-1] ** -0.5)
        return (q, k, v, do, lse, delta, dq, dk, dv), scalars

    def constexprs(self, config):
        return dict(
            D=config["D"],
            IS_CAUSAL=bool(config["causal"]),
            DOT_PRECISION="ieee" if self.dtype == torch.float32 else "tf32",  # as flash_backward
            BLOCK_M=config["BLOCK_M"],
            BLOCK_N=config["BLOCK_N"],
        )

    def check(self, t, causal):
        """dQ, dK and dV against the float64 reference; the gradient this kernel does not write comes
        from part 4's own backward (computed once per group)."""
        if "ref_grads" not in t:
            t["ref_grads"] = self.module().flash_backward(t["Q"], t["K"], t["V"], t["O"], t["L"], t["DO"], causal)
        grads = dict(zip(("dQ", "dK", "dV"), t["ref_grads"]))
        grads.update({name[0].lower() + name[1:]: t[name] for name in self.outputs})
        out = {"O": t["O"], "L": t["L"], **grads}
        return check_slices(out, t["Q"], t["K"], t["V"], causal, t["DO"])


class DKDV(Backward):
    """_attn_bwd_dkdv: holds K_j, V_j (BLOCK_N rows), streams Q_i, dO_i (BLOCK_M rows); 4 of the
    backward's 5 matrix products (S^T again, dV, dP^T, dK): FLOPs counted as 2/2.5 of the backward's."""

    outputs = ("DK", "DV")

    @property
    def name(self):
        return "part4_dkdv"

    def kernel(self):
        return self.module()._attn_bwd_dkdv

    def budget(self, config):
        bm, bn, d, w = config["BLOCK_M"], config["BLOCK_N"], config["D"], config["num_warps"]
        smem = self.module().bwd_smem_bytes(bn, bm, d, self.dtype.itemsize, config["num_stages"])
        return smem, (2 * bn * d + 2 * bn * bm) / (32 * w)  # dK_j, dV_j; S^T and dP^T

    def launch(self, t, config):
        (q, k, v, do, lse, delta, _, dk, dv), scalars = self.args(t)
        return (q, k, v, do, lse, delta, dk, dv, *scalars), self.constexprs(config)

    def grid(self, t, config):
        return (triton.cdiv(self.N, config["BLOCK_N"]) * self.B * self.H,)

    def flops(self, d, causal):
        return attention_flops(self.B, self.H, self.N, self.N, d, causal, "bwd") * 2 / 2.5


class DQ(Backward):
    """_attn_bwd_dq: holds Q_i, dO_i (BLOCK_M rows), streams K_j, V_j (BLOCK_N rows); 3 matrix
    products (S again, dP, dQ): FLOPs counted as 1.5/2.5 of the backward's."""

    outputs = ("DQ",)

    @property
    def name(self):
        return "part4_dq"

    def kernel(self):
        return self.module()._attn_bwd_dq

    def budget(self, config):
        bm, bn, d, w = config["BLOCK_M"], config["BLOCK_N"], config["D"], config["num_warps"]
        smem = self.module().bwd_smem_bytes(bm, bn, d, self.dtype.itemsize, config["num_stages"])
        return smem, (bm * d + 2 * bm * bn) / (32 * w)  # dQ_i; S and dP

    def launch(self, t, config):
        (q, k, v, do, lse, delta, dq, _, _), scalars = self.args(t)
        return (q, k, v, do, lse, delta, dq, *scalars), self.constexprs(config)

    def grid(self, t, config):
        return (triton.cdiv(self.N, config["BLOCK_M"]) * self.B * self.H,)

    def flops(self, d, causal):
        return attention_flops(self.B, self.H, self.N, self.N, d, causal, "bwd") * 1.5 / 2.5


TARGETS = {"dkdv": DKDV, "dq": DQ}

if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--kernel", choices=TARGETS)
    known, rest = ap.parse_known_args()
    if known.kernel is None:
        print(__doc__ + "\n--kernel dkdv or --kernel dq is required; the other flags are the sweep's:")
        sys.exit(sweep.main(None, "", ["--help"]))
    sys.exit(sweep.main(TARGETS[known.kernel](), __doc__, rest))
