"""The benchmark: parts against every SDPA backend, checked before timed.

    python -m lab.bench                      # every part with a kernel, the full grid, on a GPU
    python -m lab.bench --part 1             # one part (SDPA baselines are always timed alongside)
    python -m lab.bench --mode fwd --mode fwd+bwd --mode bwd
    python -m lab.bench --part 4 --flex        # FlexAttention too (compiled per shape: slow to start)
    python -m lab.bench --part 5 --sdpa cudnn --fa4   # FlashAttention-4 too, where flash-attn-4 is installed
    python -m lab.bench --d 128 --causal 1 --n 2048 --no-sdpa   # one shape of the grid, the parts alone
    python -m lab.bench --part 5 --sdpa cudnn --repeat 3   # three whole runs, one after another

Protocol: B=4, H=8, D in {64, 128}, N in {512 ... 16384}, causal and not, bf16; FLOPs 4*B*H*N*N*D,
halved for causal, the backward 2.5x the forward. Modes: fwd (the default) times the forward;
fwd+bwd the forward and the gradients of Q, K and V; bwd the backward alone, re-run on one retained
graph. Each implementation is first checked against the float64 reference on two (batch, head)
slices of the inputs it is timed on; one that fails is not timed. Timing: lab.timing.time_ms (the
protocol) and CUDA-graph replay (GPU time without the Python launch cost). Rows go to
results/<gpu>/bench.csv (a row replaces an older one of its key); with --repeat R the grid runs R
times and bench_runs.csv keeps every run's rows, numbered 1 to R. Without a GPU: checks each part's
forward and gradients under the interpreter on a small shape and says that timings need a GPU.
"""

import argparse
import functools
import re
import sys

import torch

from common import parts, runtime
from common.check import check_slices, verdict
from common.inputs import Shape, make_inputs
from lab import results
from lab.impls import FA4, FLEX, SDPA_BACKENDS, fa4_impl, flex_impl, part_impl, sdpa_impl
from lab.timing import attention_flops, graph_time_ms, tflops, time_ms

B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
DTYPE = torch.bfloat16
MODES = ("fwd", "fwd+bwd", "bwd")
FIELDS = ["impl", "part", *results.SHAPE_FIELDS, "mode", "ms", "tflops", "graph_ms", "graph_tflops", "backend"]
FIELDS += ["check", "gpu", "torch", "triton", "commit", "date", "run_id", "command"]
KEY = ("impl", "B", "H", "N", "D", "dtype", "causal", "mode")
RUNS_FIELDS = ["run", *FIELDS]  # bench_runs.csv: every run of a --repeat, numbered


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


def measure(row, impl, mode, q, k, v, do, causal, timer=time_ms, graph_timer=graph_time_ms, verdict=verdict):
    """Check one implementation in one mode on these inputs; time it only if the check passed: by
    timer (do_bench's median; None: not) and by graph_timer (CUDA-graph replay). Fills row; verdict
    (a Report -> the check cell) says how the check is written."""
    row.update(ms="", tflops="", graph_ms="", graph_tflops="", backend="")
    try:
        report = check(impl, mode, q, k, v, do, causal)
    except Exception as e:  # an SDPA backend may refuse a shape: record why, go on
        row["check"] = f"error: {results.why(e)}"
        return row
    row["check"] = verdict(report)
    if not report.ok:
        return row
    flops = attention_flops(*q.shape[:3], k.shape[-2], q.shape[-1], causal, mode)
    fn = timed_call(impl, mode, q, k, v, do, causal)
    with torch.set_grad_enabled(mode != "fwd"):  # fwd: no graph is built
        if timer is not None:
            ms = timer(fn)
            row.update(ms=f"{ms:.4f}", tflops=tflops(flops, ms))
        if impl.graph if mode == "fwd" else impl.backward_graph:
            try:
                gms = graph_timer(fn)
                row.update(graph_ms=f"{gms:.4f}", graph_tflops=tflops(flops, gms))
            except Exception as e:  # not every implementation can be captured in a graph
                row["check"] += f"; no graph timing: {type(e).__name__}"
    if impl.backend is not None:
        row["backend"] = impl.backend(q, k, v, causal)
    return row


def each_shape(seq_lens, head_dims=HEAD_DIMS, masks=(False, True), b=B, h=H):
    """(d, causal, n, (q, k, v, do)) for every shape of the grid, in the benchmark's order and with
    its seeds (every study that times on the benchmark's inputs walks the grid through this); the
    GPU's cached memory is released after each shape."""
    for d in head_dims:
        for causal in masks:
            for n in seq_lens:
                yield d, causal, n, make_inputs(Shape((b, h), n, n, d), DTYPE, runtime.DEVICE, seed=n + d + causal)
                torch.cuda.empty_cache()


def run_gpu(impls, modes, seq_lens, save, head_dims=HEAD_DIMS, masks=(False, True)):
    """Check and time every implementation; save(rows so far) after each shape, so a run cut short
    keeps what it measured."""
    meta = results.provenance()
    meta["run_id"] = re.sub(r"\D", "", meta["date"])  # the rows of one run share it
    print(f"benchmark on {runtime.describe()}, commit {meta['commit']}", flush=True)
    print("each row names what ran: a part's tiles, part 5's Gluon kernels (Hopper only; part 4's Triton kernels on")
    print("other GPUs), or the backend SDPA picked", flush=True)
    rows = []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, head_dims, masks):
        for mode in modes:
            for impl in (i for i in impls if i.runs(mode, n)):
                part = "" if impl.part is None else impl.part
                row = dict(impl=impl.name, part=part, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), mode=mode)
                with impl.context():
                    rows.append(measure(dict(row, **meta), impl, mode, q, k, v, do, causal))
                r = rows[-1]
                print(f"{impl.name:>16} {mode:<7} D={d} causal={causal:d} N={n:>5}  {r['ms'] or '-':>9} ms "
                      f"{r['tflops'] or '-':>7} TFLOP/s (graph {r['graph_tflops'] or '-':>7})  {r['backend']}  {r['check']}", flush=True)  # fmt: skip
        save(rows)
    return rows


