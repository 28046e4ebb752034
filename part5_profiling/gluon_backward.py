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
- bwd2: the row statistics come with the tiles: the loader brings L_i * log2(e) with Q_i and D_i
  with dO_i by TMA, so the warpgroups read them from shared memory, not global memory, whose
  latency was their top stall.
- bwd3: the float32 dQ in fragment order, as FlashAttention-3 keeps its dQ accumulator: each
  64 x 64 block in the order a warpgroup's registers hold it (_fragment_order), so that a thread
  stores its values four at a time to consecutive addresses, with no swizzle to work out and no
  bank conflicts, and the TMA add copies 16 KB as they lie; the last kernel puts the rows back.
- bwd4: registers. At D = 128 a warpgroup's dK and dV (four 64 x 64 float32 accumulators) take 128
  of its 240 registers, S^T and dP^T 64 more: what the compiler hoists out of the loop (the wgmma
  descriptors of K's, V's and dS^T's buffers, one per 16-column step) then spilled to local memory
  and was loaded back before each product. The loop indexes those buffers with a zero the
  compiler cannot see (z), so they are worked out where they are used: fewer spills.
- bwd5: at D = 64 the warpgroups take turns making dQ_i from both halves of dS: one add per query
  tile, not one per warpgroup.
- bwd6: the order of the programs (ORDER, default_order): which rows are in L2 when the adds
  arrive.
- bwd7: heads read and written where they lie (the forward's fwd9): Q, K, V, O and dO through 4-D
  descriptors or addresses with their own (batch, head, row) strides, and dQ, dK, dV written in the
  layout of Q, K and V, so a model's transposed heads are not copied on the way in or out.
- bwd8: grouped key/value heads read where they are (the forward's fwd8): the loader takes query
  head h's K and V from key/value head h // Q_PER_KV, so K and V are not repeated for each group;
  dK and dV are still made per query head and summed over each group after (Plan.run).
- bwd9: that sum in one launch (_group_sum): dK's and dV's together, added in float32 and rounded
  once, written in K's and V's layouts, where two torch.sum calls made two launches and their
  allocations on every call.

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
STAGES = 2  # Q/dO ring depth: smem at D = 128: K, V 64 KB, Q, dO 64 KB, dS 16 KB, dQ 2 x 32 KB, stats 1 KB
DQ_BUFFERS = 2  # float32 dQ staging buffers per warpgroup: one can be read by TMA while the next is written
REGISTERS = 240  # per thread of warpgroup 1 (setmaxnreg); the loader keeps 24, warpgroup 0 the rest
# The float32 dQ's fragment order: a 64 x 64 block (r, c) split by bits as FRAGMENT_SPLIT (row bits
# 5, 4, 3, 0-2, column bits 3-5, 1-2, 0), then its axes in FRAGMENT_ORDER: column bits 3-5 (the
# register pairs' 8-column steps), row bits 5, 4 (the warp), 0-2, column bits 1-2 (the lane), row
# bit 3 and column bit 0 (a thread's four consecutive values) - how wgmma deals the block out.
FRAGMENT_SPLIT = (2, 2, 2, 8, 8, 4, 2)
FRAGMENT_ORDER = (4, 0, 1, 3, 5, 2, 6)
# The order of the programs. SEQUENCE_MINOR: program p takes sequence p mod N_SEQS, so the programs
# running at once touch every sequence's Q, dO and float32 dQ. SEQUENCE_MAJOR numbers one sequence's
# key blocks side by side, so its Q, dO and dQ can stay in L2 while they run. GROUPED takes the
# sequences in groups whose Q, dO and float32 dQ fit in L2_BUDGET bytes together, and numbers each
# group's programs key block by key block: the longest causal walks (the first key blocks) start
# first, as in SEQUENCE_MINOR, and the rows they read and add to can stay in L2. From
# tools/gluon_study.py --backward (results/h200/part5_gluon_bwd.csv): without a mask, sequence-major
# (it turned sequence-minor's loss to part 4 at long N into a gain); causal, sequence-minor below
# GROUPED_FROM queries (faster at N = 4096: there, launching the longest walks first matters more)
# and grouped from there (1-9% faster than sequence-minor).
SEQUENCE_MINOR, SEQUENCE_MAJOR, GROUPED = (tl.constexpr(i) for i in range(3))
ORDER = {False: SEQUENCE_MAJOR, True: SEQUENCE_MINOR}
GROUPED_FROM = 8192
L2_BUDGET = 30 * 2**20  # bytes: half the H200's L2 (60 MiB as the driver reports it, results/h200/part2_device.json)
# The (batch, head, row) strides _bwd_prepare, _attn_bwd_gluon, _dq_convert and _group_sum take, by tensor.
STRIDES = [f"stride_{t}{a}" for t in ("q", "k", "v", "do", "dk", "dv") for a in "bhn"]
PREPARE_STRIDES = [f"stride_{t}{a}" for t in ("o", "do") for a in "bhn"]
CONVERT_STRIDES = [f"stride_dq{a}" for a in "bhn"]
SUM_STRIDES = [f"stride_{t}{a}" for t in ("dk", "dv") for a in "bhn"]


def default_order(is_causal, n_q):
    """Part 5's order for a call: ORDER[is_causal], or GROUPED when causal with n_q >= GROUPED_FROM."""
    return GROUPED if is_causal and n_q >= GROUPED_FROM else ORDER[is_causal]


if HAVE_GLUON:

    @gluon.constexpr_function
    def _acc_layout(n):
        """wgmma's accumulator layout for a 64 x n tile over one warpgroup (4 warps along M)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.constexpr_function
    def _flat_layout():
        """Each thread's 4 consecutive floats, 32 lanes, 4 warps along a row of 256, rows in registers:
        the layout in which a 64 x 64 wgmma accumulator, in fragment order, is 16 rows of 256."""
        return gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32], warps_per_cta=[2, 2], order=[1, 0])

    @gluon.jit
    def _fragment_order(acc):
        """A 64 x 64 float32 accumulator (one warpgroup's wgmma layout) as 16 x 256 in the order its
        registers lie (FRAGMENT_ORDER): thread t's values k*4 ... k*4 + 3 land at 512 k + 4 t, so
        the reshapes move no data (convert_layout checks that it is trivial) and a store of four
        values per thread covers consecutive addresses."""
        x = acc.reshape([2, 2, 2, 8, 8, 4, 2])  # FRAGMENT_SPLIT: row bits 5, 4, 3, 0-2; column bits 3-5, 1-2, 0
        x = x.permute((4, 0, 1, 3, 5, 2, 6))  # FRAGMENT_ORDER
        return gl.convert_layout(x.reshape([16, 256]), _flat_layout(), assert_trivial=True)

    @gluon.jit
    def _load_tile(descs, rings, ready, free, i, seq, q_start, padded, D: gl.constexpr):
        """Query tile i, once its ring slot is free: a 16-bit tile (Q_i or dO_i) in 64-column chunks
        and its row statistic (L_i * log2(e) or D_i), all on one barrier. seq: batch, head, sequence."""
        desc, stat_desc = descs
        ring, stat_ring = rings
        b, h, bh = seq
        CHUNKS: gl.constexpr = D // 64
        BLOCK_M: gl.constexpr = ring.type.shape[1]
        STAGES: gl.constexpr = ring.type.shape[0] // CHUNKS
        slot = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(free.index(slot), phase ^ 1)
        mbarrier.expect(ready.index(slot), BLOCK_M * D * 2 + BLOCK_M * 4)
        for c in gl.static_range(CHUNKS):
            chunk = ring.index(slot * CHUNKS + c).reshape([1, 1, BLOCK_M, 64])
            tma_load(desc, [b, h, q_start, c * 64], ready.index(slot), chunk)
        tma_load(stat_desc, [bh * padded + q_start], ready.index(slot), stat_ring.index(slot))

    @gluon.jit
    def _bwd_load(
        Q,
        K,
        V,
        DO,
        L2,
        DELTA,
        sizes,
        strides,
        loads,
        D: gl.constexpr,
        BLOCK_M: gl.constexpr,
    ):
        """One warp: the program's K and V (once), then Q_i with L_i * log2(e), and dO_i with D_i,
        each as soon as its buffer is free. strides: HEADS, Q_PER_KV, then Q's, K's, V's and dO's
        (batch, head, row) strides: 4-D descriptors read each where it lies; query head h reads
        key/value head h // Q_PER_KV."""
        bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS = sizes
        HEADS, Q_PER_KV, q_strides, k_strides, v_strides, do_strides = strides
        k_smem, v_smem, q_ring, do_ring, l2_ring, delta_ring, kv_ready, q_ready, q_free, do_ready, do_free = loads
        CHUNKS: gl.constexpr = D // 64
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)
        n_b = N_SEQS // HEADS
        q_desc = gluon_attention._descriptor(Q, [n_b, HEADS, N_QUERIES, D], q_strides, [1, 1, BLOCK_M, 64], layout)
        do_desc = gluon_attention._descriptor(DO, [n_b, HEADS, N_QUERIES, D], do_strides, [1, 1, BLOCK_M, 64], layout)
        n_kv = HEADS // Q_PER_KV
        k_desc = gluon_attention._descriptor(K, [n_b, n_kv, N_KEYS, D], k_strides, [1, 1, 64, 64], layout)
        v_desc = gluon_attention._descriptor(V, [n_b, n_kv, N_KEYS, D], v_strides, [1, 1, 64, 64], layout)
        seq = (bh // HEADS, bh % HEADS, bh)
        # the row statistics, padded to whole query tiles: one flat float32 vector each
        padded = gl.cdiv(N_QUERIES, BLOCK_M) * BLOCK_M
        flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
        l2_desc = tma.make_tensor_descriptor(L2, [N_SEQS * padded], [1], [BLOCK_M], flat)
        delta_desc = tma.make_tensor_descriptor(DELTA, [N_SEQS * padded], [1], [BLOCK_M], flat)
        mbarrier.expect(kv_ready, 2 * 2 * 64 * D * 2)  # keys past N_KEYS arrive as zeros, and count
        for c in gl.static_range(CHUNKS):  # chunk c of warpgroup w's keys: buffer 2c + w
            for w in gl.static_range(2):
                k_at = [seq[0], seq[1] // Q_PER_KV, k_start + w * 64, c * 64]
                tma_load(k_desc, k_at, kv_ready, k_smem.index(c * 2 + w).reshape([1, 1, 64, 64]))
                tma_load(v_desc, k_at, kv_ready, v_smem.index(c * 2 + w).reshape([1, 1, 64, 64]))
        for i in range(n_q_tiles):
            q_start = q_lo + i * BLOCK_M
            _load_tile((q_desc, l2_desc), (q_ring, l2_ring), q_ready, q_free, i, seq, q_start, padded, D)
            _load_tile((do_desc, delta_desc), (do_ring, delta_ring), do_ready, do_free, i, seq, q_start, padded, D)

    @gluon.jit
    def _add_dq(
        dq,
        dq_smem,
        dq_desc,
        n,
        bh,
        q_start,
        N_QUERIES,
        WG: gl.constexpr,
        CHUNKS: gl.constexpr,
        BLOCK_M: gl.constexpr,
        DQ_BUFFERS: gl.constexpr,
    ):
        """A warpgroup's n-th dQ tile: registers -> shared memory (in fragment order) -> TMA add into
        global memory, DQ_BUFFERS staging buffers in turn."""
        buf = (n % DQ_BUFFERS) * 2 + WG
        flat = _fragment_order(dq)
        tma.store_wait(DQ_BUFFERS - 1)  # the add that last read this buffer has read it
        dq_smem.index(buf).store(flat)
        fence_async_shared()
        block = (bh * gl.cdiv(N_QUERIES, BLOCK_M) + q_start // BLOCK_M) * CHUNKS + WG * (CHUNKS - 1)
        tma_add(dq_desc, [block * 16, 0], dq_smem.index(buf))

    @gluon.jit
    def _release(ds_free, q_free, do_free, slot):
        """This warpgroup is done with dS^T in shared memory and with the ring slot of Q_i and dO_i."""
        mbarrier.arrive(ds_free, count=1)
        mbarrier.arrive(q_free.index(slot), count=1)
        mbarrier.arrive(do_free.index(slot), count=1)

    @gluon.jit
    def _bwd_step(i, accs, sizes, loads, exchange, dq_desc, k_pos, qk_scale, WG: gl.constexpr, MASKED: gl.constexpr):
        """Query tile i against this warpgroup's 64 keys: dK and dV accumulate in registers (accs: two
        64-column chunks each at D = 128), dQ_i's share goes out by TMA."""
        dk0, dk1, dv0, dv1 = accs
        bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS = sizes
        k_smem, v_smem, q_ring, do_ring, l2_ring, delta_ring, kv_ready, q_ready, q_free, do_ready, do_free = loads
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
        stat_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query (column of S^T)

        # K's, V's and dS^T's buffers are indexed with z, zero but not to the compiler: hoisted out
        # of the loop, their wgmma descriptors and store addresses (one per 16-column step) were
        # held in registers across it, and spilled at D = 128.
        z = i >> 30  # 0: there are fewer than 2**30 query tiles
        mbarrier.wait(q_ready.index(slot), phase)
        s = warpgroup_mma(
            k_smem.index(WG + z), q_ring.index(slot * CHUNKS).permute((1, 0)), s0, use_acc=False, is_async=True
        )
        if CHUNKS == 2:
            s = warpgroup_mma(k_smem.index(2 + WG + z), q_ring.index(slot * 2 + 1).permute((1, 0)), s, is_async=True)
        l_2 = l2_ring.index(slot).load(stat_layout)  # came with Q_i: shared memory, not global
        mbarrier.wait(do_ready.index(slot), phase)
        dp = warpgroup_mma(
            v_smem.index(WG + z), do_ring.index(slot * CHUNKS).permute((1, 0)), s0, use_acc=False, is_async=True
        )
        if CHUNKS == 2:
            dp = warpgroup_mma(v_smem.index(2 + WG + z), do_ring.index(slot * 2 + 1).permute((1, 0)), dp, is_async=True)
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
        delta = delta_ring.index(slot).load(stat_layout)  # came with dO_i
        ds = (p * (dp - delta[None, :])).to(q_ring.dtype)  # dS^T, unscaled

        # dS^T into shared memory for dQ, once both warpgroups are done with the last one
        mbarrier.wait(ds_free, (i & 1) ^ 1)
        ds_smem.index(WG + z).store(ds)
        fence_async_shared()
        mbarrier.arrive(ds_ready, count=1)
        ds_a = gl.convert_layout(ds, a_layout)
        # dQ_i = dS K: at D = 128 warpgroup w makes columns 64w ... 64w + 63 from both halves of dS
        # (both warpgroups' keys); at D = 64 the warpgroups take turns, each making every other dQ_i
        # from both halves: one add per query tile, not two
        q0 = gl.zeros([BLOCK_M, 64], gl.float32, layout=_acc_layout(64))
        if CHUNKS == 2:
            dk0 = warpgroup_mma(ds_a, q_ring.index(slot * 2), dk0, is_async=True)  # dK += dS^T Q
            dk1 = warpgroup_mma(ds_a, q_ring.index(slot * 2 + 1), dk1, is_async=True)
            mbarrier.wait(ds_ready, i & 1)
            dq = warpgroup_mma(
                ds_smem.index(z).permute((1, 0)), k_smem.index(WG * 2 + z), q0, use_acc=False, is_async=True
            )
            dq = warpgroup_mma(ds_smem.index(1 + z).permute((1, 0)), k_smem.index(WG * 2 + 1 + z), dq, is_async=True)
            dq, dk0, dk1 = warpgroup_mma_wait(0, deps=[dq, dk0, dk1])
            _release(ds_free, q_free, do_free, slot)
            _add_dq(dq, dq_smem, dq_desc, i, bh, q_start, N_QUERIES, WG, CHUNKS, BLOCK_M, DQ_BUFFERS)
        elif i % 2 == WG:
            dk0 = warpgroup_mma(ds_a, q_ring.index(slot), dk0, is_async=True)
            mbarrier.wait(ds_ready, i & 1)
            dq = warpgroup_mma(ds_smem.index(z).permute((1, 0)), k_smem.index(z), q0, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_smem.index(1 + z).permute((1, 0)), k_smem.index(1 + z), dq, is_async=True)
            dq, dk0 = warpgroup_mma_wait(0, deps=[dq, dk0])
            _release(ds_free, q_free, do_free, slot)
            _add_dq(dq, dq_smem, dq_desc, i // 2, bh, q_start, N_QUERIES, WG, CHUNKS, BLOCK_M, DQ_BUFFERS)
        else:  # not this warpgroup's turn: it does not read dS from shared memory
            dk0 = warpgroup_mma(ds_a, q_ring.index(slot), dk0, is_async=True)
            mbarrier.arrive(ds_free, count=1)
            dk0 = warpgroup_mma_wait(0, deps=[dk0])
            mbarrier.arrive(q_free.index(slot), count=1)
            mbarrier.arrive(do_free.index(slot), count=1)
        return dk0, dk1, dv0, dv1

    @gluon.jit
    def _bwd_partition(work, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr):
        """Warpgroup WG: keys k_start + 64 WG ... + 63 against every query tile that sees them. work:
        what both warpgroups share (outputs, scale, masked tiles, sizes, loads, exchange)."""
        outs, scale, n_masked, sizes, loads, exchange = work
        bh, k_start, q_lo, n_q_tiles, N_QUERIES, N_KEYS, N_SEQS = sizes
        DK, DV, DQ, HEADS, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn = outs
        sdkb, sdkh, sdkn = sdkb // 8 * 8, sdkh // 8 * 8, sdkn // 8 * 8  # as they are, known to be whole 16 bytes
        sdvb, sdvh, sdvn = sdvb // 8 * 8, sdvh // 8 * 8, sdvn // 8 * 8
        acc_layout: gl.constexpr = _acc_layout(64)
        dk0 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        dk1 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        dv0 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        dv1 = gl.zeros([64, 64], gl.float32, layout=acc_layout)
        k_pos = k_start + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, _acc_layout(BLOCK_M)))
        qk_scale = scale * 1.4426950408889634
        f32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        rows = N_SEQS * gl.cdiv(N_QUERIES, BLOCK_M) * (D // 64) * 16  # 64 x 64 blocks of 16 x 256 in fragment order
        dq_desc = tma.make_tensor_descriptor(DQ, [rows, 256], [256, 1], [16, 256], f32)
        mbarrier.wait(loads[6], 0)  # kv_ready
        accs = (dk0, dk1, dv0, dv1)
        for i in range(0, n_masked):
            accs = _bwd_step(i, accs, sizes, loads, exchange, dq_desc, k_pos, qk_scale, WG, True)
        for i in range(n_masked, n_q_tiles):
            accs = _bwd_step(i, accs, sizes, loads, exchange, dq_desc, k_pos, qk_scale, WG, False)
        dk0, dk1, dv0, dv1 = accs
        tma.store_wait(0)
        rows = k_start + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, acc_layout))
        b, h = (bh // HEADS).to(gl.int64), (bh % HEADS).to(gl.int64)
        dk_at = b * sdkb + h * sdkh + rows[:, None].to(gl.int64) * sdkn + cols[None, :]  # in K's layout
        dv_at = b * sdvb + h * sdvh + rows[:, None].to(gl.int64) * sdvn + cols[None, :]
        keep = (rows < N_KEYS)[:, None]
        gl.store(DK + dk_at, (dk0 * scale).to(DK.dtype.element_ty), mask=keep)
        gl.store(DV + dv_at, dv0.to(DV.dtype.element_ty), mask=keep)
        if D == 128:
            gl.store(DK + dk_at + 64, (dk1 * scale).to(DK.dtype.element_ty), mask=keep)
            gl.store(DV + dv_at + 64, dv1.to(DV.dtype.element_ty), mask=keep)

    @gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "GROUP", "HEADS", "Q_PER_KV", *STRIDES])
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
        GROUP,
        HEADS,
        Q_PER_KV,
        stride_qb,
        stride_qh,
        stride_qn,
        stride_kb,
        stride_kh,
        stride_kn,
        stride_vb,
        stride_vh,
        stride_vn,
        stride_dob,
        stride_doh,
        stride_don,
        stride_dkb,
        stride_dkh,
        stride_dkn,
        stride_dvb,
        stride_dvh,
        stride_dvn,
        scale,
        D: gl.constexpr,
        BLOCK_M: gl.constexpr,
        STAGES: gl.constexpr,
        DQ_BUFFERS: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        REGISTERS: gl.constexpr,
        ORDER: gl.constexpr,
    ):
        CHUNKS: gl.constexpr = D // 64
        pid = gl.program_id(0)
        n_key_blocks = gl.cdiv(N_KEYS, 128)
        if ORDER == SEQUENCE_MINOR:  # programs side by side take different sequences
            bh = pid % N_SEQS
            key_block = pid // N_SEQS
        elif ORDER == GROUPED:  # GROUP sequences side by side (fewer in the last group), key block by key block
            first = pid // (GROUP * n_key_blocks) * GROUP
            size = gl.minimum(GROUP, N_SEQS - first)
            within = pid - first * n_key_blocks
            bh = first + within % size
            key_block = within // size
        else:  # programs side by side take one sequence's key blocks
            bh = pid // n_key_blocks
            key_block = pid % n_key_blocks
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
        f32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        dtype: gl.constexpr = Q.dtype.element_ty
        k_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, 64, 64], layout)
        v_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, 64, 64], layout)
        q_ring = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_M, 64], layout)
        do_ring = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_M, 64], layout)
        flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
        l2_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], flat)  # L_i * log2(e), with Q_i
        delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], flat)  # D_i, with dO_i
        ds_smem = gl.allocate_shared_memory(dtype, [2, 64, BLOCK_M], layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFFERS, 16, 256], f32)
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
        loads = (k_smem, v_smem, q_ring, do_ring, l2_ring, delta_ring, kv_ready, q_ready, q_free, do_ready, do_free)
        exchange = (ds_smem, ds_ready, ds_free, dq_smem)  # the warpgroups' dS^T, and dQ's staging
        outs = (DK, DV, DQ, HEADS, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn)
        work = (outs, scale, n_masked, sizes, loads, exchange)
        q_strides, k_strides = (stride_qb, stride_qh, stride_qn), (stride_kb, stride_kh, stride_kn)
        v_strides, do_strides = (stride_vb, stride_vh, stride_vn), (stride_dob, stride_doh, stride_don)
        strides = (HEADS, Q_PER_KV, q_strides, k_strides, v_strides, do_strides)
        gl.warp_specialize(
            [
                (_bwd_partition, (work, 0, D, BLOCK_M)),
                (_bwd_partition, (work, 1, D, BLOCK_M)),
                (_bwd_load, (Q, K, V, DO, L2, DELTA, sizes, strides, loads, D, BLOCK_M)),
            ],
            [4, 1],  # warps: warpgroup 1, the loader
            [REGISTERS, 24],  # registers per thread: warpgroup 1, the loader
        )


