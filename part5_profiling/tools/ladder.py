"""Part 5's ladders on a Hopper GPU: every step of the forward, of the backward and of the model
ladder (steps/, common/steps.py) checked, timed and profiled, beside part 4 and SDPA's cuDNN backend.
A lesson step's kernel is its Gluon file; a model step's, each Gluon file it patches (model1 and
model7 patch flash_attention.py alone: no kernel to time; model5 changes the forward of short and
causal D = 64 calls only).

    python -m part5_profiling.tools.ladder                # results/<gpu>/part5_ladder.csv
    python -m part5_profiling.tools.ladder --no-ncu       # without the hardware counters
    python -m part5_profiling.tools.ladder --step fwd3    # some steps only (repeatable)
    python -m part5_profiling.tools.ladder --table-shapes # the README's shapes only: a quarter less time
    TRITON_INTERPRET=0 python -m part5_profiling.tools.ladder --compile --save   # any machine: part5_ladder_compiled.csv

--compile needs no GPU: Triton's compiler and ptxas compile every step for sm_90 on the CPU, and it
prints what the binary holds (partitions of warps, wgmma products and waits, mbarrier waits, TMA
copies and adds, registers and stack), one JSON line per step and shape: the CPU tests read it;
--save also writes it to part5_ladder_compiled.csv (compiled with Triton 3.6, the H200's version).

Every step runs in processes of its own under a timeout: a kernel that waits on a barrier in the
wrong phase hangs rather than fails, and a hang is recorded as the step's check and the run goes
on. Three phases:

1. check (the steps side by side, one process each): each step against the float64 reference on
   CASES, bf16 and fp16, causal and not. A forward kernel's O and L; a backward kernel's dQ, dK and
   dV from part 5's own forward.
2. time (one process, the steps in turn; restarted past a step that hangs): N = 4096, B = 4, H = 8,
   bf16, D = 64 and 128, causal and not, checked on the very inputs (first and last head), then
   timed by CUDA-graph replay. A forward kernel: the forward. A backward kernel: the backward alone,
   and part 5's forward followed by it. Part 4 and SDPA cuDNN are timed the same way.
3. profile: ncu, once over every step that passed, the main kernel of each step at each shape:
   the tensor pipe's active share and the two top stall reasons (warps stalled per instruction
   issued).
"""

import argparse
import concurrent.futures
import csv
import functools
import hashlib
import json
import multiprocessing
import os
import queue
import re
import shutil
import subprocess
import sys
import threading

import torch

from common import ROOT, parts, runtime, steps, triton_tools
from common.check import check_outputs, check_slices, verdict
from common.inputs import STRESS_SCALE, Shape, make_inputs
from lab import compiler, impls, results
from lab.bench import timed_call
from lab.timing import attention_flops, graph_time_ms, tflops
from part5_profiling.tools.profile import STALL, ncu_available_metrics, ncu_number, parse_ncu_csv

B, H, N = 4, 8, 4096
SHAPES = [(d, causal) for d in (64, 128) for causal in (False, True)]
# The README's shapes (its columns, and model5's D = 64 causal): --table-shapes times these alone
TABLE_SHAPES = [(64, False), (64, True), (128, True)]
CHECK_TIMEOUT = 300  # seconds for one step's compiles and cases
TIME_TIMEOUT = 120  # seconds without a row from the timing process: a hang
# The correctness suite's cases at the head dims part 5's Gluon kernels take: friendly and ragged
# lengths, N_q != N_k both ways, one query or key, more query tiles than SMs (persistent rounds),
# full size, and scores large enough to overflow a softmax without its running max (the last).
CASES = [
    Shape((2,), 64, 64, 64),
    Shape((3,), 37, 53, 128),
    Shape((2,), 80, 33, 64),
    Shape((1, 2), 130, 200, 64),
    Shape((1, 2), 1, 50, 64),
    Shape((2,), 40, 1, 128),
    Shape((3,), 1, 1, 64),
    Shape((8, 40), 200, 333, 64),
    Shape((4, 20), 1000, 1000, 128),
    Shape((3, 50), 700, 129, 128),
    Shape((2, 3), 777, 513, 128),
    Shape((2, 4), 1000, 1531, 64),
    Shape((1, 2), 4096, 4096, 128),
    Shape((2, 4), 1500, 1500, 128),
]
STRESS = CASES[-1]
FIELDS = ["step", "label", "mode", *results.SHAPE_FIELDS, "graph_ms", "graph_tflops", "vs_cudnn", "check"]
FIELDS += [
    "tensor_pipe_pct",
    "warps_active_pct",
    "stall_1",
    "stall_1_value",
    "stall_2",
    "stall_2_value",
    *results.PROVENANCE,
]
KEY = ("step", "mode", "D", "causal")
TENSOR_PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"  # wgmma too, on the H200
WARPS_ACTIVE = "sm__warps_active.avg.pct_of_peak_sustained_active"  # achieved occupancy: warps resident of 64


