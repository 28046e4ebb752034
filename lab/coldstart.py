"""Cold start: what a part's first calls cost in a fresh process with an empty Triton cache.

    python -m lab.coldstart                          # every Triton part (make coldstart)
    python -m lab.coldstart --part 2 --dtype fp32 --causal 0 --shape small --timeout 60
    python -m lab.coldstart --parallel 8             # eight processes at once, each with its own cache
    python -m lab.coldstart --autotune --part 2      # part 2's autotuner, cold and warm (make autotune)

A first call compiles its kernels (an @triton.autotune kernel also compiles and times every
configuration left after pruning). Triton keeps what it compiled on disk, so each job runs in a new
Python process (cwd: the repository root) whose TRITON_CACHE_DIR is a new, empty folder, and writes
one row per step: import torch; import part; first forward (FlashAttention.apply); first backward;
second call (both again); process (all of it, or the seconds it ran before the --timeout kill).
`configs` counts the configurations the autotuners timed, `binaries` the kernels left in the cache.
Shapes: small = (4, 128, 64); bench = (4, 8, 4096, 64), GPU only, as is bf16. Once per part, "four
calls" runs float32 forward and backward, non-causal then causal, in one process. Rows merge into
results/<gpu>/cold_start.csv by KEY, which holds the commit, so two commits stay side by side.
--autotune: per part, a "cold cache" then a "warm disk cache" process on one new cache, each timing
the first bf16 call at N = 4096, the steady state and a first call at N = 8192 (a new N bucket):
results/<gpu>/part<N>_autotune.csv. Only the standard library and common.parts are imported at the
top: a measuring process times `import torch` and the part's import itself.
"""

import argparse
import concurrent.futures
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PROVENANCE, ROOT, parts

DTYPES = ("fp32", "fp16", "bf16")
SHAPES = {"small": ((4,), 128, 64), "bench": ((4, 8), 4096, 64)}  # (lead, N, D)
ONE, FOUR = "one shape class", "four calls"  # the scenarios: one process each
FIRST = ("first forward", "first backward")
STEPS = ("import torch", "import part", *FIRST, "second call", "four calls", "process")
FIELDS = ["part", "scenario", "device", "dtype", "causal", "shape", "B", "H", "N", "D", "step", "seconds"]
FIELDS += ["configs", "binaries", "status", "parallel", "timeout", *PROVENANCE]
KEY = ("gpu", "commit", "part", "scenario", "dtype", "shape", "causal", "step")
FILENAME = "cold_start.csv"
DEFAULT_TIMEOUT = 600.0  # seconds per process; float32 on an empty cache has taken 40-110 s on the H200
MARK = "COLDSTART "  # the prefix of the lines a measuring process prints, one JSON object each
AUTOTUNE_FIELDS = ["scenario", "seconds", "configs", "chosen", "B", "H", "N", "D", *PROVENANCE]
B, H, D, N_FIRST, N_SECOND = 4, 8, 64, 4096, 8192  # --autotune's shapes


# ------------------------------------------------------------------------------------ in the fresh process
def _emit(**fields):
    print(MARK + json.dumps(fields), flush=True)


