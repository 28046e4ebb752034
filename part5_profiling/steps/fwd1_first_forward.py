"""Part 5's Hopper forward in Gluon: FlashAttention-3's schedule, written out by hand.

Triton's compiler decides for a `tl` kernel which warps load, which multiply and when; Gluon
(`triton.experimental.gluon`) hands those decisions to the kernel. This one is built an idea at a
time (steps/, make diff PART=5 STEP=fwd1, STEP=fwd2, ...), and each step adds its line here:

- fwd1: part 4's forward in Gluon's terms. Rows of 64 queries per warpgroup (one wgmma M), TMA
  copies into shared memory, wgmma, the online softmax in registers: base-2 exponent with the scale
  folded in, masks only on the tiles that need them (the diagonal when causal, the ragged last key
  tile), L = m + log(l); causal tiles longest first.

GPU only (sm_90): Gluon has no interpreter. `flash_attention.py` sends bf16 and fp16 calls on a
Hopper GPU here and keeps its `tl` forward for the rest (float32, D = 16 and 32, other GPUs,
Triton's interpreter on the CPU).
"""

import torch
import triton

from common.runtime import INTERPRET, capability
from part5_profiling.hopper import (
    acc_layout,
    aggregate,
    gl,
    gluon,
    mbarrier,
    swizzled,
    tma,
    tma_load,
    warpgroup_mma,
)

ROWS = 64  # query rows per softmax warpgroup: one wgmma M
BLOCK_N = 128  # keys per tile


@aggregate
class Tile:
    """The program's query tile: sequence, first row, key tiles it sees, and how many of those, from the
    first, need no mask."""

    bh: gl.tensor
    q_start: gl.tensor
    n_tiles: gl.tensor
    n_unmasked: gl.tensor

    @gluon.constexpr_function
    def __init__(self, bh, q_start, n_tiles, n_unmasked):
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
    qk_scale: gl.tensor  # scale * log2(e): exp2 of S times it is exp of the scaled scores
    n_tiles_m: gl.tensor  # query tiles per sequence
    D: gl.constexpr
    ROWS: gl.constexpr  # query rows per tile
    BLOCK_N: gl.constexpr  # keys per tile
    IS_CAUSAL: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, N_QUERIES, N_KEYS, N_SEQS, qk_scale, n_tiles_m, D, ROWS, BLOCK_N, IS_CAUSAL):
        self.N_QUERIES = N_QUERIES
        self.N_KEYS = N_KEYS
        self.N_SEQS = N_SEQS
        self.qk_scale = qk_scale
        self.n_tiles_m = n_tiles_m
        self.D = gl.constexpr(D)
        self.ROWS = gl.constexpr(ROWS)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.IS_CAUSAL = gl.constexpr(IS_CAUSAL)

    @gluon.jit
    def tile(self):
        """The program's query tile."""
        BLOCK_M: gl.constexpr = self.ROWS
        idx = gl.program_id(0)
        if self.IS_CAUSAL:  # the last query tiles (the most keys) first, every sequence side by side
            tile_m = self.n_tiles_m - 1 - idx // self.N_SEQS
            bh = idx % self.N_SEQS
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
        return Tile(bh, q_start, gl.cdiv(hi, self.BLOCK_N), unmasked_hi // self.BLOCK_N)


@aggregate
class Smem:
    """The program's shared memory: Q, K_j and V_j, each with an mbarrier that completes when its
    copy has landed."""

    q: gl.shared_memory_descriptor
    k: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q, k, v, q_ready, k_ready, v_ready):
        self.q = q
        self.k = k
        self.v = v
        self.q_ready = q_ready
        self.k_ready = k_ready
        self.v_ready = v_ready


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
def _softmax_step(cfg, smem, q, j, tile, k_desc, v_desc, acc, m_i, l_i, rows, MASKED: gl.constexpr):
    """Key tile j: K_j and V_j copied into shared memory by TMA, S_j = Q K_j^T, P_j, then O = alpha O +
    P_j V_j, each copy and product waited for before the next line."""
    phase = j & 1  # k_ready and v_ready complete once per key tile
    kv_at = [tile.bh, j * cfg.BLOCK_N, 0]
    mbarrier.expect(smem.k_ready, k_desc.block_type.nbytes)  # keys past N_KEYS arrive as zeros, and count
    tma_load(k_desc, kv_at, smem.k_ready, smem.k.reshape(k_desc.block_type.shape))
    mbarrier.expect(smem.v_ready, v_desc.block_type.nbytes)
    tma_load(v_desc, kv_at, smem.v_ready, smem.v.reshape(v_desc.block_type.shape))
    mbarrier.wait(smem.k_ready, phase)
    s0 = gl.zeros([cfg.ROWS, cfg.BLOCK_N], gl.float32, layout=acc_layout(cfg.BLOCK_N))  # S's shape and layout
    s = warpgroup_mma(q, smem.k.permute((1, 0)), s0, use_acc=False)  # waits for the product
    p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, j, rows, cfg.N_KEYS, cfg.qk_scale, MASKED, cfg.IS_CAUSAL)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    p = gl.convert_layout(p.to(q.dtype), p_layout)  # P in registers: wgmma's A operand
    mbarrier.wait(smem.v_ready, phase)
    acc = warpgroup_mma(p, smem.v, acc)
    return acc, m_i, l_i


