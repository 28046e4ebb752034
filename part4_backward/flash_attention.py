"""Part 4: the backward in Triton. Part 3's forward, unchanged, and three backward kernels
replacing the tiled PyTorch backward of parts 0-3 (thousands of small launches per call):

- _attn_bwd_preprocess: D = rowsum(dO * O), which makes the softmax gradient tile-local;
- _attn_bwd_dkdv: one program per key tile accumulates dK_j and dV_j over the query tiles;
- _attn_bwd_dq: one program per query tile accumulates dQ_i over the key tiles. Deterministic:
  no atomics, so the same inputs give the same bits (tools/dq_atomics.py times FlashAttention-2's
  alternative, dQ added with atomics by the dK/dV kernel: tools/variants/atomic_dq.diff).

Both loops recompute P = exp(S - L) from the forward's L, skip the tiles causality hides, and
mask only the diagonal (and, for dQ, the ragged last key) tiles, as part 3's forward does.

Run:  make test PART=4   |   make bench PART=4   |   python -m part4_backward.tools.sweep (GPU)
"""

import torch
import triton
import triton.language as tl

from common import launch, library
from common.runtime import INTERPRET
from common.validate import check_inputs

# Winners of part 3's own sweep (results/h200/part3_sweep.csv, `python -m part3_inner_loop.tools.sweep`;
# H200, bf16, B=4, H=8, N=4096): D=64 non-causal 128x128 w4 s3, causal 128x64 w4 s4; D=128 both
# 256x64 w8 s3. The last, 128x64 w4 s2 (third at D=128), is the one that fits float32 at D=128.
TUNED = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=2),
]
# Float32 multiplies as IEEE float32 (no tensor cores): the tiles above spill (0.3-3.4 TFLOP/s, up to 70 s
# of ptxas each). The float32 sweep (results/h200/part3_fp32_sweep.csv, `python -m part3_inner_loop.tools.sweep
# --dtype fp32`) found one small tile per D: 10-11 TFLOP/s, 3-7 s to compile; a float32 call takes it alone.
FLOAT32 = {
    64: triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=2),  # D = 16, 32 and 64
    128: triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
}
INTERPRETED = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)  # M != N: swaps show
CONFIGS = [INTERPRETED] if INTERPRET else TUNED + list(FLOAT32.values())  # the interpreter cannot time


def smem_bytes(block_m, block_n, d, elem_bytes, num_stages):
    """Shared memory the tiles need on Hopper: Q once, and num_stages buffers each of K and V in flight."""
    return block_m * d * elem_bytes + num_stages * 2 * block_n * d * elem_bytes


