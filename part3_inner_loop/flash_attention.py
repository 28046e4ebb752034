"""Part 3: the inner loop. Part 2's kernel, with the key loop doing only the work it must.

- Causal tile skipping: a program stops at the diagonal; key tiles wholly above it are never
  loaded. The loop runs in two stages: tiles every row of the query tile sees in full (no mask),
  then the tiles that need one (the diagonal tiles, the ragged last key tile).
- exp2 with the scale folded in: S is multiplied by scale * log2(e) inside the exponent's
  argument (one fused multiply-add per score), m_i and the sums live in base 2, and L is turned
  back into a natural log at the store, so the interface is unchanged.
- Masks only where needed: interior tiles run without tl.where. Where masks are applied, a row can
  see no key in a tile; the update then never computes -inf - (-inf).
- Work balance: one program per (query tile, sequence) on one grid axis; causal, the heaviest tiles
  first, otherwise the tiles of one sequence together (they share K and V in L2); any number of
  (batch * head) sequences.

Run:  make test PART=3   |   make bench PART=3   |   python -m part3_inner_loop.tools.sweep (GPU)
"""

import torch
import triton
import triton.language as tl

from common import launch, library
from common.backward import flash_backward
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


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        check_inputs(Q, K, V, is_causal, triton=True)
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
