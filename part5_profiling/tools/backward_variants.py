"""Part 4's dK/dV kernel with the switch the backward's candidates study turns (candidates.py
--backward), a constexpr of this copy of the kernel:

- DQ_BY_TMA: FlashAttention-3's dQ. The dK/dV kernel adds each dS_ij K_j tile into a float32 dQ with
  one TMA reduce-add (cp.reduce.async.bulk) instead of part 4's element-wise atomics, and the dQ
  kernel, which recomputes S and dP, is skipped: five tile products per tile pair instead of
  seven. The additions' order varies, so dQ is not bitwise repeatable. Triton's interpreter has no
  TMA reduce, so there the element-wise atomics stand in. 8-warp configurations are added: the
  extra dQ tile fits without spilling at D = 128 (compiled for sm_90).

flash_backward(..., dq_by_tma=False) is part 4's backward (dK/dV, then the dQ kernel); the rest of
the backward (D_i, the dQ kernel, the configurations and their pruning) is part 5's own
(flash_attention.py: part 4's kernels), imported.
"""

import torch
import triton
import triton.language as tl

from common.runtime import INTERPRET, set_triton_allocator
from part5_profiling.flash_attention import (
    BWD_DKDV,
    BWD_DKDV_CONFIGS,
    _as_sequences,
    _attn_bwd_dq,
    _attn_bwd_preprocess,
    _dot_precision,
    bwd_fits_in_smem,
    n_bucket,
)