@triton.jit(do_not_specialize=["N_QUERIES", "N_SEQS", "HEADS", *PREPARE_STRIDES])
def _bwd_prepare(
    O,
    DO,
    L,
    L2,
    DELTA,
    DQ,
    N_QUERIES,
    N_SEQS,
    HEADS,
    stride_ob,
    stride_oh,
    stride_on,
    stride_dob,
    stride_doh,
    stride_don,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Per query tile: D_i = rowsum(dO_i * O_i) and L_i * log2(e), zeros past N_QUERIES up to a whole
    tile (the Gluon kernel reads them without masks), and zeros into the float32 dQ. O and dO are read
    where they lie, each with its (batch, head, row) strides."""
    pid = tl.program_id(0)
    tile_m = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    keep = rows < N_QUERIES
    b, h, r = bh // HEADS, bh % HEADS, rows[:, None].to(tl.int64)
    stride_ob, stride_oh, stride_on = stride_ob // 8 * 8, stride_oh // 8 * 8, stride_on // 8 * 8  # whole 16 bytes
    stride_dob, stride_doh, stride_don = stride_dob // 8 * 8, stride_doh // 8 * 8, stride_don // 8 * 8
    o = tl.load(O + b * stride_ob + h * stride_oh + r * stride_on + cols[None, :], mask=keep[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + r * stride_don + cols[None, :], mask=keep[:, None], other=0.0)
    o, do = o.to(tl.float32), do.to(tl.float32)
    padded = bh * tl.cdiv(N_QUERIES, BLOCK_M) * BLOCK_M + rows
    tl.store(DELTA + padded, tl.sum(o * do, axis=1))
    lse = tl.load(L + bh * N_QUERIES + rows, mask=keep, other=0.0)
    tl.store(L2 + padded, lse * 1.4426950408889634)
    block = (bh * tl.cdiv(N_QUERIES, BLOCK_M) + tile_m) * BLOCK_M * D  # the float32 dQ in fragment order
    tl.store(DQ + block + tl.arange(0, BLOCK_M)[:, None] * D + cols[None, :], tl.zeros([BLOCK_M, D], tl.float32))


@triton.jit(do_not_specialize=["N_QUERIES", "N_SEQS", "HEADS", *CONVERT_STRIDES])
def _dq_convert(
    DQ32,
    DQ,
    N_QUERIES,
    N_SEQS,
    HEADS,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """dQ = scale * (the float32 sum), in the inputs' dtype, per query tile: the sum's 64 x 64 blocks
    are in the fragment order _fragment_order wrote them in; dQ is written with its own (batch,
    head, row) strides."""
    pid = tl.program_id(0)
    tile_m = pid // N_SEQS
    bh = (pid % N_SEQS).to(tl.int64)
    r = tl.arange(0, BLOCK_M)[:, None]
    c = tl.arange(0, D)[None, :]
    cc = c % 64
    e = (cc >> 3) << 9 | (r >> 4) << 7 | (r & 7) << 4 | ((cc >> 1) & 3) << 2 | ((r >> 3) & 1) << 1 | (cc & 1)
    block = (bh * tl.cdiv(N_QUERIES, BLOCK_M) + tile_m) * BLOCK_M * D
    dq = tl.load(DQ32 + block + (c // 64) * 4096 + e) * scale
    rows = tile_m * BLOCK_M + r
    stride_dqb, stride_dqh, stride_dqn = stride_dqb // 8 * 8, stride_dqh // 8 * 8, stride_dqn // 8 * 8  # whole 16 bytes
    at = (bh // HEADS) * stride_dqb + (bh % HEADS) * stride_dqh + rows.to(tl.int64) * stride_dqn + c
    tl.store(DQ + at, dq.to(DQ.dtype.element_ty), mask=rows < N_QUERIES)


@triton.jit(do_not_specialize=["N_KEYS", "KV_HEADS", "Q_PER_KV", *SUM_STRIDES])
def _group_sum(DK_H, DV_H, DK, DV, N_KEYS, KV_HEADS, Q_PER_KV,
               stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
               D: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Grouped heads, per tile of BLOCK_N keys of one key/value head: dK and dV, the sums of its
    Q_PER_KV query heads' (DK_H, DV_H: contiguous (batch, query head, key, D), the group's query
    heads one after another), added in float32 and rounded once, written with their own (batch,
    head, row) strides."""
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N_KEYS, BLOCK_N)
    seq = (pid // n_tiles).to(tl.int64)  # batch * KV_HEADS + key/value head
    r = ((pid % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N))[:, None].to(tl.int64)
    c = tl.arange(0, D)[None, :]
    keep = r < N_KEYS
    at = seq * Q_PER_KV * N_KEYS * D + r * D + c  # in the group's first query head
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for _ in range(Q_PER_KV):
        dk += tl.load(DK_H + at, mask=keep, other=0.0).to(tl.float32)
        dv += tl.load(DV_H + at, mask=keep, other=0.0).to(tl.float32)
        at += N_KEYS * D
    b, h = seq // KV_HEADS, seq % KV_HEADS
    stride_dkb, stride_dkh, stride_dkn = stride_dkb // 8 * 8, stride_dkh // 8 * 8, stride_dkn // 8 * 8  # whole 16 bytes
    stride_dvb, stride_dvh, stride_dvn = stride_dvb // 8 * 8, stride_dvh // 8 * 8, stride_dvn // 8 * 8
    tl.store(DK + b * stride_dkb + h * stride_dkh + r * stride_dkn + c, dk.to(DK.dtype.element_ty), mask=keep)
    tl.store(DV + b * stride_dvb + h * stride_dvh + r * stride_dvn + c, dv.to(DV.dtype.element_ty), mask=keep)


def from_fragment_order(dq32, n_q):
    """The float32 dQ sum (n_seqs, whole query tiles, D, in fragment order) in row order, (n_seqs,
    n_q, D): _dq_convert's reordering in torch (without its scale and cast), for the tests and for
    reading the layout."""
    n_seqs, padded, d = dq32.shape
    split, order = FRAGMENT_SPLIT, FRAGMENT_ORDER
    blocks = dq32.reshape(n_seqs, padded // 64, d // 64, *(split[i] for i in order))
    back = [3 + order.index(i) for i in range(7)]  # the inverse of FRAGMENT_ORDER
    rows = blocks.permute(0, 1, *back, 2).reshape(n_seqs, padded // 64, 64, 64, d // 64)
    return rows.transpose(3, 4).reshape(n_seqs, padded, d)[:, :n_q]


def supported(q):
    """Whether this backward can run q's call: its own Gluon imports found, and a call the forward takes
    (gluon_attention.supported: compiled, bf16 or fp16, D = 64 or 128, on a Hopper GPU)."""
    return HAVE_GLUON and gluon_attention.supported(q)


def constexprs(d, is_causal, order=None, n_q=0):
    """_attn_bwd_gluon's compile-time arguments for head dim d, the programs in `order` (by default
    default_order(is_causal, n_q))."""
    order = default_order(is_causal, n_q) if order is None else order
    return dict(
        D=d,
        BLOCK_M=BLOCK_M,
        STAGES=STAGES,
        DQ_BUFFERS=DQ_BUFFERS,
        IS_CAUSAL=is_causal,
        REGISTERS=REGISTERS,
        ORDER=order,
    )


def group_size(n_seqs, n_q, d, l2_budget=L2_BUDGET):
    """How many sequences GROUPED puts side by side: as many as have Q and dO (bf16 or fp16) and
    the float32 dQ sum, n_q * d * 8 bytes each, within l2_budget; at least one, at most n_seqs."""
    return min(max(l2_budget // (n_q * d * 8), 1), n_seqs)


def _triton_path(kernel):
    """kernel as a launcher with Launch's call signature (key, grid, *args, **constexprs), through
    Triton's own launch path (the key is not needed there)."""
    return lambda key, grid, *args, **constexprs: kernel[lambda meta: (grid(meta),)](*args, **constexprs)


class Plan:
    """What the backward's launches need that the shapes alone fix, worked out once: the
    programs of each launch, their keys and arguments, the compile-time constants. A repeated call
    of the same shapes (a training loop) reuses it and pays only for its allocations and launches.

    q_shape, k_shape: the shapes of the caller's Q and K, (BH, N, D) or (..., N, D), K with as many
    heads as Q or fewer (grouped heads); the gradients come back in them. order: ORDER's program
    order (None: default_order)."""

    def __init__(self, q_shape, k_shape, device, dtype, is_causal, order=None, l2_budget=L2_BUDGET):
        n_q, n_k, d = q_shape[-2], k_shape[-2], q_shape[-1]
        n_seqs = math.prod(q_shape[:-2])
        self.device, self.dtype = device, dtype
        self.q_shape, self.k_shape = tuple(q_shape), tuple(k_shape)
        self.stats_shape = (2, n_seqs, -(-n_q // BLOCK_M) * BLOCK_M)  # L * log2(e) and D_i, whole tiles
        self.dq32_shape = (n_seqs, -(-n_q // BLOCK_M) * BLOCK_M, d)  # whole tiles, in fragment order
        self.meta = constexprs(d, is_causal, order, n_q)
        n_prepare, n_main = -(-n_q // BLOCK_M) * n_seqs, -(-n_k // BLOCK_N) * n_seqs
        self.prepare = ((device, dtype, d), lambda _: n_prepare, (n_q, n_seqs), dict(D=d, BLOCK_M=BLOCK_M))
        group = group_size(n_seqs, n_q, d, l2_budget)  # used by ORDER == GROUPED only
        self.main = ((device, dtype, d, is_causal, int(self.meta["ORDER"])), lambda _: n_main)
        self.main_args = (n_q, n_k, n_seqs, group)
        self.q_per_kv = n_seqs // math.prod(k_shape[:-2])  # grouped heads: query heads per key/value head
        self.scale = d**-0.5
        self.convert = ((device, dtype, d), lambda _: n_prepare, (n_q, n_seqs), dict(D=d, BLOCK_M=BLOCK_M))
        rows = 4096 // d  # keys per _group_sum program: 64 x 64 or 32 x 128 float32 sums of dK and of dV
        n_sum = -(-n_k // rows) * math.prod(k_shape[:-2])
        self.sums = ((device, dtype, d), lambda _: n_sum, dict(D=d, BLOCK_N=rows))

    def run(self, q, k, v, o, do, lse, launchers):
        """dQ, dK, dV (shaped like the plan's Q and K, laid out as q, k and v where those are dense) of
        q, k, v, o, do (the plan's shapes, any strides: gluon_attention.heads reads them in place or
        copies them) and a contiguous lse, with launchers as launch() takes them. Grouped heads: the
        kernel makes dK and dV per query head, and _group_sum sums them over each group."""
        prepare, main, convert, *rest = launchers
        K, V = k, v
        (q, sq), (k, sk), (v, sv), (o, so), (do, sdo) = (gluon_attention.heads(t) for t in (q, k, v, o, do))
        n_heads = q.shape[1]
        stats = torch.empty(self.stats_shape, dtype=torch.float32, device=self.device)
        dq32 = torch.empty(self.dq32_shape, dtype=torch.float32, device=self.device)
        lse2, delta = stats[0], stats[1]
        grouped = self.q_per_kv > 1  # dK and dV made per query head, summed over each group below
        if grouped:  # one buffer for both, (2, batch, query head, key, D)
            grads = k.new_empty((2, *q.shape[:2], *k.shape[2:])).unbind()
        else:
            grads = torch.empty_like(k), torch.empty_like(v)
        (dk, sdk), (dv, sdv) = (gluon_attention.heads(g) for g in grads)
        dq, sdq = gluon_attention.heads(torch.empty_like(q))
        wide = gluon_attention.stride_key((), (*sq, *sk, *sv, *so, *sdo, *sdk, *sdv, *sdq))  # 64-bit: other binaries
        key, grid, args, meta = self.prepare
        prepare((*key, *wide), grid, o, do, lse, lse2, delta, dq32, *args, n_heads, *so, *sdo, **meta)
        key, grid = self.main
        strides = (*sq, *sk, *sv, *sdo, *sdk, *sdv)
        tensors = (q, k, v, do, lse2, delta, dk, dv, dq32)
        main((*key, *wide), grid, *tensors, *self.main_args, n_heads, self.q_per_kv, *strides, self.scale, **self.meta)
        key, grid, args, meta = self.convert
        convert((*key, *wide), grid, dq32, dq, *args, n_heads, *sdq, self.scale, **meta)
        if grouped:  # summed into K's and V's layouts (a model's transposed heads: no copy)
            group_sum = rest[0] if rest else _triton_path(_group_sum)
            dk_h, dv_h = dk, dv
            (dk, sdk), (dv, sdv) = (gluon_attention.heads(torch.empty_like(t)) for t in (K, V))
            key, grid, meta = self.sums
            wide = gluon_attention.stride_key((), (*sdk, *sdv))
            sizes = (self.k_shape[-2], k.shape[1], self.q_per_kv)
            group_sum((*key, *wide), grid, dk_h, dv_h, dk, dv, *sizes, *sdk, *sdv, **meta)
        return dq.view(self.q_shape), dk.view(self.k_shape), dv.view(self.k_shape)


def launch(q, k, v, o, do, lse, is_causal, order=None, launchers=None, l2_budget=L2_BUDGET):
    """dQ, dK, dV of (BH, N, D) contiguous tensors in three launches: _bwd_prepare, _attn_bwd_gluon,
    _dq_convert, and with grouped heads a fourth, _group_sum (a Plan for these shapes, used once).
    launchers: those as callables with the signature of part 5's Launch (flash_backward passes its
    own, which skip Triton's per-call Python; _group_sum's may be left out); None: Triton's own
    launch path (the studies and tests). l2_budget: what GROUPED fits a group of sequences in (group_size)."""
    kernels = (_bwd_prepare, _attn_bwd_gluon, _dq_convert, _group_sum)
    launchers = launchers or [_triton_path(kernel) for kernel in kernels]
    plan = Plan(q.shape, k.shape, q.device, q.dtype, is_causal, order, l2_budget)
    return plan.run(q, k, v, o, do, lse, launchers)
