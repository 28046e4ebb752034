"""Part 5's Hopper forward in Gluon: FlashAttention-3's schedule, written out by hand.

Triton's compiler decides for a `tl` kernel which warps load, which multiply and when; Gluon
(`triton.experimental.gluon`) hands those decisions to the kernel. This one is built an idea at a
time (steps/, make diff PART=5 STEP=fwd1, STEP=fwd2, ...), and each step adds its line here:

- fwd1: part 4's forward in Gluon's terms. Rows of 64 queries per warpgroup (one wgmma M), TMA
  copies into shared memory, wgmma, the online softmax in registers: base-2 exponent with the scale
  folded in, masks only on the tiles that need them (the diagonal when causal, the ragged last key
  tile), L = m + log(l).

GPU only (sm_90): Gluon has no interpreter. `flash_attention.py` sends bf16 and fp16 calls on a
Hopper GPU here and keeps its `tl` forward for the rest (float32, D = 16 and 32, other GPUs,
Triton's interpreter on the CPU).
"""

import torch
import triton

from common.runtime import INTERPRET, capability

try:  # Gluon is experimental: a Triton without it (or with another API) falls back to the tl kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma

    # TMA's global-to-shared copy: tma.async_load from Triton 3.7 on, async_copy_global_to_shared before
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
except ImportError:  # pragma: no cover
    HAVE_GLUON = False

ROWS = 64  # query rows per softmax warpgroup: one wgmma M
BLOCK_N = 128  # keys per tile


