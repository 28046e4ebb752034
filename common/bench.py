"""The benchmark: parts against every SDPA backend, checked before timed.

    python -m common.bench                # every part that exists, the full grid, on a GPU
    python -m common.bench --part 1       # one part (SDPA baselines are always timed alongside)
    python -m common.bench --quick        # N = 1024 and 4096 only

Protocol: B=4, H=8, D in {64, 128}, N in {512 ... 16384}, causal and not, bf16.
Every implementation is first checked against the float64 reference on two (batch, head)
slices of the very inputs it is timed on; one that fails is not timed. Timing is
triton.testing.do_bench, median (the protocol), and also CUDA-graph replay (GPU time without the
Python launch cost). FLOPs: 4*B*H*N*N*D, halved for causal; backward 2.5x forward.
Rows go to results/<gpu>/bench.csv (a row replaces an older one with the same key).

Without a GPU: checks each part under the interpreter on a small shape and says that timings
need a GPU.
"""

import argparse
import contextlib
import csv
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from common import parts, runtime
from common.check import Report, check_outputs, check_part, saved_lse
from common.inputs import Shape, make_inputs

ROOT = Path(__file__).resolve().parent.parent
B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQ_LENS = (1024, 4096)
DTYPE = torch.bfloat16
PART0_MAX_N = 2048  # part 0 is Python loops over 64x64 tiles; the time per call grows as N^2 (seconds past 4096)
MATH_MAX_N = 4096  # SDPA's math backend materialises B*H*N*N scores: 17 GB of bf16 at N = 16384
SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math", "default")

FIELDS = [
    "impl",
    "part",
    "B",
    "H",
    "N",
    "D",
    "dtype",
    "causal",
    "mode",
    "ms",
    "tflops",
    "graph_ms",
    "graph_tflops",
    "backend",
    "check",
    "gpu",
    "torch",
    "triton",
    "commit",
    "date",
    "run_id",
]
KEY = ("impl", "B", "H", "N", "D", "dtype", "causal", "mode")


def attention_flops(b, h, n_q, n_k, d, causal, mode="fwd"):
    """4*B*H*N_q*N_k*D for the two matmuls of the forward, halved when causal; backward = 2.5x."""
    flops = 4 * b * h * n_q * n_k * d
    if causal:
        flops //= 2
    return {"fwd": flops, "bwd": flops * 2.5, "fwd+bwd": flops * 3.5}[mode]


def results_dir():
    return Path(os.environ.get("RESULTS_DIR", ROOT / "results" / runtime.gpu_slug()))


def commit():
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------------ SDPA
def _sdpa_backend(name):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def sdpa_fn(name, q, k, v, causal):
    """A closure running SDPA; pin the backend with sdpa_context(name) around the calls."""
    import torch.nn.functional as F

    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_context(name):
    """Pins SDPA to one backend ('default' lets PyTorch choose). Entered once around the check and
    all timed calls: entering it per call would add its Python cost to every timing."""
    from torch.nn.attention import sdpa_kernel

    return contextlib.nullcontext() if name == "default" else sdpa_kernel([_sdpa_backend(name)])


def part_fn(module, q, k, v, causal):
    """A closure running a part's forward."""
    return lambda: module.FlashAttention.apply(q, k, v, causal)


def chosen_config(module):
    """The configuration an autotuned part picked for its last call, e.g. '128x64 w4 s3' ('' if not autotuned)."""
    config = getattr(getattr(module, "_attn_fwd", None), "best_config", None)
    if config is None:
        return ""
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
def _check_forward(o, lse, q, k, v, causal):
    """Compare O (and L, if given) with the float64 reference on the first and the last
    (batch, head) slice: a full-size float64 reference for all B*H heads would not fit."""
    b_last, h_last = q.shape[0] - 1, q.shape[1] - 1
    report = Report()
    for b, h in ((0, 0), (b_last, h_last)):

        def one(t, b=b, h=h):
            return t[b : b + 1, h : h + 1]

        out = {"O": one(o)} if lse is None else {"O": one(o), "L": one(lse)}
        report.extend(check_outputs(out, one(q), one(k), one(v), None, causal))
    worst = Report()  # per tensor, the worse of the two slices
    for name in dict.fromkeys(c.name for c in report):
        worst.append(max((c for c in report if c.name == name), key=lambda c: (not c.ok, c.err / c.allowed)))
    return worst


def check_impl(impl, fn, q, k, v, causal):
    """Check an implementation's forward. Parts are also checked on L (found among saved tensors)."""
    if impl.startswith("part"):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            o = parts.load(int(impl[4:])).FlashAttention.apply(*leaves, causal)
        return _check_forward(o.detach(), saved_lse(o, leaves[0]).detach(), q, k, v, causal)
    with torch.no_grad():
        return _check_forward(fn(), None, q, k, v, causal)


