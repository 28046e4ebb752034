"""Cold start: what a part's first calls cost in a fresh process with an empty Triton cache.

    python -m common.coldstart                          # every Triton part (make coldstart)
    python -m common.coldstart --part 2 --dtype fp32 --causal 0 --shape small
    python -m common.coldstart --parallel 8             # eight processes at once, each with its own cache
    python -m common.coldstart --autotune --part 2      # part 2's autotuner, cold and warm (make autotune)

The first call of a Triton kernel compiles it, and the first call of an @triton.autotune kernel
for a new shape class (one autotuner key: dtype, D, causal and the bucket of N) compiles every
configuration left after pruning and times each one. Triton keeps what it compiled on disk, so
only the first process on a machine pays in full; here every measurement runs in a new Python
process (the repository root its working folder) whose TRITON_CACHE_DIR is a new, empty folder,
so it pays what a student's first run pays. Each process meets one shape class and writes one row
per step:

- import torch; import part: parts.load(n) (Triton, common/ and the part's kernel file);
- first forward: FlashAttention.apply; first backward: torch.autograd.grad of its output;
- second call: forward and backward again, on the same inputs (nothing left to compile);
- process: the whole process as the parent saw it, from Python's start to its last step (it ends
  there, without the interpreter's teardown: see leave()); where it was killed for running past
  --timeout, the seconds it ran.

On a GPU each call is followed by torch.cuda.synchronize() inside its time. `configs` is how many
configurations the part's autotuners timed during a step (each compiled first, on an empty cache),
`binaries` how many compiled kernels the process left in its cache. Shapes: small = (4, 128, 64),
3-D inputs (batch, seq, D), the shape of a course assignment; bench = the benchmark's B=4, H=8,
N=4096, D=64 (on a GPU only: the interpreter would take hours). bf16 runs on a GPU only (the
Triton parts refuse it under the interpreter). Once per part, the scenario "four calls" also runs a
float32 forward and backward, non-causal then causal, at the small shape in one fresh process: two
shape classes, and its total.

Rows go to results/<gpu>/cold_start.csv (results/cpu/ under the interpreter), merged by KEY, which
holds the commit: a run before a change and a run after it, at two commits, stay side by side in
one file, and table() shows them so. --parallel J runs J processes at once, each with its own empty
cache; compiling processes share the CPU, so the `parallel` column records J.

--autotune measures what a part's autotuner costs, for the parts given with --part: two
fresh processes one after the other, sharing one new, empty cache. In the first ("cold cache")
nothing is compiled yet: the first bf16 call at N = 4096 compiles and times every configuration
that survives the pruning, then the steady state (median), then a first call at N = 8192 (a new N
bucket: timed again, already compiled). The second ("warm disk cache") finds those kernels on disk.
Writes results/<gpu>/part<N>_autotune.csv (GPU only).

This module imports only the standard library and common.parts at its top: a process it starts
imports it first and times `import torch` and the part's import after that.
"""

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from common import PROVENANCE, ROOT, parts

DTYPES = ("fp32", "fp16", "bf16")
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# (lead, N, D): small is 3-D (batch, seq, D); bench is 4-D (batch, heads, seq, D).
SHAPES = {"small": ((4,), 128, 64), "bench": ((4, 8), 4096, 64)}
ONE, FOUR = "one shape class", "four calls"  # the scenarios: one process each
FIRST = ("first forward", "first backward")
STEPS = ("import torch", "import part", "first forward", "first backward", "second call", "four calls", "process")
FIELDS = [
    "part",
    "scenario",
    "device",
    "dtype",
    "causal",
    "shape",
    "B",
    "H",
    "N",
    "D",
    "step",
    "seconds",
    "configs",
    "binaries",
    "status",
    "parallel",
    "timeout",
    *PROVENANCE,
]
KEY = ("gpu", "commit", "part", "scenario", "dtype", "shape", "causal", "step")
FILENAME = "cold_start.csv"
DEFAULT_TIMEOUT = 600.0  # seconds per process; float32 on an empty cache has taken 40-110 s on the H200
MARK = "COLDSTART "  # the prefix of the lines a measuring process prints, one JSON object each