MORE_DKDV = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
    for m, n, w, s in ((64, 128, 8, 2), (64, 64, 8, 2), (32, 128, 8, 3))
]
TMA_REDUCE = tl.constexpr(not INTERPRET)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_desc,
    do_desc,
    L,
    DELTA,
    DQ,
    k_pos,
    lo,
    hi,
    N_QUERIES,
    N_KEYS,
    qk_scale,
    scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    DQ_BY_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Part 4's _attn_bwd_dkdv_inner; with DQ_BY_TMA each dS_ij^T's dQ share is added into DQ."""
    for q_start in range(lo, hi, BLOCK_M):
        q = q_desc.load([q_start, 0])
        do = do_desc.load([q_start, 0])
        q_pos = q_start + tl.arange(0, BLOCK_M)
        in_range = q_pos < N_QUERIES
        l_2 = tl.load(L + q_pos, mask=in_range, other=0.0) * 1.4426950408889634
        delta = tl.load(DELTA + q_pos, mask=in_range, other=0.0)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        p_t = tl.exp2(s_t * qk_scale - l_2[None, :])
        if MASKED:
            p_t = tl.where(k_pos[:, None] <= q_pos[None, :], p_t, 0.0)
        if DQ_BY_TMA:  # zero-filled keys past N_KEYS: their P can overflow, and dQ sums over keys
            p_t = tl.where(k_pos[:, None] < N_KEYS, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        if DQ_BY_TMA:
            dq = tl.dot(tl.trans(ds_t).to(k.dtype), k, input_precision=DOT_PRECISION) * scale  # (BLOCK_M, D)
            if TMA_REDUCE:
                DQ.atomic_add([q_start, 0], dq)  # one TMA reduce-add; rows past N_QUERIES are dropped
            else:  # the interpreter has no TMA reduce: part 4's element-wise atomics
                dq_ptrs = DQ + q_pos[:, None] * D + tl.arange(0, D)[None, :]
                tl.atomic_add(dq_ptrs, dq, mask=in_range[:, None], sem="relaxed")
    return dk, dv


@triton.autotune(
    configs=BWD_DKDV_CONFIGS if INTERPRET else BWD_DKDV + MORE_DKDV,
    key=["D", "IS_CAUSAL", "DQ_BY_TMA", "N_BUCKET"],
    reset_to_zero=["DQ"],
    prune_configs_by={"early_config_prune": bwd_fits_in_smem("BLOCK_M")},
)
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "N_BUCKET"])
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    L,
    DELTA,
    DK,
    DV,
    DQ,
    N_QUERIES,
    N_KEYS,
    N_SEQS,
    N_BUCKET,
    scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DQ_BY_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Part 4's _attn_bwd_dkdv; with DQ_BY_TMA it also adds dQ into the float32 DQ."""
    pid = tl.program_id(0)
    tile_n = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    q_desc = tl.make_tensor_descriptor(Q + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    do_desc = tl.make_tensor_descriptor(DO + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    dk_desc = tl.make_tensor_descriptor(DK + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    dv_desc = tl.make_tensor_descriptor(DV + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    if TMA_REDUCE and DQ_BY_TMA:
        DQ = tl.make_tensor_descriptor(DQ + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    else:
        DQ += bh * N_QUERIES * D
    L += bh * N_QUERIES
    DELTA += bh * N_QUERIES
    k_start = tile_n * BLOCK_N
    k_pos = k_start + tl.arange(0, BLOCK_N)
    k = k_desc.load([k_start, 0])
    v = v_desc.load([k_start, 0])
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634
    if IS_CAUSAL:
        lo = k_start // BLOCK_M * BLOCK_M
        masked_hi = tl.minimum(tl.cdiv(k_start + BLOCK_N, BLOCK_M) * BLOCK_M, N_QUERIES)
    else:
        lo = 0
        masked_hi = 0
    dk, dv = _attn_bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        q_desc,
        do_desc,
        L,
        DELTA,
        DQ,
        k_pos,
        lo,
        masked_hi,
        N_QUERIES,
        N_KEYS,
        qk_scale,
        scale,
        D,
        BLOCK_M,
        True,
        DQ_BY_TMA,
        DOT_PRECISION,
    )
    dk, dv = _attn_bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        q_desc,
        do_desc,
        L,
        DELTA,
        DQ,
        k_pos,
        tl.maximum(masked_hi, lo),
        N_QUERIES,
        N_QUERIES,
        N_KEYS,
        qk_scale,
        scale,
        D,
        BLOCK_M,
        False,
        DQ_BY_TMA,
        DOT_PRECISION,
    )
    dk_desc.store([k_start, 0], (dk * scale).to(k.dtype))
    dv_desc.store([k_start, 0], dv.to(v.dtype))


def flash_backward(Q, K, V, O, L, dO, is_causal, dq_by_tma=False):
    """dQ, dK, dV: part 4's backward (dq_by_tma=False), or dQ added by the dK/dV kernel by TMA."""
    set_triton_allocator()
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    q, k, v, o, do = (_as_sequences(t) for t in (Q, K, V, O, dO))
    n_seqs = q.shape[0]
    lse = L.reshape(n_seqs, n_q).contiguous()
    delta = torch.empty_like(lse)
    _attn_bwd_preprocess[(triton.cdiv(n_q, 64) * n_seqs,)](o, do, delta, n_q, n_seqs, D=d, BLOCK_M=64)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq32 = torch.zeros(q.shape if dq_by_tma else 0, dtype=torch.float32, device=q.device)
    args = (n_q, n_k, n_seqs, n_bucket(n_q, n_k), d**-0.5)
    meta = dict(D=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q))
    grid_dkdv = lambda META: (triton.cdiv(n_k, META["BLOCK_N"]) * n_seqs,)  # noqa: E731
    _attn_bwd_dkdv[grid_dkdv](q, k, v, do, lse, delta, dk, dv, dq32, *args, DQ_BY_TMA=dq_by_tma, **meta)
    if dq_by_tma:
        dq = dq32.to(Q.dtype)
    else:
        dq = torch.empty_like(q)
        grid_dq = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]) * n_seqs,)  # noqa: E731
        _attn_bwd_dq[grid_dq](q, k, v, do, lse, delta, dq, *args, **meta)
    return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)