def every_step():
    """[(ladder, Step)] of part 5: the forward's, the backward's, then the model ladder's."""
    return [(ladder, step) for ladder, found in steps.ladders(parts.folder(5)).items() for step in found]


def shapes():
    """The shapes timed and profiled: SHAPES, or with --table-shapes ($LADDER_SHAPES) the README's two."""
    return TABLE_SHAPES if os.environ.get("LADDER_SHAPES") == "table" else SHAPES


def extras():
    """{name: file} of kernel files timed beside the steps (--extra NAME=FILE, passed on to the child
    processes in $LADDER_EXTRA): the shipped kernels of an earlier commit, say. A name starting with
    fwd is a forward (launch() as gluon_attention's), one with bwd a backward (as gluon_backward's)."""
    return dict(item.split("=", 1) for item in os.environ.get("LADDER_EXTRA", "").split(",") if item)


KERNEL_FILES = {"fwd": steps.TARGETS["fwd"], "bwd": steps.TARGETS["bwd"]}


@functools.cache
def kernels(name):
    """{"fwd" and/or "bwd": the text of that Gluon file} that step `name` gives and changes: a forward
    step's forward, a backward step's backward, a model step's patched Gluon files (none: empty)."""
    if name in extras():
        return {name[:3]: (ROOT / extras()[name]).read_text()}
    ladder, i = steps.find(5, name)
    if ladder[0].ladder != steps.MODEL:
        return {ladder[0].ladder: steps.sources(5, ladder[0].ladder)[i + 1]}
    before, after = steps.states(5)[i : i + 2]
    return {kind: after[f] for kind, f in KERNEL_FILES.items() if after[f] != before[f]}


@functools.cache
def load(name, kind=None):
    """Step `name`'s forward (kind "fwd") or backward ("bwd") kernel file as a module of its own (kind
    None: the step's one kernel file), or an extra kernel file's."""
    found = kernels(name)
    kind = kind or next(iter(found))
    return parts.load_source(f"part5_step_{name}_{kind}", found[kind])


def sequences(*tensors):
    return [t.reshape(-1, *t.shape[-2:]).contiguous() for t in tensors]


def forward_of(module):
    """(q, k, v, causal) -> (O, L) through a forward step's launch()."""

    def forward(q, k, v, causal):
        qs, ks, vs = sequences(q, k, v)
        o, lse = torch.empty_like(qs), torch.empty(qs.shape[:-1], dtype=torch.float32, device=q.device)
        module.launch(qs, ks, vs, o, lse, causal)
        return o.view(q.shape), lse.view(q.shape[:-1])

    return forward


def backward_of(module):
    """(q, k, v, o, lse, do, causal) -> (dQ, dK, dV) through a backward step's launch()."""

    def backward(q, k, v, o, lse, do, causal):
        qs, ks, vs, os_, dos = sequences(q, k, v, o, do)
        dq, dk, dv = module.launch(qs, ks, vs, os_, dos, lse.reshape(qs.shape[:-1]).contiguous(), causal)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)

    return backward