def row_order(r):
    """bench.csv's order: mode, D, causal, then parts by number, SDPA's backends as listed,
    FlexAttention, FlashAttention-4; then N."""
    name = r["impl"]
    if name.startswith("part"):
        impl = (0, int(name.removeprefix("part")))
    else:
        impl = (1, [*(f"sdpa_{b}" for b in SDPA_BACKENDS), FLEX, FA4].index(name))
    return (MODES.index(r["mode"]), int(r["D"]), int(r["causal"]), impl, int(r["N"]))


def save_run(path, rows, run=1, repeat=1):
    """Write one run's rows (so far) into bench.csv at path; with --repeat (repeat > 1), into
    bench_runs.csv beside it too, numbered `run`, where a row of the same key numbered above `repeat`
    (left by an earlier, longer repeat) goes, so that a key's runs are this repeat's alone once it ends."""
    results.write_csv(path, rows, FIELDS, key=KEY, sort=row_order)
    if repeat > 1:
        keys = {tuple(str(r[c]) for c in KEY) for r in rows}
        results.write_csv(
            path.with_name("bench_runs.csv"),
            [dict(r, run=run) for r in rows],
            RUNS_FIELDS,
            key=("run", *KEY),
            sort=lambda r: (int(r["run"]), *row_order(r)),
            drop=lambda r: int(r["run"]) > repeat and tuple(r[c] for c in KEY) in keys,
        )


def run_cpu(part_numbers):
    """No GPU: check each part's forward and gradients under the interpreter on a small shape."""
    print(f"no CUDA GPU found ({runtime.describe()})")
    if 5 in part_numbers:
        print("part 5 runs part 4's Triton kernels here: its Gluon kernels need a Hopper GPU (sm_90)")
    ok = True
    shape = Shape((2, 2), 128, 96, 64)
    for n in part_numbers:
        for dtype, causal in ((torch.float32, False), (torch.float16, True)):
            q, k, v, do = make_inputs(shape, dtype, runtime.DEVICE, seed=1)
            for mode in ("fwd", "fwd+bwd"):
                report = check(part_impl(n), mode, q, k, v, do, causal)
                ok &= report.ok
                print(f"part {n} {str(dtype)[6:]:>7} causal={causal:d} {mode:<7} {shape}: {report}", flush=True)
    print(
        "checks " + ("passed" if ok else "FAILED") + ". Timings need a CUDA GPU: on a CPU the Triton parts run in "
        "Triton's interpreter, which is orders of magnitude slower and says nothing about kernel speed."
    )
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable); default: every part")
    ap.add_argument("--mode", action="append", choices=MODES, help="what to time (repeatable); default: fwd")
    ap.add_argument("--n", type=int, action="append", help="sequence length (repeatable); default: the full grid")
    ap.add_argument("--d", type=int, action="append", choices=HEAD_DIMS, help="head dim (repeatable); default: all")
    ap.add_argument("--causal", type=int, choices=(0, 1), help="only causal (1) or only not (0); default: both")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the SDPA baselines")
    ap.add_argument("--sdpa", action="append", choices=SDPA_BACKENDS, help="SDPA backend (repeatable); default: all")
    ap.add_argument("--flex", action="store_true", help="also time FlexAttention (compiles per shape: slow to start)")
    ap.add_argument("--fa4", action="store_true", help="also time FlashAttention-4 (flash-attn-4), if installed")
    ap.add_argument("--repeat", type=int, default=1, help="whole runs, one after another (all in bench_runs.csv)")
    args = ap.parse_args(argv)
    try:
        if args.repeat < 1:
            raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
        part_numbers = parts.require(args.part) if args.part else parts.available()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if not runtime.HAS_GPU:
        return 0 if run_cpu(part_numbers) else 1
    if runtime.INTERPRET:
        sys.exit("TRITON_INTERPRET=1 is set: unset it to benchmark compiled kernels on the GPU")
    impls = [part_impl(n) for n in part_numbers]
    impls += [] if args.no_sdpa else [sdpa_impl(name) for name in args.sdpa or SDPA_BACKENDS]
    impls += [flex_impl()] if args.flex else []
    impls += [fa4_impl()] if args.fa4 else []
    if None in impls:  # fa4_impl(): flash-attn-4 does not import
        print("--fa4: flash-attn-4 is not installed here (pip install flash-attn-4): no FA4 rows", flush=True)
        impls.remove(None)
    modes = [m for m in MODES if m in (args.mode or ["fwd"])]
    path = results.results_dir() / "bench.csv"
    masks = (False, True) if args.causal is None else (bool(args.causal),)
    failed = set()
    for run in range(1, args.repeat + 1):
        print(f"run {run} of {args.repeat}", flush=True)
        save = functools.partial(save_run, path, run=run, repeat=args.repeat)
        rows = run_gpu(impls, modes, args.n or SEQ_LENS, save, args.d or HEAD_DIMS, masks)
        failed |= {tuple(r[c] for c in KEY) for r in rows if r["check"].startswith("FAIL")}
        print(f"wrote {len(rows)} rows to {results.shown(path)}")
    if failed:
        print(f"{len(failed)} implementation/shape pairs FAILED their check and were not timed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
