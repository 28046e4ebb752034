"""Where a short forward + backward's host time goes: part 5 beside Functions that do a growing
share of its work, and the single operations its calls are made of.

    python -m part5_profiling.tools.host_parts      # GPU: results/<gpu>/part5_host_parts.csv

Launch cost (launch_cost.py) finds part 5's forward + backward through autograd taking the host
1.7-1.9x SDPA cuDNN's at N = 512-2048 (its paired measure), and its "floor" (a Python Function that
launches nothing) half of cuDNN's time already. This study says which ingredient costs what, at
launch cost's shape (D = 128, non-causal, bf16, B=4, H=8):

1. The ladder ("ladder" rows). A forward + backward through autograd (torch.autograd.grad, as
   training runs it) of each target, timed in turn round after round (the host's pace drifts: a
   round compares like with like), on autograd's device thread and on the calling thread
   (torch.autograd.set_multithreading_enabled(False)), at N = 512, 1024 and 2048:
   - floor: launch_cost's Floor (allocates O, returns dO as each gradient);
   - tensors: a Function with part 5's tensors and nothing else: O and L allocated and Q, K, V, O, L
     saved in the forward; the backward's five allocations (its statistics, a float32 dQ's, which
     it lets go at once, dK, dV, and after its launches dQ) and the three gradients returned;
   - tensors + torch launches: the same with four launches made by PyTorch (a zero_ of L in the
     forward, three of the statistics in the backward, before dQ's allocation): a launch path in C++;
   - tensors + Triton launches: the same four launches as a one-program Triton kernel through
     fast_launch.Launch: Triton's launcher, without part 5's Python around it;
   - part 5;
   - SDPA cuDNN, the yardstick.
   Each: the median over the rounds of the host us per call (CALLS calls back to back, the GPU not
   waited for) and its ratio to SDPA cuDNN's of the same round.
2. The pieces ("piece" rows): one operation issued back to back on the calling thread, N = 512: an
   allocation, a descriptor scratch from Triton's allocator (what a kernel that builds tensor
   descriptors in the kernel asks for at every launch), the input check, a launch of the
   one-program kernel and a PyTorch zero_, part 5's flash_forward and flash_backward. Host us per
   call, the median of 5 rounds of 200 calls.
3. Where the TMA descriptors are made ("descriptors" pieces): one Gluon program that reads a tile
   of Q, K and V by TMA and writes Q's to O, its four 4-D descriptors either made on the host
   (Gluon's TensorDescriptor, built each call, encoded by the launcher) or made in the kernel from
   the pointers and strides (tma.make_tensor_descriptor, as part 5's kernels do: the launcher asks
   Triton's allocator for the descriptors' global scratch). The same work on the GPU; the host us
   per call says which way a short call's host time favours.

A run replaces the rows of the targets and pieces it measures and keeps the others: the rows of
part 5 with "LEAN" off and on are of a launch tried and not kept (the launcher's C function
called directly, one descriptor scratch per stream: 2-3% of the host time, and the cached scratch
broke torch.compile's CUDA graphs, whose warm-up allocates into the graph's pool).
"""

import functools
import statistics
import sys
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

from common import parts, runtime
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE, _descriptor_scratch, properties
from common.validate import check_inputs
from lab import results, study
from lab.impls import sdpa_context
from part5_profiling import fast_launch, gluon_backward
from part5_profiling.hopper import gl, gluon, heads_descriptor, mbarrier, swizzled, tma, tma_load, tma_store
from part5_profiling.tools.launch_cost import B, D, Floor, H, host_us, one_thread, paired_times, sdpa_calls

LENS = (512, 1024, 2048)
ROUNDS = 15
CALLS = 40
FIELDS = ["section", "target", "threads", "N", "what", "us", *results.PROVENANCE]
KEY = ("section", "target", "threads", "N", "what")
DEVICE_THREAD, ONE_THREAD = "autograd's device thread", "one thread"


@triton.jit
def _touch(X):
    """One program writes one float: a launch with (next to) nothing to run."""
    tl.store(X + tl.program_id(0), 0.0)


_touch_launch = fast_launch.Launch(_touch)


