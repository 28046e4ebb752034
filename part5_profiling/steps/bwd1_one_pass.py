"""Part 5's Hopper backward in Gluon: dK, dV and dQ from one pass over the scores, as FlashAttention-3
does it: five matrix products per pair of tiles, where part 4's two kernels make seven. It is built
an idea at a time (steps/, make diff PART=5 STEP=bwd1, STEP=bwd2, ...), each step adding its line:

- bwd1: one pass, one step at a time. A program owns 64 keys (one warpgroup, one wgmma M) and
  walks the query tiles that see them: K and V copied once by TMA, then for each tile of 64 queries
  Q_i and dO_i: S^T = K Q_i^T, P^T = exp2(S^T * scale * log2(e) - L_i * log2(e)), dV += P^T dO_i
  (P^T in registers as wgmma's A operand), dP^T = V dO_i^T, dS^T = P^T (dP^T - D_i), dK += dS^T Q_i;
  dK and dV stay in registers for the whole walk. dQ_i = dS K sums over every key: each program
  adds its keys' share into a float32 dQ with atomic adds (so dQ's last bits vary from run to run).
  A tl kernel first writes D_i = rowsum(dO_i * O_i) and L_i * log2(e), padded with zeros to whole
  query tiles, and zeroes the float32 dQ, which is then scaled and rounded to Q's dtype.

Tiles are split in 64-column chunks (one 128-byte swizzle row of 16-bit elements): dQ is made 64
columns at a time. GPU only (sm_90); flash_attention.py keeps part 4's kernels for every other call
and under torch.use_deterministic_algorithms(True), since this kernel's dQ bits vary.
"""

import torch
import triton
import triton.language as tl

from part5_profiling.hopper import (
    Ring,
    acc_layout,
    aggregate,
    fence_async_shared,
    gl,
    gluon,
    swizzled,
    tma,
    tma_load,
    warpgroup_mma,
)

BLOCK_N = 64  # keys per program: one wgmma M
BLOCK_M = 64  # queries per step


@aggregate
class Config:
    """The lengths and scale, and the program's work: its sequence, keys, and query tiles (masked first)."""

    N_QUERIES: gl.tensor
    N_KEYS: gl.tensor
    N_SEQS: gl.tensor
    scale: gl.tensor
    bh: gl.tensor
    k_start: gl.tensor  # the program's first key
    q_lo: gl.tensor  # the first query tile's first row
    n_q_tiles: gl.tensor
    n_masked: gl.tensor
    D: gl.constexpr
    BLOCK_M: gl.constexpr  # queries per tile
    CHUNKS: gl.constexpr  # 64-column chunks of a row: D // 64

    @gluon.constexpr_function
    def __init__(self, N_QUERIES, N_KEYS, N_SEQS, scale, bh, k_start, q_lo, n_q_tiles, n_masked, D, BLOCK_M):
        self.N_QUERIES = N_QUERIES
        self.N_KEYS = N_KEYS
        self.N_SEQS = N_SEQS
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
    """The program's shared memory, rings of one stage (hopper.Ring), a 64-column chunk a part: its 64
    keys and values (loaded once), Q_i, dO_i, and dS^T (stored from registers, read back as dS)."""

    k: Ring
    v: Ring
    q: Ring
    do: Ring
    ds: Ring

    @gluon.constexpr_function
    def __init__(self, k, v, q, do, ds):
        self.k = k
        self.v = v
        self.q = q
        self.do = do
        self.ds = ds


@gluon.jit
def _load_tile(ring, c, desc, bh, row, CHUNKS: gl.constexpr):
    """Rows row ... of sequence bh (K or V, Q_i or dO_i) into stage c of a ring, once it is free, in
    64-column chunks, all on the stage's ready barrier."""
    _, ready = ring.fill(c, CHUNKS * desc.block_type.nbytes)
    for part in gl.static_range(CHUNKS):
        tma_load(desc, [bh, row, part * 64], ready, ring.buffer(c, part).reshape(desc.block_type.shape))