def leave():
    """End a measuring process after its last row: os._exit skips the interpreter's teardown, where
    PyTorch can abort a process whose autograd thread ran a backward ("terminate called without an
    active exception", pytorch/pytorch#38230) after every step was measured."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _timed(tuners, sync, call):
    """(call()'s value, its seconds up to a synchronize, how many configurations the autotuners
    `tuners` timed during it: lab.compiler.timed_configs)."""
    from lab import compiler  # here: the parent process never imports torch

    out = []
    start = time.perf_counter()
    configs = compiler.timed_configs(tuners, lambda: (out.append(call()), sync()))
    return out[0], time.perf_counter() - start, configs


def _loaded(part):
    """(the part's module, its @triton.autotune kernels, the device, a synchronize)."""
    import torch

    from common import runtime  # first: it sets Triton up before triton loads

    module = parts.load(part)
    from triton.runtime import Autotuner

    tuners = [x for x in vars(module).values() if isinstance(x, Autotuner)]
    sync = torch.cuda.synchronize if runtime.DEVICE.type == "cuda" else (lambda: None)
    return module, tuners, runtime.DEVICE, sync


def child(job):
    """The steps of one job ({part, scenario, dtype, shape, causal}), timed in this fresh process;
    each printed as a MARK line as soon as it is measured, so a process killed later keeps them."""
    start = time.perf_counter()
    import torch

    _emit(step="import torch", seconds=time.perf_counter() - start)
    start = time.perf_counter()
    module, tuners, device, sync = _loaded(job["part"])
    _emit(step="import part", seconds=time.perf_counter() - start)
    from common.inputs import Shape, make_inputs

    lead, n, d = SHAPES[job["shape"]]
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[job["dtype"]]
    q, k, v, do = make_inputs(Shape(lead, n, n, d), dtype, device)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    sync()

    def step(name, causal, fn, *args):
        out, seconds, configs = _timed(tuners, sync, functools.partial(fn, *args))
        _emit(step=name, seconds=seconds, configs=configs, causal=int(causal))
        return out

    def both(causal):
        return torch.autograd.grad(module.FlashAttention.apply(*leaves, causal), leaves, do)

    four = job["scenario"] == FOUR
    start = time.perf_counter()
    for causal in (False, True) if four else (bool(job["causal"]),):
        o = step("first forward", causal, module.FlashAttention.apply, *leaves, causal)
        step("first backward", causal, torch.autograd.grad, o, leaves, do)
        if not four:
            step("second call", causal, both, causal)
    if four:
        _emit(step="four calls", seconds=time.perf_counter() - start, causal="")


def autotune_child(part):
    """--autotune's fresh process: part's first bf16 forward at N_FIRST (compiling and timing every
    configuration the autotuner keeps), the steady state, then a first call at N_SECOND (a new N
    bucket); one MARK line each. Through FlashAttention.apply, as child(): the part's custom op would
    add PyTorch's first import of torch._dynamo, which is not the autotuner's cost."""
    import torch

    from common.inputs import Shape, make_inputs
    from lab.timing import time_ms

    module, tuners, device, sync = _loaded(part)
    if not tuners:
        raise SystemExit(f"part {part}'s kernel file has no @triton.autotune kernel: there is no autotuning to time")

    def emit(scenario, seconds, n, configs=0):
        _emit(scenario=scenario, seconds=seconds, configs=configs, chosen=parts.forward_config(module), N=n)

    for n, label in ((N_FIRST, ""), (N_SECOND, ": new N bucket, kernels already compiled")):
        q, k, v, _ = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, device, seed=n)
        call = functools.partial(module.FlashAttention.apply, q, k, v, False)
        sync()
        _, seconds, tried = _timed(tuners, sync, call)
        emit(f"first call, N={n}{label}", seconds, n, tried)
        if n == N_FIRST:
            emit(f"steady state, N={n} (median)", time_ms(call) / 1e3, n)


# ------------------------------------------------------------------------------------ the parent
def run_process(code, timeout, cache=None):
    """Run `code` in a fresh Python process (cwd: the repository root) with TRITON_CACHE_DIR set to
    `cache`, or to a new, empty folder deleted afterwards. A process still running after `timeout`
    seconds is killed with everything it started (ptxas, say). Returns (its MARK lines as dicts,
    "ok" | "timeout: ..." | "error: <its last line>", seconds, compiled kernels left in the cache)."""
    if cache is None:
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as fresh:
            return run_process(code, timeout, fresh)
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    # start_new_session: its own process group, so that a kill reaches what it started
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        last = err.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        status = "ok" if proc.returncode == 0 else f"error: {last[0][:200]}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = f"timeout: killed after {time.perf_counter() - start:.0f} s (limit {timeout:g} s)"
    seconds = time.perf_counter() - start
    lines = [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]
    binaries = sum(1 for p in Path(cache).glob("*/*") if p.suffix in (".cubin", ".hsaco"))  # NVIDIA, AMD
    return lines, status, seconds, binaries


def job_rows(job, ran):
    """The CSV rows of one job from run_process's answer: one per step measured, then the process."""
    lines, status, seconds, binaries = ran
    lead, n, d = SHAPES[job["shape"]]
    common = dict(job, B=lead[0], H=lead[1] if len(lead) > 1 else "", N=n, D=d)
    rows = [{**common, "status": "ok", **line} for line in lines]
    rows.append({**common, "step": "process", "seconds": seconds, "status": status, "binaries": binaries})
    return [dict(r, seconds=f"{r['seconds']:.6g}") for r in rows]


def jobs(args):
    """One job per part, shape, dtype and causal flag; then per part the four calls, when float32
    and the small shape are among those chosen."""
    every = itertools.product(args.part, args.shape, args.dtype, args.causal)
    out = [dict(part=n, scenario=ONE, dtype=dt, shape=shape, causal=int(c)) for n, shape, dt, c in every]
    if "fp32" in args.dtype and "small" in args.shape:
        out += [dict(part=n, scenario=FOUR, dtype="fp32", shape="small", causal="") for n in args.part]
    return out


def order(row):
    """Rows in the order of the tables: part, scenario, shape, dtype, causal, step, then date."""
    rank = lambda seq, x: seq.index(x) if x in seq else len(seq)  # noqa: E731
    causal = "" if row["causal"] is None else str(row["causal"])  # "": the four calls' totals
    return (
        int(row["part"]), rank((ONE, FOUR), row["scenario"]), rank(tuple(SHAPES), row["shape"]),
        rank(DTYPES, row["dtype"]), causal == "", causal, rank(STEPS, row["step"]), str(row["date"]),
    )  # fmt: skip