def touch(x):
    """_touch on x (float32) through part 5's Launch: Triton's launcher, none of part 5's Python."""
    _touch_launch(("touch", x.device), lambda _: 1, x)


@gluon.jit
def _copy_tiles(q_desc, k_desc, v_desc, o_desc):
    """Read the first tile of Q, K and V by TMA, write Q's to O: four descriptors, nearly no work."""
    q = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, q_desc.block_type.nbytes + k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(q_desc, [0, 0, 0, 0], bar, q)
    tma_load(k_desc, [0, 0, 0, 0], bar, k)
    tma_load(v_desc, [0, 0, 0, 0], bar, v)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    tma_store(o_desc, [0, 0, 0, 0], q)
    tma.store_wait(0)


@gluon.jit
def _tiles_host_descriptors(q_desc, k_desc, v_desc, o_desc):
    _copy_tiles(q_desc, k_desc, v_desc, o_desc)


@gluon.jit
def _tiles_kernel_descriptors(Q, K, V, O, B, H, N, sb, sh, sn, ROWS: gl.constexpr, D: gl.constexpr):
    q_desc = heads_descriptor(Q, [B, H, N, D], [sb, sh, sn], [1, 1, ROWS, D])
    k_desc = heads_descriptor(K, [B, H, N, D], [sb, sh, sn], [1, 1, ROWS, D])
    v_desc = heads_descriptor(V, [B, H, N, D], [sb, sh, sn], [1, 1, ROWS, D])
    o_desc = heads_descriptor(O, [B, H, N, D], [sb, sh, sn], [1, 1, ROWS, D])
    _copy_tiles(q_desc, k_desc, v_desc, o_desc)