# --autotune: what a part's autotuner costs on its first calls (results/<gpu>/part<N>_autotune.csv).
AUTOTUNE_FIELDS = ["scenario", "seconds", "configs", "chosen", "B", "H", "N", "D", *PROVENANCE]
B, H, D = 4, 8, 64
N_FIRST, N_SECOND = 4096, 8192


# ------------------------------------------------------------------------------------ in the fresh process
def _emit(**fields):
    print(MARK + json.dumps(fields), flush=True)


def leave():
    """End a measuring process once its last row is printed. os._exit skips the interpreter's
    teardown, where PyTorch can abort a process whose autograd thread ran a backward ("terminate
    called without an active exception": a race between Python's shutdown and that thread, seen in
    one part 1 process of the H200's test run; pytorch/pytorch#38230): the run would be reported
    failed after every step was measured. Nothing is measured after the last step."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _autotuners(module):
    """The @triton.autotune kernels of a loaded part's kernel file."""
    from triton.runtime import Autotuner

    return [value for value in vars(module).values() if isinstance(value, Autotuner)]


def _timed_configs(tuners, call):
    """Run call(); how many configurations the autotuners `tuners` timed during it, together."""
    from common import triton_tools

    counts = []

    def nested(i):
        if i == len(tuners):
            call()
        else:
            counts.append(triton_tools.timed_configs(tuners[i], lambda: nested(i + 1)))

    nested(0)
    return sum(counts)


def child(job):
    """The steps of one job ({part, scenario, dtype, shape, causal}), timed in this fresh process;
    each printed as a MARK line as soon as it is measured, so a process killed later keeps them."""
    start = time.perf_counter()
    import torch

    _emit(step="import torch", seconds=time.perf_counter() - start)
    start = time.perf_counter()
    module = parts.load(job["part"])
    _emit(step="import part", seconds=time.perf_counter() - start)

    from common import runtime
    from common.inputs import Shape, make_inputs

    tuners = _autotuners(module)
    sync = torch.cuda.synchronize if runtime.DEVICE.type == "cuda" else (lambda: None)
    lead, n, d = SHAPES[job["shape"]]
    q, k, v, do = make_inputs(Shape(lead, n, n, d), getattr(torch, DTYPE_NAMES[job["dtype"]]), runtime.DEVICE)
    for t in (q, k, v):
        t.requires_grad_()
    sync()
    held = {}

    def step(name, call, causal):
        start = time.perf_counter()
        configs = _timed_configs(tuners, lambda: (call(), sync()))
        seconds = time.perf_counter() - start
        _emit(step=name, seconds=seconds, configs=configs, causal=int(causal))
        return seconds

    def forward(causal):
        held["o"] = module.FlashAttention.apply(q, k, v, causal)

    def backward():
        torch.autograd.grad(held.pop("o"), (q, k, v), do)

    def both(causal):
        forward(causal)
        backward()

    if job["scenario"] == FOUR:
        start = time.perf_counter()
        for causal in (False, True):
            step("first forward", partial(forward, causal), causal)
            step("first backward", backward, causal)
        _emit(step="four calls", seconds=time.perf_counter() - start, causal="")
    else:
        causal = bool(job["causal"])
        step("first forward", partial(forward, causal), causal)
        step("first backward", backward, causal)
        step("second call", partial(both, causal), causal)


