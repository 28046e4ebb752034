"""Part 5's Hopper forward in Gluon: FlashAttention-3's schedule, written out by hand.

Triton's compiler decides for a `tl` kernel which warps load, which multiply and when; Gluon
(`triton.experimental.gluon`) hands those decisions to the kernel. This one is built an idea at a
time (steps/, make diff PART=5 STEP=fwd1, STEP=fwd2, ...), and each step adds its line here:

- fwd1: part 4's forward in Gluon's terms. Rows of 64 queries per warpgroup (one wgmma M), TMA
  copies into shared memory, wgmma, the online softmax in registers: base-2 exponent with the scale
  folded in, masks only on the tiles that need them (the diagonal when causal, the ragged last key
  tile), L = m + log(l).
- fwd2: a loader warp (gl.warp_specialize) only issues TMA copies: Q, then K_j and V_j into a ring
  of STAGES shared-memory buffers. mbarriers carry the hand-offs: k_ready/v_ready (the copy has
  landed, counted in bytes), k_free/v_free (the warpgroups are done with the buffer).
- fwd3: the next tile's S = Q K^T is issued before this tile's P V has finished: wgmma runs
  asynchronously, so the tensor cores multiply while the same warps compute exp2. Step j issues
  S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, waits for S_j only (wgmma groups finish in order),
  computes P_j from S_j, then waits for the P V product and rescales O.
- fwd4: two softmax warpgroups at D = 128, three at D = 64 (CONFIGS) read every K_j and V_j the
  loader brings in: while one computes its exponentials another keeps the tensor cores busy.
- fwd5: a persistent grid: one program per SM, each taking query tiles in turn (_work_item), so
  the loader brings the next tile's Q, K and V while the last products and stores of one run.
- fwd6: the causal order takes GROUP sequences side by side (group_size): one sequence at a time at
  D = 128 from SEQUENCE_MAJOR_FROM queries, so its K and V stay in L2.
- fwd7: at D = 64 the warpgroups take turns issuing their products (PINGPONG, FlashAttention-3's
  ping-pong): warpgroup w waits on an mbarrier that the warpgroup before it arrives on once it has
  issued its own, so the products reach the tensor cores in a fixed order while the other
  warpgroups compute their exponentials.
- fwd8: grouped key/value heads (grouped-query attention): K and V hold N_SEQS / Q_PER_KV sequences,
  and the loader reads query sequence bh's keys and values from sequence bh // Q_PER_KV.
- fwd9: heads read where they lie. A model's Q, K and V are (B, N, H, D) in memory, seen as (B, H, N,
  D) through a transpose: 4-D descriptors with each tensor's (batch, head, row) strides load their
  tiles in place (sequence bh is batch bh // HEADS, head bh % HEADS), and O is written in Q's layout,
  so neither side of the call copies a head.
- fwd10: short sequences and causal masks at D = 64 take query tiles of two warpgroups (SHORT, 128
  rows, config_for): three leave N_q = 1024 a last tile a third full, and a causal mask's tiles of
  unequal length share out more evenly among the programs in smaller pieces.

GPU only (sm_90): Gluon has no interpreter. `flash_attention.py` sends bf16 and fp16 calls on a
Hopper GPU here and keeps its `tl` forward for the rest (float32, D = 16 and 32, other GPUs,
Triton's interpreter on the CPU).
"""

import torch
import triton

from common.runtime import INTERPRET, capability, properties

try:  # Gluon is experimental: a Triton without it (or with another API) falls back to the tl kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    # TMA's global-to-shared copy: tma.async_load from Triton 3.7 on, async_copy_global_to_shared before
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
except ImportError:  # pragma: no cover
    HAVE_GLUON = False

