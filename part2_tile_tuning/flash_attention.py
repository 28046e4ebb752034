"""Part 2: tile tuning. Part 1's kernel, unchanged, with tile sizes, warps and stages autotuned.

The kernel body is part 1's line for line; only the launch changes. @triton.autotune times each
configuration in CONFIGS (tools/sweep.py's best, less those that do not fit in shared memory) the first
time it meets a shape class (dtype, D, causal, the power of two above N) and keeps the fastest.

Run:  make test PART=2   |   make bench PART=2   |   python -m part2_tile_tuning.tools.sweep (GPU)
"""

import torch
import triton
import triton.language as tl

from common import launch, library
from common.backward import flash_backward
from common.runtime import INTERPRET
from common.validate import check_inputs

# Winners of the sweep (results/h200/part2_sweep.csv, `python -m part2_tile_tuning.tools.sweep`; H200, bf16, B=4,
# H=8, N=4096): D=64 64x128 w4 s2 (causal or not); D=128 128x128 w8 s3, causal 128x64 w4 s2.
TUNED = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
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


# N_QUERIES and N_KEYS are runtime values: without do_not_specialize, Triton would compile one
# variant per "N divisible by 16 / N == 1 / other" class, several compiles for one kernel.
# N_BUCKET is read only by the autotuner (its key): a new power of two of N re-tunes.
@triton.autotune(
    configs=CONFIGS, key=["D", "IS_CAUSAL", "N_BUCKET"], prune_configs_by={"early_config_prune": fits_in_smem}
)
@triton.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_BUCKET"])
def _attn_fwd(
    Q,  # (BH, N_q, D), contiguous: one row of tiles per (batch, head) sequence
    K,  # (BH, N_k, D)
    V,  # (BH, N_k, D)
    O,  # (BH, N_q, D), written
    L,  # (BH, N_q) float32, written: logsumexp of each row of S
    N_QUERIES,
    N_KEYS,
    N_BUCKET,
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
    grid = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]), q.shape[0])  # noqa: E731
    meta = dict(D=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q))
    launch.run(_attn_fwd, grid, q, k, v, o, lse, n_q, n_k, launch.n_bucket(n_q, n_k), d**-0.5, **meta)
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