def autotune_child(part, n_first, n_second):
    """Runs in the fresh process of --autotune: part's first bf16 forward at N = n_first (compiling
    and timing every configuration the autotuner keeps), the steady state, then a first call at
    n_second (a new N bucket); one MARK line each. The calls go through FlashAttention.apply, as in
    child(): the part's flash_attention op would add its own first-call cost, PyTorch importing
    torch._dynamo (a custom op's function is wrapped in a decorator that imports it on first use;
    0.9 s on a 2-core CPU), which is not the autotuner's."""
    import torch

    from common import runtime
    from common.inputs import Shape, make_inputs
    from common.timing import time_ms

    module = parts.load(part)
    tuners = _autotuners(module)
    if not tuners:
        raise SystemExit(f"part {part}'s kernel file has no @triton.autotune kernel: there is no autotuning to time")

    def first_call(n, label):
        q, k, v, _ = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, runtime.DEVICE, seed=n)
        torch.cuda.synchronize()
        start = time.perf_counter()

        def call():
            module.FlashAttention.apply(q, k, v, False)
            torch.cuda.synchronize()

        tried = _timed_configs(tuners, call)
        seconds = time.perf_counter() - start
        _emit(scenario=label, seconds=seconds, configs=tried, chosen=parts.forward_config(module), N=n)
        return q, k, v

    q, k, v = first_call(n_first, f"first call, N={n_first}")
    steady = time_ms(lambda: module.FlashAttention.apply(q, k, v, False)) / 1e3
    label = f"steady state, N={n_first} (median)"
    _emit(scenario=label, seconds=steady, configs=0, chosen=parts.forward_config(module), N=n_first)
    first_call(n_second, f"first call, N={n_second}: new N bucket, kernels already compiled")


# ------------------------------------------------------------------------------------ the parent
@dataclass
class Ran:
    """What one fresh process gave: its MARK lines (dicts), how it ended ("ok", "timeout: ...",
    "error: ..."), the seconds it ran, and the compiled kernels it left in its cache."""

    lines: list
    status: str
    seconds: float
    binaries: int


def _binaries(folder):
    """Compiled kernels in a Triton cache folder (one subfolder per entry): .cubin (NVIDIA) and .hsaco (AMD) files."""
    return sum(1 for p in Path(folder).glob("*/*") if p.suffix in (".cubin", ".hsaco"))


def run_process(code, timeout, cache=None):
    """Run `code` in a fresh Python process (cwd: the repository root) with TRITON_CACHE_DIR set to
    `cache`, or to a new, empty folder deleted afterwards. A process still running after `timeout`
    seconds is killed with everything it started (ptxas, say) and reported as such."""
    if cache is None:
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as fresh:
            return run_process(code, timeout, fresh)
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so that a kill reaches what it started
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        seconds = time.perf_counter() - start
        last = err.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        status = "ok" if proc.returncode == 0 else f"error: {last[0][:200]}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        seconds = time.perf_counter() - start
        out, err = proc.communicate()
        status = f"timeout: killed after {seconds:.0f} s (limit {timeout:g} s)"
    lines = [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]
    return Ran(lines, status, seconds, _binaries(cache))


def job_rows(job, ran):
    """The CSV rows of one job: one per step measured, then the process."""
    lead, n, d = SHAPES[job["shape"]]
    common = dict(job, B=lead[0], H=lead[1] if len(lead) > 1 else "", N=n, D=d)
    rows = [{**common, "status": "ok", **line} for line in ran.lines]
    rows.append({**common, "step": "process", "seconds": ran.seconds, "status": ran.status, "binaries": ran.binaries})
    for r in rows:
        r["seconds"] = f"{r['seconds']:.6g}"
    return rows


def jobs(args):
    """One job per part, shape, dtype and causal flag; then per part the four-call scenario, when
    float32 and the small shape are among those chosen."""
    out = [
        dict(part=n, scenario=ONE, dtype=dt, shape=shape, causal=int(c))
        for n in args.part
        for shape in args.shape
        for dt in args.dtype
        for c in args.causal
    ]
    if "fp32" in args.dtype and "small" in args.shape:
        out += [dict(part=n, scenario=FOUR, dtype="fp32", shape="small", causal="") for n in args.part]
    return out


def _rank(sequence, value):
    return sequence.index(value) if value in sequence else len(sequence)


