"""Part 3's forward with the switches its two studies turn, each a constexpr of this copy of the kernel:

- ORDER (launch_order.py): how a program's index becomes (query tile, sequence). SHIPPED is what
  part 3's kernel does: tile-major, last tile first, when causal; sequence-major otherwise.
- P_PRODUCT (p_cast.py): what P_ij V_j multiplies. CAST is part 3's: P rounded to the input dtype
  (tensor cores multiply 16-bit operands). F32_TF32 and F32_IEEE keep P in float32 and widen V,
  the product then TF32 (P keeps 10 mantissa bits) or IEEE float32 (no rounding, no tensor cores).

With ORDER = SHIPPED and P_PRODUCT = CAST this is part 3's kernel, line for line otherwise:
tests/test_part3_tools.py checks that the two give the same O and L, bit for bit. The rest
(configurations, pruning, the launch arithmetic) is part 3's own, imported.
"""

import torch
import triton
import triton.language as tl

from common import triton_tools
from common.runtime import set_triton_allocator
from part3_inner_loop.flash_attention import CONFIGS, _as_sequences, _dot_precision, fits_in_smem, n_bucket

SHIPPED, SEQUENCE_MAJOR, SEQUENCE_MAJOR_LAST_FIRST, TILE_MAJOR_LAST_FIRST, TILE_MAJOR_GROUPED = range(5)
ORDERS = {  # the study's names for them
    "sequence-major": SEQUENCE_MAJOR,
    "sequence-major, last tile first": SEQUENCE_MAJOR_LAST_FIRST,
    "tile-major, last tile first": TILE_MAJOR_LAST_FIRST,
    "tile-major in groups of 4 sequences, last tile first": TILE_MAJOR_GROUPED,
}
SHIPPED_ORDER = {False: "sequence-major", True: "tile-major, last tile first"}  # part 3's, by causal
CAST, F32_TF32, F32_IEEE = range(3)
P_PRODUCTS = {
    "P cast to the input dtype (part 3)": CAST,
    "P float32, TF32 product": F32_TF32,
    "P float32, IEEE product": F32_IEEE,
}


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_desc,
    v_desc,
    q_pos,
    lo,
    hi,
    N_KEYS,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    P_PRODUCT: tl.constexpr,
):
    """Part 3's _attn_fwd_inner; P_PRODUCT picks what P_ij V_j multiplies."""
    for k_start in range(lo, hi, BLOCK_N):
        k = k_desc.load([k_start, 0])
        v = v_desc.load([k_start, 0])
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED:
            k_pos = k_start + tl.arange(0, BLOCK_N)
            keep = k_pos[None, :] < N_KEYS
            if IS_CAUSAL:
                keep = keep & (k_pos[None, :] <= q_pos[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_sub = m_new
        if MASKED:
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if P_PRODUCT == 0:  # CAST: part 3's
            p = p.to(v.dtype)
            acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)
        elif P_PRODUCT == 1:  # F32_TF32: P stays float32; V is widened to match
            v = v.to(tl.float32)
            acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)
        else:  # F32_IEEE
            v = v.to(tl.float32)
            acc = tl.dot(p, v, acc, input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(
    configs=CONFIGS,
    key=["D", "IS_CAUSAL", "N_BUCKET", "ORDER", "P_PRODUCT"],
    prune_configs_by={"early_config_prune": fits_in_smem},
)
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "N_BUCKET"])
def _attn_fwd(
    Q,
    K,
    V,
    O,
    L,
    N_QUERIES,
    N_KEYS,
    N_SEQS,
    N_BUCKET,
    scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ORDER: tl.constexpr,
    P_PRODUCT: tl.constexpr,
):
    """Part 3's _attn_fwd; ORDER picks the program order."""
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N_QUERIES, BLOCK_M)
    if (ORDER == 0 and IS_CAUSAL) or ORDER == 3:  # tile-major, last tile first
        tile_m = n_tiles - 1 - pid // N_SEQS
        bh = (pid % N_SEQS).to(tl.int64)
    elif ORDER == 0 or ORDER == 1:  # sequence-major
        tile_m = pid % n_tiles
        bh = (pid // n_tiles).to(tl.int64)
    elif ORDER == 2:  # sequence-major, last tile first
        tile_m = n_tiles - 1 - pid % n_tiles
        bh = (pid // n_tiles).to(tl.int64)
    else:  # tile-major in groups of 4 sequences, last tile first
        first = pid // (4 * n_tiles) * 4  # the group's first sequence
        in_group = tl.minimum(N_SEQS - first, 4)  # the last group may hold fewer
        rest = pid - first * n_tiles
        tile_m = n_tiles - 1 - rest // in_group
        bh = (first + rest % in_group).to(tl.int64)

    q_desc = tl.make_tensor_descriptor(Q + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    o_desc = tl.make_tensor_descriptor(O + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    q_start = tile_m * BLOCK_M
    q_pos = q_start + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634
    if IS_CAUSAL:
        hi = tl.minimum(q_start + BLOCK_M, N_KEYS)
        unmasked_hi = tl.minimum(q_start, N_KEYS) // BLOCK_N * BLOCK_N
    else:
        hi = N_KEYS
        unmasked_hi = N_KEYS // BLOCK_N * BLOCK_N
    q = q_desc.load([q_start, 0])
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_desc,
        v_desc,
        q_pos,
        0,
        unmasked_hi,
        N_KEYS,
        qk_scale,
        BLOCK_N,
        False,
        IS_CAUSAL,
        DOT_PRECISION,
        P_PRODUCT,
    )
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_desc,
        v_desc,
        q_pos,
        unmasked_hi,
        hi,
        N_KEYS,
        qk_scale,
        BLOCK_N,
        True,
        IS_CAUSAL,
        DOT_PRECISION,
        P_PRODUCT,
    )
    o = acc / l_i[:, None]
    o_desc.store([q_start, 0], o.to(q.dtype))
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(L + bh * N_QUERIES + q_pos, lse, mask=q_pos < N_QUERIES)


def flash_forward(Q, K, V, is_causal, order=SHIPPED, p_product=CAST):
    """part 3's flash_forward, with the two switches."""
    set_triton_allocator()
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    q, k, v = (_as_sequences(t) for t in (Q, K, V))
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    grid = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]) * q.shape[0],)  # noqa: E731
    meta = dict(D=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q), ORDER=order, P_PRODUCT=p_product)
    _attn_fwd[grid](q, k, v, o, lse, n_q, n_k, q.shape[0], n_bucket(n_q, n_k), d**-0.5, **meta)
    return o.view(Q.shape), lse.view(Q.shape[:-1])


def forward(order=SHIPPED, p_product=CAST):
    """flash_forward(Q, K, V, is_causal) -> (O, L) with these switches, for a study's table of variants."""
    return lambda Q, K, V, is_causal: flash_forward(Q, K, V, is_causal, order, p_product)


def chosen():
    """The configuration the autotuner chose for the last call, as the tables name it."""
    return triton_tools.chosen_label(_attn_fwd)
