"""The ground truth: attention with the full N_q x N_k score matrix materialised.

    S = Q K^T / sqrt(D),   P = softmax(S) row-wise,   O = P V,   L = logsumexp(S) row-wise.

Causal means key j is visible to query i when j <= i (top-left aligned), exactly as
`torch.nn.functional.scaled_dot_product_attention(is_causal=True)`; with bottom_right, when
j <= i + N_k - N_q (queries continuing a key/value cache: the last query sees every key). Every
part is checked against this function run in float64; run in the input's own dtype it is the
"what PyTorch itself would get" baseline of the tolerance rule in `common/check.py`.
"""

import math

import torch


def expand_groups(q, t):
    """t, a key or value tensor, with one head per query head of q: grouped heads (..., H_kv, N, D)
    repeated so that query head h reads key/value head h // (H / H_kv); t itself when they match."""
    if q.dim() <= 3 or t.shape[-3] == q.shape[-3]:
        return t
    return t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3)


def attention_reference(q, k, v, is_causal=False, dtype=torch.float64, bottom_right=False):
    """Materialised attention computed in `dtype`. Returns (O, L).

    q: (..., N_q, D); k, v: (..., N_k, D), or (..., H_kv, N_k, D) with q's H a multiple of H_kv
    (grouped heads; the gradients sum over each group). O has shape (..., N_q, D) in `dtype`;
    L has shape (..., N_q): the natural-log logsumexp of each row of scaled scores, in
    float32 or float64 (never lower: L is a statistic the backward reuses).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k, v = expand_groups(q, k), expand_groups(q, v)
    s = (q @ k.transpose(-2, -1)) * scale  # (..., N_q, N_k)
    if is_causal:
        n_q, n_k = s.shape[-2:]
        shift = n_k - n_q if bottom_right else 0
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(shift)  # j <= i + shift
        s = s.masked_fill(~visible, float("-inf"))
    stat_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    lse = torch.logsumexp(s.to(stat_dtype), dim=-1)  # (..., N_q)
    p = torch.softmax(s, dim=-1)
    return p @ v, lse


def reference_with_grads(q, k, v, do, is_causal=False, dtype=torch.float64, bottom_right=False):
    """(O, L, dQ, dK, dV) of the materialised attention in `dtype`, gradients by autograd."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    o, lse = attention_reference(*leaves, is_causal=is_causal, dtype=dtype, bottom_right=bottom_right)
    dq, dk, dv = torch.autograd.grad(o, leaves, do.to(dtype))
    return o.detach(), lse.detach(), dq, dk, dv
