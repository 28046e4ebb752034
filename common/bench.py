"""The benchmark: parts against every SDPA backend, checked before timed.

    python -m common.bench                      # every part with a kernel, the full grid, on a GPU
    python -m common.bench --part 1             # one part (SDPA baselines are always timed alongside)
    python -m common.bench --quick              # N = 1024 and 4096 only
    python -m common.bench --mode fwd --mode fwd+bwd --mode bwd
    python -m common.bench --part 4 --flex        # FlexAttention too (compiled per shape: slow to start)
    python -m common.bench --d 128 --causal 1 --n 2048    # one shape of the grid

Protocol: B=4, H=8, D in {64, 128}, N in {512 ... 16384}, causal and not, bf16.
Modes: fwd (the default) times the forward; fwd+bwd times the forward followed by the gradients of
Q, K and V; bwd times the backward alone, re-run on one retained graph. Every implementation is
first checked against the float64 reference on two (batch, head) slices of the very inputs it is
timed on (O and L for fwd; O, dQ, dK, dV for the backward modes); one that fails is not timed.
Timing is triton.testing.do_bench, median (the protocol), and also CUDA-graph replay (GPU time
without the Python launch cost); a call of 50 ms or more (a PyTorch backward at long N) is instead
the median of three calls, each timed alone after an L2 flush. FLOPs: 4*B*H*N*N*D, halved for causal; backward 2.5x forward.
Rows go to results/<gpu>/bench.csv (a row replaces an older one with the same key).

Without a GPU: checks each part's forward and gradients under the interpreter on a small shape
and says that timings need a GPU.
"""

import argparse
import contextlib
import functools
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common import parts, results, runtime
from common.check import Report, check_outputs
from common.inputs import Shape, make_inputs

B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQ_LENS = (1024, 4096)
DTYPE = torch.bfloat16
MODES = ("fwd", "fwd+bwd", "bwd")
PYTORCH_PART_MAX_N = 2048  # part 0 is Python loops over 64x64 tiles; the time per call grows as N^2
# The PyTorch backward of parts 0-3 launches over a dozen small kernels per pair of 64-row tiles,
# 4096 pairs at N = 4096 (over a second per call, B=4, H=8), four times as many at 8192.
PYTORCH_BACKWARD_MAX_N = 4096
MATH_MAX_N = 4096  # SDPA's math backend materialises B*H*N*N scores: 17 GB of bf16 at N = 16384
SDPA_BACKENDS = {"flash": "SDPA flash (FA2)", "cudnn": "SDPA cuDNN", "efficient": "SDPA efficient",
                 "math": "SDPA math", "default": "SDPA default"}  # fmt: skip

FLEX = "flex"  # FlexAttention (torch.nn.attention.flex_attention, compiled): timed only with --flex
FIELDS = ["impl", "part", "B", "H", "N", "D", "dtype", "causal", "mode", "ms", "tflops", "graph_ms", "graph_tflops",
          "backend", "check", "gpu", "torch", "triton", "commit", "date", "run_id", "command"]  # fmt: skip
KEY = ("impl", "B", "H", "N", "D", "dtype", "causal", "mode")


