"""Part 5's Hopper forward in Gluon: FlashAttention-3's schedule, written out by hand.

Triton's compiler decides for a `tl` kernel which warps load, which multiply and when; Gluon
(`triton.experimental.gluon`) hands those decisions to the kernel. This one is built an idea at a
time (steps/, make diff PART=5 STEP=fwd1, STEP=fwd2, ...), and each step adds its line here:

- fwd1: part 4's forward in Gluon's terms. Rows of 64 queries per warpgroup (one wgmma M), TMA
  copies into shared memory, wgmma, the online softmax in registers: base-2 exponent with the scale
  folded in, masks only on the tiles that need them (the diagonal when causal, the ragged last key
  tile), L = m + log(l); causal tiles longest first.
- fwd2: a loader warp (gl.warp_specialize) only issues TMA copies: Q, then K_j and V_j into rings
  of STAGES shared-memory buffers (hopper.Ring), whose mbarriers carry the hand-offs: ready (the
  copy has landed, counted in bytes) and free (the warpgroup is done with the buffer).
- fwd3: both products in flight: step j issues S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, waits for
  S_j only (wgmma groups finish in order), computes P_j from S_j while the tensor cores multiply,
  then waits for the P V product and rescales O.
- fwd4: two softmax warpgroups at D = 128, three at D = 64 (CONFIGS) read every K_j and V_j the
  loader brings: while one computes its exponentials another keeps the tensor cores busy.
- fwd5: a persistent grid: one program per SM, each taking query tiles in turn (Config.tile), so
  the loader brings the next tile's Q, K and V while the last products and stores of one run.
- fwd6: L2-friendly order: the programs running together take GROUP sequences' tiles (group_size):
  one sequence at a time at D = 128 from SEQUENCE_MAJOR_FROM queries, so its K and V stay in L2.
- fwd7: ping-pong at D = 64 (PINGPONG): the warpgroups take turns issuing their products (Turns),
  so the products reach the tensor cores in a fixed order while the others compute exponentials.
- fwd8: O by TMA at D = 64 (O_BY_TMA): each warpgroup writes its O tile into shared memory and one
  TMA store takes it out, while the warpgroup goes on to its next query tile.
- fwd9: P packed at its product at D = 64 (PACK_LATE): P_j stays in float32 until P_j V_j is issued,
  and is packed to bf16 straight into the operand's layout there (no byte permutes in between).
- model3: grouped key/value heads: K and V hold N_SEQS / Q_PER_KV sequences, and the loader reads
  query sequence bh's keys and values from sequence bh // Q_PER_KV.
- model4: heads read where they lie. A model's Q, K and V are (B, N, H, D) in memory, seen as (B,
  H, N, D) through a transpose: 4-D descriptors with each tensor's (batch, head, row) strides load
  their tiles in place, and O is written in Q's layout, so neither side of the call copies a head.
- model5: short sequences and causal masks at D = 64 take query tiles of two warpgroups (SHORT, 128
  rows, config_for): three leave N_q = 1024 a last tile a third full, and a causal mask's tiles of
  unequal length share out more evenly among the programs in smaller pieces.

GPU only (sm_90): Gluon has no interpreter. `flash_attention.py` sends bf16 and fp16 calls on a
Hopper GPU here and keeps its `tl` forward for the rest (float32, D = 16 and 32, other GPUs,
Triton's interpreter on the CPU).
"""

import torch
import triton

from common.runtime import INTERPRET, capability, properties
from part5_profiling.hopper import (
    Ring,
    acc_layout,
    aggregate,
    fence_async_shared,
    gl,
    gluon,
    heads_descriptor,
    mbarrier,
    swizzled,
    tma,
    tma_load,
    tma_store,
    warpgroup_mma,
    warpgroup_mma_wait,
)

