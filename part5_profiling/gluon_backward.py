"""Part 5's Hopper backward in Gluon: dK, dV and dQ from one pass over the scores, as FlashAttention-3
does it: five matrix products per pair of tiles, where part 4's two kernels make seven. It is built
an idea at a time (steps/, make diff PART=5 STEP=bwd1, STEP=bwd2, ...), each step adding its line:

- bwd1: one pass, one step at a time. A program owns 64 keys (one warpgroup, one wgmma M) and
  walks the query tiles that see them: K and V copied once by TMA, then for each tile of 64 queries
  Q_i and dO_i: S^T = K Q_i^T, P^T = exp2(S^T * scale * log2(e) - L_i * log2(e)), dV += P^T dO_i
  (P^T in registers as wgmma's A operand), dP^T = V dO_i^T, dS^T = P^T (dP^T - D_i), dK += dS^T Q_i;
  dK and dV stay in registers for the whole walk. dQ_i = dS K sums over every key: the program
  adds its keys' share into a float32 dQ with atomic adds, so dQ's last bits depend on the order
  the adds arrive (part 4's two kernels are bitwise repeatable). A small tl kernel first writes
  D_i = rowsum(dO_i * O_i) and L_i * log2(e), padded with zeros to whole query tiles (no masks in
  the inner loop), and zeroes the float32 dQ; another writes dQ in Q's dtype (times the scale).
- bwd2: a loader warp and rings (the forward's fwd2): the loader brings K and V once, then Q_i with
  L_i * log2(e) and dO_i with D_i into rings of STAGES buffers, each statistic on its tile's barrier.
- bwd3: products in flight (the forward's fwd3): S^T and dP^T are issued together and P^T is made
  while dP^T runs; dV += P^T dO_i runs while dS^T is made, dK += dS^T Q_i while dQ_i is.
- bwd4: two warpgroups share the rings (the forward's fwd4): a program owns 128 keys, 64 each, and
  dQ_i sums both halves of dS: each warpgroup puts its dS^T in shared memory (a Ring both fill and
  both read), at D = 128 warpgroup w makes dQ's columns 64w ... 64w + 63, at D = 64 its own keys'
  share, and adds its 64 x 64 block into the float32 dQ with one TMA reduce-add
  (cp.reduce.async.bulk: the add happens in L2, with no atomic instruction per element).
- bwd5: the float32 dQ in fragment order, as FlashAttention-3 keeps its dQ accumulator: each
  64 x 64 block in the order a warpgroup's registers hold it (_fragment_order), so that a thread
  stores its values four at a time to consecutive addresses, with no swizzle to work out and no
  bank conflicts, and the TMA add copies 16 KB as they lie; the last kernel puts the rows back.
- bwd6: registers. At D = 128 a warpgroup's dK and dV (four 64 x 64 float32 accumulators) take 128
  of its 240 registers, S^T and dP^T 64 more: what the compiler hoists out of the loop (the wgmma
  descriptors of K's, V's and dS^T's buffers, one per 16-column step) then spilled to local memory
  and was loaded back before each product. The loop indexes those buffers with a zero the
  compiler cannot see (z), so they are worked out where they are used: fewer spills.
- bwd7: at D = 64 the warpgroups take turns making dQ_i from both halves of dS: one add per query
  tile, not one per warpgroup.
- bwd8: the order of the programs (ORDER, default_order): which rows are in L2 when the adds arrive.
- model2: the host path: what a call's launches need that the shapes fix, worked out once (Plan),
  and launchers that skip Triton's per-call Python (flash_attention.py passes fast_launch's).
- model3: grouped key/value heads read where they are: the loader takes query head h's K and V from
  key/value head h // Q_PER_KV, so K and V are not repeated for each group; dK and dV are made per
  query head and summed over each group after (Plan.run).
- model4: heads read and written where they lie (the forward's model4): Q, K, V, O and dO through
  4-D descriptors or addresses with their own (batch, head, row) strides, and dQ, dK, dV written in
  the layout of Q, K and V, so a model's transposed heads are not copied on the way in or out.
- model6: the group's sum in one launch (_group_sum): dK's and dV's together, added in float32 and
  rounded once, written in K's and V's layouts, where two torch.sum calls made two launches.

Tiles are split in 64-column chunks (one 128-byte swizzle row of 16-bit elements): dQ is made 64
columns at a time. GPU only (sm_90); flash_attention.py keeps part 4's kernels for every other call
and under torch.use_deterministic_algorithms(True), since this kernel's dQ bits vary.
"""