def order(row):
    """Rows in the order of the tables: part, scenario, shape, dtype, causal, step, then date."""
    causal = "" if row["causal"] is None else str(row["causal"])  # "": the four calls' totals
    return (
        int(row["part"]),
        _rank((ONE, FOUR), row["scenario"]),
        _rank(tuple(SHAPES), row["shape"]),
        _rank(DTYPES, row["dtype"]),
        causal == "",
        causal,
        _rank(STEPS, row["step"]),
        str(row["date"]),
    )


def write(rows):
    """Merge rows into results/<gpu>/cold_start.csv by KEY (which holds the commit)."""
    from common import results

    return results.write_csv(results.results_dir() / FILENAME, rows, FIELDS, key=KEY, sort=order)


def _summary(job, rows):
    """One line for the terminal: the steps' seconds (of the four calls, only their total)."""
    seconds = {r["step"]: r["seconds"] for r in rows if job["scenario"] == ONE or r["causal"] == ""}
    what = f"part {job['part']} {job['dtype']} {job['shape']}"
    what += " four calls" if job["scenario"] == FOUR else f" causal={job['causal']}"
    steps = [s for s in STEPS if s in seconds and s != "process"]
    timed = ", ".join(f"{s} {float(seconds[s]):.3g}" for s in steps)
    return f"{what:<32} {timed}; process {float(seconds['process']):.3g} s [{rows[-1]['status']}]"


def measure(args, compiled):
    """Run every job, args.parallel at a time, each in a fresh process with an empty cache; the file
    is written after each one, so a run cut short keeps what it measured. Returns the rows."""
    from common import results, runtime

    meta = dict(
        results.provenance(),
        device=runtime.DEVICE.type + ("" if compiled else ", interpreter"),
        parallel=args.parallel,
        timeout=f"{args.timeout:g}",
    )
    todo = jobs(args)
    print(
        f"{len(todo)} fresh process{'es' * (len(todo) != 1)}, {args.parallel} at a time, each with an empty Triton cache ({runtime.describe()})"
    )
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        running = {
            pool.submit(
                run_process, f"from common.coldstart import child, leave; child({job!r}); leave()", args.timeout
            ): job
            for job in todo
        }
        for done in concurrent.futures.as_completed(running):
            job = running[done]
            mine = [{**meta, **r} for r in job_rows(job, done.result())]
            rows += mine
            write(rows)
            print(_summary(job, mine), flush=True)
    return rows


def autotune(numbers, timeout):
    """--autotune: for each part, the cold-cache process, then the warm-disk-cache one on the same
    cache; writes results/<gpu>/part<N>_autotune.csv. Returns the exit status."""
    from common import results

    status = 0
    for n in numbers:
        rows = []
        code = (
            f"from common.coldstart import autotune_child, leave; autotune_child({n}, {N_FIRST}, {N_SECOND}); leave()"
        )
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
            for label in ("cold cache", "warm disk cache"):
                ran = run_process(code, timeout, cache)
                if ran.status != "ok":
                    print(f"part {n}, {label}: the process ended with {ran.status}", file=sys.stderr)
                    status = 1
                    break
                rows += [dict(line, scenario=f"{label}: {line['scenario']}") for line in ran.lines]
                whole = f"{label}: whole process (Python, torch and CUDA start included)"
                rows.append(dict(scenario=whole, seconds=ran.seconds, configs=0, chosen="", N=N_FIRST))
        if status:
            continue
        meta = dict(B=B, H=H, D=D, **results.provenance())
        path = results.write_csv(
            results.results_dir() / f"part{n}_autotune.csv",
            [{**meta, **r, "seconds": f"{r['seconds']:.6g}"} for r in rows],
            AUTOTUNE_FIELDS,
        )
        print(f"wrote {results.shown(path)}")
        for r in rows:
            print(f"{r['seconds']:10.4f} s  {r['scenario']}  {r['chosen']}")
    return status