ROWS = 64  # query rows per softmax warpgroup: one wgmma M
BLOCK_N = 128  # keys per tile
# L2-friendly order: programs take the longest query tiles first, GROUP sequences side by side. At
# D = 128 from SEQUENCE_MAJOR_FROM queries, one sequence at a time (its query tiles side by side, as
# without a mask); otherwise every sequence at once (the programs running together take the same
# query tile of different sequences). tools/gluon_study.py --order times GROUP = 1, 2, 4, 8, 16 and
# 32 at B = 4, H = 8, N = 4096-16384 (results/h200/part5_gluon_order.csv): one sequence at a time
# is the fastest at D = 128; at D = 64 no group beats every sequence at every N.
SEQUENCE_MAJOR_FROM = 4096
# Per head dim: softmax warpgroups per program (BLOCK_M = 64 x that), K/V ring depth, registers per
# thread of each extra warpgroup (setmaxnreg; the loader keeps 24, warpgroup 0 gets the rest), and
# whether the warpgroups take turns at the tensor cores (PINGPONG): chosen by tools/gluon_study.py
# (the log's "The Gluon forward": turns pay at D = 64, not at D = 128). O_BY_TMA: O leaves through
# shared memory by a TMA store; PACK_LATE: P_j is packed to bf16 when its product is issued. Both pay
# at D = 64, not at D = 128 (gluon_study --candidates: the log's "Forward candidates tried").
CONFIGS = {
    128: dict(WARPGROUPS=2, STAGES=2, REGISTERS=232, PINGPONG=False, O_BY_TMA=False, PACK_LATE=False),
    64: dict(WARPGROUPS=3, STAGES=4, REGISTERS=160, PINGPONG=True, O_BY_TMA=True, PACK_LATE=True),
}  # smem: D = 128, Q 32 KB + 2 x (K 32 KB + V 32 KB); D = 64, Q 24 KB + 4 x (16 KB + 16 KB) + O 24 KB
# model5's tiles for short and causal calls. tools/gluon_study.py (results/h200/part5_gluon.csv): at
# D = 64 two warpgroups are the faster up to N_q = 1024 without the mask and 4096 with it.
SHORT = {64: dict(WARPGROUPS=2, STAGES=4, REGISTERS=232, PINGPONG=True, O_BY_TMA=True, PACK_LATE=True)}
SHORT_UP_TO = {False: 1024, True: 4096}  # N_q, without and with the causal mask
# The kernel's (batch, head, row) strides of Q, K, V and O, in order: run-time values like the lengths.
STRIDES = [f"stride_{t}{a}" for t in "qkvo" for a in "bhn"]


@aggregate
class Tile:
    """One query tile of a program: index (past the last tile: none), sequence, first row, key tiles
    it sees, and how many of those, from the first, need no mask."""

    idx: gl.tensor
    bh: gl.tensor
    q_start: gl.tensor
    n_tiles: gl.tensor
    n_unmasked: gl.tensor

    @gluon.constexpr_function
    def __init__(self, idx, bh, q_start, n_tiles, n_unmasked):
        self.idx = idx
        self.bh = bh
        self.q_start = q_start
        self.n_tiles = n_tiles
        self.n_unmasked = n_unmasked