import math

import torch
import triton
import triton.language as tl

from part5_profiling import gluon_attention
from part5_profiling.hopper import (
    Ring,
    acc_layout,
    aggregate,
    fence_async_shared,
    gl,
    gluon,
    heads_descriptor,
    swizzled,
    tma,
    tma_add,
    tma_load,
    warpgroup_mma,
    warpgroup_mma_wait,
)

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
# and grouped from there (faster than sequence-minor: the log's "The Gluon backward").
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


@aggregate
class Config:
    """What both warpgroups and the loader know: the lengths and scale, and this program's work: its
    sequence and keys, the query tiles that see them, how many of those (from the first) need a mask."""

    N_QUERIES: gl.tensor
    N_KEYS: gl.tensor
    N_SEQS: gl.tensor
    HEADS: gl.tensor  # heads per batch: sequence bh is batch bh // HEADS, head bh % HEADS
    Q_PER_KV: gl.tensor  # grouped heads: query head h reads key/value head h // Q_PER_KV
    scale: gl.tensor
    bh: gl.tensor
    k_start: gl.tensor  # the program's first key: warpgroup w takes k_start + 64 w ... + 63
    q_lo: gl.tensor  # the first query tile's first row
    n_q_tiles: gl.tensor
    n_masked: gl.tensor
    D: gl.constexpr
    BLOCK_M: gl.constexpr  # queries per tile
    CHUNKS: gl.constexpr  # 64-column chunks of a row: D // 64

    @gluon.constexpr_function
    def __init__(self, N_QUERIES, N_KEYS, N_SEQS, HEADS, Q_PER_KV, scale, bh, k_start, q_lo, n_q_tiles, n_masked,
                 D, BLOCK_M):  # fmt: skip
        self.N_QUERIES = N_QUERIES
        self.N_KEYS = N_KEYS
        self.N_SEQS = N_SEQS
        self.HEADS = HEADS
        self.Q_PER_KV = Q_PER_KV
        self.scale = scale
        self.bh = bh
        self.k_start = k_start
        self.q_lo = q_lo
        self.n_q_tiles = n_q_tiles
        self.n_masked = n_masked
        self.D = gl.constexpr(D)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.CHUNKS = gl.constexpr(D // 64)


@aggregate
class Smem:
    """The program's shared memory. k, v: its 128 keys and values, chunk c of warpgroup w's rows part
    2c + w (one stage, loaded once). q, do: rings of Q_i and dO_i, a 64-column chunk a part, with
    their row statistics L_i * log2(e) and D_i (l2, delta: a stage's row each), which land on the
    same barriers. ds: both warpgroups' dS^T (part w: warpgroup w's), exchanged for dQ. dq: the
    float32 dQ tiles on their way to TMA's add, DQ_BUFFERS per warpgroup."""

    k: Ring
    v: Ring
    q: Ring
    do: Ring
    l2: gl.shared_memory_descriptor
    delta: gl.shared_memory_descriptor
    ds: Ring
    dq: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, k, v, q, do, l2, delta, ds, dq):
        self.k = k
        self.v = v
        self.q = q
        self.do = do
        self.l2 = l2
        self.delta = delta
        self.ds = ds
        self.dq = dq


@gluon.jit
def _load_tile(ring, stats, c, desc, stat_desc, b, h, q_start, stat_at, CHUNKS: gl.constexpr):
    """Query tile c of a ring, once its stage is free: a 16-bit tile (Q_i or dO_i) in 64-column
    chunks and its row statistic (L_i * log2(e) or D_i), all on the stage's one barrier."""
    nbytes: gl.constexpr = CHUNKS * desc.block_type.nbytes + stat_desc.block_type.nbytes
    _, ready = ring.fill(c, nbytes)
    for part in gl.static_range(CHUNKS):
        tma_load(desc, [b, h, q_start, part * 64], ready, ring.buffer(c, part).reshape(desc.block_type.shape))
    tma_load(stat_desc, [stat_at], ready, stats.index(c.index()))