# ------------------------------------------------------------------------------------ timing
def time_ms(fn, warmup=25, rep=100):
    """Median milliseconds of fn over about `rep` ms of runs, after `warmup` ms (L2 flushed between runs)."""
    import triton

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def graph_time_ms(fn):
    """Median milliseconds of fn replayed from a CUDA graph: the GPU's time alone, without the
    Python and launch cost of each call (which do_bench includes whenever it exceeds the GPU time)."""
    import triton

    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def measure(row, fn, q, k, v, causal, timer, graph_timer=None):
    """Check one implementation on these inputs; time it only if the check passed. Fills row."""
    row.update(ms="", tflops="", graph_ms="", graph_tflops="", backend="")
    try:
        report = check_impl(row["impl"], fn, q, k, v, causal)
    except Exception as e:  # an SDPA backend may refuse a shape: record why, go on
        row["check"] = f"error: {type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
        return row
    row["check"] = ("ok " if report.ok else "FAIL ") + " ".join(f"{c.name}={c.err:.1e}" for c in report)
    if not report.ok:
        return row
    b, h, n_q, d = q.shape
    flops = attention_flops(b, h, n_q, k.shape[-2], d, causal)
    with torch.no_grad():
        ms = timer(fn)
        row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms * 1e-9:.1f}")
        if graph_timer is not None:
            try:
                gms = graph_timer(fn)
                row.update(graph_ms=f"{gms:.4f}", graph_tflops=f"{flops / gms * 1e-9:.1f}")
            except Exception as e:  # not every implementation can be captured in a graph
                row["check"] += f"; no graph timing: {type(e).__name__}"
    if row["impl"] == "sdpa_default":
        row["backend"] = dispatched_backend(fn)
    return row


def run_gpu(part_numbers, seq_lens, include_sdpa=True):
    meta = dict(
        gpu=runtime.gpu_name(),
        torch=torch.__version__,
        triton=runtime.TRITON_VERSION,
        commit=commit(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        run_id=datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d%H%M%S"),
    )
    print(f"benchmark on {runtime.describe()}, commit {meta['commit']}", flush=True)
    rows = []
    for d in HEAD_DIMS:
        for causal in (False, True):
            for n in seq_lens:
                shape = Shape((B, H), n, n, d)
                q, k, v, _ = make_inputs(shape, DTYPE, runtime.DEVICE, seed=n + d + causal)
                impls = []
                for p in part_numbers:
                    if p == 0 and n > PART0_MAX_N:
                        continue
                    impls.append((f"part{p}", p, part_fn(parts.load(p), q, k, v, causal), contextlib.nullcontext()))
                if include_sdpa:
                    for name in SDPA_BACKENDS:
                        if name == "math" and n > MATH_MAX_N:
                            continue
                        impls.append((f"sdpa_{name}", "", sdpa_fn(name, q, k, v, causal), sdpa_context(name)))
                for impl, part, fn, context in impls:
                    row = dict(
                        impl=impl, part=part, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), mode="fwd", **meta
                    )
                    # part 0 is thousands of small PyTorch ops per call: no graph for it
                    graph = graph_time_ms if impl != "part0" else None
                    with context:
                        rows.append(measure(row, fn, q, k, v, causal, time_ms, graph))
                    if part != "" and rows[-1]["ms"]:
                        rows[-1]["backend"] = chosen_config(parts.load(part))
                    r = rows[-1]
                    print(
                        f"{impl:>16} D={d} causal={causal:d} N={n:>5}  {r['ms'] or '-':>9} ms {r['tflops'] or '-':>7} "
                        f"TFLOP/s (graph {r['graph_tflops'] or '-':>7})  {r['check']}",
                        flush=True,
                    )
                torch.cuda.empty_cache()
    return rows


def write_rows(rows, path):
    """Merge rows into the CSV: a new row replaces an old one with the same key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = []
    if path.exists():
        with open(path, newline="") as f:
            old = list(csv.DictReader(f))
    new_keys = {tuple(str(r[k]) for k in KEY) for r in rows}
    merged = [r for r in old if tuple(str(r[k]) for k in KEY) not in new_keys] + rows

    def order(r):
        impl = r["impl"]
        rank = (0, int(impl[4:])) if impl.startswith("part") else (1, SDPA_BACKENDS.index(impl[5:]))
        return (r["mode"], int(r["D"]), int(r["causal"]), rank, int(r["N"]))

    merged.sort(key=order)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(merged)
    return path


def run_cpu(part_numbers):
    """No GPU: check each part under the interpreter on a small shape; timings need a GPU."""
    print(f"no CUDA GPU found ({runtime.describe()})")
    ok = True
    for p in part_numbers:
        for dtype, causal in ((torch.float32, False), (torch.float16, True)):
            shape = Shape((2, 2), 128, 96, 64)
            q, k, v, do = make_inputs(shape, dtype, runtime.DEVICE, seed=1)
            start = time.perf_counter()
            report = check_part(parts.load(p), q, k, v, do, causal)
            ok &= report.ok
            print(
                f"part {p} {str(dtype)[6:]:>7} causal={causal:d} {shape}: {report}  ({time.perf_counter() - start:.1f} s)"
            )
    print(
        "checks " + ("passed" if ok else "FAILED") + ". Timings need a CUDA GPU: on a CPU the Triton parts run in "
        "Triton's interpreter, which is orders of magnitude slower and says nothing about kernel speed."
    )
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable); default: every part")
    ap.add_argument("--quick", action="store_true", help=f"only N in {QUICK_SEQ_LENS}")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the SDPA baselines")
    args = ap.parse_args(argv)
    part_numbers = args.part or parts.available()
    if not runtime.HAS_GPU:
        return 0 if run_cpu(part_numbers) else 1
    if runtime.INTERPRET:
        sys.exit("TRITON_INTERPRET=1 is set: unset it to benchmark compiled kernels on the GPU")
    rows = run_gpu(part_numbers, QUICK_SEQ_LENS if args.quick else SEQ_LENS, include_sdpa=not args.no_sdpa)
    path = write_rows(rows, results_dir() / "bench.csv")
    failed = [r for r in rows if r["check"].startswith("FAIL")]
    print(f"wrote {len(rows)} rows to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if failed:
        print(f"{len(failed)} implementation/shape pairs FAILED their check and were not timed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