@aggregate
class Config:
    """What the program knows: the lengths, the scale and the tiling."""

    N_QUERIES: gl.tensor
    N_KEYS: gl.tensor
    N_SEQS: gl.tensor
    GROUP: gl.tensor  # the L2-friendly order's sequences side by side
    HEADS: gl.tensor  # heads per batch: sequence bh is batch bh // HEADS, head bh % HEADS
    Q_PER_KV: gl.tensor  # grouped heads: query head h reads key/value head h // Q_PER_KV
    qk_scale: gl.tensor  # scale * log2(e): exp2 of S times it is exp of the scaled scores
    n_programs: gl.tensor
    n_tiles_m: gl.tensor  # query tiles per sequence
    D: gl.constexpr
    ROWS: gl.constexpr  # query rows per softmax warpgroup
    WARPGROUPS: gl.constexpr  # softmax warpgroups: a query tile is WARPGROUPS x ROWS rows
    BLOCK_N: gl.constexpr  # keys per tile
    IS_CAUSAL: gl.constexpr
    O_BY_TMA: gl.constexpr  # O through shared memory by a TMA store (else straight from registers)
    PACK_LATE: gl.constexpr  # P_j packed to bf16 when its product is issued (else when it is made)

    @gluon.constexpr_function
    def __init__(self, N_QUERIES, N_KEYS, N_SEQS, GROUP, HEADS, Q_PER_KV, qk_scale, n_programs, n_tiles_m,
                 D, ROWS, WARPGROUPS, BLOCK_N, IS_CAUSAL, O_BY_TMA, PACK_LATE):  # fmt: skip
        self.N_QUERIES = N_QUERIES
        self.N_KEYS = N_KEYS
        self.N_SEQS = N_SEQS
        self.GROUP = GROUP
        self.HEADS = HEADS
        self.Q_PER_KV = Q_PER_KV
        self.qk_scale = qk_scale
        self.n_programs = n_programs
        self.n_tiles_m = n_tiles_m
        self.D = gl.constexpr(D)
        self.ROWS = gl.constexpr(ROWS)
        self.WARPGROUPS = gl.constexpr(WARPGROUPS)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.IS_CAUSAL = gl.constexpr(IS_CAUSAL)
        self.O_BY_TMA = gl.constexpr(O_BY_TMA)
        self.PACK_LATE = gl.constexpr(PACK_LATE)

    @gluon.jit
    def rounds(self):
        """The rounds of tiles a program takes: every program has a tile in each but the last."""
        return gl.cdiv(self.n_tiles_m * self.N_SEQS, self.n_programs)

    @gluon.jit
    def tile(self, r):
        """The program's tile in round r. Programs take tiles up the program ids in even rounds and
        down in odd ones, so that causal, where tiles come longest first, no program gets the
        longest of every round."""
        BLOCK_M: gl.constexpr = self.WARPGROUPS * self.ROWS
        pid = gl.program_id(0)
        idx = r * self.n_programs + pid + (r % 2) * (self.n_programs - 1 - 2 * pid)
        if self.IS_CAUSAL:  # the last query tiles (the most keys) first, GROUP sequences side by side
            first = idx // (self.GROUP * self.n_tiles_m) * self.GROUP  # the group's first sequence
            size = gl.maximum(gl.minimum(self.GROUP, self.N_SEQS - first), 1)  # fewer in the last group; 1 past it
            within = idx - first * self.n_tiles_m
            tile_m = self.n_tiles_m - 1 - within // size
            bh = first + within % size
        else:  # consecutive tiles: consecutive query tiles of one sequence, sharing K and V in L2
            tile_m = idx % self.n_tiles_m
            bh = idx // self.n_tiles_m
        q_start = tile_m * BLOCK_M
        if self.IS_CAUSAL:
            hi = gl.minimum(q_start + BLOCK_M, self.N_KEYS)
            unmasked_hi = gl.minimum(q_start, self.N_KEYS) // self.BLOCK_N * self.BLOCK_N
        else:
            hi = self.N_KEYS
            unmasked_hi = self.N_KEYS // self.BLOCK_N * self.BLOCK_N
        return Tile(idx, bh, q_start, gl.cdiv(hi, self.BLOCK_N), unmasked_hi // self.BLOCK_N)

    @gluon.jit
    def has(self, tile):
        return tile.idx < self.n_tiles_m * self.N_SEQS


@aggregate
class Turns:
    """Ping-pong (ON): the warpgroups issue their products in turn, 0, 1, ..., 0, 1, ..., so that one
    multiplies while another computes its softmax. bars[w] is arrived on by the warpgroup before w
    once it has issued its products; warpgroup 0 goes first (a fresh barrier passes parity 1)."""

    bars: gl.shared_memory_descriptor  # (WARPGROUPS, 1) mbarriers
    ON: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, bars, ON):
        self.bars = bars
        self.ON = gl.constexpr(ON)

    @gluon.jit
    def alloc(WARPGROUPS: gl.constexpr, ON: gl.constexpr):
        bars = gl.allocate_shared_memory(gl.int64, [WARPGROUPS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(WARPGROUPS):
            mbarrier.init(bars.index(i), count=1)
        return Turns(bars, ON)

    @gluon.jit
    def take(self, k, WG: gl.constexpr):
        """Wait until warpgroup WG may issue its k-th set of products."""
        if self.ON:
            if WG == 0:
                mbarrier.wait(self.bars.index(0), (k & 1) ^ 1)
            else:
                mbarrier.wait(self.bars.index(WG), k & 1)

    @gluon.jit
    def pass_on(self, WG: gl.constexpr):
        """Warpgroup WG's products are issued: the next warpgroup's turn."""
        if self.ON:
            mbarrier.arrive(self.bars.index((WG + 1) % self.bars.type.shape[0]), count=1)


@aggregate
class Smem:
    """The program's shared memory: Q (one buffer: every warpgroup's rows of a query tile), the K and
    V rings, the ping-pong turns, and O's staging buffers (one a warpgroup) for its TMA store."""

    q: Ring
    k: Ring
    v: Ring
    turns: Turns
    o: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q, k, v, turns, o):
        self.q = q
        self.k = k
        self.v = v
        self.turns = turns
        self.o = o


@gluon.jit
def _load_partition(cfg, smem, Q, K, V, q_strides, k_strides, v_strides):
    """One warp: the TMA copies of every query tile the program takes."""
    D: gl.constexpr = cfg.D
    # 4-D descriptors (batch, head, row, column) over each tensor where it lies: a tile never reads
    # past its own sequence's last row (TMA fills zeros there), and one descriptor serves every
    # sequence the program visits.
    n_batch = cfg.N_SEQS // cfg.HEADS
    q_desc = heads_descriptor(Q, [n_batch, cfg.HEADS, cfg.N_QUERIES, D], q_strides, [1, 1, cfg.ROWS, D])
    n_kv = cfg.HEADS // cfg.Q_PER_KV
    k_desc = heads_descriptor(K, [n_batch, n_kv, cfg.N_KEYS, D], k_strides, [1, 1, cfg.BLOCK_N, D])
    v_desc = heads_descriptor(V, [n_batch, n_kv, cfg.N_KEYS, D], v_strides, [1, 1, cfg.BLOCK_N, D])
    c = smem.k.counter()  # key tiles loaded so far, over all query tiles: the rings' position
    qc = smem.q.counter()  # query tiles so far
    for r in range(cfg.rounds()):
        tile = cfg.tile(r)
        if cfg.has(tile):
            c = _load_tile(cfg, smem, tile, c, qc, q_desc, k_desc, v_desc)
            qc = qc.next()


@gluon.jit
def _load_tile(cfg, smem, tile, c, qc, q_desc, k_desc, v_desc):
    """The loader's part of one query tile (ring positions c and qc): Q, once the warpgroups are
    done with the last one, then K_j and V_j, each as soon as its buffer is free. Returns c after it."""
    b, h = tile.bh // cfg.HEADS, tile.bh % cfg.HEADS
    _, q_ready = smem.q.fill(qc, cfg.WARPGROUPS * q_desc.block_type.nbytes)  # rows past N_QUERIES count too
    for w in gl.static_range(cfg.WARPGROUPS):  # each warpgroup's own rows
        q_at = [b, h, tile.q_start + w * cfg.ROWS, 0]
        tma_load(q_desc, q_at, q_ready, smem.q.buffer(qc, w).reshape(q_desc.block_type.shape))
    for j in range(tile.n_tiles):
        kv_at = [b, h // cfg.Q_PER_KV, j * cfg.BLOCK_N, 0]
        k_buf, k_ready = smem.k.fill(c, k_desc.block_type.nbytes)
        tma_load(k_desc, kv_at, k_ready, k_buf.reshape(k_desc.block_type.shape))
        v_buf, v_ready = smem.v.fill(c, v_desc.block_type.nbytes)
        tma_load(v_desc, kv_at, v_ready, v_buf.reshape(v_desc.block_type.shape))
        c = c.next()
    return c


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
def _softmax_step(cfg, smem, q, j, kc, turn, acc, p_prev, m_i, l_i, rows, WG: gl.constexpr, MASKED: gl.constexpr):
    """Key tile j >= 1, at ring position kc: S_j = Q K_j^T and O += P_{j-1} V_{j-1} in flight together,
    then P_j while the second product runs. turn: the warpgroup's sets of products issued so far."""
    vc = kc.next(-1)  # V_{j-1}'s position
    k_buf = smem.k.wait(kc)
    if smem.turns.ON:  # both operands ready before the turn is taken: the turn is not held waiting
        v_buf = smem.v.wait(vc)
    smem.turns.take(turn, WG)
    s0 = gl.zeros([cfg.ROWS, cfg.BLOCK_N], gl.float32, layout=acc_layout(cfg.BLOCK_N))  # S's shape and layout
    s = warpgroup_mma(q, k_buf.permute((1, 0)), s0, use_acc=False, is_async=True)
    if not smem.turns.ON:
        v_buf = smem.v.wait(vc)
    acc = warpgroup_mma(_operand(cfg, p_prev, q.dtype, acc), v_buf, acc, is_async=True)
    smem.turns.pass_on(WG)
    s, acc = warpgroup_mma_wait(1, deps=[s, acc])  # S_j is done (issued first); P V may still run
    smem.k.release(kc)
    p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, j, rows, cfg.N_KEYS, cfg.qk_scale, MASKED, cfg.IS_CAUSAL)
    acc = warpgroup_mma_wait(0, deps=[acc])
    smem.v.release(vc)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    return acc, _carried(cfg, p, q.dtype, acc), m_i, l_i


@gluon.jit
def _carried(cfg, p, dtype, acc):
    """P_j as the key step carries it to its product: packed now, or (PACK_LATE) in float32, packed
    by _operand where the product reads it."""
    if cfg.PACK_LATE:
        return p
    else:
        return _packed(p, dtype, acc)


@gluon.jit
def _operand(cfg, p, dtype, acc):
    """The A operand of P V from what _carried kept. Packing P_j here, as its product is issued, spares
    Triton 3.6's code 32 byte permutes (PRMT) a key step (gluon_study.key_step_opcodes)."""
    if cfg.PACK_LATE:
        return _packed(p, dtype, acc)
    else:
        return p


@gluon.jit
def _packed(p, dtype, acc):
    """P in `dtype`, laid out as wgmma reads its A operand from registers, for P V into acc."""
    return gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2))


