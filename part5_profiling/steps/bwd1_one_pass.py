"""Part 5's Hopper backward in Gluon: dK, dV and dQ from one pass over the scores, as FlashAttention-3
does it.

Part 4's backward walks the scores twice: _attn_bwd_dkdv (one program per key tile) and
_attn_bwd_dq (one per query tile) each recompute S = Q K^T and dP = dO V^T, seven matrix products
per tile pair where five would do. This kernel makes the five once. It is built an idea at a time
(steps/, make diff PART=5 STEP=bwd1, STEP=bwd2, ...), and each step adds its line here:

- bwd1: one pass. A program holds 128 keys, 64 per warpgroup (two warpgroups), and one loader warp
  (gl.warp_specialize), which brings the program's K and V once, then Q_i and dO_i, 64 queries at
  a time, into a ring of STAGES buffers. Each warpgroup, for its 64 keys: S^T = K Q_i^T and
  dP^T = V dO_i^T (in flight together), P^T = exp2(S^T * scale * log2(e) - L_i * log2(e)),
  dV += P^T dO_i (P^T in registers as wgmma's A operand), dS^T = P^T (dP^T - D_i), dK += dS^T Q_i;
  dK and dV stay in registers for the whole walk. dQ_i = dS K sums over every key: the warpgroups
  put their dS^T in shared memory (the mbarrier ds_ready says both have), and at D = 128 warpgroup
  w multiplies dS by K's columns 64w ... 64w + 63, at D = 64 each its own dS^T by its own keys;
  each adds its 64 x 64 float32 result into a float32 dQ in global memory with a TMA reduce-add
  (cp.reduce.async.bulk: the add happens in L2, no atomic instruction per element). Programs add
  into the same rows in any order, so dQ's last bits can differ from run to run (part 4's two
  kernels are bitwise repeatable). A small tl kernel first writes D_i = rowsum(dO_i * O_i) and
  L_i * log2(e), padded with zeros to whole query tiles (no masks in the inner loop), and zeroes
  the float32 dQ; another writes it out in Q's dtype at the end (times the softmax scale).

Tiles are split in 64-column chunks (one 128-byte swizzle row of 16-bit elements) so that a
warpgroup can take K's columns 64w ... 64w + 63 as one shared-memory operand. GPU only (sm_90).
`flash_attention.py` sends the calls it supports here (16-bit, D = 64 or 128, a Hopper GPU: measured
faster than part 4's two kernels at every N, results/h200/part5_gluon_bwd.csv) and keeps part 4's
kernels for the rest, and for torch.use_deterministic_algorithms(True): this kernel's dQ bits vary.
"""

import math

import torch
import triton
import triton.language as tl

from part5_profiling import gluon_attention

try:  # Gluon is experimental: a Triton without it (or with another API) keeps part 4's kernels
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

    @builtin
    def _tma_add_shared_to_global(tensor_desc, coord, src, _semantic=None):
        """TMA's reduce-add from shared memory into global memory. Triton 3.6's compiler has the
        operation (it lowers tl's descriptor atomic_add to it) but Gluon gained a wrapper for it
        only in 3.7 (tma.async_atomic_add): this is that wrapper."""
        from triton._C.libtriton import ir

        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)

    tma_add = getattr(tma, "async_atomic_add", None) or _tma_add_shared_to_global
    HAVE_GLUON = True
except ImportError:  # pragma: no cover
    HAVE_GLUON = False

KEYS = 64  # keys per warpgroup: one wgmma M
BLOCK_N = 2 * KEYS  # keys per program
BLOCK_M = 64  # queries per step
STAGES = 2  # Q/dO ring depth: smem at D = 128: K, V 64 KB, Q, dO 64 KB, dS 16 KB, dQ 2 x 32 KB
DQ_BUFFERS = 2  # float32 dQ staging buffers per warpgroup: one can be read by TMA while the next is written
REGISTERS = 240  # per thread of warpgroup 1 (setmaxnreg); the loader keeps 24, warpgroup 0 the rest


