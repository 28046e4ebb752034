"""Part 0: FlashAttention-2 in plain PyTorch (with einops), tile by tile.

The algorithm every later part implements, written so each line can be read against the paper:
query tiles in the outer loop, key/value tiles in the inner loop, a running max m_i, a running
sum l_i and an unnormalised output O_i per query row, one division at the end, and L (the
logsumexp) kept for the backward. Slow on purpose: the loops are Python loops.

Run:  make test PART=0   |   python -m part0_pytorch_reference.walkthrough
"""

import einops
import torch

from common import library
from common.backward import flash_backward
from common.validate import check_inputs

BLOCK_M = 64  # B_q: query rows per tile
BLOCK_N = 64  # B_k: key rows per tile


def flash_forward(Q, K, V, is_causal):
    """O (like Q) and L (float32, Q.shape[:-1]) for softmax(Q K^T / sqrt(D)) V, tile by tile."""
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    scale = d**-0.5
    O = torch.empty_like(Q)
    L = torch.empty(Q.shape[:-1], dtype=torch.float32, device=Q.device)

    for i0 in range(0, n_q, BLOCK_M):  # outer loop: query tiles Q_i (the last one may be short)
        Q_i = Q[..., i0 : i0 + BLOCK_M, :].float()  # (..., B_q, D)
        q_pos = torch.arange(i0, i0 + Q_i.shape[-2], device=Q.device)
        m_i = torch.full(Q_i.shape[:-1], float("-inf"), device=Q.device)  # (..., B_q) running max
        l_i = torch.zeros(Q_i.shape[:-1], device=Q.device)  # (..., B_q) running sum of exp(S - m_i)
        O_i = torch.zeros_like(Q_i)  # (..., B_q, D) unnormalised output

        for j0 in range(0, n_k, BLOCK_N):  # inner loop: key/value tiles K_j, V_j
            K_j = K[..., j0 : j0 + BLOCK_N, :].float()  # (..., B_k, D)
            V_j = V[..., j0 : j0 + BLOCK_N, :].float()
            S_ij = einops.einsum(Q_i, K_j, "... q d, ... k d -> ... q k") * scale  # (..., B_q, B_k)
            if is_causal:  # key j is visible to query i when j <= i
                k_pos = torch.arange(j0, j0 + K_j.shape[-2], device=Q.device)
                S_ij = S_ij.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))

            m_new = torch.maximum(m_i, einops.reduce(S_ij, "... q k -> ... q", "max"))
            P_ij = torch.exp(S_ij - m_new[..., None])  # (..., B_q, B_k), each entry in [0, 1]
            alpha = torch.exp(m_i - m_new)  # rescales what was summed against the old max
            l_i = alpha * l_i + einops.reduce(P_ij, "... q k -> ... q", "sum")
            O_i = alpha[..., None] * O_i + einops.einsum(P_ij, V_j, "... q k, ... k d -> ... q d")
            m_i = m_new

        O[..., i0 : i0 + BLOCK_M, :] = (O_i / l_i[..., None]).to(Q.dtype)  # the one division
        L[..., i0 : i0 + BLOCK_M] = m_i + torch.log(l_i)  # logsumexp of the row, natural log
    return O, L


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        check_inputs(Q, K, V, is_causal)
        O, L = flash_forward(Q, K, V, is_causal)
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        dQ, dK, dV = flash_backward(Q, K, V, O, L, dO, ctx.is_causal)
        return dQ, dK, dV, None


@library.custom_op
def flash_attention(q, k, v, is_causal=False):
    """FlashAttention.apply(q, k, v, is_causal) as a torch.library op, which torch.compile can trace:
    common/library.py builds it from flash_forward and flash_backward above."""