@gluon.jit
def _bwd_load(cfg, smem, Q, K, V, DO, L2, DELTA, q_strides, k_strides, v_strides, do_strides):
    """One warp: the program's K and V (once), then Q_i with L_i * log2(e), and dO_i with D_i, each as
    soon as its buffers are free. 4-D descriptors read each tensor where it lies, given its (batch,
    head, row) strides; query head h reads key/value head h // Q_PER_KV."""
    D: gl.constexpr = cfg.D
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    n_b = cfg.N_SEQS // cfg.HEADS
    q_desc = heads_descriptor(Q, [n_b, cfg.HEADS, cfg.N_QUERIES, D], q_strides, [1, 1, BLOCK_M, 64])
    do_desc = heads_descriptor(DO, [n_b, cfg.HEADS, cfg.N_QUERIES, D], do_strides, [1, 1, BLOCK_M, 64])
    n_kv = cfg.HEADS // cfg.Q_PER_KV
    k_desc = heads_descriptor(K, [n_b, n_kv, cfg.N_KEYS, D], k_strides, [1, 1, 64, 64])
    v_desc = heads_descriptor(V, [n_b, n_kv, cfg.N_KEYS, D], v_strides, [1, 1, 64, 64])
    b, h = cfg.bh // cfg.HEADS, cfg.bh % cfg.HEADS
    # the row statistics, padded to whole query tiles: one flat float32 vector each
    padded = gl.cdiv(cfg.N_QUERIES, BLOCK_M) * BLOCK_M
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    l2_desc = tma.make_tensor_descriptor(L2, [cfg.N_SEQS * padded], [1], [BLOCK_M], flat)
    delta_desc = tma.make_tensor_descriptor(DELTA, [cfg.N_SEQS * padded], [1], [BLOCK_M], flat)
    kv = smem.k.counter()
    _, k_ready = smem.k.fill(kv, 2 * cfg.CHUNKS * k_desc.block_type.nbytes)  # keys past N_KEYS: zeros, and count
    _, v_ready = smem.v.fill(kv, 2 * cfg.CHUNKS * v_desc.block_type.nbytes)
    for part in gl.static_range(cfg.CHUNKS):  # chunk c of warpgroup w's keys: part 2c + w
        for w in gl.static_range(2):
            k_at = [b, h // cfg.Q_PER_KV, cfg.k_start + w * 64, part * 64]
            tma_load(k_desc, k_at, k_ready, smem.k.buffer(kv, part * 2 + w).reshape(k_desc.block_type.shape))
            tma_load(v_desc, k_at, v_ready, smem.v.buffer(kv, part * 2 + w).reshape(v_desc.block_type.shape))
    for i in range(cfg.n_q_tiles):
        q_start = cfg.q_lo + i * BLOCK_M
        stat_at = cfg.bh * padded + q_start
        _load_tile(smem.q, smem.l2, smem.q.at(i), q_desc, l2_desc, b, h, q_start, stat_at, cfg.CHUNKS)
        _load_tile(smem.do, smem.delta, smem.do.at(i), do_desc, delta_desc, b, h, q_start, stat_at, cfg.CHUNKS)


@gluon.jit
def _add_dq(cfg, smem, dq, dq_desc, n, q_start, WG: gl.constexpr):
    """A warpgroup's n-th dQ tile: registers -> shared memory (in fragment order) -> TMA add into
    global memory, DQ_BUFFERS staging buffers in turn."""
    DQ_BUFFERS: gl.constexpr = smem.dq.type.shape[0] // 2
    buf = (n % DQ_BUFFERS) * 2 + WG
    flat = _fragment_order(dq)
    tma.store_wait(DQ_BUFFERS - 1)  # the add that last read this buffer has read it
    smem.dq.index(buf).store(flat)
    fence_async_shared()
    block = (cfg.bh * gl.cdiv(cfg.N_QUERIES, cfg.BLOCK_M) + q_start // cfg.BLOCK_M) * cfg.CHUNKS
    block += WG * (cfg.CHUNKS - 1)
    tma_add(dq_desc, [block * 16, 0], smem.dq.index(buf))


@gluon.jit
def _bwd_step(cfg, smem, i, dk0, dk1, dv0, dv1, dq_desc, k_pos, qk_scale, WG: gl.constexpr, MASKED: gl.constexpr):
    """Query tile i against this warpgroup's 64 keys: dK and dV accumulate in
    registers (two 64-column chunks each at D = 128), dQ_i's share goes out by TMA."""
    CHUNKS: gl.constexpr = cfg.CHUNKS
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    s_layout: gl.constexpr = acc_layout(BLOCK_M)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv0.type.layout, k_width=2)
    s0 = gl.zeros([64, BLOCK_M], gl.float32, layout=s_layout)
    q_start = cfg.q_lo + i * BLOCK_M
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    stat_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query (column of S^T)
    c = smem.q.at(i)  # Q_i's and dO_i's place in their rings
    kv = smem.k.counter()
    dc = smem.ds.at(i)  # dS^T's exchange: one stage, used once per query tile

    # K's, V's and dS^T's buffers are indexed with z, zero but not to the compiler: hoisted out of
    # the loop, their wgmma descriptors and store addresses (one per 16-column step) were held in
    # registers across it, and spilled at D = 128.
    z = i >> 30  # 0: there are fewer than 2**30 query tiles
    smem.q.wait(c)
    k0 = smem.k.buffer(kv, WG + z)
    s = warpgroup_mma(k0, smem.q.buffer(c, 0).permute((1, 0)), s0, use_acc=False, is_async=True)
    if CHUNKS == 2:
        k1 = smem.k.buffer(kv, 2 + WG + z)
        s = warpgroup_mma(k1, smem.q.buffer(c, 1).permute((1, 0)), s, is_async=True)
    l_2 = smem.l2.index(c.index()).load(stat_layout)  # came with Q_i: shared memory, not global
    smem.do.wait(c)
    v0 = smem.v.buffer(kv, WG + z)
    dp = warpgroup_mma(v0, smem.do.buffer(c, 0).permute((1, 0)), s0, use_acc=False, is_async=True)
    if CHUNKS == 2:
        v1 = smem.v.buffer(kv, 2 + WG + z)
        dp = warpgroup_mma(v1, smem.do.buffer(c, 1).permute((1, 0)), dp, is_async=True)
    s = warpgroup_mma_wait(CHUNKS, deps=[s])  # S^T is done (issued first); dP^T may still run
    p = gl.exp2(s * qk_scale - l_2[None, :])
    if MASKED:  # causal: the query tiles across the diagonal
        p = gl.where(k_pos[:, None] <= (q_start + cols)[None, :], p, 0.0)
    p16 = gl.convert_layout(p.to(smem.q.buffers.dtype), a_layout)
    dv0 = warpgroup_mma(p16, smem.do.buffer(c, 0), dv0, is_async=True)  # dV += P^T dO
    if CHUNKS == 2:
        dv1 = warpgroup_mma(p16, smem.do.buffer(c, 1), dv1, is_async=True)
    if CHUNKS == 2:  # all done: P^T's registers are free again
        dp, dv0, dv1 = warpgroup_mma_wait(0, deps=[dp, dv0, dv1])
    else:
        dp, dv0 = warpgroup_mma_wait(0, deps=[dp, dv0])
    delta = smem.delta.index(c.index()).load(stat_layout)  # came with dO_i
    ds = (p * (dp - delta[None, :])).to(smem.q.buffers.dtype)  # dS^T, unscaled

    # dS^T into shared memory for dQ, once both warpgroups are done with the last one
    smem.ds.acquire(dc)
    smem.ds.buffer(dc, WG + z).store(ds)
    fence_async_shared()
    smem.ds.commit(dc)
    ds_a = gl.convert_layout(ds, a_layout)
    # dQ_i = dS K: at D = 128 warpgroup w makes columns 64w ... 64w + 63 from both halves of dS (both
    # warpgroups' keys); at D = 64 the warpgroups take turns, each making every other dQ_i from both
    # halves: one add per query tile, not two
    q0 = gl.zeros([BLOCK_M, 64], gl.float32, layout=acc_layout(64))
    if CHUNKS == 2:
        dk0 = warpgroup_mma(ds_a, smem.q.buffer(c, 0), dk0, is_async=True)  # dK += dS^T Q
        dk1 = warpgroup_mma(ds_a, smem.q.buffer(c, 1), dk1, is_async=True)
        smem.ds.wait(dc)
        ds0, ds1 = smem.ds.buffer(dc, z).permute((1, 0)), smem.ds.buffer(dc, 1 + z).permute((1, 0))
        dq = warpgroup_mma(ds0, smem.k.buffer(kv, WG * 2 + z), q0, use_acc=False, is_async=True)
        dq = warpgroup_mma(ds1, smem.k.buffer(kv, WG * 2 + 1 + z), dq, is_async=True)
        dq, dk0, dk1 = warpgroup_mma_wait(0, deps=[dq, dk0, dk1])
        smem.ds.release(dc)
        smem.q.release(c)
        smem.do.release(c)
        _add_dq(cfg, smem, dq, dq_desc, i, q_start, WG)
    elif i % 2 == WG:
        dk0 = warpgroup_mma(ds_a, smem.q.buffer(c, 0), dk0, is_async=True)
        smem.ds.wait(dc)
        ds0, ds1 = smem.ds.buffer(dc, z).permute((1, 0)), smem.ds.buffer(dc, 1 + z).permute((1, 0))
        dq = warpgroup_mma(ds0, smem.k.buffer(kv, z), q0, use_acc=False, is_async=True)
        dq = warpgroup_mma(ds1, smem.k.buffer(kv, 1 + z), dq, is_async=True)
        dq, dk0 = warpgroup_mma_wait(0, deps=[dq, dk0])
        smem.ds.release(dc)
        smem.q.release(c)
        smem.do.release(c)
        _add_dq(cfg, smem, dq, dq_desc, i // 2, q_start, WG)
    else:  # not this warpgroup's turn: it does not read dS from shared memory
        dk0 = warpgroup_mma(ds_a, smem.q.buffer(c, 0), dk0, is_async=True)
        smem.ds.release(dc)
        dk0 = warpgroup_mma_wait(0, deps=[dk0])
        smem.q.release(c)
        smem.do.release(c)
    return dk0, dk1, dv0, dv1


@gluon.jit
def _bwd_partition(cfg, smem, DK, DV, DQ, dk_strides, dv_strides, WG: gl.constexpr):
    """Warpgroup WG: keys k_start + 64 WG ... + 63 against every query tile that sees them; dK and dV
    written where K and V lie, given their (batch, head, row) strides."""
    D: gl.constexpr = cfg.D
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    acc_l: gl.constexpr = acc_layout(64)
    zero = gl.zeros([64, 64], gl.float32, layout=acc_l)
    dk0, dk1, dv0, dv1 = zero, zero, zero, zero  # dK and dV, 64 columns each (the second at D = 128)
    k_pos = cfg.k_start + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout(BLOCK_M)))
    qk_scale = cfg.scale * 1.4426950408889634
    f32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    rows = cfg.N_SEQS * gl.cdiv(cfg.N_QUERIES, BLOCK_M) * cfg.CHUNKS * 16  # 64 x 64 blocks of 16 x 256
    dq_desc = tma.make_tensor_descriptor(DQ, [rows, 256], [256, 1], [16, 256], f32)
    kv = smem.k.counter()
    smem.k.wait(kv)
    smem.v.wait(kv)
    for i in range(0, cfg.n_masked):
        dk0, dk1, dv0, dv1 = _bwd_step(cfg, smem, i, dk0, dk1, dv0, dv1, dq_desc, k_pos, qk_scale, WG, True)
    for i in range(cfg.n_masked, cfg.n_q_tiles):
        dk0, dk1, dv0, dv1 = _bwd_step(cfg, smem, i, dk0, dk1, dv0, dv1, dq_desc, k_pos, qk_scale, WG, False)
    tma.store_wait(0)
    rows = cfg.k_start + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, acc_l))
    b, h = (cfg.bh // cfg.HEADS).to(gl.int64), (cfg.bh % cfg.HEADS).to(gl.int64)
    sdkb, sdkh, sdkn = dk_strides
    sdvb, sdvh, sdvn = dv_strides
    # dK and dV in K's and V's layouts: rows of whole 16 bytes (heads() checked the strides)
    dk_at = gl.multiple_of(b * sdkb + h * sdkh + rows[:, None].to(gl.int64) * sdkn + cols[None, :], [1, 8])
    dv_at = gl.multiple_of(b * sdvb + h * sdvh + rows[:, None].to(gl.int64) * sdvn + cols[None, :], [1, 8])
    keep = (rows < cfg.N_KEYS)[:, None]
    gl.store(DK + dk_at, (dk0 * cfg.scale).to(DK.dtype.element_ty), mask=keep)
    gl.store(DV + dv_at, dv0.to(DV.dtype.element_ty), mask=keep)
    if D == 128:
        gl.store(DK + dk_at + 64, (dk1 * cfg.scale).to(DK.dtype.element_ty), mask=keep)
        gl.store(DV + dv_at + 64, dv1.to(DV.dtype.element_ty), mask=keep)


@gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "GROUP", "HEADS", "Q_PER_KV", *STRIDES])
def _attn_bwd_gluon(Q, K, V, DO, L2, DELTA, DK, DV, DQ, N_QUERIES, N_KEYS, N_SEQS, GROUP, HEADS, Q_PER_KV,
                    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, scale,
                    D: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DQ_BUFFERS: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, REGISTERS: gl.constexpr, ORDER: gl.constexpr):  # fmt: skip
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
    cfg = Config(N_QUERIES, N_KEYS, N_SEQS, HEADS, Q_PER_KV, scale, bh, k_start, q_lo, n_q_tiles, n_masked,
                 D, BLOCK_M)  # fmt: skip
    dtype: gl.constexpr = Q.dtype.element_ty
    k = Ring.alloc(dtype, [64, 64], swizzled(2), 1, 2, PARTS=2 * CHUNKS)
    v = Ring.alloc(dtype, [64, 64], swizzled(2), 1, 2, PARTS=2 * CHUNKS)
    q = Ring.alloc(dtype, [BLOCK_M, 64], swizzled(2), STAGES, 2, PARTS=CHUNKS)
    do = Ring.alloc(dtype, [BLOCK_M, 64], swizzled(2), STAGES, 2, PARTS=CHUNKS)
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    l2 = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], flat)  # L_i * log2(e), with Q_i
    delta = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], flat)  # D_i, with dO_i
    ds = Ring.alloc(dtype, [64, BLOCK_M], swizzled(2), 1, 2, PARTS=2, producers=2)  # both store, both read
    f32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    dq = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFFERS, 16, 256], f32)
    smem = Smem(k, v, q, do, l2, delta, ds, dq)
    dk_strides, dv_strides = (stride_dkb, stride_dkh, stride_dkn), (stride_dvb, stride_dvh, stride_dvn)
    q_strides, k_strides = (stride_qb, stride_qh, stride_qn), (stride_kb, stride_kh, stride_kn)
    v_strides, do_strides = (stride_vb, stride_vh, stride_vn), (stride_dob, stride_doh, stride_don)
    gl.warp_specialize(
        [
            (_bwd_partition, (cfg, smem, DK, DV, DQ, dk_strides, dv_strides, 0)),
            (_bwd_partition, (cfg, smem, DK, DV, DQ, dk_strides, dv_strides, 1)),
            (_bwd_load, (cfg, smem, Q, K, V, DO, L2, DELTA, q_strides, k_strides, v_strides, do_strides)),
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
    o_at = tl.multiple_of(b * stride_ob + h * stride_oh + r * stride_on + cols[None, :], [1, 8])  # whole 16 bytes
    do_at = tl.multiple_of(b * stride_dob + h * stride_doh + r * stride_don + cols[None, :], [1, 8])
    o = tl.load(O + o_at, mask=keep[:, None], other=0.0)
    do = tl.load(DO + do_at, mask=keep[:, None], other=0.0)
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
    at = (bh // HEADS) * stride_dqb + (bh % HEADS) * stride_dqh + rows.to(tl.int64) * stride_dqn + c
    at = tl.multiple_of(at, [1, 8])  # the strides are whole 16 bytes
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
    dk_at = tl.multiple_of(b * stride_dkb + h * stride_dkh + r * stride_dkn + c, [1, 8])  # whole 16 bytes
    dv_at = tl.multiple_of(b * stride_dvb + h * stride_dvh + r * stride_dvn + c, [1, 8])
    tl.store(DK + dk_at, dk.to(DK.dtype.element_ty), mask=keep)
    tl.store(DV + dv_at, dv.to(DV.dtype.element_ty), mask=keep)


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