if HAVE_GLUON:

    @gluon.constexpr_function
    def _acc_layout(n):
        """wgmma's accumulator layout for a 64 x n tile over one warpgroup (4 warps along M)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _load_tile(desc, ring, ready, free, i, bh, q_start, D: gl.constexpr):
        """Query tile i, once its ring slot is free: a 16-bit tile (Q_i or dO_i) in 64-column chunks,
        on one barrier."""
        CHUNKS: gl.constexpr = D // 64
        BLOCK_M: gl.constexpr = ring.type.shape[1]
        STAGES: gl.constexpr = ring.type.shape[0] // CHUNKS
        slot = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(free.index(slot), phase ^ 1)
        mbarrier.expect(ready.index(slot), BLOCK_M * D * 2)
        for c in gl.static_range(CHUNKS):
            chunk = ring.index(slot * CHUNKS + c).reshape([1, BLOCK_M, 64])
            tma_load(desc, [bh, q_start, c * 64], ready.index(slot), chunk)

    @gluon.jit
    def _bwd_load(
        Q,
        K,
        V,
        DO,
        sizes,
        loads,
        D: gl.constexpr,
        BLOCK_M: gl.constexpr,
    ):
        """One warp: the program's K and V (once), then Q_i and dO_i, each as soon as its buffer is
        free."""
        bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS = sizes
        k_smem, v_smem, q_ring, do_ring, kv_ready, q_ready, q_free, do_ready, do_free = loads
        CHUNKS: gl.constexpr = D // 64
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
        q_desc = tma.make_tensor_descriptor(Q, [N_SEQS, N_QUERIES, D], [N_QUERIES * D, D, 1], [1, BLOCK_M, 64], layout)
        do_desc = tma.make_tensor_descriptor(
            DO, [N_SEQS, N_QUERIES, D], [N_QUERIES * D, D, 1], [1, BLOCK_M, 64], layout
        )
        k_desc = tma.make_tensor_descriptor(K, [N_SEQS, N_KEYS, D], [N_KEYS * D, D, 1], [1, 64, 64], layout)
        v_desc = tma.make_tensor_descriptor(V, [N_SEQS, N_KEYS, D], [N_KEYS * D, D, 1], [1, 64, 64], layout)
        mbarrier.expect(kv_ready, 2 * 2 * 64 * D * 2)  # keys past N_KEYS arrive as zeros, and count
        for c in gl.static_range(CHUNKS):  # chunk c of warpgroup w's keys: buffer 2c + w
            for w in gl.static_range(2):
                tma_load(k_desc, [bh, k_start + w * 64, c * 64], kv_ready, k_smem.index(c * 2 + w).reshape([1, 64, 64]))
                tma_load(v_desc, [bh, k_start + w * 64, c * 64], kv_ready, v_smem.index(c * 2 + w).reshape([1, 64, 64]))
        for i in range(n_q_tiles):
            q_start = q_lo + i * BLOCK_M
            _load_tile(q_desc, q_ring, q_ready, q_free, i, bh, q_start, D)
            _load_tile(do_desc, do_ring, do_ready, do_free, i, bh, q_start, D)

    @gluon.jit
    def _add_dq(
        dq,
        dq_smem,
        dq_desc,
        n,
        bh,
        q_start,
        WG: gl.constexpr,
        CHUNKS: gl.constexpr,
        BLOCK_M: gl.constexpr,
        DQ_BUFFERS: gl.constexpr,
    ):
        """A warpgroup's n-th dQ tile: registers -> shared memory -> TMA add into global memory (its 64
        columns of rows q_start ... q_start + 63; rows past N_QUERIES are dropped), DQ_BUFFERS staging
        buffers in turn."""
        buf = (n % DQ_BUFFERS) * 2 + WG
        tma.store_wait(DQ_BUFFERS - 1)  # the add that last read this buffer has read it
        dq_smem.index(buf).store(dq)
        fence_async_shared()
        tma_add(dq_desc, [bh, q_start, WG * (CHUNKS - 1) * 64], dq_smem.index(buf).reshape([1, BLOCK_M, 64]))

    @gluon.jit
    def _release(ds_free, q_free, do_free, slot):
        """This warpgroup is done with dS^T in shared memory and with the ring slot of Q_i and dO_i."""
        mbarrier.arrive(ds_free, count=1)
        mbarrier.arrive(q_free.index(slot), count=1)
        mbarrier.arrive(do_free.index(slot), count=1)

    @gluon.jit
    def _bwd_step(
        i, accs, sizes, loads, exchange, stats, dq_desc, k_pos, qk_scale, WG: gl.constexpr, MASKED: gl.constexpr
    ):
        """Query tile i against this warpgroup's 64 keys: dK and dV accumulate in registers (accs: two
        64-column chunks each at D = 128), dQ_i's share goes out by TMA. stats: L * log2(e) and D,
        padded to whole query tiles."""
        dk0, dk1, dv0, dv1 = accs
        L2, DELTA = stats
        bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS = sizes
        k_smem, v_smem, q_ring, do_ring, kv_ready, q_ready, q_free, do_ready, do_free = loads
        ds_smem, ds_ready, ds_free, dq_smem = exchange
        CHUNKS: gl.constexpr = k_smem.type.shape[0] // 2  # 64-column chunks: D // 64
        BLOCK_M: gl.constexpr = q_ring.type.shape[1]
        STAGES: gl.constexpr = q_ring.type.shape[0] // CHUNKS
        DQ_BUFFERS: gl.constexpr = dq_smem.type.shape[0] // 2
        slot = i % STAGES
        phase = (i // STAGES) & 1
        s_layout: gl.constexpr = _acc_layout(BLOCK_M)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv0.type.layout, k_width=2)
        s0 = gl.zeros([64, BLOCK_M], gl.float32, layout=s_layout)
        q_start = q_lo + i * BLOCK_M
        cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        padded = bh.to(gl.int64) * gl.cdiv(N_QUERIES, BLOCK_M) * BLOCK_M + q_start + cols  # no mask needed
        l_2 = gl.load(L2 + padded)  # L_i * log2(e): one value per query (column of S^T)

        mbarrier.wait(q_ready.index(slot), phase)
        s = warpgroup_mma(
            k_smem.index(WG), q_ring.index(slot * CHUNKS).permute((1, 0)), s0, use_acc=False, is_async=True
        )
        if CHUNKS == 2:
            s = warpgroup_mma(k_smem.index(2 + WG), q_ring.index(slot * 2 + 1).permute((1, 0)), s, is_async=True)
        mbarrier.wait(do_ready.index(slot), phase)
        dp = warpgroup_mma(
            v_smem.index(WG), do_ring.index(slot * CHUNKS).permute((1, 0)), s0, use_acc=False, is_async=True
        )
        if CHUNKS == 2:
            dp = warpgroup_mma(v_smem.index(2 + WG), do_ring.index(slot * 2 + 1).permute((1, 0)), dp, is_async=True)
        s = warpgroup_mma_wait(CHUNKS, deps=[s])  # S^T is done (issued first); dP^T may still run
        p = gl.exp2(s * qk_scale - l_2[None, :])
        if MASKED:  # causal: the query tiles across the diagonal
            p = gl.where(k_pos[:, None] <= (q_start + cols)[None, :], p, 0.0)
        p16 = gl.convert_layout(p.to(q_ring.dtype), a_layout)
        dv0 = warpgroup_mma(p16, do_ring.index(slot * CHUNKS), dv0, is_async=True)  # dV += P^T dO
        if CHUNKS == 2:
            dv1 = warpgroup_mma(p16, do_ring.index(slot * 2 + 1), dv1, is_async=True)
        if CHUNKS == 2:  # all done: P^T's registers are free again
            dp, dv0, dv1 = warpgroup_mma_wait(0, deps=[dp, dv0, dv1])
        else:
            dp, dv0 = warpgroup_mma_wait(0, deps=[dp, dv0])
        delta = gl.load(DELTA + padded)  # D_i
        ds = (p * (dp - delta[None, :])).to(q_ring.dtype)  # dS^T, unscaled

        # dS^T into shared memory for dQ, once both warpgroups are done with the last one
        mbarrier.wait(ds_free, (i & 1) ^ 1)
        ds_smem.index(WG).store(ds)
        fence_async_shared()
        mbarrier.arrive(ds_ready, count=1)
        ds_a = gl.convert_layout(ds, a_layout)
        # dQ_i = dS K: at D = 128 warpgroup w makes columns 64w ... 64w + 63 from both halves of dS
        # (both warpgroups' keys); at D = 64 each warpgroup adds its own keys' share
        q0 = gl.zeros([BLOCK_M, 64], gl.float32, layout=_acc_layout(64))
        if CHUNKS == 2:
            dk0 = warpgroup_mma(ds_a, q_ring.index(slot * 2), dk0, is_async=True)  # dK += dS^T Q
            dk1 = warpgroup_mma(ds_a, q_ring.index(slot * 2 + 1), dk1, is_async=True)
            mbarrier.wait(ds_ready, i & 1)
            dq = warpgroup_mma(ds_smem.index(0).permute((1, 0)), k_smem.index(WG * 2), q0, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_smem.index(1).permute((1, 0)), k_smem.index(WG * 2 + 1), dq, is_async=True)
            dq, dk0, dk1 = warpgroup_mma_wait(0, deps=[dq, dk0, dk1])
            _release(ds_free, q_free, do_free, slot)
            _add_dq(dq, dq_smem, dq_desc, i, bh, q_start, WG, CHUNKS, BLOCK_M, DQ_BUFFERS)
        else:
            dk0 = warpgroup_mma(ds_a, q_ring.index(slot), dk0, is_async=True)
            mbarrier.wait(ds_ready, i & 1)
            dq = warpgroup_mma(ds_smem.index(WG).permute((1, 0)), k_smem.index(WG), q0, use_acc=False, is_async=True)
            dq, dk0 = warpgroup_mma_wait(0, deps=[dq, dk0])
            _release(ds_free, q_free, do_free, slot)
            _add_dq(dq, dq_smem, dq_desc, i, bh, q_start, WG, CHUNKS, BLOCK_M, DQ_BUFFERS)
        return dk0, dk1, dv0, dv1

    @gluon.jit
    def _bwd_partition(work, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr):
        """Warpgroup WG: keys k_start + 64 WG ... + 63 against every query tile that sees them. work:
        what both warpgroups share (outputs, statistics, scale, masked tiles, sizes, loads, exchange)."""
        outs, stats, scale, n_masked, sizes, loads, exchange = work
        bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS = sizes
        DK, DV, DQ = outs
        acc_layout: gl.constexpr = _acc_layout(64)
        dk0 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        dk1 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        dv0 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        dv1 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        k_pos = k_start + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, _acc_layout(BLOCK_M)))
        qk_scale = scale * 1.4426950408889634
        f32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
        dq_desc = tma.make_tensor_descriptor(DQ, [N_SEQS, N_QUERIES, D], [N_QUERIES * D, D, 1], [1, BLOCK_M, 64], f32)
        mbarrier.wait(loads[4], 0)  # kv_ready
        accs = (dk0, dk1, dv0, dv1)
        for i in range(0, n_masked):
            accs = _bwd_step(i, accs, sizes, loads, exchange, stats, dq_desc, k_pos, qk_scale, WG, True)
        for i in range(n_masked, n_q_tiles):
            accs = _bwd_step(i, accs, sizes, loads, exchange, stats, dq_desc, k_pos, qk_scale, WG, False)
        dk0, dk1, dv0, dv1 = accs
        tma.store_wait(0)
        rows = k_start + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, acc_layout))
        offs = (bh.to(gl.int64) * N_KEYS + rows[:, None]) * D + cols[None, :]
        keep = (rows < N_KEYS)[:, None]
        gl.store(DK + offs, (dk0 * scale).to(DK.dtype.element_ty), mask=keep)
        gl.store(DV + offs, dv0.to(DV.dtype.element_ty), mask=keep)
        if D == 128:
            gl.store(DK + offs + 64, (dk1 * scale).to(DK.dtype.element_ty), mask=keep)
            gl.store(DV + offs + 64, dv1.to(DV.dtype.element_ty), mask=keep)

    @gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS"])
    def _attn_bwd_gluon(
        Q,
        K,
        V,
        DO,
        L2,
        DELTA,
        DK,
        DV,
        DQ,
        N_QUERIES,
        N_KEYS,
        N_SEQS,
        scale,
        D: gl.constexpr,
        BLOCK_M: gl.constexpr,
        STAGES: gl.constexpr,
        DQ_BUFFERS: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        REGISTERS: gl.constexpr,
    ):
        CHUNKS: gl.constexpr = D // 64
        pid = gl.program_id(0)
        bh = pid % N_SEQS  # programs side by side take different sequences
        key_block = pid // N_SEQS
        k_start = key_block * 128  # BLOCK_N: two warpgroups of 64 keys
        if IS_CAUSAL:  # query tiles before the first that sees key k_start contribute nothing
            q_lo = k_start // BLOCK_M * BLOCK_M
            n_masked = gl.cdiv(gl.minimum(k_start + 128, N_QUERIES) - q_lo, BLOCK_M)
        else:
            q_lo = 0
            n_masked = 0
        n_q_tiles = gl.maximum(gl.cdiv(N_QUERIES - q_lo, BLOCK_M), 0)
        n_masked = gl.minimum(gl.maximum(n_masked, 0), n_q_tiles)
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        f32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
        dtype: gl.constexpr = Q.dtype.element_ty
        k_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, 64, 64], layout)
        v_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, 64, 64], layout)
        q_ring = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_M, 64], layout)
        do_ring = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_M, 64], layout)
        ds_smem = gl.allocate_shared_memory(dtype, [2, 64, BLOCK_M], layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFFERS, BLOCK_M, 64], f32)
        kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_ready, count=1)
        mbarrier.init(ds_ready, count=2)  # both warpgroups have stored their dS^T
        mbarrier.init(ds_free, count=2)  # both are done reading it
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(q_free.index(i), count=2)
            mbarrier.init(do_free.index(i), count=2)
        sizes = (bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS)
        loads = (k_smem, v_smem, q_ring, do_ring, kv_ready, q_ready, q_free, do_ready, do_free)
        exchange = (ds_smem, ds_ready, ds_free, dq_smem)  # the warpgroups' dS^T, and dQ's staging
        outs = (DK, DV, DQ)
        work = (outs, (L2, DELTA), scale, n_masked, sizes, loads, exchange)
        gl.warp_specialize(
            [
                (_bwd_partition, (work, 0, D, BLOCK_M)),
                (_bwd_partition, (work, 1, D, BLOCK_M)),
                (_bwd_load, (Q, K, V, DO, sizes, loads, D, BLOCK_M)),
            ],
            [4, 1],  # warps: warpgroup 1, the loader
            [REGISTERS, 24],  # registers per thread: warpgroup 1, the loader
        )


@triton.jit(do_not_specialize=["N_QUERIES", "N_SEQS"])
def _bwd_prepare(O, DO, L, L2, DELTA, DQ, N_QUERIES, N_SEQS, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per query tile: D_i = rowsum(dO_i * O_i) and L_i * log2(e), zeros past N_QUERIES up to a whole
    tile (the Gluon kernel reads them without masks), and zeros into the float32 dQ."""
    pid = tl.program_id(0)
    tile_m = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    keep = rows < N_QUERIES
    offs = (bh * N_QUERIES + rows[:, None]) * D + cols[None, :]
    o = tl.load(O + offs, mask=keep[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=keep[:, None], other=0.0).to(tl.float32)
    padded = bh * tl.cdiv(N_QUERIES, BLOCK_M) * BLOCK_M + rows
    tl.store(DELTA + padded, tl.sum(o * do, axis=1))
    lse = tl.load(L + bh * N_QUERIES + rows, mask=keep, other=0.0)
    tl.store(L2 + padded, lse * 1.4426950408889634)
    tl.store(DQ + offs, tl.zeros([BLOCK_M, D], tl.float32), mask=keep[:, None])


@triton.jit(do_not_specialize=["N_QUERIES", "N_SEQS"])
def _dq_convert(DQ32, DQ, N_QUERIES, N_SEQS, scale, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """dQ = scale * (the float32 sum), in the inputs' dtype, per query tile."""
    pid = tl.program_id(0)
    tile_m = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    r = tl.arange(0, BLOCK_M)[:, None]
    c = tl.arange(0, D)[None, :]
    rows = tile_m * BLOCK_M + r
    dq = tl.load(DQ32 + (bh * N_QUERIES + rows) * D + c, mask=rows < N_QUERIES) * scale
    tl.store(DQ + (bh * N_QUERIES + rows) * D + c, dq.to(DQ.dtype.element_ty), mask=rows < N_QUERIES)


def supported(q):
    """Whether this backward can run q's call: its own Gluon imports found, and a call the forward takes
    (gluon_attention.supported: compiled, bf16 or fp16, D = 64 or 128, on a Hopper GPU)."""
    return HAVE_GLUON and gluon_attention.supported(q)


def constexprs(d, is_causal):
    """_attn_bwd_gluon's compile-time arguments for head dim d."""
    return dict(
        D=d,
        BLOCK_M=BLOCK_M,
        STAGES=STAGES,
        DQ_BUFFERS=DQ_BUFFERS,
        IS_CAUSAL=is_causal,
        REGISTERS=REGISTERS,
    )


def _triton_path(kernel):
    """kernel as a launcher with Launch's call signature (key, grid, *args, **constexprs), through
    Triton's own launch path (the key is not needed there)."""
    return lambda key, grid, *args, **constexprs: kernel[lambda meta: (grid(meta),)](*args, **constexprs)


class Plan:
    """What the backward's three launches need that the shapes alone fix, worked out once: the
    programs of each launch, their keys and arguments, the compile-time constants. A repeated call
    of the same shapes (a training loop) reuses it and pays only for its allocations and launches.

    q_shape, k_shape: the shapes of the caller's Q and K, (BH, N, D) or (..., N, D); the gradients come
    back in them."""

    def __init__(self, q_shape, k_shape, device, dtype, is_causal):
        n_q, n_k, d = q_shape[-2], k_shape[-2], q_shape[-1]
        n_seqs = math.prod(q_shape[:-2])
        self.device, self.dtype = device, dtype
        self.q_shape, self.k_shape = tuple(q_shape), tuple(k_shape)
        self.stats_shape = (2, n_seqs, -(-n_q // BLOCK_M) * BLOCK_M)  # L * log2(e) and D_i, whole tiles
        self.dq32_shape = (n_seqs, n_q, d)
        self.meta = constexprs(d, is_causal)
        n_prepare, n_main = -(-n_q // BLOCK_M) * n_seqs, -(-n_k // BLOCK_N) * n_seqs
        self.prepare = ((device, dtype, d), lambda _: n_prepare, (n_q, n_seqs), dict(D=d, BLOCK_M=BLOCK_M))
        self.main = ((device, dtype, d, is_causal), lambda _: n_main)
        self.main_args = (n_q, n_k, n_seqs, d**-0.5)
        self.convert = ((device, dtype, d), lambda _: n_prepare, (n_q, n_seqs, d**-0.5), dict(D=d, BLOCK_M=BLOCK_M))

    def run(self, q, k, v, o, do, lse, launchers):
        """dQ, dK, dV (shaped like the plan's Q and K) of contiguous q, k, v, o, do (any shape of the
        same memory: a kernel sees only the address) and lse, with launchers as launch() takes them."""
        prepare, main, convert = launchers
        stats = torch.empty(self.stats_shape, dtype=torch.float32, device=self.device)
        dq32 = torch.empty(self.dq32_shape, dtype=torch.float32, device=self.device)
        lse2, delta = stats[0], stats[1]
        dk = torch.empty(self.k_shape, dtype=self.dtype, device=self.device)
        dv = torch.empty(self.k_shape, dtype=self.dtype, device=self.device)
        key, grid, args, meta = self.prepare
        prepare(key, grid, o, do, lse, lse2, delta, dq32, *args, **meta)
        key, grid = self.main
        main(key, grid, q, k, v, do, lse2, delta, dk, dv, dq32, *self.main_args, **self.meta)
        dq = torch.empty(self.q_shape, dtype=self.dtype, device=self.device)
        key, grid, args, meta = self.convert
        convert(key, grid, dq32, dq, *args, **meta)
        return dq, dk, dv


def launch(q, k, v, o, do, lse, is_causal, launchers=None):
    """dQ, dK, dV of (BH, N, D) contiguous tensors in three launches: _bwd_prepare, _attn_bwd_gluon,
    _dq_convert (a Plan for these shapes, used once). launchers: the three as callables with the
    signature of part 5's Launch (flash_backward passes its own, which skip Triton's per-call
    Python); None: Triton's own launch path (the studies and tests)."""
    launchers = launchers or (_triton_path(_bwd_prepare), _triton_path(_attn_bwd_gluon), _triton_path(_dq_convert))
    plan = Plan(q.shape, k.shape, q.device, q.dtype, is_causal)
    return plan.run(q, k, v, o, do, lse, launchers)