def autotune(numbers, timeout):
    """--autotune: per part, the cold-cache process, then the warm-disk-cache one on the same cache;
    writes results/<gpu>/part<N>_autotune.csv. Returns the exit status."""
    from lab import results

    code = "from lab.coldstart import autotune_child, leave; autotune_child({}); leave()"
    status = 0
    for n in numbers:
        rows = []
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
            for label in ("cold cache", "warm disk cache"):
                lines, ended, seconds, _ = run_process(code.format(n), timeout, cache)
                if ended != "ok":
                    print(f"part {n}, {label}: the process ended with {ended}", file=sys.stderr)
                    status = 1
                    break
                rows += [dict(line, scenario=f"{label}: {line['scenario']}") for line in lines]
                whole = f"{label}: whole process (Python, torch and CUDA start included)"
                rows.append(dict(scenario=whole, seconds=seconds, configs=0, chosen="", N=N_FIRST))
            else:
                meta = dict(B=B, H=H, D=D, **results.provenance())
                rows = [{**meta, **r, "seconds": f"{r['seconds']:.6g}"} for r in rows]
                path = results.write_csv(results.results_dir() / f"part{n}_autotune.csv", rows, AUTOTUNE_FIELDS)
                print(
                    f"wrote {results.shown(path)}", *(f"{r['seconds']:>10} s  {r['scenario']}" for r in rows), sep="\n"
                )
    return status


def arguments(argv, compiled):
    """The command line, its defaults resolved for this machine (compiled: a GPU running compiled
    kernels): every Triton part, fp32 and fp16 (and bf16 on a GPU), causal and not, the small shape
    (and the benchmark's on a GPU)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable); default every Triton part")
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default fp32, fp16, bf16 (GPU only)")
    ap.add_argument("--causal", type=int, action="append", choices=(0, 1), help="0 or 1 (repeatable); default both")
    ap.add_argument("--shape", action="append", choices=tuple(SHAPES), help="repeatable; default small, bench (GPU)")
    ap.add_argument("--parallel", type=int, default=1, metavar="J", help="processes at once (default 1)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S", help="seconds before a kill")
    ap.add_argument("--autotune", action="store_true", help="the autotuner's cost, cold and warm (with --part)")
    args = ap.parse_args(argv)
    if args.autotune and not args.part:
        ap.error("--autotune needs --part N: the part whose autotuner to measure (make autotune: part 2)")
    try:
        args.part = parts.require(args.part or [n for n in parts.available() if parts.uses_triton(n)])
    except ValueError as e:
        ap.error(str(e))
    args.dtype = tuple(args.dtype or (DTYPES if compiled else DTYPES[:2]))
    args.shape = tuple(args.shape or (("small", "bench") if compiled else ("small",)))
    args.causal = tuple(bool(c) for c in args.causal or (0, 1))
    if not compiled and ("bf16" in args.dtype or "bench" in args.shape):
        ap.error("bf16 and --shape bench need a GPU: the interpreter refuses bf16 and would take hours at N = 4096")
    if args.parallel < 1 or args.timeout <= 0:
        ap.error("--parallel must be 1 or more and --timeout positive")
    return args


def main(argv=None):
    """Run every job, --parallel at a time, each in a fresh process with an empty cache; the file is
    written after each one, so a run cut short keeps what it measured. Or --autotune."""
    from common import runtime
    from lab import results

    args = arguments(argv, runtime.COMPILED)
    if args.autotune:
        if not runtime.COMPILED:
            print("Autotuning times configurations on a GPU; without one there is nothing to measure.")
        return autotune(args.part, args.timeout) if runtime.COMPILED else 0
    device = runtime.DEVICE.type + ("" if runtime.COMPILED else ", interpreter")
    meta = dict(results.provenance(), device=device, parallel=args.parallel, timeout=f"{args.timeout:g}")
    rows, todo, path = [], jobs(args), results.results_dir() / FILENAME
    code = "from lab.coldstart import child, leave; child({!r}); leave()"
    print(f"{len(todo)} fresh processes, {args.parallel} at a time, each with an empty Triton cache")
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        running = {pool.submit(run_process, code.format(job), args.timeout): job for job in todo}
        for done in concurrent.futures.as_completed(running):
            mine = [{**meta, **r} for r in job_rows(running[done], done.result())]
            rows += mine
            results.write_csv(path, rows, FIELDS, key=KEY, sort=order)
            print(" ".join(f"{r['step']} {r['seconds']}" for r in mine), f"[{mine[-1]['status']}]", running[done])
    print(f"wrote {len(rows)} rows to {results.shown(path)}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


# ------------------------------------------------------------------------------------ the log's line
def table(gpu_dir):
    """Part 2's log names cold_start.csv's runs in one line: no README shows the every-part matrix (the
    run prints it; part 2's README shows the autotuner's first call, part2_autotune.csv)."""
    from lab.results import study_line

    return study_line(gpu_dir / FILENAME, "make coldstart && make report")


if __name__ == "__main__":
    sys.exit(main())