@gluon.jit
def _bwd_step(cfg, smem, i, dk0, dk1, dv0, dv1, L2, DELTA, DQ, k_pos, qk_scale, MASKED: gl.constexpr):
    """Query tile i against the program's keys: dK and dV accumulate in registers (64 columns each)."""
    CHUNKS: gl.constexpr = cfg.CHUNKS
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    s_layout: gl.constexpr = acc_layout(BLOCK_M)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv0.type.layout, k_width=2)
    s0 = gl.zeros([64, BLOCK_M], gl.float32, layout=s_layout)
    q_start = cfg.q_lo + i * BLOCK_M
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    c = smem.q.at(i)  # Q_i's and dO_i's place in their rings
    kv = smem.k.counter()
    dc = smem.ds.at(i)  # dS^T's buffer: one stage, used once per query tile

    smem.q.wait(c)
    s = warpgroup_mma(smem.k.buffer(kv, 0), smem.q.buffer(c, 0).permute((1, 0)), s0, use_acc=False)
    if CHUNKS == 2:  # S^T = K Q_i^T, one 64-column chunk of D at a time
        s = warpgroup_mma(smem.k.buffer(kv, 1), smem.q.buffer(c, 1).permute((1, 0)), s)
    stats = cfg.bh.to(gl.int64) * gl.cdiv(cfg.N_QUERIES, BLOCK_M) * BLOCK_M + q_start + cols  # padded rows
    l_2 = gl.load(L2 + stats)  # L_i * log2(e)
    p = gl.exp2(s * qk_scale - l_2[None, :])
    if MASKED:  # causal: the query tiles across the diagonal
        p = gl.where(k_pos[:, None] <= (q_start + cols)[None, :], p, 0.0)
    p16 = gl.convert_layout(p.to(smem.q.buffers.dtype), a_layout)
    smem.do.wait(c)
    dv0 = warpgroup_mma(p16, smem.do.buffer(c, 0), dv0)  # dV += P^T dO
    if CHUNKS == 2:
        dv1 = warpgroup_mma(p16, smem.do.buffer(c, 1), dv1)
    dp = warpgroup_mma(smem.v.buffer(kv, 0), smem.do.buffer(c, 0).permute((1, 0)), s0, use_acc=False)
    if CHUNKS == 2:
        dp = warpgroup_mma(smem.v.buffer(kv, 1), smem.do.buffer(c, 1).permute((1, 0)), dp)
    delta = gl.load(DELTA + stats)  # D_i
    ds = (p * (dp - delta[None, :])).to(smem.q.buffers.dtype)  # dS^T, unscaled

    # dS^T into shared memory, read back transposed as dS: dQ_i = dS K, per 64 columns of K
    smem.ds.acquire(dc)
    smem.ds.buffer(dc).store(ds)
    fence_async_shared()
    smem.ds.commit(dc)
    ds_a = gl.convert_layout(ds, a_layout)
    dk0 = warpgroup_mma(ds_a, smem.q.buffer(c, 0), dk0)  # dK += dS^T Q
    if CHUNKS == 2:
        dk1 = warpgroup_mma(ds_a, smem.q.buffer(c, 1), dk1)
    q0 = gl.zeros([BLOCK_M, 64], gl.float32, layout=acc_layout(64))
    rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout(64)))
    dst = smem.ds.wait(dc).permute((1, 0))
    for part in gl.static_range(CHUNKS):  # dQ_i's share of the program's keys, atomically into the float32 dQ
        dq = warpgroup_mma(dst, smem.k.buffer(kv, part), q0, use_acc=False)
        cols = part * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, acc_layout(64)))
        at = (cfg.bh.to(gl.int64) * cfg.N_QUERIES + rows[:, None]) * cfg.D + cols[None, :]
        gl.atomic_add(DQ + at, dq, mask=(rows < cfg.N_QUERIES)[:, None], sem="relaxed")
    smem.ds.release(dc)
    smem.q.release(c)
    smem.do.release(c)
    return dk0, dk1, dv0, dv1


@gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS"])
def _attn_bwd_gluon(Q, K, V, DO, L2, DELTA, DK, DV, DQ, N_QUERIES, N_KEYS, N_SEQS, scale,
                    D: gl.constexpr, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):  # fmt: skip
    CHUNKS: gl.constexpr = D // 64
    pid = gl.program_id(0)
    bh = pid % N_SEQS  # programs side by side take different sequences: causal, the longest walks first
    k_start = pid // N_SEQS * 64  # BLOCK_N
    if IS_CAUSAL:  # query tiles before the first that sees key k_start contribute nothing
        q_lo = k_start // BLOCK_M * BLOCK_M
        n_masked = gl.cdiv(gl.minimum(k_start + 64, N_QUERIES) - q_lo, BLOCK_M)
    else:
        q_lo = 0
        n_masked = 0
    n_q_tiles = gl.maximum(gl.cdiv(N_QUERIES - q_lo, BLOCK_M), 0)
    n_masked = gl.minimum(gl.maximum(n_masked, 0), n_q_tiles)
    cfg = Config(N_QUERIES, N_KEYS, N_SEQS, scale, bh, k_start, q_lo, n_q_tiles, n_masked, D, BLOCK_M)
    dtype: gl.constexpr = Q.dtype.element_ty
    k = Ring.alloc(dtype, [64, 64], swizzled(2), 1, 1, PARTS=CHUNKS)
    v = Ring.alloc(dtype, [64, 64], swizzled(2), 1, 1, PARTS=CHUNKS)
    q = Ring.alloc(dtype, [BLOCK_M, 64], swizzled(2), 1, 1, PARTS=CHUNKS)
    do = Ring.alloc(dtype, [BLOCK_M, 64], swizzled(2), 1, 1, PARTS=CHUNKS)
    smem = Smem(k, v, q, do, Ring.alloc(dtype, [64, BLOCK_M], swizzled(2), 1, 1))
    # 3-D descriptors (sequence, row, column) of 64-column chunks; rows past N_QUERIES or N_KEYS load as zeros
    N_Q, N_K = N_QUERIES, N_KEYS
    q_desc = tma.make_tensor_descriptor(Q, [N_SEQS, N_Q, D], [N_Q * D, D, 1], [1, BLOCK_M, 64], swizzled(3))
    do_desc = tma.make_tensor_descriptor(DO, [N_SEQS, N_Q, D], [N_Q * D, D, 1], [1, BLOCK_M, 64], swizzled(3))
    k_desc = tma.make_tensor_descriptor(K, [N_SEQS, N_K, D], [N_K * D, D, 1], [1, 64, 64], swizzled(3))
    v_desc = tma.make_tensor_descriptor(V, [N_SEQS, N_K, D], [N_K * D, D, 1], [1, 64, 64], swizzled(3))
    kv = smem.k.counter()
    _load_tile(smem.k, kv, k_desc, bh, k_start, CHUNKS)  # keys past N_KEYS arrive as zeros, and count
    _load_tile(smem.v, kv, v_desc, bh, k_start, CHUNKS)
    zero = gl.zeros([64, 64], gl.float32, layout=acc_layout(64))
    dk0, dk1, dv0, dv1 = zero, zero, zero, zero  # dK and dV, 64 columns each (the second at D = 128)
    k_pos = k_start + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout(BLOCK_M)))
    qk_scale = scale * 1.4426950408889634
    smem.k.wait(kv)
    smem.v.wait(kv)
    for i in range(0, n_q_tiles):  # each tile's copies issued, then waited for by its products
        _load_tile(smem.q, smem.q.at(i), q_desc, bh, q_lo + i * BLOCK_M, CHUNKS)
        _load_tile(smem.do, smem.do.at(i), do_desc, bh, q_lo + i * BLOCK_M, CHUNKS)
        if i < n_masked:
            dk0, dk1, dv0, dv1 = _bwd_step(cfg, smem, i, dk0, dk1, dv0, dv1, L2, DELTA, DQ, k_pos, qk_scale, True)
        else:
            dk0, dk1, dv0, dv1 = _bwd_step(cfg, smem, i, dk0, dk1, dv0, dv1, L2, DELTA, DQ, k_pos, qk_scale, False)
    rows = k_start + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout(64)))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, acc_layout(64)))
    at = (bh.to(gl.int64) * N_KEYS + rows[:, None]) * D + cols[None, :]  # (BH, N_KEYS, D), contiguous
    keep = (rows < N_KEYS)[:, None]
    gl.store(DK + at, (dk0 * scale).to(DK.dtype.element_ty), mask=keep)
    gl.store(DV + at, dv0.to(DV.dtype.element_ty), mask=keep)
    if D == 128:
        gl.store(DK + at + 64, (dk1 * scale).to(DK.dtype.element_ty), mask=keep)
        gl.store(DV + at + 64, dv1.to(DV.dtype.element_ty), mask=keep)