ROWS = 64  # query rows per softmax warpgroup: one wgmma M
BLOCK_N = 128  # keys per tile
# The causal order: programs take the longest query tiles first, GROUP sequences side by side. At
# D = 128 from SEQUENCE_MAJOR_FROM queries, one sequence at a time (its query tiles side by side, as
# without a mask); otherwise every sequence at once (the programs running together take the same
# query tile of different sequences). tools/gluon_study.py --order times GROUP = 1, 2, 4, 8, 16 and
# 32 at B = 4, H = 8, N = 4096-16384 (results/h200/part5_gluon_order.csv): one sequence at a time
# is the fastest at D = 128; at D = 64 no group beats every sequence at every N.
SEQUENCE_MAJOR_FROM = 4096
# Per head dim: softmax warpgroups per program (BLOCK_M = 64 x that), K/V ring depth, registers per
# thread of each extra warpgroup (setmaxnreg; the loader keeps 24, warpgroup 0 gets the rest), and
# whether the warpgroups take turns at the tensor cores (PINGPONG). tools/gluon_study.py
# (results/h200/part5_gluon.csv): turns make D = 64 without a mask 4-5% faster at N = 4096-8192 and
# the causal D = 64 within 1.3% either way; at D = 128 they cost 1-3%.
CONFIGS = {
    128: dict(WARPGROUPS=2, STAGES=2, REGISTERS=232, PINGPONG=False),  # smem: Q 32 KB + 2 x (K 32 KB + V 32 KB)
    64: dict(WARPGROUPS=3, STAGES=4, REGISTERS=160, PINGPONG=True),  # smem: Q 24 KB + 4 x (K 16 KB + V 16 KB)
}
# fwd10's tiles for short and causal calls. tools/gluon_study.py (results/h200/part5_gluon.csv): at
# D = 64 two warpgroups are the faster up to N_q = 1024 without the mask and 4096 with it.
SHORT = {64: dict(WARPGROUPS=2, STAGES=4, REGISTERS=232, PINGPONG=True)}
SHORT_UP_TO = {False: 1024, True: 4096}  # N_q, without and with the causal mask
# The kernel's (batch, head, row) strides of Q, K, V and O, in order: run-time values like the lengths.
STRIDES = [f"stride_{t}{a}" for t in "qkvo" for a in "bhn"]