def arguments(argv=None, compiled=None):
    """The command line, with its defaults resolved for this machine (compiled: a GPU running
    compiled kernels; None: ask common.runtime): every Triton part (--autotune: --part is required), fp32 and
    fp16 and on a GPU bf16, causal and not, the small shape and on a GPU the benchmark's."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable); default every Triton part")
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default fp32, fp16, bf16 (GPU only)")
    ap.add_argument("--causal", type=int, action="append", choices=(0, 1), help="0 or 1 (repeatable); default both")
    ap.add_argument("--shape", action="append", choices=tuple(SHAPES), help="repeatable; default small, bench (GPU)")
    ap.add_argument("--parallel", type=int, default=1, metavar="J", help="processes at once (default 1)")
    ap.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds a process may run before it is killed and recorded as such (default {DEFAULT_TIMEOUT:g})",
    )
    ap.add_argument("--autotune", action="store_true", help="the autotuner's cost, cold and warm (with --part)")
    args = ap.parse_args(argv)
    if compiled is None:
        from common import runtime

        compiled = runtime.COMPILED
    if args.autotune and not args.part:
        ap.error("--autotune needs --part N: the part whose autotuner to measure (make autotune: part 2)")
    default_parts = [n for n in parts.available() if parts.uses_triton(n)]
    try:
        args.part = parts.require(args.part or default_parts)
    except ValueError as e:
        ap.error(str(e))
    args.dtype = tuple(args.dtype or (DTYPES if compiled else DTYPES[:2]))
    args.shape = tuple(args.shape or (tuple(SHAPES) if compiled else ("small",)))
    args.causal = tuple(bool(c) for c in args.causal) if args.causal else (False, True)
    if not compiled and "bf16" in args.dtype:
        ap.error("bf16 needs a GPU: the Triton parts refuse it under the interpreter (choose fp32 or fp16)")
    if not compiled and "bench" in args.shape:
        ap.error("--shape bench needs a GPU: the interpreter would take hours at N = 4096 (choose small)")
    if args.parallel < 1 or args.timeout <= 0:
        ap.error("--parallel must be 1 or more and --timeout positive")
    return args


def main(argv=None):
    from common import results, runtime

    compiled = runtime.COMPILED
    args = arguments(argv, compiled)
    if args.autotune:
        if not compiled:
            print("Autotuning times configurations on a GPU; without one there is nothing to measure.")
            return 0
        return autotune(args.part, args.timeout)
    rows = measure(args, compiled)
    print(f"wrote {len(rows)} rows to {results.shown(results.results_dir() / FILENAME)}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


# ------------------------------------------------------------------------------------ the table
def _seconds(x):
    return "—" if x is None else f"{x:.3g}"


def _history_position(commit):
    """How many commits lead to this one (git rev-list --count), so that an older commit sorts first
    even when it was measured later; -1 where git cannot say (no repository, an unknown commit)."""
    try:
        out = subprocess.run(["git", "rev-list", "--count", str(commit)], cwd=ROOT, capture_output=True, text=True)
        return int(out.stdout.strip()) if out.returncode == 0 else -1
    except (OSError, ValueError):
        return -1


def _commits_in_order(rows):
    """The commits of the rows, oldest first: in the repository's history where git knows every one
    of them, otherwise (no repository, a commit it does not have) by the date of their first row."""
    first_date = {}
    for r in rows:
        first_date[r["commit"]] = min(first_date.get(r["commit"], r["date"]), r["date"])
    position = {c: _history_position(c) for c in first_date}
    if any(p < 0 for p in position.values()):
        position = dict.fromkeys(first_date, 0)
    return sorted(first_date, key=lambda c: (position[c], first_date[c]))


def _compared(rows, measured=None):
    """The commits a table (or one of its columns) compares, oldest first: the newest commit with
    rows that `measured` accepts (any row, by default), and before it the latest earlier such commit
    measured with as many processes at once (a process that shares the CPU compiles slower, so only
    runs alike are set side by side)."""
    have = [
        c for c in _commits_in_order(rows) if any(measured is None or measured(r) for r in rows if r["commit"] == c)
    ]
    if not have:
        return []

    def at_once(commit):
        return max((r["parallel"] or 1 for r in rows if r["commit"] == commit), default=1)

    alike = [c for c in have[:-1] if at_once(c) == at_once(have[-1])]
    return [*alike[-1:], have[-1]]


def table(gpu_dir):
    """cold_start.csv as a README table: one line per part, dtype, causal flag and shape with the
    first forward, first backward and second call; the four-call scenario below it. Where the file
    holds more than one commit, two side by side (_compared): before, then after (in the repository's
    history where git can say, otherwise by the date of their rows)."""
    from common.results import markdown_table, provenance_line, read_csv

    rows = read_csv(gpu_dir / FILENAME)
    commits = _compared(rows)
    rows = [r for r in rows if r["commit"] in commits]
    by = {(r["commit"], r["part"], r["scenario"], r["dtype"], r["shape"], r["causal"], r["step"]): r for r in rows}

    def cell(commit, group, step):
        r = by.get((commit, *group, step))
        if r is not None:
            return _seconds(r["seconds"])
        process = by.get((commit, *group, "process"))
        status = (process or {}).get("status") or ""
        if status.startswith("timeout"):
            return f"> {_seconds(process['timeout'])} (killed)" if process.get("timeout") else "timed out"
        return "error" if status.startswith("error") else "—"

    def columns(names):
        return [f"{name}, {c}" if len(commits) > 1 else name for name in names for c in commits]

    def line(group, steps):
        return [cell(c, group, step) for step in steps for c in commits]

    def groups(scenario):
        """The table's lines: one process each (the four calls' per-call rows, causal 0 and 1, left out)."""
        keys = {
            (r["part"], r["scenario"], r["dtype"], r["shape"], r["causal"])
            for r in rows
            if r["scenario"] == scenario and (scenario == ONE or r["causal"] is None)
        }
        return sorted(
            keys, key=lambda g: order(dict(zip(("part", "scenario", "dtype", "shape", "causal"), g), step="", date=""))
        )

    def shape(name):
        lead, n, d = SHAPES[name]
        return f"({', '.join(map(str, (*lead, n, d)))})"

    one = (*FIRST, "second call")
    body = [[g[0], g[2], "yes" if g[4] else "no", shape(g[3]), *line(g, one)] for g in groups(ONE)]
    out = [
        provenance_line(rows, "make coldstart && make report"),
        "",
        "Seconds in a fresh Python process whose Triton cache (TRITON_CACHE_DIR) is a new, empty folder, one process "
        "per line: whatever the first call needs compiled, it compiles. Second call: forward and backward again, "
        "nothing left to compile. Shapes: (batch, seq, D), and the benchmark's (B, H, N, D)."
        + (f" Before and after: commit {commits[0]}, then {commits[1]}." if len(commits) > 1 else ""),
    ]
    if any(r["gpu"] == "cpu" for r in rows):
        out[-1] += (
            " On a CPU these are the times of Triton's interpreter, which compiles nothing: a first call is not "
            "slower for compiling, and the times say nothing of a GPU's."
        )
    jobs_at_once = sorted({(r["commit"], r["parallel"]) for r in rows if r["parallel"] is not None})
    if jobs_at_once:
        out[-1] += " Processes run at once: " + ", ".join(f"{j} ({c})" for c, j in jobs_at_once) + "."
    out += [
        "",
        markdown_table(["part", "dtype", "causal", "shape", *columns(one)], body, "llll" + "r" * len(commits) * 3),
    ]
    four = groups(FOUR)
    if four:
        steps = ("import part", "four calls", "process")
        body = [[g[0], *line(g, steps)] for g in four]
        out += [
            "",
            "Four calls in one fresh process (float32, (4, 128, 64): forward and backward, non-causal then causal): "
            "importing the part, the four calls, and the whole process (Python's start included):",
            "",
            markdown_table(["part", *columns(steps)], body, "l" + "r" * len(commits) * 3),
        ]
    return "\n".join(out)


def summary(gpu_dir):
    """cold_start.csv in one small table: per part, the first forward + first backward at the small
    shape in each dtype measured (the slower of causal and not), and the four-call run. Each column
    shows the newest commit that measured it and, where the latest earlier commit measured with as
    many processes at once measured it too, "before -> after" (a dtype measured alone at a later
    commit does not blank the others). The full table, every step of two commits, is `table`."""
    from common.results import markdown_table, provenance_line, read_csv

    rows = [r for r in read_csv(gpu_dir / FILENAME) if r["shape"] in (None, "small")]
    # the four-call scenario has first forward and backward rows too: the scenario is part of the key
    by = {(r["commit"], r["scenario"], r["part"], r["dtype"], r["causal"], r["step"]): r for r in rows}

    def first_call(commit, part, dtype):
        """The slower causal flag's first forward + first backward; a killed process: '> its timeout'."""
        totals = []
        for causal in (0, 1):
            f, b, process = (by.get((commit, ONE, part, dtype, causal, s)) for s in (*FIRST, "process"))
            if f is not None and b is not None:
                totals.append(f"{f['seconds'] + b['seconds']:.3g}")
            if process is not None and str(process["status"]).startswith("timeout"):
                return f"> {_seconds(process['timeout'])}"
        return max(totals, key=float) if totals else None

    def four(commit, part):
        row = by.get((commit, FOUR, part, "fp32", None, "four calls"))
        return None if row is None else _seconds(row["seconds"])

    columns = [  # (name, measure, its extra argument, the commits it compares)
        (
            f"{d}, first forward + backward",
            first_call,
            (d,),
            tuple(_compared(rows, lambda r, d=d: r["scenario"] == ONE and r["dtype"] == d)),
        )
        for d in DTYPES
    ] + [
        (
            "fp32, four calls",
            four,
            (),
            tuple(_compared(rows, lambda r: r["scenario"] == FOUR and r["step"] == "four calls")),
        )
    ]
    columns = [c for c in columns if c[3]]

    def cell(measure, args, pair, part):
        after = measure(pair[-1], part, *args)
        if after is None:
            return "—"
        earlier = measure(pair[0], part, *args) if len(pair) == 2 else None
        return after if earlier is None else f"{earlier} → {after}"

    part_numbers = sorted({r["part"] for r in rows if any(r["commit"] == c[3][-1] for c in columns)})
    body = [[n, *(cell(measure, args, pair, n) for _, measure, args, pair in columns)] for n in part_numbers]
    lead, n, d = SHAPES["small"]
    caption = (
        f"Seconds in a fresh process with an empty Triton cache, inputs of shape {(*lead, n, d)} (N = {n}, D = {d}): "
        "the first forward and the first backward of one shape class (the slower of causal and not), and a "
        "float32 run of four calls (forward and backward, non-causal then causal)"
    )
    pairs = {}
    for name, *_, pair in columns:
        pairs.setdefault(pair, []).append(name.split(",")[0] if "four" not in name else "the four calls")
    listed = lambda names: " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)  # noqa: E731
    said = [f"{listed(names)}: commit {' → '.join(pair)}" for pair, names in pairs.items()]
    caption += (
        "; each column at the newest commit that measured it, after the commit before that measured it with as "
        "many processes at once, where one did, as before → after (" + "; ".join(said) + ")"
    )
    used = {c for *_, pair in columns for c in pair}
    rows = [r for r in rows if r["commit"] in used]
    at_once = max((r["parallel"] for r in rows if r["parallel"] is not None), default=None)
    if at_once and at_once > 1:
        caption += (
            f". Up to {at_once} such processes ran at once (the CSV's parallel column), sharing the CPU that compiles"
        )
    elif at_once == 1:
        caption += ". One process at a time"
    return "\n".join(
        [
            provenance_line(rows, "make coldstart && make report"),
            "",
            caption + ":",
            "",
            markdown_table(["part", *(c[0] for c in columns)], body, "l" + "r" * len(columns)),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