# ------------------------------------------------------------------------------------ 1. check
def check_step(name):
    """Every case of CASES, bf16 and fp16, causal and not: "ok: n cases", or how many failed and the first."""
    runtime.set_triton_allocator()  # the kernels make their TMA descriptors in global scratch memory
    part5 = parts.load(5)
    failures, done = [], 0
    for kind in kernels(name):
        module = load(name, kind)
        for i, shape in enumerate(CASES):
            for dtype in (torch.bfloat16, torch.float16):
                for causal in (False, True):
                    scale = STRESS_SCALE if shape is STRESS else 1.0
                    q, k, v, do = make_inputs(shape, dtype, runtime.DEVICE, seed=i, scale=scale)
                    if kind == "fwd":
                        o, lse = forward_of(module)(q, k, v, causal)
                        out = {"O": o, "L": lse}
                    else:
                        o, lse = part5.flash_forward(q, k, v, causal)
                        dq, dk, dv = backward_of(module)(q, k, v, o, lse, do, causal)
                        out = {"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}
                    report = check_outputs(out, q, k, v, do, causal)
                    done += 1
                    if not report.ok:
                        failures.append(f"{kind} {shape} {str(dtype)[6:]} causal={causal:d}: {verdict(report)}")
    if not done:
        return "ok: no kernel changed"
    return f"ok: {done} cases" if not failures else f"FAIL {len(failures)} of {done}: {failures[0]}"


def run_child(args, timeout):
    """Run this module with args in a fresh process: (the JSON lines it printed, None), or (those it
    printed before it stopped, why): a child that prints nothing for `timeout` seconds is killed."""
    cmd = [sys.executable, "-m", "part5_profiling.tools.ladder", *args]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in child.stdout] + [lines.put(None)], daemon=True).start()
    found = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            child.kill()
            return found, f"hang: no answer in {timeout} s"
        if line is None:
            break
        if line.startswith("{"):
            found.append(json.loads(line))
    if child.wait() != 0:
        return found, f"exit {child.returncode}: {child.stderr.read()[-300:]}"
    return found, None


def check_all(names):
    """{step: its check}, the steps checked side by side in processes of their own."""

    def one(name):
        found, stopped = run_child(["--child-check", name], CHECK_TIMEOUT)
        return found[0]["check"] if found else f"error: {stopped}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        return dict(zip(names, pool.map(one, names)))


# ------------------------------------------------------------------------------------ 2. time
def inputs(d, causal):
    return make_inputs(Shape((B, H), N, N, d), torch.bfloat16, runtime.DEVICE, seed=d + causal)


def calls(name, d, causal):
    """{mode: (call, its outputs to check)} of one step, or of part 4 ("part4"), on the timing inputs."""
    q, k, v, do = inputs(d, causal)
    part5 = parts.load(5)
    if name == "part4":
        impl = impls.part_impl(4)
        return {mode: timed_call(impl, mode, q, k, v, do, causal) for mode in ("fwd", "bwd", "fwd+bwd")}
    found = {}
    if "fwd" in kernels(name):
        found["fwd"] = functools.partial(forward_of(load(name, "fwd")), q, k, v, causal)
    if "bwd" in kernels(name):
        backward = backward_of(load(name, "bwd"))
        o, lse = part5.flash_forward(q, k, v, causal)

        def both():
            o, lse = part5.flash_forward(q, k, v, causal)
            return backward(q, k, v, o, lse, do, causal)

        found.update(bwd=functools.partial(backward, q, k, v, o, lse, do, causal), both=both)
        found["fwd+bwd"] = found.pop("both")
    return found