def why(e):
    """An exception in one line for a CSV cell: its type and the first line of its message (which may be empty)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:120]}" if lines else type(e).__name__


def attention_flops(b, h, n_q, n_k, d, causal, mode="fwd"):
    """4*B*H*N_q*N_k*D for the two matmuls of the forward, halved when causal; backward = 2.5x."""
    flops = 4 * b * h * n_q * n_k * d
    if causal:
        flops //= 2
    return {"fwd": flops, "bwd": flops * 2.5, "fwd+bwd": flops * 3.5}[mode]


# ------------------------------------------------------------------------------------ implementations
@dataclass
class Impl:
    """One implementation the benchmark checks and times."""

    name: str  # the CSV's impl column: "part1", "sdpa_flash"
    forward: Callable  # (q, k, v, causal) -> {"O": O} or {"O": O, "L": L}: what the forward check compares
    attention: Callable  # (q, k, v, causal) -> O, differentiable: what is timed, and the backward's source
    part: int | None = None  # the part number; None for SDPA
    context: Callable = contextlib.nullcontext  # entered once around the check and all timed calls
    max_n: int | None = None  # the longest N it is run at
    graph: bool = True  # also time its replay from a CUDA graph
    backward_max_n: int | None = None  # the longest N of the fwd+bwd and bwd modes, if shorter
    backward_graph: bool = True  # whether the backward modes are timed from a CUDA graph too

    def runs(self, mode, n):
        """Whether this implementation is timed in this mode at this N."""
        longest = [m for m in (self.max_n, None if mode == "fwd" else self.backward_max_n) if m is not None]
        return all(n <= m for m in longest)

    backend: Callable | None = None  # (q, k, v, causal) -> what really ran, for the CSV's backend column


def impl_label(name):
    """How tables and plots name an implementation: "part1" -> "part 1", "sdpa_flash" -> "SDPA flash (FA2)"."""
    if name == FLEX:
        return "FlexAttention"
    return SDPA_BACKENDS.get(name.removeprefix("sdpa_"), name.replace("part", "part "))


def part_impl(n):
    """Part n, checked through flash_forward(Q, K, V, is_causal) -> (O, L), timed through FlashAttention.apply.
    A part written in PyTorch alone (part 0: thousands of small ops per call) runs only up to
    PYTORCH_PART_MAX_N and without a CUDA graph; so does, in the backward modes, a part whose backward
    is the tiled PyTorch one of common/backward.py, up to PYTORCH_BACKWARD_MAX_N."""
    module = parts.load(n)
    triton_part = parts.uses_triton(n)
    pytorch_backward = module.flash_backward.__module__ != module.__name__  # borrowed from common/

    def forward(q, k, v, causal):
        o, lse = module.flash_forward(q, k, v, causal)
        return {"O": o, "L": lse}

    return Impl(name=f"part{n}", forward=forward, attention=module.FlashAttention.apply, part=n,
                max_n=None if triton_part else PYTORCH_PART_MAX_N, graph=triton_part,
                backward_max_n=PYTORCH_BACKWARD_MAX_N if pytorch_backward else None,
                backward_graph=triton_part and not pytorch_backward, backend=lambda *_: chosen_config(module))  # fmt: skip


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_impl(backend):
    """SDPA pinned to one backend ("default": PyTorch chooses, and the CSV records what it chose)."""
    chosen = (lambda q, k, v, c: dispatched_backend(lambda: sdpa(q, k, v, c))) if backend == "default" else None
    return Impl(name=f"sdpa_{backend}", forward=lambda q, k, v, c: {"O": sdpa(q, k, v, c)}, attention=sdpa,
                context=functools.partial(sdpa_context, backend), max_n=MATH_MAX_N if backend == "math" else None,
                backend=chosen)  # fmt: skip


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx  # top-left alignment, as every part and SDPA's is_causal


@functools.cache
def _flex():
    """flex_attention compiled once (torch.compile generates its Triton kernels per shape on first use)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def _block_mask(n_q, n_k, device):
    """The causal block mask for one shape, built once (building it is work on the GPU of its own)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, B=None, H=None, Q_LEN=n_q, KV_LEN=n_k, device=device)


def flex(q, k, v, causal):
    """FlexAttention, compiled: PyTorch's template for attention variants, generated as Triton kernels."""
    mask = _block_mask(q.shape[-2], k.shape[-2], str(q.device)) if causal else None
    return _flex()(q, k, v, block_mask=mask)


def flex_impl():
    """FlexAttention beside SDPA. Its first call at each shape compiles (tens of seconds), so the
    benchmark times it only when asked (--flex); the check runs first and compiles it."""
    return Impl(name=FLEX, forward=lambda q, k, v, c: {"O": flex(q, k, v, c)}, attention=flex)


def sdpa_fn(name, q, k, v, causal):
    """A closure running SDPA pinned to one backend ('default': PyTorch chooses). Entering the pin on
    every call costs Python time: the benchmark enters sdpa_context(name) once instead."""

    def run():
        with sdpa_context(name):
            return sdpa(q, k, v, causal)

    return run


def sdpa_context(name):
    """Pins SDPA to one backend ('default' lets PyTorch choose). Entered once around the check and
    all timed calls: entering it per call would add its Python cost to every timing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pinned = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # fmt: skip
    return contextlib.nullcontext() if name == "default" else sdpa_kernel([pinned[name]])


def chosen_config(module):
    """The configuration an autotuned part picked for its last forward, e.g. '128x64 w4 s3' ('' if
    not autotuned). The forward kernel is _attn_fwd in every part; a part that can launch another
    forward kernel says so through forward_label() (None: it was _attn_fwd)."""
    label = getattr(module, "forward_label", lambda: None)()
    if label is not None:
        return label
    kernel = getattr(module, "_attn_fwd", None)
    if kernel is None:  # part 0 has no kernel, and may run where Triton is not installed
        return ""
    from common import triton_tools

    config = triton_tools.chosen(kernel)
    return "" if config is None else config_label(config)


def config_label(config):
    """A triton.Config of a tiled kernel as the tables write it: '128x64 w4 s3'."""
    return f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']} w{config.num_warps} s{config.num_stages}"


def dispatched_backend(fn):
    """Which backend SDPA's default dispatch really ran, read off the profiler's operator names."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = " ".join(e.key for e in prof.key_averages())
    for label in ("cudnn", "flash", "efficient"):
        if f"_scaled_dot_product_{label}_attention" in names:
            return label
    return "math" if "_scaled_dot_product_attention_math" in names else "unknown"


