"""Part 4's forward (which part 5 keeps as its `tl` forward) with the switches two studies turn, each
a constexpr of this copy of the kernel:

- STAGE (stages.py): one stage of the inner loop done twice, or left out, to time what it costs:
  ORIGINAL, QK_TWICE (a second Q K^T product), PV_TWICE (a second P V product), EXP2_TWICE (a
  second exp2 per score), NO_EXP2. These compute something else on purpose.
- CANDIDATE (candidates.py): a change that keeps the answer and might make it faster: PART4 (none),
  WS_LOOP (Triton's warp specialization of the key loop), GROUPED_ORDER (the causal programs in
  groups of 4 sequences), ONE_WS_LOOP (one loop over every key tile, masked throughout,
  warp-specialized), WS_WHOLE_TILES (warp specialization where no tile needs a mask: not causal,
  N_k a multiple of 128), QK_AHEAD (the next tile's Q K^T issued before this tile's softmax).
  Some candidates add configurations to the autotuner's list (EXTRA_CONFIGS).

With both switches at 0 this is part 4's kernel: tests/test_part5_tools.py checks that the two give
the same O and L, bit for bit. The configurations, their pruning and the launch arithmetic are part
5's own (flash_attention.py), imported.
"""

import torch
import triton
import triton.language as tl

from common import triton_tools
from common.runtime import INTERPRET, set_triton_allocator
from part5_profiling.flash_attention import CONFIGS, _as_sequences, _dot_precision, fits_in_smem, n_bucket

ORIGINAL, QK_TWICE, PV_TWICE, EXP2_TWICE, NO_EXP2 = range(5)
STAGES = {
    "original": ORIGINAL,
    "Q K^T twice": QK_TWICE,
    "P V twice": PV_TWICE,
    "exp2 twice": EXP2_TWICE,
    "no exp2": NO_EXP2,
}
PART4, WS_LOOP, GROUPED_ORDER, ONE_WS_LOOP, WS_WHOLE_TILES, QK_AHEAD = range(6)
CANDIDATES = {
    "part 4": PART4,
    "warp-specialized key loop": WS_LOOP,
    "grouped causal order": GROUPED_ORDER,
    "one warp-specialized loop": ONE_WS_LOOP,
    "warp-specialized whole tiles": WS_WHOLE_TILES,
    "Q K^T issued one tile ahead": QK_AHEAD,
}


def _config(m, n, warps, stages):
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)


# Triton 3.6 specializes warps only at 4 warps, so the warp-specialized candidates add the 128 x 128
# tile with 2 stages for D = 128; two live score tiles (QK_AHEAD) spill at D = 128 with 4 warps per
# 128 rows, and 8 warps (64 rows per warpgroup) hold them (compiled.py shows both).
EXTRA_CONFIGS = {
    ONE_WS_LOOP: [_config(128, 128, 4, 2)],
    WS_WHOLE_TILES: [_config(128, 128, 4, 2)],
    QK_AHEAD: [_config(128, 64, 8, 3), _config(128, 128, 8, 2), _config(128, 128, 8, 3)],
}
EVERY_CONFIG = CONFIGS if INTERPRET else CONFIGS + [c for extra in EXTRA_CONFIGS.values() for c in extra]


def configs(candidate):
    """The autotuner's list for a candidate: part 5's (TUNED, and the float32 tiles, which fits_in_smem
    gives a float32 call alone), and the candidate's extra configurations."""
    return CONFIGS + EXTRA_CONFIGS.get(candidate, [])


def prune(configs_, named_args, **kwargs):
    """early_config_prune: the candidate's own configurations (configs()), those that fit in shared memory."""
    if not INTERPRET:
        own = configs(kwargs["CANDIDATE"])
        configs_ = [c for c in configs_ if any(c is o for o in own)]
    return fits_in_smem(configs_, named_args, **kwargs)


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
    STAGE: tl.constexpr,
    WS: tl.constexpr,
):
    """Part 4's _attn_fwd_inner; STAGE doubles or drops one stage; WS warp-specializes the loop."""
    for k_start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([k_start, 0])
        v = v_desc.load([k_start, 0])
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if STAGE == 1:  # QK_TWICE
            s = tl.dot(q, tl.trans(k), s, input_precision=DOT_PRECISION)
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
        if STAGE == 3:  # EXP2_TWICE
            p = tl.exp2(s * qk_scale - m_sub[:, None]) + tl.exp2(s * qk_scale - m_sub[:, None] - 64.0)
        elif STAGE == 4:  # NO_EXP2 (finite where masked)
            p = tl.maximum(s * qk_scale - m_sub[:, None], -1.0)
        else:
            p = tl.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        p = p.to(v.dtype)
        acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)
        if STAGE == 2:  # PV_TWICE
            acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_ahead(
    acc, l_i, m_i, q, k_desc, v_desc, lo, hi, qk_scale, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr
):
    """QK_AHEAD's loop over whole tiles (lo < hi): the next tile's Q K^T issued before this tile's
    softmax (FlashAttention-3's overlap within a warpgroup, by hand), so the product can run on the
    tensor cores while the same warps compute exp2. Two score tiles are live at once."""
    s = tl.dot(q, tl.trans(k_desc.load([lo, 0])), input_precision=DOT_PRECISION)
    for k_start in range(lo, hi, BLOCK_N):
        v = v_desc.load([k_start, 0])
        next_start = tl.minimum(k_start + BLOCK_N, hi - BLOCK_N)  # the last round recomputes its own tile
        s_next = tl.dot(q, tl.trans(k_desc.load([next_start, 0])), input_precision=DOT_PRECISION)
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
        s = s_next
    return acc, l_i, m_i


