"""The tiled FlashAttention-2 backward in PyTorch, shared by parts 0-3 (part 4 writes it in Triton).

Nothing N_q x N_k is ever stored. For each key tile K_j, V_j (outer loop) and query tile Q_i
(inner loop) the score tile is recomputed and the probabilities recovered from the saved
logsumexp L, without a second pass over the row:

    S_ij = Q_i K_j^T * scale          P_ij = exp(S_ij - L_i)         (exact softmax, thanks to L)
    dV_j += P_ij^T dO_i               dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - D_i)      with D = rowsum(dO * O), computed once up front
    dQ_i += dS_ij K_j * scale         dK_j += dS_ij^T Q_i * scale

D_i = rowsum(dP_ij * P_ij) summed over all j equals rowsum(dO_i * O_i), which needs only
N x D tensors: that identity is what keeps the softmax gradient tile-local.
"""

import einops
import torch

BLOCK_M = 64  # query rows per tile
BLOCK_N = 64  # key rows per tile


def flash_backward(Q, K, V, O, L, dO, is_causal, block_m=BLOCK_M, block_n=BLOCK_N):
    """dQ, dK, dV for O = softmax(Q K^T / sqrt(D)) V, given the forward's O and L (natural log).

    Q, O, dO: (..., N_q, D); K, V: (..., N_k, D); L: (..., N_q) float32.
    Accumulates in float32 whatever the input dtype; returns gradients in the inputs' dtypes.
    """
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    scale = d**-0.5
    Qf, Kf, Vf, Of, dOf = (t.float() for t in (Q, K, V, O, dO))
    D = einops.reduce(dOf * Of, "... q d -> ... q", "sum")  # (..., N_q): rowsum(dO * O)
    dQ = torch.zeros_like(Qf)  # (..., N_q, D) float32: O(N) memory
    dK = torch.zeros_like(Kf)
    dV = torch.zeros_like(Vf)
    for j0 in range(0, n_k, block_n):  # outer loop: key/value tiles K_j, V_j
        K_j, V_j = Kf[..., j0 : j0 + block_n, :], Vf[..., j0 : j0 + block_n, :]  # (..., B_k, D)
        cols = torch.arange(j0, j0 + K_j.shape[-2], device=Q.device)
        dK_j = torch.zeros_like(K_j)
        dV_j = torch.zeros_like(V_j)
        for i0 in range(0, n_q, block_m):  # inner loop: query tiles Q_i
            rows = slice(i0, i0 + block_m)
            Q_i, dO_i = Qf[..., rows, :], dOf[..., rows, :]  # (..., B_q, D)
            L_i, D_i = L[..., rows], D[..., rows]  # (..., B_q)
            S_ij = einops.einsum(Q_i, K_j, "... q d, ... k d -> ... q k") * scale  # (..., B_q, B_k)
            if is_causal:
                q_pos = torch.arange(i0, i0 + Q_i.shape[-2], device=Q.device)
                S_ij = S_ij.masked_fill(cols[None, :] > q_pos[:, None], float("-inf"))
            P_ij = torch.exp(S_ij - L_i[..., None])  # the forward's softmax, recomputed
            dV_j += einops.einsum(P_ij, dO_i, "... q k, ... q d -> ... k d")
            dP_ij = einops.einsum(dO_i, V_j, "... q d, ... k d -> ... q k")
            dS_ij = P_ij * (dP_ij - D_i[..., None])
            dQ[..., rows, :] += einops.einsum(dS_ij, K_j, "... q k, ... k d -> ... q d") * scale
            dK_j += einops.einsum(dS_ij, Q_i, "... q k, ... q d -> ... k d") * scale
        dK[..., j0 : j0 + block_n, :] = dK_j
        dV[..., j0 : j0 + block_n, :] = dV_j
    return dQ.to(Q.dtype), dK.to(K.dtype), dV.to(V.dtype)