# ------------------------------------------------------------------------------------ checks
def check_slices(out, q, k, v, causal, do=None):
    """Compare outputs (O, L, dQ, dK, dV, as check_outputs takes them) with the float64 reference on
    the first and the last (batch, head) slice: a float64 reference for all B*H heads would not fit
    at full size. Heads are independent, so a slice of the outputs is the output of the slice."""
    report = Report()
    for b, h in ((0, 0), (q.shape[0] - 1, q.shape[1] - 1)):

        def one(t, b=b, h=h):
            return None if t is None else t[b : b + 1, h : h + 1]

        report.extend(check_outputs({name: one(t) for name, t in out.items()}, one(q), one(k), one(v), one(do), causal))
    worst = Report()  # per tensor, the worse of the two slices
    for name in dict.fromkeys(c.name for c in report):
        worst.append(max((c for c in report if c.name == name), key=lambda c: (not c.ok, c.err / c.allowed)))
    return worst


def check(impl, mode, q, k, v, do, causal):
    """Check impl on these inputs: for fwd its forward's O and L; for the backward modes O and the
    gradients dQ, dK, dV that autograd gets through it for the upstream gradient do."""
    if mode == "fwd":
        with torch.no_grad():
            return check_slices(impl.forward(q, k, v, causal), q, k, v, causal)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        o = impl.attention(*leaves, causal)
        dq, dk, dv = torch.autograd.grad(o, leaves, do)
    return check_slices({"O": o.detach(), "dQ": dq, "dK": dk, "dV": dv}, q, k, v, causal, do)


# ------------------------------------------------------------------------------------ timing
SLOW_MS = 50.0  # a call this long is timed by slow_time_ms, not do_bench
SLOW_SAMPLES = 3
_FLUSH_BYTES = 256 * 2**20  # what do_bench writes to flush L2 (the H200's is 60 MB)


def time_ms(fn, warmup=25, rep=100):
    """Median milliseconds of fn over about `rep` ms of runs, after `warmup` ms (L2 flushed between
    runs): triton.testing.do_bench. A call that takes SLOW_MS or more twice in a row (the PyTorch
    backward of parts 0-3 at long N: seconds a call) gets slow_time_ms instead: do_bench would make
    eight such calls and time only one of them."""
    import triton

    if one_call_ms(fn) < SLOW_MS or one_call_ms(fn) < SLOW_MS:  # the first may include compiling
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return slow_time_ms(fn)


