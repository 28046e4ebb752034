"""Part 1: the first Triton forward. One program per (query tile, sequence), 16x16 tiles.

The FlashAttention-2 loop of part 0 as one kernel: the outer loop over query tiles becomes the
launch grid, the inner loop over key/value tiles stays a loop inside each program. Tiles are read
and written through tensor descriptors (one per sequence, so a ragged last tile reads zeros, never
the next sequence's rows). m_i, l_i and the output accumulator are float32 whatever the input
dtype. The backward is the tiled PyTorch backward from common/ (part 4 replaces it).

Run:  make test PART=1   |   make bench PART=1   |   python -m part1_triton_baseline.walkthrough
"""

import torch
import triton
import triton.language as tl

from common import launch, library
from common.backward import flash_backward
from common.validate import check_inputs

BLOCK_M = 16  # query rows per program
BLOCK_N = 16  # key rows per inner-loop step


# N_QUERIES and N_KEYS are runtime values: without do_not_specialize, Triton would compile one
# variant per "N divisible by 16 / N == 1 / other" class, several compiles for one kernel.
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS"])
def _attn_fwd(
    Q,  # (BH, N_q, D), contiguous: one row of tiles per (batch, head) sequence
    K,  # (BH, N_k, D)
    V,  # (BH, N_k, D)
    O,  # (BH, N_q, D), written
    L,  # (BH, N_q) float32, written: logsumexp of each row of S
    N_QUERIES,
    N_KEYS,
    scale,  # 1 / sqrt(D)
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs (Triton's default there is TF32)
):
    tile_m = tl.program_id(0)  # which query tile
    bh = tl.program_id(1).to(tl.int64)  # which sequence (batch * head); int64: B*H*N*D can pass 2**31

    # One descriptor per sequence: rows past N_QUERIES / N_KEYS load as zeros and are not stored.
    q_desc = tl.make_tensor_descriptor(Q + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D], [D, 1], [BLOCK_N, D])
    o_desc = tl.make_tensor_descriptor(O + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])

    q_start = tile_m * BLOCK_M
    q_pos = q_start + tl.arange(0, BLOCK_M)  # (BLOCK_M,) row index of each query
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of S
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(S - m_i)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)  # unnormalised O_i

    q = q_desc.load([q_start, 0])  # (BLOCK_M, D), loaded once
    for k_start in range(0, N_KEYS, BLOCK_N):
        k = k_desc.load([k_start, 0])  # (BLOCK_N, D)
        v = v_desc.load([k_start, 0])  # (BLOCK_N, D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (BLOCK_M, BLOCK_N) S_ij, float32

        # Zero-padded keys past N_KEYS would score exactly 0, an ordinary score: mask them out on
        # every tile. Causal: key j is visible to query i when j <= i. The first tile holds key 0,
        # which every query sees, so m_i is finite after it and exp(-inf - m_i) = 0 is safe.
        k_pos = k_start + tl.arange(0, BLOCK_N)
        keep = k_pos[None, :] < N_KEYS
        if IS_CAUSAL:
            keep = keep & (k_pos[None, :] <= q_pos[:, None])
        s = tl.where(keep, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # (BLOCK_M,)
        p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N) P_ij, in [0, 1]
        alpha = tl.exp(m_i - m_new)  # rescales what was accumulated against the old max
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        p = p.to(v.dtype)  # .to() returns a new tensor: assign it, or tl.dot sees float32 P
        acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)  # acc += P_ij V_j, float32 accumulate
        m_i = m_new

    o = acc / l_i[:, None]  # the one division
    o_desc.store([q_start, 0], o.to(q.dtype))  # rows past N_QUERIES are dropped
    lse = m_i + tl.log(l_i)  # L_i, natural log, float32
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
    grid = (triton.cdiv(n_q, BLOCK_M), q.shape[0])
    meta = dict(D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q))
    launch.run(_attn_fwd, grid, q, k, v, o, lse, n_q, n_k, d**-0.5, **meta)
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