@gluon.jit
def _softmax_tile(cfg, smem, tile, c, qc, turn, O, L, o_out, WG: gl.constexpr):
    """Warpgroup WG's rows of one query tile, q_start + WG * ROWS ... + ROWS - 1, against every key
    tile it sees; c, qc: the rings' positions, turn: sets of products so far; o_out: O's TMA descriptor
    (O_BY_TMA) or its (batch, head, row) strides. Returns c and turn after."""
    ROWS: gl.constexpr = cfg.ROWS
    D: gl.constexpr = cfg.D
    s_layout: gl.constexpr = acc_layout(cfg.BLOCK_N)
    o_layout: gl.constexpr = acc_layout(D)
    s0 = gl.zeros([ROWS, cfg.BLOCK_N], gl.float32, layout=s_layout)
    rows = tile.q_start + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, D], gl.float32, layout=o_layout)

    # Key tile 0: S_0 alone (no P V before it); masked if it is the diagonal or the last.
    smem.q.wait(qc)
    q = smem.q.buffer(qc, WG)
    k_buf = smem.k.wait(c)
    smem.turns.take(turn, WG)
    s = warpgroup_mma(q, k_buf.permute((1, 0)), s0, use_acc=False, is_async=True)
    smem.turns.pass_on(WG)
    turn += 1
    s = warpgroup_mma_wait(0, deps=[s])
    smem.k.release(c)
    if tile.n_unmasked > 0:
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, 0, rows, cfg.N_KEYS, cfg.qk_scale, False, cfg.IS_CAUSAL)
    else:
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, 0, rows, cfg.N_KEYS, cfg.qk_scale, True, cfg.IS_CAUSAL)
    p_prev = _carried(cfg, p, O.dtype.element_ty, acc)

    for j in range(1, tile.n_unmasked):  # whole tiles every row sees: no mask
        acc, p_prev, m_i, l_i = _softmax_step(
            cfg, smem, q, j, c.next(j), turn + j - 1, acc, p_prev, m_i, l_i, rows, WG, False
        )
    for j in range(gl.maximum(tile.n_unmasked, 1), tile.n_tiles):  # the diagonal and the ragged last tile
        acc, p_prev, m_i, l_i = _softmax_step(
            cfg, smem, q, j, c.next(j), turn + j - 1, acc, p_prev, m_i, l_i, rows, WG, True
        )
    smem.q.release(qc)  # every S of this tile is done: the loader may bring the next Q

    c = c.next(tile.n_tiles)
    turn += tile.n_tiles - 1
    last = c.next(-1)  # the last key tile's P V
    v_buf = smem.v.wait(last)
    smem.turns.take(turn, WG)
    acc = warpgroup_mma(_operand(cfg, p_prev, O.dtype.element_ty, acc), v_buf, acc, is_async=True)
    smem.turns.pass_on(WG)
    acc = warpgroup_mma_wait(0, deps=[acc])
    smem.v.release(last)

    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    if cfg.O_BY_TMA:  # O = acc / l into shared memory, then one TMA store (rows past N_QUERIES not written)
        buf = smem.o.index(WG)
        tma.store_wait(0)  # this warpgroup's last O has left the buffer
        buf.store(o.to(O.dtype.element_ty))
        fence_async_shared()
        o_at = [tile.bh // cfg.HEADS, tile.bh % cfg.HEADS, tile.q_start + WG * ROWS, 0]
        tma_store(o_out, o_at, buf.reshape(o_out.block_type.shape))
    else:  # straight from registers (rows past N_QUERIES dropped)
        o_rows = tile.q_start + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        sob, soh, son = o_out
        head = (tile.bh // cfg.HEADS).to(gl.int64) * sob + (tile.bh % cfg.HEADS).to(gl.int64) * soh
        o_at = gl.multiple_of(head + o_rows[:, None].to(gl.int64) * son + cols[None, :], [1, 8])  # 16-byte strides
        gl.store(O + o_at, o.to(O.dtype.element_ty), mask=(o_rows < cfg.N_QUERIES)[:, None])
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural log, as part 4's L
    gl.store(L + tile.bh.to(gl.int64) * cfg.N_QUERIES + rows, lse, mask=rows < cfg.N_QUERIES)
    return c, turn + 1


@gluon.jit
def _softmax_partition(cfg, smem, O, L, o_strides, WG: gl.constexpr):
    """Warpgroup WG: its rows of each query tile the program takes."""
    o_out = o_strides
    if cfg.O_BY_TMA:  # O where it lies, as the loader's descriptors see Q, K and V
        n_batch = cfg.N_SEQS // cfg.HEADS
        o_out = heads_descriptor(O, [n_batch, cfg.HEADS, cfg.N_QUERIES, cfg.D], o_strides, [1, 1, cfg.ROWS, cfg.D])
    c = smem.k.counter()  # key tiles so far, over all query tiles: the rings' position
    qc = smem.q.counter()  # query tiles so far
    turn = 0  # sets of products issued (ping-pong's turns taken)
    for r in range(cfg.rounds()):
        tile = cfg.tile(r)
        if cfg.has(tile):
            c, turn = _softmax_tile(cfg, smem, tile, c, qc, turn, O, L, o_out, WG)
            qc = qc.next()
    if cfg.O_BY_TMA:
        tma.store_wait(0)  # the last O has left shared memory before the program ends


@gluon.constexpr_function
def _roles(softmax, softmax_args, loader, loader_args, WARPGROUPS):
    """gl.warp_specialize's partitions: the softmax on every warpgroup (the first on the kernel's own
    4 warps), each told its number, then the loader."""
    return [(softmax, (*softmax_args, gl.constexpr(wg))) for wg in range(WARPGROUPS)] + [(loader, loader_args)]


@gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "GROUP", "Q_PER_KV", "HEADS", *STRIDES])
def _attn_fwd_gluon(Q, K, V, O, L, N_QUERIES, N_KEYS, N_SEQS, GROUP, Q_PER_KV, HEADS,
                    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on, scale,
                    D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                    ROWS: gl.constexpr, WARPGROUPS: gl.constexpr, REGISTERS: gl.constexpr,
                    PINGPONG: gl.constexpr, O_BY_TMA: gl.constexpr, PACK_LATE: gl.constexpr):  # fmt: skip
    n_programs = gl.num_programs(0)  # persistent: fewer programs than query tiles, each takes several
    n_tiles_m = gl.cdiv(N_QUERIES, WARPGROUPS * ROWS)
    qk_scale = scale * 1.4426950408889634  # scale * log2(e)
    cfg = Config(N_QUERIES, N_KEYS, N_SEQS, GROUP, HEADS, Q_PER_KV, qk_scale, n_programs, n_tiles_m,
                 D, ROWS, WARPGROUPS, BLOCK_N, IS_CAUSAL, O_BY_TMA, PACK_LATE)  # fmt: skip
    q = Ring.alloc(
        Q.dtype.element_ty, [ROWS, D], swizzled(2), 1, WARPGROUPS, PARTS=WARPGROUPS
    )  # a warpgroup's rows a part
    k = Ring.alloc(K.dtype.element_ty, [BLOCK_N, D], swizzled(2), STAGES, WARPGROUPS)
    v = Ring.alloc(V.dtype.element_ty, [BLOCK_N, D], swizzled(2), STAGES, WARPGROUPS)
    o = gl.allocate_shared_memory(O.dtype.element_ty, [WARPGROUPS if O_BY_TMA else 1, ROWS, D], swizzled(2))
    smem = Smem(q, k, v, Turns.alloc(WARPGROUPS, PINGPONG), o)
    softmax_args = (cfg, smem, O, L, (stride_ob, stride_oh, stride_on))
    loader_args = (cfg, smem, Q, K, V, (stride_qb, stride_qh, stride_qn), (stride_kb, stride_kh, stride_kn),
                   (stride_vb, stride_vh, stride_vn))  # fmt: skip
    gl.warp_specialize(
        _roles(_softmax_partition, softmax_args, _load_partition, loader_args, WARPGROUPS).value,
        [4] * (WARPGROUPS - 1) + [1],  # warps: the other softmax warpgroups, then the loader
        [REGISTERS] * (WARPGROUPS - 1) + [24],  # registers per thread (setmaxnreg) of each
    )