def one_call_ms(fn, flush=None):
    """Milliseconds of one call of fn between two CUDA events, after writing `flush` (if given)."""
    if flush is not None:
        flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def slow_time_ms(fn):
    """Median of SLOW_SAMPLES calls, each timed alone with L2 flushed before it (for calls so long
    that one more warm-up or a few samples are all the statistics they need)."""
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    times = sorted(one_call_ms(fn, flush) for _ in range(SLOW_SAMPLES))
    return times[len(times) // 2]


def graph_time_ms(fn):
    """Median milliseconds of fn replayed from a CUDA graph: the GPU's time alone, without the
    Python and launch cost of each call (which do_bench includes whenever it exceeds the GPU time)."""
    import triton

    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def timed_call(impl, mode, q, k, v, do, causal):
    """The call to time in each mode. fwd: the forward alone (inputs that need no gradient: no graph
    is built). fwd+bwd: the forward, then dQ, dK, dV. bwd: the backward alone. The forward runs once
    here and each call re-runs the backward on its graph: retain_graph=True keeps the forward's saved
    tensors, so every call does exactly the backward's work and nothing else. On a GPU that forward
    runs on a stream of its own, so that the backward can be captured in a CUDA graph too."""
    if mode == "fwd":
        return lambda: impl.attention(q, k, v, causal)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    if mode == "fwd+bwd":
        return lambda: torch.autograd.grad(impl.attention(*leaves, causal), leaves, do)
    if not q.is_cuda:
        o = impl.attention(*leaves, causal)
    else:  # autograd runs each backward op on its forward's stream: not the legacy default stream,
        stream = torch.cuda.Stream()  # which cannot join a CUDA-graph capture
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            o = impl.attention(*leaves, causal)
        torch.cuda.current_stream().wait_stream(stream)
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def measure(row, impl, mode, q, k, v, do, causal, timer, graph_timer=None):
    """Check one implementation in one mode on these inputs; time it only if the check passed. Fills row."""
    row.update(ms="", tflops="", graph_ms="", graph_tflops="", backend="")
    try:
        report = check(impl, mode, q, k, v, do, causal)
    except Exception as e:  # an SDPA backend may refuse a shape: record why, go on
        row["check"] = f"error: {why(e)}"
        return row
    row["check"] = ("ok " if report.ok else "FAIL ") + " ".join(f"{c.name}={c.err:.1e}" for c in report)
    if not report.ok:
        return row
    b, h, n_q, d = q.shape
    flops = attention_flops(b, h, n_q, k.shape[-2], d, causal, mode)
    fn = timed_call(impl, mode, q, k, v, do, causal)
    with torch.no_grad() if mode == "fwd" else contextlib.nullcontext():
        ms = timer(fn)
        row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms * 1e-9:.1f}")
        if graph_timer is not None and (impl.graph if mode == "fwd" else impl.backward_graph):
            try:
                gms = graph_timer(fn)
                row.update(graph_ms=f"{gms:.4f}", graph_tflops=f"{flops / gms * 1e-9:.1f}")
            except Exception as e:  # not every implementation can be captured in a graph
                row["check"] += f"; no graph timing: {type(e).__name__}"
    if impl.backend is not None:
        row["backend"] = impl.backend(q, k, v, causal)
    return row


def measure_forward(module, q, k, v, causal, do_bench=True):
    """Check a part's forward (or a study's variant of it: ablation steps, launch orders, candidates)
    against the float64 reference on (q, k, v); if it passed, time it: do_bench median (the
    protocol; skipped with do_bench=False) and CUDA-graph replay. Returns row fields: check, ms,
    tflops, graph_ms, graph_tflops and config (what the autotuner chose)."""
    b, h, n_q, d = q.shape
    flops = attention_flops(b, h, n_q, k.shape[-2], d, causal)
    with torch.no_grad():
        o, lse = module.flash_forward(q, k, v, causal)
        report = check_slices({"O": o, "L": lse}, q, k, v, causal)
        out = {"check": ("ok " if report.ok else "FAIL ") + str(report)}
        if not report.ok:
            return out
        fn = functools.partial(module.flash_forward, q, k, v, causal)
        if do_bench:
            ms = time_ms(fn)
            out.update(ms=f"{ms:.4f}", tflops=f"{flops / ms * 1e-9:.1f}")
        try:
            gms = graph_time_ms(fn)
            out.update(graph_ms=f"{gms:.4f}", graph_tflops=f"{flops / gms * 1e-9:.1f}")
        except Exception as e:  # as in the benchmark: say why, keep the do_bench time
            out["check"] += f"; no graph timing: {type(e).__name__}"
    out["config"] = chosen_config(module)
    return out


def each_shape(seq_lens, head_dims=HEAD_DIMS, masks=(False, True), b=B, h=H):
    """(d, causal, n, (q, k, v, do)) for every shape of the grid, in the benchmark's order and with
    its seeds (every study that times on the benchmark's inputs walks the grid through this); the
    GPU's cached memory is released after each shape."""
    for d in head_dims:
        for causal in masks:
            for n in seq_lens:
                yield d, causal, n, make_inputs(Shape((b, h), n, n, d), DTYPE, runtime.DEVICE, seed=n + d + causal)
                torch.cuda.empty_cache()