def checked(name, mode, d, causal, fn):
    """The check of one timed call on its own inputs (first and last head against float64)."""
    if name == "part4":
        return "checked by the benchmark"
    q, k, v, do = inputs(d, causal)
    if mode == "fwd":
        o, lse = fn()
        return verdict(check_slices({"O": o, "L": lse}, q, k, v, causal))
    o, lse = parts.load(5).flash_forward(q, k, v, causal)
    dq, dk, dv = fn()
    return verdict(check_slices({"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}, q, k, v, causal, do))


def time_step(name):
    """Rows of one step (or part4, or sdpa_cudnn) at every shape, printed as JSON lines as they come."""
    runtime.set_triton_allocator()
    for d, causal in shapes():
        if name == "sdpa_cudnn":
            cudnn = impls.sdpa_impl("cudnn")
            with impls.sdpa_context("cudnn"):
                q, k, v, do = inputs(d, causal)
                found = {m: timed_call(cudnn, m, q, k, v, do, causal) for m in ("fwd", "bwd", "fwd+bwd")}
                times = {m: graph_time_ms(fn) for m, fn in found.items()}
            checks = dict.fromkeys(times, "checked by the benchmark")
        else:
            found = calls(name, d, causal)
            checks = {m: checked(name, m, d, causal, fn) for m, fn in found.items()}
            times = {m: graph_time_ms(fn) for m, fn in found.items() if checks[m].startswith(("ok", "checked"))}
        for mode, check in checks.items():
            ms = times.get(mode)
            flops = attention_flops(B, H, N, N, d, causal, mode)
            row = dict(step=name, mode=mode, D=d, causal=int(causal), check=check)
            row.update(graph_ms=f"{ms:.4f}" if ms else "", graph_tflops=tflops(flops, ms) if ms else "")
            print(json.dumps(row), flush=True)


def time_all(names):
    """Rows of every step in turn, in one process; past a step that hangs, a new process for the rest."""
    rows, todo = [], list(names)
    while todo:
        found, stopped = run_child(["--child-time", *todo], TIME_TIMEOUT)
        rows += [r for r in found if "done" not in r]
        done = {r["done"] for r in found if "done" in r}
        if stopped is None:
            break
        stuck = next(n for n in todo if n not in done)
        rows.append(dict(step=stuck, mode="", D="", causal="", check=f"error: {stopped}"))
        todo = todo[todo.index(stuck) + 1 :]
    return rows


# ------------------------------------------------------------------------------------ 3. profile
def profile_child(names):
    """Under ncu: warm every step at every shape, then each once between cudaProfilerStart/Stop."""
    runtime.set_triton_allocator()
    launches = []
    for name in names:
        for d, causal in shapes():
            for mode, fn in calls(name, d, causal).items():
                if mode != "fwd+bwd":
                    fn(), fn()
                    launches.append(fn)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in launches:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profile_all(names):
    """{(step, mode, D, causal): counters} from one ncu run over the main kernels of every step and shape."""
    ncu = shutil.which("ncu")
    if ncu is None or not names:
        return {}, "ncu is not on the PATH" if ncu is None else ""
    known = ncu_available_metrics(ncu)
    stalls = sorted(f"{m}.ratio" for m in known if STALL.fullmatch(m))
    order = [(name, kind, d, causal) for name in names for d, causal in shapes() for kind in kernels(name)]
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--kernel-name"]
    cmd += ["regex:_attn_(fwd|bwd)_gluon", "--launch-count", str(len(order)), "--csv", "--page", "raw"]
    occupancy = [WARPS_ACTIVE] if WARPS_ACTIVE.split(".")[0] in known else []
    cmd += [
        "--metrics",
        ",".join([TENSOR_PIPE, *occupancy, *stalls]),
        sys.executable,
        "-m",
        "part5_profiling.tools.ladder",
    ]
    try:
        out = subprocess.run([*cmd, "--child-profile", *names], cwd=ROOT, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {}, "ncu timed out"
    launches, _ = parse_ncu_csv(out.stdout)
    if len(launches) != len(order):
        lines = [x for x in (out.stdout + out.stderr).splitlines() if "ERR" in x or "rror" in x]
        return {}, f"ncu gave {len(launches)} of {len(order)} launches: {(lines or [''])[0][:150]}"
    found = {}
    for key, launch in zip(order, launches):
        top = sorted((ncu_number(launch[m]) or 0.0, STALL.match(m).group(1)) for m in stalls if m in launch)[::-1]
        top = [(value, reason) for value, reason in top if reason != "selected"]  # selected: issuing, not stalled
        counters = dict(tensor_pipe_pct=launch.get(TENSOR_PIPE, ""), warps_active_pct=launch.get(WARPS_ACTIVE, ""))
        for rank, (value, reason) in enumerate(top[:2], 1):
            counters.update({f"stall_{rank}": reason, f"stall_{rank}_value": f"{value:.2f}"})
        found[key] = counters
    return found, ""


# ------------------------------------------------------------------------------------ compile
COMPILED_SHAPES = [(64, False), (128, True)]
COMPILED_FIELDS = ["step", "kernel", "D", "causal", "partitions", "warps", "smem", "params", "wgmma", "wgmma_waits"]
COMPILED_FIELDS += ["barrier_waits", "tma_loads", "tma_stores", "tma_adds", "global_loads", "registers", "stack", "ptx"]
COMPILED_FIELDS += results.PROVENANCE
TYPES = dict.fromkeys(("Q", "K", "V", "O", "DO", "DK", "DV"), "*bf16") | {"scale": "fp32"}
TYPES |= dict.fromkeys(("L", "L2", "DELTA", "DQ"), "*fp32")  # the rest: i32


def compile_gluon(module, kind, d, causal, **changes):
    """The main Gluon kernel of `kind` ("fwd", "bwd") of `module` (a Gluon file, a step's or a variant's)
    compiled for sm_90 at this D and mask, its compile-time arguments changed where given. No GPU needed."""
    fn = module._attn_fwd_gluon if kind == "fwd" else module._attn_bwd_gluon
    meta = module.constexprs(d, causal) | changes
    signature = {n: "constexpr" if n in meta else TYPES.get(n, "i32") for n in fn.arg_names}
    return triton_tools.compile_for(fn, signature, meta, 90, dict(num_warps=4), gluon=True)


def compiled_facts(name, kind, d, causal):
    """Step `name`'s main kernel of `kind` ("fwd", "bwd") compiled for sm_90 at this D and mask: what the
    binary holds."""
    kernel = compile_gluon(load(name, kind), kind, d, causal)
    ptx, (registers, stack) = kernel.asm["ptx"], compiler.binary_resources(kernel.asm["cubin"])
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    return dict(
        step=name,
        kernel=kind,
        D=d,
        causal=causal,
        partitions=int("ttg.warp_specialize" in kernel.asm["ttgir"]),
        warps=kernel.metadata.num_warps,
        smem=kernel.metadata.shared,
        params=len(set(re.findall(r"_param_(\d+)", ptx))),
        wgmma=ptx.count("wgmma.mma_async"),
        wgmma_waits={w: waits.count(w) for w in sorted(set(waits))},
        barrier_waits=ptx.count("mbarrier.try_wait"),
        tma_loads={r: ptx.count(f"cp.async.bulk.tensor.{r}d.shared") for r in (1, 2, 3, 4)},  # into shared memory
        tma_stores=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),  # out of it
        tma_adds={r: ptx.count(f"cp.reduce.async.bulk.tensor.{r}d") for r in (1, 2, 3, 4)},
        global_loads=ptx.count("ld.global"),
        registers=registers,
        stack=stack,
        ptx=fingerprint(ptx),
    )


def fingerprint(ptx):
    """The PTX's instructions, hashed: equal where two steps compile to the same code, whatever their
    files and line numbers (the .loc and .file lines, comments and debug sections left out)."""
    kept, debug = [], False
    for line in ptx.splitlines():
        text = line.strip()
        debug = debug or (text.startswith(".section") and ".debug" in text)
        if debug:
            debug = text != "}"
        elif text and not text.startswith((".loc", ".file", "//")):
            kept.append(text)
    return "sha256:" + hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]  # text, never a number


# ------------------------------------------------------------------------------------ the run
def run(names, use_ncu, save=None):
    meta = results.provenance()
    labels = {s.name: s.label for _, s in every_step()} | extras()
    checks = check_all(names)
    for name, check in checks.items():
        print(f"{name:<5} {labels[name]:<22} {check[:100]}", flush=True)
    passed = [n for n in names if checks[n].startswith("ok") and kernels(n)]
    rows = [dict(r, label=labels.get(r["step"], r["step"])) for r in time_all(["part4", "sdpa_cudnn", *passed])]
    rows += [dict(step=n, label=labels[n], mode="", check=c) for n, c in checks.items() if n not in passed]
    cudnn = {(r["mode"], r["D"], r["causal"]): r["graph_ms"] for r in rows if r["step"] == "sdpa_cudnn"}
    counters, why = profile_all([n for n in passed if n not in extras() and kernels(n)]) if use_ncu else ({}, "")
    for row in rows:
        row.update(B=B, H=H, N=N, dtype="bf16", **meta)
        base = cudnn.get((row["mode"], row.get("D"), row.get("causal")))  # a step with no kernel: no shape
        if base and row.get("graph_ms"):
            row["vs_cudnn"] = f"{float(base) / float(row['graph_ms']):.3f}"
        if row["mode"] in ("fwd", "bwd"):
            row.update(counters.get((row["step"], row["mode"], row["D"], bool(row["causal"])), {}))
    if why:
        print(f"no counters: {why}")
    for row in rows:
        print(
            f"{row['step']:<10} {row['mode']:<7} D={row.get('D', '')!s:<3} causal={row.get('causal', '')!s:<1} "
            f"{row.get('graph_tflops') or '-':>6} TFLOP/s  x{row.get('vs_cudnn') or '-':<5} of cuDNN  "
            f"pipe {row.get('tensor_pipe_pct') or '-':>5}%  {row.get('stall_1') or '':<16} {row['check'][:40]}"
        )
    return rows


def add_counters(names):
    """The counters of the steps named, into the rows part5_ladder.csv already holds for them."""
    path = results.results_dir() / "part5_ladder.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    timed = [
        n
        for n in names
        if n not in extras() and kernels(n) and any(r["step"] == n and r["check"].startswith("ok") for r in rows)
    ]
    counters, why = profile_all(timed)
    for row in rows:
        if row["mode"] in ("fwd", "bwd") and row["D"]:
            row.update(counters.get((row["step"], row["mode"], int(row["D"]), row["causal"] == "1"), {}))
    results.write_csv(path, rows, FIELDS)
    print(f"counters of {len(counters)} step shapes into {results.shown(path)}" + (f"; none: {why}" if why else ""))
    return 0 if counters else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", action="append", help="only this step (repeatable): fwd1 ... model7")
    ap.add_argument("--no-ncu", action="store_true", help="skip the hardware counters")
    ap.add_argument("--counters-only", action="store_true", help="profile the steps already timed in the CSV")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=FILE", help="time a kernel file too")
    ap.add_argument("--table-shapes", action="store_true", help="time the README's shapes only (not D = 128 alone)")
    ap.add_argument("--compile", action="store_true", help="compile every step for sm_90 (any machine)")
    ap.add_argument("--save", action="store_true", help="with --compile: write part5_ladder_compiled.csv")
    ap.add_argument("--child-check", help=argparse.SUPPRESS)
    ap.add_argument("--child-time", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_check:
        print(json.dumps(dict(step=args.child_check, check=check_step(args.child_check))), flush=True)
        return 0
    if args.child_time:
        for name in args.child_time:
            time_step(name)
            print(json.dumps(dict(done=name)), flush=True)
        return 0
    if args.child_profile:
        profile_child(args.child_profile)
        return 0
    os.environ["LADDER_EXTRA"] = ",".join(args.extra)
    if args.table_shapes:
        os.environ["LADDER_SHAPES"] = "table"
    names = [s.name for _, s in every_step()] + list(extras())
    unknown = sorted(set(args.step or ()) - set(names))
    if unknown:
        print(f"no step {', '.join(unknown)}; part 5's steps: {', '.join(names)}", file=sys.stderr)
        return 2
    if args.compile:
        if runtime.INTERPRET:
            print("Triton's interpreter is on, which compiles nothing: run with TRITON_INTERPRET=0.")
            return 2
        chosen = [n for n in names if n not in extras() and n in (args.step or names)]
        jobs = [(name, kind, d, causal) for name in chosen for kind in kernels(name) for d, causal in COMPILED_SHAPES]
        facts = []
        # every step's kernels at each shape, compiled in fresh processes side by side, printed in order
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(8, os.cpu_count() or 1), mp_context=spawn) as pool:
            for fact in pool.map(compiled_facts, *zip(*jobs)):
                facts.append(fact)
                print(json.dumps(fact), flush=True)
        if not args.save:
            return 0
        # sm_90 is the H200's architecture, whichever machine compiles: its results folder
        path = results.results_dir("h200") / "part5_ladder_compiled.csv"
        flat = [
            {k: " ".join(f"{a}:{b}" for a, b in v.items()) if isinstance(v, dict) else v for k, v in f.items()}
            for f in facts
        ]
        meta = results.provenance() | {"gpu": "sm_90, compiled on this machine"}
        gone = lambda r: r.get("step") not in names or not r.get("kernel")  # noqa: E731  rows of old ladders
        rows = [dict(f, **meta) for f in flat]
        results.write_csv(path, rows, COMPILED_FIELDS, key=("step", "kernel", "D", "causal"), drop=gone)
        return 0
    from part5_profiling import gluon_attention

    if not gluon_attention.supported(torch.empty(1, 1, 64, dtype=torch.bfloat16, device=runtime.DEVICE)):
        print("The ladder's steps are Gluon kernels for a Hopper GPU (sm_90): nothing to run here.")
        return 0
    chosen = [n for n in names if n in (args.step or names)]
    if args.counters_only:
        return add_counters(chosen)
    measure = lambda save: run(chosen, not args.no_ncu, save)  # noqa: E731
    return results.write_as_measured("part5_ladder.csv", FIELDS, measure, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