def descriptor_calls(q, k, v, o, rows=64):
    """{way: a call} that launches the four-descriptor copy with its descriptors made on the host
    (each call, as a launch of part 5 would) or in the kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d, layout = q.shape[-1], swizzled(4)

    def host():
        descs = [TensorDescriptor.from_tensor(t, [1, 1, rows, d], layout) for t in (q, k, v, o)]
        _tiles_host_descriptors[(1,)](*descs, num_warps=4)

    def kernel():
        _tiles_kernel_descriptors[(1,)](q, k, v, o, *q.shape[:3], *q.stride()[:3], rows, d, num_warps=4)

    return {"descriptors made on the host": host, "descriptors made in the kernel": kernel}


def statistics_shapes(q):
    """The shapes of part 5's backward's statistics (L * log2(e) and D_i) and float32 dQ, in whole
    query tiles (gluon_backward.Plan's)."""
    n_seqs, tiles = q.shape[0] * q.shape[1], -(-q.shape[2] // gluon_backward.BLOCK_M) * gluon_backward.BLOCK_M
    return (2, n_seqs, tiles), (n_seqs, tiles, q.shape[-1])


def with_tensors(launch=None):
    """An autograd.Function with part 5's tensors and none of its work: what its allocations, saved
    tensors and returned gradients cost the host; launch(t), given, is called where part 5 launches."""

    class Tensors(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            if launch is not None:
                launch(lse)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            stats_shape, dq32_shape = statistics_shapes(q)
            stats = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
            torch.empty(dq32_shape, dtype=torch.float32, device=q.device)
            dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
            dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
            if launch is not None:
                for _ in range(3):
                    launch(stats)
            dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            return dq, dk, dv, None

    return Tensors


Tensors = with_tensors()
TorchLaunches = with_tensors(torch.Tensor.zero_)
TritonLaunches = with_tensors(touch)


def fwd_bwd(function, q, k, v, do):
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    return lambda: torch.autograd.grad(function(*leaves, False), leaves, do)


def ladder_rows(module, n, meta):
    """The ladder at sequence length n: rows of the median us and the ratio to SDPA cuDNN's."""
    q, k, v, do = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, DEVICE, seed=n)
    plain = {
        "floor": fwd_bwd(Floor.apply, q, k, v, do),
        "tensors": fwd_bwd(Tensors.apply, q, k, v, do),
        "tensors + torch launches": fwd_bwd(TorchLaunches.apply, q, k, v, do),
        "tensors + Triton launches": fwd_bwd(TritonLaunches.apply, q, k, v, do),
        "part 5": fwd_bwd(module.FlashAttention.apply, q, k, v, do),
        "SDPA cuDNN": sdpa_calls("cudnn", n)["fwd+bwd"],
    }
    targets = {}
    for name, fn in plain.items():
        context = (lambda: sdpa_context("cudnn")) if name == "SDPA cuDNN" else nullcontext
        for threads, wrap in ((DEVICE_THREAD, lambda f: f), (ONE_THREAD, one_thread)):
            targets[name, threads] = (wrap(fn), context)
    paired_times(targets, 1, CALLS)  # a round that warms every target up: compiles, autotunes, learns its launches
    times = paired_times(targets, ROUNDS, CALLS)
    rows = []
    for (name, threads), us in times.items():
        base = dict(section="ladder", target=name, threads=threads, N=n, **meta)
        yard = times["SDPA cuDNN", threads]
        ratio = statistics.median(a / b for a, b in zip(us, yard))
        rows.append(dict(base, what="us (median of rounds)", us=f"{statistics.median(us):.1f}"))
        rows.append(dict(base, what="over SDPA cuDNN (median of rounds)", us=f"{ratio:.2f}"))
        print(f"N={n:>5} {threads:<25} {name:<28} {statistics.median(us):8.1f} us  {ratio:5.2f}x cuDNN", flush=True)
    return rows


def piece_rows(module, meta, n=512):
    """Single operations, issued back to back on the calling thread: host us per call."""
    q, k, v, do = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, DEVICE, seed=n)
    stream = torch.cuda.current_stream().cuda_stream
    small = torch.empty(64, dtype=torch.float32, device=DEVICE)
    o, lse = module.flash_forward(q, k, v, False)
    sms = properties(q.device).multi_processor_count
    scratch_bytes = sms * 3 * 128  # the forward's persistent grid: 3 descriptors of 128 bytes a program
    forward = lambda: module.flash_forward(q, k, v, False)  # noqa: E731
    backward = lambda: module.flash_backward(q, k, v, o, lse, do, False)  # noqa: E731
    pieces = [  # (name, the call)
        ("torch.empty, O's shape", lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device)),
        ("descriptor scratch, Triton's allocator", lambda: _descriptor_scratch(scratch_bytes, 128, stream)),
        ("check_inputs", lambda: check_inputs(q, k, v, False, triton=True)),
        ("a PyTorch launch (zero_ of 64 floats)", small.zero_),
        ("a Triton launch (one program)", lambda: touch(small)),
        ("flash_forward", forward),
        ("flash_backward", backward),
    ]
    o_copy = torch.empty_like(q)
    for way, fn in descriptor_calls(q, k, v, o_copy).items():
        fn()
        torch.cuda.synchronize()
        if not torch.equal(o_copy[0, 0, :64], q[0, 0, :64]):
            raise AssertionError(f"the copy with {way} did not copy Q's first tile")
        o_copy.zero_()
        pieces.append((f"a 4-descriptor TMA copy, {way}", fn))
    rows = []
    for name, fn in pieces:
        with torch.no_grad():
            fn()  # the first call of a key goes through Triton's own path
            us = host_us(fn, rounds=5, calls=200)
        row = dict(section="piece", target=name, threads="calling", N=n, what="us per call", us=f"{us:.2f}")
        rows.append(dict(row, **meta))
        print(f"piece  {name:<45} {us:8.2f} us", flush=True)
    return rows


def run(save=None, pieces_only=False):
    runtime.set_triton_allocator()  # the in-kernel descriptors' scratch
    module = parts.load(5)
    meta = results.provenance()
    rows = piece_rows(module, meta)
    for n in () if pieces_only else LENS:
        rows += ladder_rows(module, n, meta)
        torch.cuda.empty_cache()
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    args = study.arguments(
        __doc__, argv, extra=[(("--pieces-only",), dict(action="store_true", help="the pieces, not the ladder"))]
    )
    if not study.on_gpu("The host's pieces are measured beside a GPU's launches"):
        return 0
    measure = functools.partial(run, pieces_only=args.pieces_only)
    return results.write_as_measured("part5_host_parts.csv", FIELDS, measure, failed=lambda r: False, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
