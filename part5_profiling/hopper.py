"""The Gluon that part 5's two Hopper kernels are written in: its imports, wgmma's register layout,
and the pipeline's state as Triton's own Gluon examples keep it, in @aggregate classes.

- Counter: a position in a ring of buffers, kept as the count of tiles that went through it:
  index() is the buffer, phase() the parity of that buffer's round (what mbarrier.wait waits for),
  next(n) the position n tiles on.
- Ring: STAGES buffers in shared memory, each with two mbarriers: ready (the producer's TMA bytes
  have landed) and free (every consumer is done with it). The producer fill()s a buffer: it waits
  until the buffer is free and says how many bytes to expect; the copies it then issues complete
  the ready barrier. A consumer wait()s for a buffer to be ready and release()s it.

An mbarrier's phases alternate 0, 1, 0, ...: the k-th use of a buffer (k = 0, 1, ...) waits for
parity k & 1 to complete on ready, and the producer, before its k-th fill, for parity (k & 1) ^ 1 on
free. A fresh barrier counts as having completed the phase before phase 0, so the first fills do
not wait. Nothing is ever reset.

Triton 3.6 (the GPU's here) is the floor. Triton 3.7 renamed TMA's copies into and out of shared
memory (tma.async_load, tma.async_store) and gave Gluon the TMA reduce-add (tma.async_atomic_add);
the names below work on both. Triton 3.9 adds mbarrier.allocate_mbarrier, which would shorten Ring.alloc. GPU only
(sm_90): Gluon has no interpreter; part 5's flash_attention.py sends a call here only on Hopper.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401  (re-exported to both kernels)
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate  # Gluon's examples import it so in 3.6-3.9

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@builtin
def _tma_add_shared_to_global(tensor_desc, coord, src, _semantic=None):
    """TMA's reduce-add from shared memory into global memory (cp.reduce.async.bulk): Triton 3.6's
    compiler has the operation (tl's descriptor atomic_add lowers to it) but not Gluon's wrapper."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


tma_add = getattr(tma, "async_atomic_add", None) or _tma_add_shared_to_global


@gluon.constexpr_function
def acc_layout(n):
    """wgmma's accumulator layout for a 64 x n tile over one warpgroup (its 4 warps along M)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def swizzled(rank, bits=16):
    """The shared-memory layout TMA writes and wgmma reads: rows of 128 bytes, swizzled."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bits, rank=rank)


@gluon.jit
def heads_descriptor(t, shape, strides, block):
    """A 4-D TMA descriptor over t where it lies: shape (batch, head, row, column), strides its
    (batch, head, row) strides (the columns are contiguous)."""
    return tma.make_tensor_descriptor(t, shape, [strides[0], strides[1], strides[2], 1], block, swizzled(4))


@aggregate
class Counter:
    count: gl.tensor  # tiles through the ring so far
    STAGES: gl.constexpr  # buffers in the ring

    @gluon.constexpr_function
    def __init__(self, count, STAGES):
        self.count = count
        self.STAGES = gl.constexpr(STAGES)

    @gluon.jit
    def start(STAGES: gl.constexpr):
        return Counter(gl.to_tensor(0), STAGES)

    @gluon.jit
    def index(self):
        return self.count % self.STAGES

    @gluon.jit
    def phase(self):
        return (self.count // self.STAGES) & 1

    @gluon.jit
    def next(self, n=1):
        return Counter(self.count + n, self.STAGES)


@aggregate
class Ring:
    buffers: gl.shared_memory_descriptor  # (STAGES * PARTS, ...): PARTS buffers a stage
    ready: gl.shared_memory_descriptor  # (STAGES, 1) mbarriers: the bytes have landed
    free: gl.shared_memory_descriptor  # (STAGES, 1) mbarriers: every consumer is done with the stage
    PARTS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, buffers, ready, free, PARTS):
        self.buffers = buffers
        self.ready = ready
        self.free = free
        self.PARTS = gl.constexpr(PARTS)

    @gluon.jit
    def alloc(dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr, STAGES: gl.constexpr,
              consumers: gl.constexpr, PARTS: gl.constexpr = 1, producers: gl.constexpr = 1):  # fmt: skip
        """STAGES stages of PARTS buffers of `shape` each. A stage is ready after `producers` arrivals
        (a TMA producer's is its expect, then the bytes landing) and free after `consumers`."""
        buffers = gl.allocate_shared_memory(dtype, [STAGES * PARTS] + shape, layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=producers)
            mbarrier.init(free.index(i), count=consumers)
        return Ring(buffers, ready, free, PARTS)

    @gluon.jit
    def counter(self):
        """A position at the ring's start."""
        return Counter.start(self.ready.type.shape[0])

    @gluon.jit
    def at(self, n):
        """The position of the ring's n-th tile (n = 0, 1, ...)."""
        return Counter(n, self.ready.type.shape[0])

    @gluon.jit
    def buffer(self, c, part=0):
        """Buffer `part` of stage c."""
        return self.buffers.index(c.index() * self.PARTS + part)

    @gluon.jit
    def fill(self, c, nbytes):
        """The producer's side: once stage c is free, expect nbytes on its ready barrier. Returns its
        (first) buffer and the barrier for the TMA copies that fill it."""
        mbarrier.wait(self.free.index(c.index()), c.phase() ^ 1)
        mbarrier.expect(self.ready.index(c.index()), nbytes)
        return self.buffer(c), self.ready.index(c.index())

    @gluon.jit
    def wait(self, c):
        """A consumer's side: stage c's (first) buffer, once its bytes have landed."""
        mbarrier.wait(self.ready.index(c.index()), c.phase())
        return self.buffer(c)

    @gluon.jit
    def release(self, c):
        """A consumer is done with stage c."""
        mbarrier.arrive(self.free.index(c.index()), count=1)

    @gluon.jit
    def acquire(self, c):
        """A producer that writes the buffer itself (not by TMA): wait until stage c is free."""
        mbarrier.wait(self.free.index(c.index()), c.phase() ^ 1)

    @gluon.jit
    def commit(self, c):
        """That producer has written its part of stage c (after fence_async_shared, for wgmma to read)."""
        mbarrier.arrive(self.ready.index(c.index()), count=1)