if HAVE_GLUON:

    @gluon.constexpr_function
    def _acc_layout(n):
        """wgmma's accumulator layout for a 64 x n tile over one warpgroup (4 warps along M)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _work_item(sizes, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
        """The program's query tile: (sequence, first row, key tiles, unmasked key tiles)."""
        n_tiles_m, N_QUERIES, N_KEYS, N_SEQS = sizes
        idx = gl.program_id(0)
        if IS_CAUSAL:  # the last query tiles (the most keys) first, every sequence side by side
            tile_m = n_tiles_m - 1 - idx // N_SEQS
            bh = idx % N_SEQS
        else:  # consecutive tiles: consecutive query tiles of one sequence, sharing K and V in L2
            tile_m = idx % n_tiles_m
            bh = idx // n_tiles_m
        q_start = tile_m * BLOCK_M
        if IS_CAUSAL:
            hi = gl.minimum(q_start + BLOCK_M, N_KEYS)
            unmasked_hi = gl.minimum(q_start, N_KEYS) // BLOCK_N * BLOCK_N
        else:
            hi = N_KEYS
            unmasked_hi = N_KEYS // BLOCK_N * BLOCK_N
        return bh, q_start, gl.cdiv(hi, BLOCK_N), unmasked_hi // BLOCK_N

    @gluon.jit
    def _online_softmax(s, m_i, l_i, j, rows, N_KEYS, qk_scale, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
        """P_j (float32) from S_j, and the new max, sum and rescale factor alpha; rows: query index."""
        if MASKED:  # keys past N_KEYS (zero-filled) and, causal, keys after the query
            cols = j * s.shape[1] + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
            keep = cols[None, :] < N_KEYS
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)  # finite: tile 0 holds key 0, seen by every row
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def _softmax_step(
        j,
        state,
        tile,
        buffers,
        loads,
        MASKED: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
    ):
        """Key tile j of a query tile: K_j and V_j copied into shared memory by TMA, S_j = Q K_j^T,
        P_j, then O = alpha O + P_j V_j, each copy and product waited for before the next line.
        state: O, m, l; loads: K's and V's descriptors and the sequence."""
        acc, m_i, l_i = state
        q, s0, rows, N_KEYS, qk_scale = tile  # s0: zeros shaped and laid out as S
        q_smem, k_smem, v_smem, q_ready, k_ready, v_ready = buffers
        k_desc, v_desc, bh = loads
        BLOCK_N: gl.constexpr = k_smem.type.shape[0]
        D: gl.constexpr = k_smem.type.shape[1]
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
        phase = j & 1  # k_ready and v_ready complete once per key tile
        mbarrier.expect(k_ready, BLOCK_N * D * 2)  # keys past N_KEYS arrive as zeros, and count
        tma_load(k_desc, [bh, j * BLOCK_N, 0], k_ready, k_smem.reshape([1, BLOCK_N, D]))
        mbarrier.expect(v_ready, BLOCK_N * D * 2)
        tma_load(v_desc, [bh, j * BLOCK_N, 0], v_ready, v_smem.reshape([1, BLOCK_N, D]))
        mbarrier.wait(k_ready, phase)
        s = warpgroup_mma(q, k_smem.permute((1, 0)), s0, use_acc=False)  # waits for the product
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, j, rows, N_KEYS, qk_scale, MASKED, IS_CAUSAL)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p = gl.convert_layout(p.to(q.dtype), p_layout)  # P in registers: wgmma's A operand
        mbarrier.wait(v_ready, phase)
        acc = warpgroup_mma(p, v_smem, acc)
        return acc, m_i, l_i

    @gluon.jit
    def _softmax_tile(
        O,
        L,
        qk_scale,
        work,
        sizes,
        buffers,
        descs,
        D: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
    ):
        """One query tile, rows q_start ... q_start + ROWS - 1, against every key tile it sees. work:
        the tile (sequence, first row, key tiles, unmasked key tiles); descs: Q's, K's and V's."""
        bh, q_start, n_tiles, n_unmasked = work
        n_tiles_m, N_QUERIES, N_KEYS, N_SEQS = sizes
        q_smem, k_smem, v_smem, q_ready, k_ready, v_ready = buffers
        q_desc, k_desc, v_desc = descs
        ROWS: gl.constexpr = q_smem.type.shape[0]
        BLOCK_N: gl.constexpr = k_smem.type.shape[0]
        s_layout: gl.constexpr = _acc_layout(BLOCK_N)
        o_layout: gl.constexpr = _acc_layout(D)
        s0 = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        q = q_smem
        rows = q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([ROWS, D], gl.float32, layout=o_layout)
        tile = (q, s0, rows, N_KEYS, qk_scale)

        mbarrier.expect(q_ready, ROWS * D * 2)  # zero rows past N_QUERIES count too
        tma_load(q_desc, [bh, q_start, 0], q_ready, q_smem.reshape([1, ROWS, D]))
        mbarrier.wait(q_ready, 0)
        loads = (k_desc, v_desc, bh)
        for j in range(0, n_unmasked):  # whole tiles every row sees: no mask
            acc, m_i, l_i = _softmax_step(j, (acc, m_i, l_i), tile, buffers, loads, False, IS_CAUSAL)
        for j in range(n_unmasked, n_tiles):  # the diagonal and the ragged last tile
            acc, m_i, l_i = _softmax_step(j, (acc, m_i, l_i), tile, buffers, loads, True, IS_CAUSAL)

        # O = acc / l and L = m + log(l), straight from registers (rows past N_QUERIES dropped)
        o_rows = q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        seq = bh.to(gl.int64) * N_QUERIES
        gl.store(
            O + (seq + o_rows[:, None]) * D + cols[None, :],
            o.to(O.dtype.element_ty),
            mask=(o_rows < N_QUERIES)[:, None],
        )
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural log, as part 4's L
        gl.store(L + seq + rows, lse, mask=rows < N_QUERIES)

    @gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS"])
    def _attn_fwd_gluon(
        Q,
        K,
        V,
        O,
        L,
        N_QUERIES,
        N_KEYS,
        N_SEQS,
        scale,
        D: gl.constexpr,
        BLOCK_N: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        ROWS: gl.constexpr,
    ):
        n_tiles_m = gl.cdiv(N_QUERIES, ROWS)
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_smem = gl.allocate_shared_memory(Q.dtype.element_ty, [ROWS, D], layout)
        k_smem = gl.allocate_shared_memory(K.dtype.element_ty, [BLOCK_N, D], layout)
        v_smem = gl.allocate_shared_memory(V.dtype.element_ty, [BLOCK_N, D], layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)  # an expect, then the bytes landing
        mbarrier.init(k_ready, count=1)
        mbarrier.init(v_ready, count=1)
        # 3-D descriptors (sequence, row, column): a tile never reads past its own sequence's last
        # row (TMA fills zeros there), and one descriptor serves every sequence.
        rank3: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
        q_desc = tma.make_tensor_descriptor(Q, [N_SEQS, N_QUERIES, D], [N_QUERIES * D, D, 1], [1, ROWS, D], rank3)
        k_desc = tma.make_tensor_descriptor(K, [N_SEQS, N_KEYS, D], [N_KEYS * D, D, 1], [1, BLOCK_N, D], rank3)
        v_desc = tma.make_tensor_descriptor(V, [N_SEQS, N_KEYS, D], [N_KEYS * D, D, 1], [1, BLOCK_N, D], rank3)

        qk_scale = scale * 1.4426950408889634  # scale * log2(e)
        sizes = (n_tiles_m, N_QUERIES, N_KEYS, N_SEQS)
        buffers = (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready)
        work = _work_item(sizes, ROWS, BLOCK_N, IS_CAUSAL)
        _softmax_tile(O, L, qk_scale, work, sizes, buffers, (q_desc, k_desc, v_desc), D, IS_CAUSAL)


def supported(q):
    """Whether this forward can run q's call: Gluon present and compiled (not the interpreter), bf16
    or fp16, D = 64 or 128, on a Hopper GPU (sm_90: wgmma and TMA as this kernel uses them)."""
    return (
        HAVE_GLUON
        and not INTERPRET
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and q.shape[-1] in (64, 128)
        and capability(q.device) == (9, 0)
    )


def programs(n_q, n_seqs, d, device):
    """Programs to launch: one per query tile."""
    return triton.cdiv(n_q, ROWS) * n_seqs


def launch(q, k, v, o, lse, is_causal, config=None):
    """O and L of (BH, N, D) contiguous q, k, v into o, lse through Triton's own launch path (part 5's
    flash_forward launches the same kernel through its Launch). config: more constexprs, if any."""
    n_seqs, n_q, d = q.shape
    meta = constexprs(d, is_causal, config)
    grid = (programs(n_q, n_seqs, d, q.device),)
    _attn_fwd_gluon[grid](q, k, v, o, lse, n_q, k.shape[1], n_seqs, d**-0.5, **meta)


def constexprs(d, is_causal, config=None):
    """_attn_fwd_gluon's compile-time arguments for head dim d (config: more, if any)."""
    return dict(D=d, BLOCK_N=BLOCK_N, IS_CAUSAL=is_causal, ROWS=ROWS, **(config or {}))