@gluon.jit
def _softmax_tile(cfg, smem, tile, O, L, q_desc, k_desc, v_desc):
    """One query tile, rows q_start ... q_start + ROWS - 1, against every key tile it sees."""
    ROWS: gl.constexpr = cfg.ROWS
    D: gl.constexpr = cfg.D
    s_layout: gl.constexpr = acc_layout(cfg.BLOCK_N)
    o_layout: gl.constexpr = acc_layout(D)
    rows = tile.q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, D], gl.float32, layout=o_layout)

    mbarrier.expect(smem.q_ready, q_desc.block_type.nbytes)  # rows past N_QUERIES count too
    tma_load(q_desc, [tile.bh, tile.q_start, 0], smem.q_ready, smem.q.reshape(q_desc.block_type.shape))
    mbarrier.wait(smem.q_ready, 0)
    q = smem.q
    for j in range(0, tile.n_unmasked):  # whole tiles every row sees: no mask
        acc, m_i, l_i = _softmax_step(cfg, smem, q, j, tile, k_desc, v_desc, acc, m_i, l_i, rows, False)
    for j in range(tile.n_unmasked, tile.n_tiles):  # the diagonal and the ragged last tile
        acc, m_i, l_i = _softmax_step(cfg, smem, q, j, tile, k_desc, v_desc, acc, m_i, l_i, rows, True)

    # O = acc / l and L = m + log(l), straight from registers (rows past N_QUERIES dropped)
    o_rows = tile.q_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    seq = tile.bh.to(gl.int64) * cfg.N_QUERIES
    o_at = O + (seq + o_rows[:, None]) * D + cols[None, :]
    gl.store(o_at, o.to(O.dtype.element_ty), mask=(o_rows < cfg.N_QUERIES)[:, None])
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural log, as part 4's L
    gl.store(L + seq + rows, lse, mask=rows < cfg.N_QUERIES)


@gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS"])
def _attn_fwd_gluon(Q, K, V, O, L, N_QUERIES, N_KEYS, N_SEQS, scale,
                    D: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, ROWS: gl.constexpr):  # fmt: skip
    n_tiles_m = gl.cdiv(N_QUERIES, ROWS)
    qk_scale = scale * 1.4426950408889634  # scale * log2(e)
    cfg = Config(N_QUERIES, N_KEYS, N_SEQS, qk_scale, n_tiles_m, D, ROWS, BLOCK_N, IS_CAUSAL)
    q = gl.allocate_shared_memory(Q.dtype.element_ty, [ROWS, D], swizzled(2))
    k = gl.allocate_shared_memory(K.dtype.element_ty, [BLOCK_N, D], swizzled(2))
    v = gl.allocate_shared_memory(V.dtype.element_ty, [BLOCK_N, D], swizzled(2))
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)  # an expect, then the bytes landing
    mbarrier.init(k_ready, count=1)
    mbarrier.init(v_ready, count=1)
    smem = Smem(q, k, v, q_ready, k_ready, v_ready)
    # 3-D descriptors (sequence, row, column): a tile never reads past its own sequence's last row
    # (TMA fills zeros there), and one descriptor serves every sequence.
    q_desc = tma.make_tensor_descriptor(Q, [N_SEQS, N_QUERIES, D], [N_QUERIES * D, D, 1], [1, ROWS, D], swizzled(3))
    k_desc = tma.make_tensor_descriptor(K, [N_SEQS, N_KEYS, D], [N_KEYS * D, D, 1], [1, BLOCK_N, D], swizzled(3))
    v_desc = tma.make_tensor_descriptor(V, [N_SEQS, N_KEYS, D], [N_KEYS * D, D, 1], [1, BLOCK_N, D], swizzled(3))
    _softmax_tile(cfg, smem, cfg.tile(), O, L, q_desc, k_desc, v_desc)


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