def supported(q):
    """Whether this forward can run q's call: compiled (not the interpreter), bf16 or fp16, D = 64 or
    128, on a Hopper GPU (sm_90: wgmma and TMA as this kernel uses them)."""
    return (
        not INTERPRET
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and q.shape[-1] in (64, 128)
        and capability(q.device) == (9, 0)
    )


def programs(n_q, n_seqs, d, device, warpgroups=None):
    """Programs to launch: one per SM, each taking query tiles in turn until none are left, or
    fewer when there are fewer query tiles."""
    tiles = triton.cdiv(n_q, (warpgroups or CONFIGS[d]["WARPGROUPS"]) * ROWS) * n_seqs
    return min(tiles, properties(device).multi_processor_count)


def group_size(n_seqs, n_q, d, is_causal):
    """How many sequences the causal order puts side by side (GROUP): one at D = 128 from
    SEQUENCE_MAJOR_FROM queries, else every sequence (without a mask GROUP is not used)."""
    return 1 if is_causal and d == 128 and n_q >= SEQUENCE_MAJOR_FROM else n_seqs


def heads(t):
    """t as (B, H, N, D) where the kernels read it in place, and its (batch, head, row) strides.

    A model's heads are (B, N, H, D) in memory, seen as (B, H, N, D) through a transpose: TMA reads
    them where they lie, given rows on a 16-byte boundary and every stride in whole 16 bytes (8
    elements of bf16 or fp16). A view of t when it has those; otherwise a contiguous copy. Leading
    dimensions other than (B, H) fold into B; a (N, D) or (S, N, D) tensor is one batch. The stride
    of a dimension of size 1 is never used: it is given as a contiguous tensor's."""
    if t.dim() != 4:
        t = t.reshape(-1, *t.shape[-3:]) if t.dim() > 4 else t.reshape((1,) * (4 - t.dim()) + t.shape)
    sb, sh, sn, sd = t.stride()
    if sd == 1 and t.data_ptr() % 16 == 0 and sb > 0 and sh > 0 and sn > 0 and not (sb % 8 or sh % 8 or sn % 8):
        return t, (sb, sh, sn)  # the common case, checked first: this runs on every call
    _, h, n, d = t.shape
    dense = (h * n * d, n * d, d)  # a contiguous tensor's strides
    strides = tuple(s if size > 1 else dense[i] for i, (size, s) in enumerate(zip(t.shape, (sb, sh, sn))))
    if sd == 1 and t.data_ptr() % 16 == 0 and all(s > 0 and s % 8 == 0 for s in strides):
        return t, strides
    return t.clone(memory_format=torch.contiguous_format), dense