if HAVE_GLUON:

    @gluon.constexpr_function
    def _acc_layout(n):
        """wgmma's accumulator layout for a 64 x n tile over one warpgroup (4 warps along M)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _work_item(r, sizes, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
        """The program's r-th query tile: (index, sequence, first row, key tiles, unmasked key tiles).
        Programs take tiles in rounds of n_programs, up the program ids in even rounds and down in
        odd ones, so that causal, where tiles come longest first, no program gets the longest of
        every round."""
        n_programs, n_tiles_m, N_QUERIES, N_KEYS, N_SEQS, GROUP = sizes
        pid = gl.program_id(0)
        idx = r * n_programs + pid + (r % 2) * (n_programs - 1 - 2 * pid)
        if IS_CAUSAL:  # the last query tiles (the most keys) first, GROUP sequences side by side
            first = idx // (GROUP * n_tiles_m) * GROUP  # the group's first sequence (fewer in the last group)
            size = gl.maximum(gl.minimum(GROUP, N_SEQS - first), 1)  # 1 past the last tile: no division by 0
            within = idx - first * n_tiles_m
            tile_m = n_tiles_m - 1 - within // size
            bh = first + within % size
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
        return idx, bh, q_start, gl.cdiv(hi, BLOCK_N), unmasked_hi // BLOCK_N

    @gluon.jit
    def _descriptor(t, shape, strides, block, layout: gl.constexpr):
        """A 4-D TMA descriptor over t where it lies: shape (batch, head, row, column), strides its
        (batch, head, row) strides (the columns are contiguous)."""
        return tma.make_tensor_descriptor(t, shape, [strides[0], strides[1], strides[2], 1], block, layout)

    @gluon.jit
    def _load_tile(descs, b, h, kv, q_start, n_tiles, it, done, buffers, D: gl.constexpr, BLOCK_N: gl.constexpr):
        """The loader's part of one query tile: Q (once the warpgroups are done with the last one),
        then K_j and V_j into the ring, each as soon as its buffer is free; it: the ring position
        before the tile, returned after it."""
        q_desc, k_desc, v_desc = descs
        q_smem, k_ring, v_ring, q_ready, q_free, k_ready, k_free, v_ready, v_free, turn = buffers
        WARPGROUPS: gl.constexpr = q_smem.type.shape[0]
        ROWS: gl.constexpr = q_smem.type.shape[1]
        STAGES: gl.constexpr = k_ring.type.shape[0]
        mbarrier.wait(q_free, (done & 1) ^ 1)  # the warpgroups are done with the last tile's Q
        mbarrier.expect(q_ready, WARPGROUPS * ROWS * D * 2)  # zero rows past N_QUERIES count too
        for i in gl.static_range(WARPGROUPS):  # each warpgroup's own rows
            tma_load(q_desc, [b, h, q_start + i * ROWS, 0], q_ready, q_smem.index(i).reshape([1, 1, ROWS, D]))
        for j in range(n_tiles):
            slot = it % STAGES
            phase = (it // STAGES) & 1
            # parity of the barriers' rounds: a fresh barrier counts as having passed round "-1", so
            # the first wait on a free buffer (parity 1) does not block
            mbarrier.wait(k_free.index(slot), phase ^ 1)
            mbarrier.expect(k_ready.index(slot), BLOCK_N * D * 2)
            k_at = [b, kv, j * BLOCK_N, 0]
            tma_load(k_desc, k_at, k_ready.index(slot), k_ring.index(slot).reshape([1, 1, BLOCK_N, D]))
            mbarrier.wait(v_free.index(slot), phase ^ 1)
            mbarrier.expect(v_ready.index(slot), BLOCK_N * D * 2)
            tma_load(v_desc, k_at, v_ready.index(slot), v_ring.index(slot).reshape([1, 1, BLOCK_N, D]))
            it += 1
        return it

    @gluon.jit
    def _load_partition(
        Q, K, V, sizes, Q_PER_KV, strides, buffers, D: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr
    ):
        """One warp: the TMA copies of every query tile the program takes. Grouped heads: query
        head h reads key/value head h // Q_PER_KV. strides: HEADS, then Q's, K's and V's (batch,
        head, row) strides."""
        n_programs, n_tiles_m, N_QUERIES, N_KEYS, N_SEQS, GROUP = sizes
        HEADS, q_strides, k_strides, v_strides = strides
        WARPGROUPS: gl.constexpr = buffers[0].type.shape[0]
        ROWS: gl.constexpr = buffers[0].type.shape[1]
        # 4-D descriptors (batch, head, row, column) over each tensor where it lies: a tile never
        # reads past its own sequence's last row (TMA fills zeros there), and one descriptor serves
        # every sequence the program visits.
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)
        n_batch = N_SEQS // HEADS
        q_desc = _descriptor(Q, [n_batch, HEADS, N_QUERIES, D], q_strides, [1, 1, ROWS, D], layout)
        n_kv = HEADS // Q_PER_KV
        k_desc = _descriptor(K, [n_batch, n_kv, N_KEYS, D], k_strides, [1, 1, BLOCK_N, D], layout)
        v_desc = _descriptor(V, [n_batch, n_kv, N_KEYS, D], v_strides, [1, 1, BLOCK_N, D], layout)
        it = 0  # key tiles loaded so far, over all query tiles: the ring position
        done = 0  # query tiles so far
        for r in range(gl.cdiv(n_tiles_m * N_SEQS, n_programs)):
            idx, bh, q_start, n_tiles, n_unmasked = _work_item(r, sizes, WARPGROUPS * ROWS, BLOCK_N, IS_CAUSAL)
            if idx < n_tiles_m * N_SEQS:
                b, h = bh // HEADS, bh % HEADS
                descs = (q_desc, k_desc, v_desc)
                it = _load_tile(descs, b, h, h // Q_PER_KV, q_start, n_tiles, it, done, buffers, D, BLOCK_N)
                done += 1

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
    def _my_turn(turn, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
        """With PINGPONG, wait until warpgroup WG may issue its k-th set of products: the warpgroups
        issue theirs in turn, 0, 1, ..., 0, 1, ..., so that one multiplies while another computes
        its softmax. turn[w] is arrived on by the warpgroup before it ((w - 1) mod WARPGROUPS) after
        each of its issues; warpgroup 0 goes first (a fresh barrier passes a wait on parity 1)."""
        if PINGPONG:
            if WG == 0:
                mbarrier.wait(turn.index(0), (k & 1) ^ 1)
            else:
                mbarrier.wait(turn.index(WG), k & 1)

    @gluon.jit
    def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
        """With PINGPONG: this warpgroup's products are issued, the next warpgroup's turn."""
        if PINGPONG:
            WARPGROUPS: gl.constexpr = turn.type.shape[0]
            mbarrier.arrive(turn.index((WG + 1) % WARPGROUPS), count=1)

    @gluon.jit
    def _softmax_step(
        j,
        it,
        turns,
        state,
        tile,
        buffers,
        WG: gl.constexpr,
        MASKED: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        PINGPONG: gl.constexpr,
    ):
        """Key tile j >= 1 of a query tile whose key tile 0 was ring position it: S_j = Q K_j^T and
        O += P_{j-1} V_{j-1} in flight together, then P_j while the second product runs. state: O,
        P_{j-1}, m, l; turns: the warpgroup's sets of products issued so far (PINGPONG)."""
        acc, p_prev, m_i, l_i = state
        q, s0, rows, N_KEYS, qk_scale = tile  # s0: zeros shaped and laid out as S
        q_smem, k_ring, v_ring, q_ready, q_free, k_ready, k_free, v_ready, v_free, turn = buffers
        STAGES: gl.constexpr = k_ring.type.shape[0]
        it += j
        slot = it % STAGES
        prev = (it - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (it // STAGES) & 1)
        if PINGPONG:  # both operands ready before the turn is taken: the turn is not held waiting
            mbarrier.wait(v_ready.index(prev), ((it - 1) // STAGES) & 1)
        _my_turn(turn, turns + j - 1, WG, PINGPONG)
        s = warpgroup_mma(q, k_ring.index(slot).permute((1, 0)), s0, use_acc=False, is_async=True)
        if not PINGPONG:
            mbarrier.wait(v_ready.index(prev), ((it - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_ring.index(prev), acc, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        s, acc = warpgroup_mma_wait(1, deps=[s, acc])  # S_j is done (issued first); P V may still run
        mbarrier.arrive(k_free.index(slot), count=1)
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, j, rows, N_KEYS, qk_scale, MASKED, IS_CAUSAL)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(v_free.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p_prev = gl.convert_layout(p.to(p_prev.dtype), p_prev.type.layout)
        return acc, p_prev, m_i, l_i

    @gluon.jit
    def _softmax_tile(
        O,
        L,
        o_strides,
        qk_scale,
        work,
        sizes,
        buffers,
        WG: gl.constexpr,
        D: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        PINGPONG: gl.constexpr,
    ):
        """Warpgroup WG's rows of one query tile, q_start + WG * ROWS ... + ROWS - 1, against every key
        tile it sees. work: the tile (sequence, first row, key tiles, unmasked key tiles) and where
        the warpgroup stands (ring position, query tiles and turns so far); returns the ring position
        and turns after it. o_strides: HEADS, then O's (batch, head, row) strides."""
        bh, q_start, n_tiles, n_unmasked, it, done, turns = work
        n_programs, n_tiles_m, N_QUERIES, N_KEYS, N_SEQS, GROUP = sizes
        q_smem, k_ring, v_ring, q_ready, q_free, k_ready, k_free, v_ready, v_free, turn = buffers
        ROWS: gl.constexpr = q_smem.type.shape[1]
        BLOCK_N: gl.constexpr = k_ring.type.shape[1]
        STAGES: gl.constexpr = k_ring.type.shape[0]
        s_layout: gl.constexpr = _acc_layout(BLOCK_N)
        o_layout: gl.constexpr = _acc_layout(D)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        s0 = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        q = q_smem.index(WG)
        rows = q_start + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([ROWS, D], gl.float32, layout=o_layout)
        tile = (q, s0, rows, N_KEYS, qk_scale)

        # Key tile 0: S_0 alone (no P V before it); masked if it is the diagonal or the last.
        mbarrier.wait(q_ready, done & 1)
        slot = it % STAGES
        mbarrier.wait(k_ready.index(slot), (it // STAGES) & 1)
        _my_turn(turn, turns, WG, PINGPONG)
        s = warpgroup_mma(q, k_ring.index(slot).permute((1, 0)), s0, use_acc=False, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        turns += 1
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_free.index(slot), count=1)
        if n_unmasked > 0:
            p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, 0, rows, N_KEYS, qk_scale, False, IS_CAUSAL)
        else:
            p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, 0, rows, N_KEYS, qk_scale, True, IS_CAUSAL)
        p_prev = gl.convert_layout(p.to(O.dtype.element_ty), p_layout)

        for j in range(1, n_unmasked):  # whole tiles every row sees: no mask
            acc, p_prev, m_i, l_i = _softmax_step(
                j, it, turns, (acc, p_prev, m_i, l_i), tile, buffers, WG, False, IS_CAUSAL, PINGPONG
            )
        for j in range(gl.maximum(n_unmasked, 1), n_tiles):  # the diagonal and the ragged last tile
            acc, p_prev, m_i, l_i = _softmax_step(
                j, it, turns, (acc, p_prev, m_i, l_i), tile, buffers, WG, True, IS_CAUSAL, PINGPONG
            )
        mbarrier.arrive(q_free, count=1)  # every S of this tile is done: the loader may bring the next Q

        it += n_tiles
        turns += n_tiles - 1
        last = (it - 1) % STAGES  # the last key tile's P V
        mbarrier.wait(v_ready.index(last), ((it - 1) // STAGES) & 1)
        _my_turn(turn, turns, WG, PINGPONG)
        acc = warpgroup_mma(p_prev, v_ring.index(last), acc, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(v_free.index(last), count=1)

        # O = acc / l and L = m + log(l), straight from registers (rows past N_QUERIES dropped)
        o_rows = q_start + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        HEADS, sob, soh, son = o_strides
        sob, soh, son = sob // 8 * 8, soh // 8 * 8, son // 8 * 8  # as they are, now known to be whole 16 bytes
        head = (bh // HEADS).to(gl.int64) * sob + (bh % HEADS).to(gl.int64) * soh
        gl.store(
            O + head + o_rows[:, None].to(gl.int64) * son + cols[None, :],
            o.to(O.dtype.element_ty),
            mask=(o_rows < N_QUERIES)[:, None],
        )
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural log, as part 4's L
        gl.store(L + bh.to(gl.int64) * N_QUERIES + rows, lse, mask=rows < N_QUERIES)
        return it, turns + 1

    @gluon.jit
    def _softmax_partition(
        O,
        L,
        o_strides,
        qk_scale,
        sizes,
        buffers,
        WG: gl.constexpr,
        D: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        PINGPONG: gl.constexpr,
    ):
        """Warpgroup WG: its rows of each query tile the program takes."""
        n_programs, n_tiles_m, N_QUERIES, N_KEYS, N_SEQS, GROUP = sizes
        WARPGROUPS: gl.constexpr = buffers[0].type.shape[0]
        ROWS: gl.constexpr = buffers[0].type.shape[1]
        BLOCK_N: gl.constexpr = buffers[1].type.shape[1]
        it = 0  # key tiles so far, over all query tiles: the ring position
        done = 0  # query tiles so far
        turns = 0  # sets of products issued (PINGPONG's turns taken)
        for r in range(gl.cdiv(n_tiles_m * N_SEQS, n_programs)):
            idx, bh, q_start, n_tiles, n_unmasked = _work_item(r, sizes, WARPGROUPS * ROWS, BLOCK_N, IS_CAUSAL)
            if idx < n_tiles_m * N_SEQS:
                work = (bh, q_start, n_tiles, n_unmasked, it, done, turns)
                it, turns = _softmax_tile(O, L, o_strides, qk_scale, work, sizes, buffers, WG, D, IS_CAUSAL, PINGPONG)
                done += 1

    @gluon.jit(do_not_specialize=["N_QUERIES", "N_KEYS", "N_SEQS", "GROUP", "Q_PER_KV", "HEADS", *STRIDES])
    def _attn_fwd_gluon(
        Q,
        K,
        V,
        O,
        L,
        N_QUERIES,
        N_KEYS,
        N_SEQS,
        GROUP,
        Q_PER_KV,
        HEADS,
        stride_qb,
        stride_qh,
        stride_qn,
        stride_kb,
        stride_kh,
        stride_kn,
        stride_vb,
        stride_vh,
        stride_vn,
        stride_ob,
        stride_oh,
        stride_on,
        scale,
        D: gl.constexpr,
        BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr,
        IS_CAUSAL: gl.constexpr,
        ROWS: gl.constexpr,
        WARPGROUPS: gl.constexpr,
        REGISTERS: gl.constexpr,
        PINGPONG: gl.constexpr,
    ):
        n_programs = gl.num_programs(0)  # persistent: fewer programs than query tiles, each takes several
        n_tiles_m = gl.cdiv(N_QUERIES, WARPGROUPS * ROWS)
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_smem = gl.allocate_shared_memory(Q.dtype.element_ty, [WARPGROUPS, ROWS, D], layout)
        k_ring = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, D], layout)
        v_ring = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, D], layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [WARPGROUPS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(WARPGROUPS):
            mbarrier.init(turn.index(i), count=1)  # the warpgroup before it has issued (PINGPONG)
        mbarrier.init(q_ready, count=1)  # the loader's expect, then the bytes landing
        mbarrier.init(q_free, count=WARPGROUPS)  # every warpgroup releases a buffer
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_free.index(i), count=WARPGROUPS)
            mbarrier.init(v_free.index(i), count=WARPGROUPS)

        qk_scale = scale * 1.4426950408889634  # scale * log2(e)
        sizes = (n_programs, n_tiles_m, N_QUERIES, N_KEYS, N_SEQS, GROUP)
        buffers = (q_smem, k_ring, v_ring, q_ready, q_free, k_ready, k_free, v_ready, v_free, turn)
        q_strides, k_strides = (stride_qb, stride_qh, stride_qn), (stride_kb, stride_kh, stride_kn)
        strides = (HEADS, q_strides, k_strides, (stride_vb, stride_vh, stride_vn))
        o_strides = (HEADS, stride_ob, stride_oh, stride_on)
        # gl.warp_specialize([(function, args), ...], worker warps, worker registers): the first
        # function runs on the kernel's own 4 warps (warpgroup 0), each other one on warps of its own.
        if WARPGROUPS == 2:
            gl.warp_specialize(
                [
                    (_softmax_partition, (O, L, o_strides, qk_scale, sizes, buffers, 0, D, IS_CAUSAL, PINGPONG)),
                    (_softmax_partition, (O, L, o_strides, qk_scale, sizes, buffers, 1, D, IS_CAUSAL, PINGPONG)),
                    (_load_partition, (Q, K, V, sizes, Q_PER_KV, strides, buffers, D, BLOCK_N, IS_CAUSAL)),
                ],
                [4, 1],  # warps: warpgroup 1, the loader
                [REGISTERS, 24],  # registers per thread: warpgroup 1, the loader
            )
        else:
            gl.warp_specialize(
                [
                    (_softmax_partition, (O, L, o_strides, qk_scale, sizes, buffers, 0, D, IS_CAUSAL, PINGPONG)),
                    (_softmax_partition, (O, L, o_strides, qk_scale, sizes, buffers, 1, D, IS_CAUSAL, PINGPONG)),
                    (_softmax_partition, (O, L, o_strides, qk_scale, sizes, buffers, 2, D, IS_CAUSAL, PINGPONG)),
                    (_load_partition, (Q, K, V, sizes, Q_PER_KV, strides, buffers, D, BLOCK_N, IS_CAUSAL)),
                ],
                [4, 4, 1],  # warps: warpgroups 1 and 2, the loader
                [REGISTERS, REGISTERS, 24],
            )


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