def fits_in_smem(configs, named_args, **kwargs):
    """early_config_prune: a float32 call gets its D's float32 tile; a 16-bit call the others, those
    whose binary the compiler sizes within this GPU's shared memory (on Hopper, smem_bytes)."""
    elem_bytes, d = named_args["Q"].element_size(), kwargs["D"]
    tile = FLOAT32[128 if d > 64 else 64]
    if elem_bytes == 4 and any(c is tile for c in configs):
        return [tile]
    configs = [c for c in configs if all(c is not t for t in FLOAT32.values())] or configs
    return launch.fitting(_attn_fwd, configs, named_args, kwargs)  # those whose binary fits this GPU


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i,  # running state of the query tile: unnormalised O_i, sum and max (base 2)
    q, k_desc, v_desc, q_pos, lo, hi, N_KEYS, qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key in [lo, hi) is visible to every row, no tl.where at all
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The online softmax over the key tiles starting at lo, lo + BLOCK_N, ... below hi."""
    for k_start in range(lo, hi, BLOCK_N):
        k = k_desc.load([k_start, 0])  # (BLOCK_N, D)
        v = v_desc.load([k_start, 0])  # (BLOCK_N, D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) Q_i K_j^T, float32

        if MASKED:  # keys past N_KEYS (zero-filled rows) and, causal, keys after the query
            k_pos = k_start + tl.arange(0, BLOCK_N)
            keep = k_pos[None, :] < N_KEYS
            if IS_CAUSAL:
                keep = keep & (k_pos[None, :] <= q_pos[:, None])
            s = tl.where(keep, s, float("-inf"))

        # Base 2: S_ij * scale * log2(e) is the exponent of 2, exp(x) = exp2(x * log2(e)).
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)  # (BLOCK_M,)
        m_sub = m_new
        if MASKED:
            # A row with no visible key in this tile, and none before it, has m_new = -inf, and
            # exp2(-inf - (-inf)) is NaN. Subtract 0 instead: p and alpha are then exp2(-inf) = 0,
            # while m_i stays -inf, so the row's first visible score still sets the max.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s * qk_scale - m_sub[:, None])  # (BLOCK_M, BLOCK_N) P_ij, one FMA and one exp2 each
        alpha = tl.exp2(m_i - m_sub)  # rescales what was accumulated against the old max
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        p = p.to(v.dtype)  # .to() returns a new tensor: assign it, or tl.dot sees float32 P
        acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)  # acc += P_ij V_j, float32 accumulate
        m_i = m_new
    return acc, l_i, m_i


# N_QUERIES, N_KEYS and N_SEQS are runtime values: without do_not_specialize, Triton would compile
# one variant per "N divisible by 16 / N == 1 / other" class, several compiles for one kernel.
# N_BUCKET is read only by the autotuner (its key): a new power of two of N re-tunes.
@triton.autotune(
    configs=CONFIGS, key=["D", "IS_CAUSAL", "N_BUCKET"], prune_configs_by={"early_config_prune": fits_in_smem}
)
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "N_BUCKET"])
def _attn_fwd(
    Q,  # (BH, N_q, D), contiguous: one row of tiles per (batch, head) sequence
    K,  # (BH, N_k, D)
    V,  # (BH, N_k, D)
    O,  # (BH, N_q, D), written
    L,  # (BH, N_q) float32, written: logsumexp of each row of S
    N_QUERIES,
    N_KEYS,
    N_SEQS,  # BH
    N_BUCKET,
    scale,  # 1 / sqrt(D)
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs (Triton's default there is TF32)
):
    # One grid axis of N_SEQS * (query tiles) programs (axis 0 allows 2**31 - 1; the others stop at
    # 65535). The GPU starts programs roughly in index order, so the index -> (query tile, sequence)
    # map decides what runs together. Causal, the last query
    # tiles hold the most keys: consecutive programs take the same query tile of consecutive
    # sequences, last tile first, so the longest programs start first and the short ones fill the GPU
    # at the end. Not causal, every program does the same work: consecutive programs take consecutive
    # query tiles of one sequence, so the programs running together read the same K and V from L2.
    # bh (which sequence, batch * head) is int64: B*H*N*D can pass 2**31.
    pid = tl.program_id(0)
    if IS_CAUSAL:
        tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid // N_SEQS
        bh = (pid % N_SEQS).to(tl.int64)
    else:
        tile_m = pid % tl.cdiv(N_QUERIES, BLOCK_M)
        bh = (pid // tl.cdiv(N_QUERIES, BLOCK_M)).to(tl.int64)

    # One descriptor per sequence: rows past N_QUERIES / N_KEYS load as zeros and are not stored.
    q_desc = tl.make_tensor_descriptor(Q + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    o_desc = tl.make_tensor_descriptor(O + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])

    q_start = tile_m * BLOCK_M
    q_pos = q_start + tl.arange(0, BLOCK_M)  # (BLOCK_M,) row index of each query
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of S * scale * log2(e)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(S * scale * log2(e) - m_i)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)  # unnormalised O_i
    qk_scale = scale * 1.4426950408889634  # scale * log2(e)

    # Key j is visible to query i when j <= i (causal). Keys below q_start are visible to every row
    # of the tile, and so is every key below N_KEYS when not causal: whole tiles of those need no
    # mask. The rest, up to the last visible key, gets masks: the diagonal tile(s) (several when
    # BLOCK_M > BLOCK_N) and the ragged last key tile. Tiles above the diagonal are never visited.
    if IS_CAUSAL:
        hi = tl.minimum(q_start + BLOCK_M, N_KEYS)
        unmasked_hi = tl.minimum(q_start, N_KEYS) // BLOCK_N * BLOCK_N
    else:
        hi = N_KEYS
        unmasked_hi = N_KEYS // BLOCK_N * BLOCK_N

    q = q_desc.load([q_start, 0])  # (BLOCK_M, D), loaded once
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, q_pos, 0, unmasked_hi,  # unmasked tiles
                                    N_KEYS, qk_scale, BLOCK_N, False, IS_CAUSAL, DOT_PRECISION)  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, q_pos, unmasked_hi, hi,  # then masked
                                    N_KEYS, qk_scale, BLOCK_N, True, IS_CAUSAL, DOT_PRECISION)  # fmt: skip

    o = acc / l_i[:, None]  # the one division
    o_desc.store([q_start, 0], o.to(q.dtype))  # rows past N_QUERIES are dropped
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # L_i back in natural log: log2(x) * ln(2)
    tl.store(L + bh * N_QUERIES + q_pos, lse, mask=q_pos < N_QUERIES)


def _dot_precision(Q):
    """Float32 inputs get IEEE float32 products. tl.dot's default on a GPU is TF32 (10 mantissa
    bits): S would carry errors of order |S| * 2**-10, L with it, and the float32 backward, which
    recomputes S exactly and takes P = exp(S - L), would get probabilities that do not sum to 1."""
    return "ieee" if Q.dtype == torch.float32 else "tf32"


@library.traceable
def flash_forward(Q, K, V, is_causal):
    """O (like Q) and L (float32, Q.shape[:-1]) from one launch of _attn_fwd."""
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    q, k, v = launch.sequences(Q, K, V)  # (B*H, N, D), contiguous
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    grid = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]) * q.shape[0],)  # noqa: E731
    meta = dict(D=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q))
    launch.run(_attn_fwd, grid, q, k, v, o, lse, n_q, n_k, q.shape[0], launch.n_bucket(n_q, n_k), d**-0.5, **meta)
    return o.view(Q.shape), lse.view(Q.shape[:-1])


# ----------------------------------------------------------------------------------- backward
# The FlashAttention-2 backward in three launches, never storing anything N_q x N_k:
#   1. _attn_bwd_preprocess: D_i = rowsum(dO_i * O_i), float32 (Q.shape[:-1]).
#   2. _attn_bwd_dkdv: one program per key tile K_j, V_j; walks the query tiles that see it and
#      accumulates dK_j, dV_j in registers (a key tile's gradient sums over queries).
#   3. _attn_bwd_dq: one program per query tile Q_i; walks the key tiles it sees and accumulates
#      dQ_i (a query tile's gradient sums over keys). No atomics: each program owns its output
#      tile, so the result is the same bits on every run.
# Winners of part 4's sweeps (results/h200/part4_dkdv_sweep.csv and part4_dq_sweep.csv,
# `python -m part4_backward.tools.sweep --kernel dkdv|dq`; H200, bf16, B=4, H=8, N=4096). dK/dV: D=64
# 32x128 w4 s3, D=128 64x64 w4 s2 (causal or not). dQ: D=64 128x64 w8 s3, D=128 128x32 w4 s3
# (non-causal) and 128x64 w8 s3 (causal), and 64x64 w4 s2.
BWD_DKDV = [
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
]
BWD_DQ = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
]
# Float32, as in the forward (FLOAT32): small tiles, one per head dim and causal flag, from float32
# sweeps (`python -m part4_backward.tools.sweep --kernel dq|dkdv --dtype fp32 --configs ...`). dQ
# (results/h200/part4_dq_fp32_sweep.csv): the 16-bit tiles at 1.4-1.8 TFLOP/s at D = 64, 32x16 w4 s1
# at 5. dK/dV (part4_dkdv_fp32_sweep.csv): causal, the tiles that suit the non-causal loop spill
# by the thousand and take 9-22 s to compile (32x64 w4 s2 at D = 64: 1.8 TFLOP/s, 9 s); the small
# ones below run 3.5x and 1.3x faster and compile in 2.6 and 4.8 s.
BWD_DKDV_FLOAT32 = {  # (D, causal)
    (64, False): triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    (64, True): triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=2),
    (128, False): triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2),
    (128, True): triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=2),
}
_DQ_FLOAT32 = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)  # one for all four
BWD_DQ_FLOAT32 = {
    (64, False): _DQ_FLOAT32,
    (64, True): _DQ_FLOAT32,
    (128, False): _DQ_FLOAT32,
    (128, True): _DQ_FLOAT32,
}
BWD_DKDV_CONFIGS = (
    [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    if INTERPRET
    else BWD_DKDV + list(BWD_DKDV_FLOAT32.values())
)
BWD_DQ_CONFIGS = (
    [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    if INTERPRET
    else BWD_DQ + list(BWD_DQ_FLOAT32.values())
)


def bwd_smem_bytes(held_rows, streamed_rows, d, elem_bytes, num_stages):
    """Shared memory of a backward kernel: two tiles it holds for the whole loop (K_j and V_j in
    the dK/dV kernel, Q_i and dO_i in the dQ kernel) and num_stages buffers of the two it streams (Hopper's count)."""
    return 2 * held_rows * d * elem_bytes + num_stages * 2 * streamed_rows * d * elem_bytes


def bwd_fits_in_smem(streamed):
    """early_config_prune for a backward kernel whose loop streams tiles of `streamed` rows
    ("BLOCK_M": the dK/dV kernel walks query tiles; "BLOCK_N": the dQ kernel walks key tiles): a
    float32 call gets the kernel's float32 tile of its D, a 16-bit call the others whose binary fits
    this GPU, as the forward's fits_in_smem does."""
    float32 = BWD_DKDV_FLOAT32 if streamed == "BLOCK_M" else BWD_DQ_FLOAT32

    def prune(configs, named_args, **kwargs):
        elem_bytes, d = named_args["Q"].element_size(), kwargs["D"]
        tile = float32[128 if d > 64 else 64, kwargs["IS_CAUSAL"]]
        if elem_bytes == 4 and any(c is tile for c in configs):
            return [tile]
        configs = [c for c in configs if all(c is not t for t in float32.values())] or configs
        return launch.fitting(_attn_bwd_dkdv if streamed == "BLOCK_M" else _attn_bwd_dq, configs, named_args, kwargs)

    return prune


@triton.jit(do_not_specialize=["N_QUERIES", "N_SEQS"])
def _attn_bwd_preprocess(O, DO, DELTA, N_QUERIES, N_SEQS, D: tl.constexpr, BLOCK_M: tl.constexpr):
    pid = tl.program_id(0)
    tile_m = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    o_desc = tl.make_tensor_descriptor(O + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    do_desc = tl.make_tensor_descriptor(DO + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    q_pos = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o = o_desc.load([tile_m * BLOCK_M, 0]).to(tl.float32)  # (BLOCK_M, D)
    do = do_desc.load([tile_m * BLOCK_M, 0]).to(tl.float32)
    tl.store(DELTA + bh * N_QUERIES + q_pos, tl.sum(o * do, axis=1), mask=q_pos < N_QUERIES)  # D_i


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v, k_pos,  # this program's key tile, its running dK_j and dV_j
    q_desc, do_desc, L, DELTA, lo, hi, N_QUERIES, qk_scale,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dK_j, dV_j summed over the query tiles starting at lo, lo + BLOCK_M, ... below hi. Works on
    the transposed tile (keys x queries) so that dK_j and dV_j come out of plain row-major dots."""
    for q_start in range(lo, hi, BLOCK_M):
        q = q_desc.load([q_start, 0])  # (BLOCK_M, D); rows past N_QUERIES are zeros
        do = do_desc.load([q_start, 0])  # (BLOCK_M, D); zeros there too, so they add nothing
        q_pos = q_start + tl.arange(0, BLOCK_M)
        in_range = q_pos < N_QUERIES
        l_2 = tl.load(L + q_pos, mask=in_range, other=0.0) * 1.4426950408889634  # (BLOCK_M,) L_i in base 2
        delta = tl.load(DELTA + q_pos, mask=in_range, other=0.0)  # (BLOCK_M,) D_i

        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M) S_ij^T
        p_t = tl.exp2(s_t * qk_scale - l_2[None, :])  # P_ij^T = exp(S_ij - L_i), the forward's softmax
        if MASKED:  # causal, on the diagonal tiles: key j is visible to query i when j <= i
            p_t = tl.where(k_pos[:, None] <= q_pos[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # dV_j += P_ij^T dO_i
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M) dP_ij^T
        ds_t = p_t * (dp_t - delta[None, :])  # dS_ij^T = P_ij^T * (dP_ij^T - D_i)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)  # dK_j += dS_ij^T Q_i
    return dk, dv


@triton.autotune(
    configs=BWD_DKDV_CONFIGS,
    key=["D", "IS_CAUSAL", "N_BUCKET"],
    prune_configs_by={"early_config_prune": bwd_fits_in_smem("BLOCK_M")},
)
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "N_BUCKET"])
def _attn_bwd_dkdv(
    Q, K, V, DO, L, DELTA,  # inputs: Q, dO (BH, N_q, D); K, V (BH, N_k, D); L, D_i (BH, N_q) float32
    DK, DV,  # written: dK, dV like K
    N_QUERIES, N_KEYS, N_SEQS, N_BUCKET, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Causal, the first key tiles are seen by the most queries: program order = key tile order
    # puts the longest programs first, as the forward does with its last query tiles.
    pid = tl.program_id(0)
    tile_n = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    q_desc = tl.make_tensor_descriptor(Q + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    do_desc = tl.make_tensor_descriptor(DO + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    dk_desc = tl.make_tensor_descriptor(DK + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    dv_desc = tl.make_tensor_descriptor(DV + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    L += bh * N_QUERIES
    DELTA += bh * N_QUERIES

    k_start = tile_n * BLOCK_N
    k_pos = k_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    k = k_desc.load([k_start, 0])  # (BLOCK_N, D), held for the whole loop
    v = v_desc.load([k_start, 0])
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # scale * log2(e)

    # Causal: queries before k_start see none of these keys (those tiles are skipped); queries from
    # k_start + BLOCK_N on see all of them (no mask); the tiles in between straddle the diagonal.
    # Not causal: every query sees every key, and the zero-filled rows past N_QUERIES or N_KEYS add
    # nothing to dK_j or dV_j (their dO or their own row is dropped at the store): no mask at all.
    if IS_CAUSAL:
        lo = k_start // BLOCK_M * BLOCK_M
        masked_hi = tl.minimum(tl.cdiv(k_start + BLOCK_N, BLOCK_M) * BLOCK_M, N_QUERIES)
    else:
        lo = 0
        masked_hi = 0
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, k_pos, q_desc, do_desc, L, DELTA, lo, masked_hi,  # the diagonal's
                                  N_QUERIES, qk_scale, BLOCK_M, True, DOT_PRECISION)  # fmt: skip
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, k_pos, q_desc, do_desc, L, DELTA, tl.maximum(masked_hi, lo),
                                  N_QUERIES, N_QUERIES, qk_scale, BLOCK_M, False, DOT_PRECISION)  # fmt: skip
    dk_desc.store([k_start, 0], (dk * scale).to(k.dtype))  # dK_j = scale * sum_i dS_ij^T Q_i
    dv_desc.store([k_start, 0], dv.to(v.dtype))


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, l_2, delta, q_pos,  # this program's query tile and its running dQ_i
    k_desc, v_desc, lo, hi, N_KEYS, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ_i summed over the key tiles starting at lo, lo + BLOCK_N, ... below hi."""
    for k_start in range(lo, hi, BLOCK_N):
        k = k_desc.load([k_start, 0])  # (BLOCK_N, D)
        v = v_desc.load([k_start, 0])
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) S_ij
        p = tl.exp2(s * qk_scale - l_2[:, None])  # P_ij
        if MASKED:  # keys past N_KEYS (their P can overflow: S = 0 there) and, causal, keys after the query
            k_pos = k_start + tl.arange(0, BLOCK_N)
            keep = k_pos[None, :] < N_KEYS
            if IS_CAUSAL:
                keep = keep & (k_pos[None, :] <= q_pos[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) dP_ij
        ds = p * (dp - delta[:, None])  # dS_ij
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # dQ_i += dS_ij K_j
    return dq


@triton.autotune(
    configs=BWD_DQ_CONFIGS,
    key=["D", "IS_CAUSAL", "N_BUCKET"],
    prune_configs_by={"early_config_prune": bwd_fits_in_smem("BLOCK_N")},
)
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "N_BUCKET"])
def _attn_bwd_dq(
    Q, K, V, DO, L, DELTA,
    DQ,  # DQ like Q, written
    N_QUERIES, N_KEYS, N_SEQS, N_BUCKET, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid // N_SEQS  # last query tiles (most keys) first
    bh = (pid % N_SEQS).to(tl.int64)
    q_desc = tl.make_tensor_descriptor(Q + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    do_desc = tl.make_tensor_descriptor(DO + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    dq_desc = tl.make_tensor_descriptor(DQ + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])

    q_start = tile_m * BLOCK_M
    q_pos = q_start + tl.arange(0, BLOCK_M)
    in_range = q_pos < N_QUERIES
    q = q_desc.load([q_start, 0])  # (BLOCK_M, D), held for the whole loop
    do = do_desc.load([q_start, 0])
    l_2 = tl.load(L + bh * N_QUERIES + q_pos, mask=in_range, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh * N_QUERIES + q_pos, mask=in_range, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634

    # The forward's split: whole tiles every row sees need no mask; the diagonal and ragged tiles do.
    if IS_CAUSAL:
        hi = tl.minimum(q_start + BLOCK_M, N_KEYS)
        unmasked_hi = tl.minimum(q_start, N_KEYS) // BLOCK_N * BLOCK_N
    else:
        hi = N_KEYS
        unmasked_hi = N_KEYS // BLOCK_N * BLOCK_N
    dq = _attn_bwd_dq_inner(dq, q, do, l_2, delta, q_pos, k_desc, v_desc, 0, unmasked_hi,  # unmasked tiles
                            N_KEYS, qk_scale, BLOCK_N, False, IS_CAUSAL, DOT_PRECISION)  # fmt: skip
    dq = _attn_bwd_dq_inner(dq, q, do, l_2, delta, q_pos, k_desc, v_desc, unmasked_hi, hi,  # then masked
                            N_KEYS, qk_scale, BLOCK_N, True, IS_CAUSAL, DOT_PRECISION)  # fmt: skip
    dq_desc.store([q_start, 0], (dq * scale).to(q.dtype))  # dQ_i = scale * sum_j dS_ij K_j


@library.traceable
def flash_backward(Q, K, V, O, L, dO, is_causal):
    """dQ, dK, dV (like Q, K, V) from the forward's O and L, in three launches."""
    n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    q, k, v, o, do = launch.sequences(Q, K, V, O, dO)
    n_seqs = q.shape[0]
    lse = L.reshape(n_seqs, n_q).contiguous()
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (n_q, n_k, n_seqs, launch.n_bucket(n_q, n_k), d**-0.5)
    meta = dict(D=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q))
    launch.run(_attn_bwd_preprocess, (triton.cdiv(n_q, 64) * n_seqs,), o, do, delta, n_q, n_seqs, D=d, BLOCK_M=64)
    grid_dkdv = lambda META: (triton.cdiv(n_k, META["BLOCK_N"]) * n_seqs,)  # noqa: E731
    launch.run(_attn_bwd_dkdv, grid_dkdv, q, k, v, do, lse, delta, dk, dv, *args, **meta)
    grid_dq = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]) * n_seqs,)  # noqa: E731
    launch.run(_attn_bwd_dq, grid_dq, q, k, v, do, lse, delta, dq, *args, **meta)
    return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        check_inputs(Q, K, V, is_causal, triton=True)
        if any(ctx.needs_input_grad):  # the backward's kernels compile (launch.ahead) beside the forward's
            launch.ahead(flash_backward, Q, K, V, Q, launch.Blank(Q.shape[:-1], torch.float32), Q, is_causal)
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