def stride_key(key, strides):
    """A Launch key told apart for strides of 2**31 elements or more: Triton passes such an integer
    as a 64-bit one, which compiles another binary (do_not_specialize keeps the value out of the
    binary, not its type)."""
    return key if max(strides) < 2**31 else (*key, "64-bit strides")


def launch(q, k, v, o, lse, is_causal, config=None, group=None):
    """O and L of q (k, v of q's rank: (B, H_kv, N_k, D), H_kv dividing H, or (B * H_kv, N_k, D)) into o (q's shape,
    any strides heads() reads in place) and lse through Triton's own launch path (part 5's
    flash_forward launches the same kernel through its Launch). config: config_for's unless given;
    group: the causal order's sequences side by side (group_size's unless given)."""
    (q4, q_strides), (k4, k_strides), (v4, v_strides), (o4, o_strides) = (heads(t) for t in (q, k, v, o))
    if o4.data_ptr() != o.data_ptr():
        raise ValueError("o: the kernel writes it in place, so its strides must be whole 16 bytes")
    n_b, n_h, n_q, d = q4.shape
    n_seqs = n_b * n_h
    meta = constexprs(d, is_causal, config or config_for(d, n_q, is_causal))
    grid = (programs(n_q, n_seqs, d, q.device, meta["WARPGROUPS"]),)
    group = group_size(n_seqs, n_q, d, is_causal) if group is None else group
    if group < 1:
        raise ValueError(f"group: at least one sequence side by side, got {group}")
    sizes = (n_q, k4.shape[2], n_seqs, group, n_h // k4.shape[1], n_h)
    strides = (*q_strides, *k_strides, *v_strides, *o_strides)
    _attn_fwd_gluon[grid](q4, k4, v4, o4, lse, *sizes, *strides, d**-0.5, **meta)


def config_for(d, n_q, is_causal):
    """The configuration of a call: SHORT[d] up to SHORT_UP_TO[is_causal] queries, else CONFIGS[d]."""
    return SHORT[d] if d in SHORT and n_q <= SHORT_UP_TO[bool(is_causal)] else CONFIGS[d]


def constexprs(d, is_causal, config=None):
    """_attn_fwd_gluon's compile-time arguments for head dim d (config: CONFIGS[d] unless given)."""
    return dict(D=d, BLOCK_N=BLOCK_N, IS_CAUSAL=is_causal, ROWS=ROWS, **(config or CONFIGS[d]))