def run_gpu(impls, modes, seq_lens, save=None, head_dims=HEAD_DIMS, masks=(False, True)):
    """Check and time every implementation; save(rows so far), if given, after each shape, so a run
    cut short keeps what it measured."""
    meta = results.provenance()
    meta["run_id"] = re.sub(r"\D", "", meta["date"])  # the rows of one run share it
    print(f"benchmark on {runtime.describe()}, commit {meta['commit']}", flush=True)
    rows = []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, head_dims, masks):
        for mode in modes:
            for impl in (i for i in impls if i.runs(mode, n)):
                row = dict(impl=impl.name, part="" if impl.part is None else impl.part, B=B, H=H, N=n, D=d,
                           dtype="bf16", causal=int(causal), mode=mode, **meta)  # fmt: skip
                with impl.context():
                    rows.append(measure(row, impl, mode, q, k, v, do, causal, time_ms, graph_time_ms))
                print(f"{impl.name:>16} {mode:<7} D={d} causal={causal:d} N={n:>5}  {row['ms'] or '-':>9} ms "
                      f"{row['tflops'] or '-':>7} TFLOP/s (graph {row['graph_tflops'] or '-':>7})  {row['check']}",
                      flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows


def row_order(r):
    """bench.csv's order: mode, D, causal, then parts by number and SDPA backends as listed, then N."""
    part = str(r["part"])
    if part:
        impl = (0, int(part))
    elif r["impl"] == FLEX:
        impl = (2, 0)
    else:
        impl = (1, list(SDPA_BACKENDS).index(r["impl"].removeprefix("sdpa_")))
    return (MODES.index(r["mode"]), int(r["D"]), int(r["causal"]), impl, int(r["N"]))


def run_cpu(part_numbers):
    """No GPU: check each part's forward and gradients under the interpreter on a small shape."""
    print(f"no CUDA GPU found ({runtime.describe()})")
    ok = True
    shape = Shape((2, 2), 128, 96, 64)
    for n in part_numbers:
        impl = part_impl(n)
        for dtype, causal in ((torch.float32, False), (torch.float16, True)):
            q, k, v, do = make_inputs(shape, dtype, runtime.DEVICE, seed=1)
            for mode in ("fwd", "fwd+bwd"):
                start = time.perf_counter()
                report = check(impl, mode, q, k, v, do, causal)
                ok &= report.ok
                print(f"part {n} {str(dtype)[6:]:>7} causal={causal:d} {mode:<7} {shape}: {report}  "
                      f"({time.perf_counter() - start:.1f} s)")  # fmt: skip
    print(
        "checks " + ("passed" if ok else "FAILED") + ". Timings need a CUDA GPU: on a CPU the Triton parts run in "
        "Triton's interpreter, which is orders of magnitude slower and says nothing about kernel speed."
    )
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable); default: every part")
    ap.add_argument("--mode", action="append", choices=MODES, help="what to time (repeatable); default: fwd")
    ap.add_argument("--quick", action="store_true", help=f"only N in {QUICK_SEQ_LENS}")
    ap.add_argument("--n", type=int, action="append", help="sequence length (repeatable); default: the full grid")
    ap.add_argument("--d", type=int, action="append", choices=HEAD_DIMS, help="head dim (repeatable); default: all")
    ap.add_argument("--causal", type=int, choices=(0, 1), help="only causal (1) or only not (0); default: both")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the SDPA baselines")
    ap.add_argument("--sdpa", action="append", choices=SDPA_BACKENDS, help="SDPA backend (repeatable); default: all")
    ap.add_argument("--flex", action="store_true", help="also time FlexAttention (compiles per shape: slow to start)")
    args = ap.parse_args(argv)
    try:
        part_numbers = parts.require(args.part) if args.part else parts.available()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if not runtime.HAS_GPU:
        return 0 if run_cpu(part_numbers) else 1
    if runtime.INTERPRET:
        sys.exit("TRITON_INTERPRET=1 is set: unset it to benchmark compiled kernels on the GPU")
    impls = [part_impl(n) for n in part_numbers]
    backends = args.sdpa or list(SDPA_BACKENDS)
    impls += [] if args.no_sdpa else [sdpa_impl(name) for name in backends]
    impls += [flex_impl()] if args.flex else []
    modes = [m for m in MODES if m in (args.mode or ["fwd"])]
    path = results.results_dir() / "bench.csv"

    def save(rows):
        results.write_csv(path, rows, FIELDS, key=KEY, sort=row_order)

    masks = (False, True) if args.causal is None else (bool(args.causal),)
    seq_lens = args.n or (QUICK_SEQ_LENS if args.quick else SEQ_LENS)
    rows = run_gpu(impls, modes, seq_lens, save, head_dims=args.d or HEAD_DIMS, masks=masks)
    save(rows)
    failed = [r for r in rows if r["check"].startswith("FAIL")]
    print(f"wrote {len(rows)} rows to {results.shown(path)}")
    if failed:
        print(f"{len(failed)} implementation/shape pairs FAILED their check and were not timed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