@triton.jit(do_not_specialize=["N_QUERIES", "N_SEQS"])
def _bwd_prepare(O, DO, L, L2, DELTA, DQ, N_QUERIES, N_SEQS, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per query tile: D_i = rowsum(dO_i * O_i) and L_i * log2(e), zeros past N_QUERIES up to a whole
    tile (the Gluon kernel reads them without masks), and zeros into the float32 dQ."""
    pid = tl.program_id(0)
    tile_m, bh = pid // N_SEQS, (pid % N_SEQS).to(tl.int64)
    rows, cols = tile_m * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, D)
    keep = rows < N_QUERIES
    at = (bh * N_QUERIES + rows[:, None]) * D + cols[None, :]  # O and dO: (BH, N_QUERIES, D), contiguous
    o = tl.load(O + at, mask=keep[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=keep[:, None], other=0.0).to(tl.float32)
    padded = bh * tl.cdiv(N_QUERIES, BLOCK_M) * BLOCK_M + rows
    tl.store(DELTA + padded, tl.sum(o * do, axis=1))
    lse = tl.load(L + bh * N_QUERIES + rows, mask=keep, other=0.0)
    tl.store(L2 + padded, lse * 1.4426950408889634)
    tl.store(DQ + at, tl.zeros([BLOCK_M, D], tl.float32), mask=keep[:, None])  # the float32 dQ, like Q


def constexprs(d, is_causal):
    """_attn_bwd_gluon's compile-time arguments for head dim d."""
    return dict(D=d, BLOCK_M=BLOCK_M, IS_CAUSAL=is_causal)


def launch(q, k, v, o, do, lse, is_causal):
    """dQ, dK, dV of (BH, N, D) contiguous q, k, v, o, do and lse (BH, N_q) in three launches:
    _bwd_prepare, _attn_bwd_gluon, _dq_convert."""
    (n_seqs, n_q, d), n_k = q.shape, k.shape[1]
    padded = triton.cdiv(n_q, BLOCK_M) * BLOCK_M  # whole query tiles
    stats = torch.empty((2, n_seqs, padded), dtype=torch.float32, device=q.device)  # L * log2(e) and D_i
    dq32 = torch.empty((n_seqs, n_q, d), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    tiles = (triton.cdiv(n_q, BLOCK_M) * n_seqs,)
    _bwd_prepare[tiles](o, do, lse, stats[0], stats[1], dq32, n_q, n_seqs, D=d, BLOCK_M=BLOCK_M)
    programs = (triton.cdiv(n_k, BLOCK_N) * n_seqs,)
    tensors = (q, k, v, do, stats[0], stats[1], dk, dv, dq32)
    _attn_bwd_gluon[programs](*tensors, n_q, n_k, n_seqs, d**-0.5, **constexprs(d, is_causal))
    return (dq32 * d**-0.5).to(q.dtype), dk, dv