@triton.autotune(
    configs=EVERY_CONFIG,
    key=["D", "IS_CAUSAL", "N_BUCKET", "STAGE", "CANDIDATE", "WHOLE_TILES"],
    prune_configs_by={"early_config_prune": prune},
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
    STAGE: tl.constexpr,
    CANDIDATE: tl.constexpr,
    WHOLE_TILES: tl.constexpr,
):
    """Part 4's _attn_fwd, with STAGE passed to the loop and CANDIDATE's change where it applies.
    WHOLE_TILES (WS_WHOLE_TILES only, set by the host): no tile of this call needs a mask."""
    pid = tl.program_id(0)
    if IS_CAUSAL and CANDIDATE == 2:  # GROUPED_ORDER: tile-major in groups of 4 sequences, last tile first
        n_tiles = tl.cdiv(N_QUERIES, BLOCK_M)
        first = pid // (4 * n_tiles) * 4
        in_group = tl.minimum(N_SEQS - first, 4)
        rest = pid - first * n_tiles
        tile_m = n_tiles - 1 - rest // in_group
        bh = (first + rest % in_group).to(tl.int64)
    elif IS_CAUSAL:
        tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid // N_SEQS
        bh = (pid % N_SEQS).to(tl.int64)
    else:
        tile_m = pid % tl.cdiv(N_QUERIES, BLOCK_M)
        bh = (pid // tl.cdiv(N_QUERIES, BLOCK_M)).to(tl.int64)

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

    WS: tl.constexpr = CANDIDATE == 1 or CANDIDATE == 3  # WS_LOOP, ONE_WS_LOOP
    if WHOLE_TILES:  # WS_WHOLE_TILES, on a call whose every tile is whole: one unmasked, specialized loop
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_desc,
            v_desc,
            q_pos,
            0,
            N_KEYS,
            N_KEYS,
            qk_scale,
            BLOCK_N,
            False,
            IS_CAUSAL,
            DOT_PRECISION,
            STAGE,
            True,
        )
    elif CANDIDATE == 3:  # ONE_WS_LOOP: every tile masked, one loop
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_desc,
            v_desc,
            q_pos,
            0,
            hi,
            N_KEYS,
            qk_scale,
            BLOCK_N,
            True,
            IS_CAUSAL,
            DOT_PRECISION,
            STAGE,
            True,
        )
    else:
        if CANDIDATE == 5:  # QK_AHEAD, over the whole tiles
            if unmasked_hi > 0:
                acc, l_i, m_i = _attn_fwd_ahead(
                    acc, l_i, m_i, q, k_desc, v_desc, 0, unmasked_hi, qk_scale, BLOCK_N, DOT_PRECISION
                )
        else:
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
                STAGE,
                WS,
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
            STAGE,
            WS,
        )

    o = acc / l_i[:, None]
    o_desc.store([q_start, 0], o.to(q.dtype))
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    if WHOLE_TILES:  # stored with tl.store after the specialized loop, L came out wrong in whole 128-row tiles
        tl.make_tensor_descriptor(L + bh * N_QUERIES, [N_QUERIES], [1], [BLOCK_M]).store([q_start], lse)
    else:
        tl.store(L + bh * N_QUERIES + q_pos, lse, mask=q_pos < N_QUERIES)


def whole_tiles(candidate, n_q, n_k, is_causal):
    """Whether WS_WHOLE_TILES runs a call as whole tiles: not causal and N_k a multiple of every
    BLOCK_N (128); L then goes out through a descriptor, which needs each sequence's row of L on a
    16-byte boundary: N_q a multiple of 4."""
    return candidate == WS_WHOLE_TILES and not is_causal and n_k % 128 == 0 and n_q % 4 == 0


def flash_forward(Q, K, V, is_causal, stage=ORIGINAL, candidate=PART4):
    """Part 4's flash_forward, with the two switches."""
    set_triton_allocator()
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    q, k, v = (_as_sequences(t) for t in (Q, K, V))
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    grid = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]) * q.shape[0],)  # noqa: E731
    meta = dict(
        D=d,
        IS_CAUSAL=is_causal,
        DOT_PRECISION=_dot_precision(Q),
        STAGE=stage,
        CANDIDATE=candidate,
        WHOLE_TILES=whole_tiles(candidate, n_q, n_k, is_causal),
    )
    _attn_fwd[grid](q, k, v, o, lse, n_q, n_k, q.shape[0], n_bucket(n_q, n_k), d**-0.5, **meta)
    return o.view(Q.shape), lse.view(Q.shape[:-1])


def forward(stage=ORIGINAL, candidate=PART4):
    """flash_forward(Q, K, V, is_causal) -> (O, L) with these switches, for a study's table of variants."""
    return lambda Q, K, V, is_causal: flash_forward(Q, K, V, is_causal, stage, candidate)


def chosen():
    """The configuration the autotuner chose for the last call, as the tables name it."""
    return triton_tools.chosen_label(_attn_fwd)
