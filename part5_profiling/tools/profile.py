"""Profile a part's kernels (or an SDPA backend's) at fixed shapes: what each kernel costs and why.

    python -m part5_profiling.tools.profile --part 4          # make profile PART=4
    python -m part5_profiling.tools.profile --sdpa cudnn      # an SDPA backend, pinned (flash, cudnn, ...)
    python -m part5_profiling.tools.profile --part 4 --no-ncu # without hardware counters
    python -m part5_profiling.tools.profile --part 5 --fa4    # beside FlashAttention-4, where installed

Shapes: B=4, H=8, N=4096, D = 64 and 128, causal and not, bf16. Passes: the forward; the backward
too where it is a kernel of its own (from part 4 on, and SDPA), timed from the saved forward.

Every row says which method produced it:
- "cupti": each kernel's GPU time from PyTorch's profiler (CUPTI activity records: no hardware
  counters needed), mean over REPEATS warm calls, and the FLOP/s that time gives.
- "compiler": a Triton kernel's warps, stages, shared memory, registers and spills, read off the
  compiled kernel, and the programs per SM those allow (an estimate from the GPU's limits).
- "ncu": Nsight Compute's hardware counters for one warm call (run with --clock-control none, at
  the clocks the benchmark sees): duration, DRAM and L2 bytes, SM and tensor-pipe utilisation,
  achieved and theoretical occupancy, registers, shared memory, and the top warp stall reasons.
  Where ncu is missing or cannot read the counters (some virtual machines), the run says so in a
  row of method "ncu" and metric "unavailable", and the other methods still run.
Rows go to results/<gpu>/part5_profile.csv, merged by (target, D, causal, pass, method): a run replaces
what it measured, but a machine whose ncu cannot read the counters leaves the counters already there.
"""

import argparse
import csv
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import types

import torch

from common import parts, runtime
from common.inputs import Shape, make_inputs
from lab import compiler, impls, results
from lab.bench import timed_call
from lab.timing import attention_flops

B, H, N = 4, 8, 4096
HEAD_DIMS = (64, 128)
REPEATS = 20
FIELDS = ["target", "kernel", "D", "causal", "pass", "method", "metric", "value", "unit", "note", *results.PROVENANCE]
# A run replaces every row of each target, shape, pass and method it measures (a stall reason that is
# no longer among the top, a kernel since renamed, go with it) and keeps the others'; a row saying ncu
# could not read the counters here (or failed) replaces nothing: the counters measured before stay.
KEY = ("target", "D", "causal", "pass", "method")


def replaces(row):
    return not (row["method"] == "ncu" and row["metric"] in ("unavailable", "error"))


# Counters asked of ncu (those this ncu knows; the rest are reported missing). Names: Nsight
# Compute's metric reference; .sum / .avg / .pct... are roll-ups of the base name before the dot.
NCU_METRICS = {
    "gpu__time_duration.sum": "duration",
    "dram__bytes_read.sum": "DRAM bytes read",
    "dram__bytes_write.sum": "DRAM bytes written",
    "lts__t_bytes.sum": "L2 bytes",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM throughput, % of peak",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory throughput, % of peak",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe (wgmma) active, %",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe (mma) active, %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy, %",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical occupancy, %",
    "launch__registers_per_thread": "registers per thread",
    "launch__shared_mem_per_block_dynamic": "dynamic shared memory per block",
    "launch__shared_mem_per_block_static": "static shared memory per block",
    "launch__grid_size": "programs (grid size)",
    "launch__block_size": "threads per program",
}
NCU_MAX_LAUNCHES = 20  # ncu replays each launch many times: a cap, far above the 1-3 kernels of a pass
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active")
TOP_STALLS = 4
# ncu's answers that hold for every later shape too: the run stops asking it (each try costs a
# whole child process, tens of seconds) and records the same reason for the rest.
NCU_FINAL = ("ERR_NVGPUCTRPERM", "not on the PATH", "timed out")


# ------------------------------------------------------------------------------------ targets
def target_impl(target):
    """'part4', 'sdpa_cudnn' or 'fa4' -> the benchmark's Impl for it (the same calls the benchmark times)."""
    if target.startswith("part"):
        return impls.part_impl(int(target.removeprefix("part")))
    if target == impls.FA4:
        return impls.fa4_impl()
    return impls.sdpa_impl(target.removeprefix("sdpa_"))


def has_backward_kernels(target):
    """Whether the target's backward is GPU kernels worth profiling: SDPA's, and a part's own Triton
    backward (parts 0-3 borrow common/backward.py, thousands of small PyTorch launches)."""
    if not target.startswith("part"):
        return True
    return not parts.pytorch_backward(parts.load(int(target.removeprefix("part"))))


def passes(target):
    return ("fwd", "bwd") if has_backward_kernels(target) else ("fwd",)


def call_for(impl, pass_, d, causal):
    """A warm, repeatable call of one pass on the fixed shape: fwd runs the forward; bwd re-runs the
    backward on one retained graph (the benchmark's bwd mode)."""
    q, k, v, do = make_inputs(Shape((B, H), N, N, d), torch.bfloat16, runtime.DEVICE, seed=d + causal)
    mode = "fwd" if pass_ == "fwd" else "bwd"
    fn = timed_call(impl, mode, q, k, v, do, causal)
    if pass_ == "bwd":
        return fn

    def forward():  # no autograd graph, as the benchmark's fwd mode
        with torch.no_grad():
            return fn()

    return forward


def kernel_label(name):
    """A GPU kernel's name, shortened for tables: Triton's _attn_fwd, cuDNN's long generated names cut."""
    return name if len(name) <= 60 else name[:57] + "..."


# ------------------------------------------------------------------------------------ cupti
def cupti_rows(target, impl, pass_, d, causal):
    """Each kernel's mean GPU time over REPEATS calls, from the profiler's CUDA kernel records."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with impl.context():  # entered first: the backward's graph is built by the pinned backend's forward
        fn = call_for(impl, pass_, d, causal)
        for _ in range(3):  # compile, autotune, warm caches
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(REPEATS):
                fn()
            torch.cuda.synchronize()
    per_kernel = {}
    for event in prof.events():  # GPU records: kernels, memsets, copies; not the ranges annotating them
        if event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
            per_kernel.setdefault(event.name, []).append(event.time_range.elapsed_us())
    if not per_kernel:
        raise RuntimeError("the profiler recorded no GPU kernel (CUPTI activity records unavailable?)")
    flops = attention_flops(B, H, N, N, d, causal, pass_)
    total_us = sum(sum(times) for times in per_kernel.values()) / REPEATS
    base = dict(target=target, D=d, causal=int(causal), **{"pass": pass_}, method="cupti")
    rows = [  # per call (a kernel may run several times per call)
        dict(base, kernel=kernel_label(name), metric="time per call", value=f"{sum(times) / REPEATS:.1f}", unit="us",
             note=f"{len(times) // REPEATS} launch(es) per call") for name, times in per_kernel.items()
    ]  # fmt: skip
    achieved = dict(
        value=f"{flops / total_us * 1e-6:.1f}", unit="TFLOP/s", note="the pass's FLOPs over its kernels' time"
    )
    rows.append(dict(base, kernel="(all kernels)", metric="time per call", value=f"{total_us:.1f}", unit="us", note=""))
    return rows + [dict(base, kernel="(all kernels)", metric="achieved", **achieved)]


# ------------------------------------------------------------------------------------ compiler
def triton_kernels(module):
    """The module's Triton kernels (jit functions, Gluon ones included, and autotuned wrappers), by
    name, and those of the modules of its own package it imports (part 5's gluon_attention and
    gluon_backward)."""
    from triton.runtime import Autotuner, JITFunction

    package = module.__name__.rpartition(".")[0] + "."
    siblings = [m for m in vars(module).values() if isinstance(m, types.ModuleType) and m.__name__.startswith(package)]
    return {n: k for m in [module, *siblings] for n, k in vars(m).items() if isinstance(k, (Autotuner, JITFunction))}


def occupancy(res, props):
    """Programs per SM the compiled resources allow (registers, shared memory, threads), and which limits."""
    threads = 32 * res["num_warps"]
    limits = {
        "threads": 2048 // threads,
        "registers": props["max_num_regs"] // max(1, res["regs"] * threads),
        "shared memory": props["max_shared_mem"] // max(1, res["shared"]),
    }
    best = min(limits.values())
    return best, [name for name, value in limits.items() if value == best]


def compiler_rows(target, impl, pass_, d, causal):
    """Resources of every Triton kernel one warm call launches (none for a part without Triton or SDPA)."""
    if not target.startswith("part") or not parts.uses_triton(int(target.removeprefix("part"))):
        return []

    module = parts.load(int(target.removeprefix("part")))
    fn = call_for(impl, pass_, d, causal)
    fn()  # compile and autotune first: while tuning, every configuration timed is a launch too
    torch.cuda.synchronize()
    props = compiler.device_properties()
    rows, seen = [], set()
    for name, compiled in compiler.launched(triton_kernels(module).values(), fn):
        if name in seen:
            continue
        seen.add(name)
        res = compiler.resources(compiled)
        per_sm, limited_by = occupancy(res, props)
        base = dict(target=target, kernel=name, D=d, causal=int(causal), **{"pass": pass_}, method="compiler", note="")
        rows += [
            dict(base, metric="warps", value=res["num_warps"], unit=""),
            dict(base, metric="stages", value=res["num_stages"], unit=""),
            dict(base, metric="shared memory per program", value=res["shared"], unit="bytes"),
            dict(base, metric="registers per thread", value=res["regs"], unit=""),
            dict(base, metric="spilled registers", value=res["spills"], unit=""),
            dict(base, metric="programs per SM (estimate)", value=per_sm, unit="", note="limited by " + " and ".join(limited_by)),
        ]  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------ ncu
def ncu_available_metrics(ncu):
    """Base names of the metrics this ncu knows for this GPU (empty if it cannot say)."""
    try:
        out = subprocess.run([ncu, "--devices", "0", "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    names = (line.split()[0] for line in out.stdout.splitlines() if line.strip())  # a name, then its description
    return {name.split(".")[0] for name in names if re.match(r"[a-z]\w*__\w+", name)}


def ncu_number(text):
    """A value as ncu's CSV prints it ("1,024.50", "n/a") -> float, or None if it is not a number."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def parse_ncu_csv(text):
    """ncu --csv --page raw output -> [{column: value}] per kernel launch; the units row is returned
    as the second value. Lines ncu or the program print around the table are skipped."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if not lines:
        return [], {}
    table = list(csv.DictReader(io.StringIO("\n".join(lines))))
    units = table[0] if table and not table[0].get("ID") else {}
    return [row for row in table if row.get("ID")], units


def ncu_rows(target, pass_, d, causal, wanted, stall_metrics):
    """Run this script's --child mode under ncu and turn its counters into rows."""
    ncu = shutil.which("ncu")
    base = dict(target=target, D=d, causal=int(causal), **{"pass": pass_}, method="ncu")

    def unavailable(note):
        return [dict(base, kernel="(all kernels)", metric="unavailable", value="", unit="", note=note)]

    if ncu is None:
        return unavailable("ncu is not on the PATH")

    def run_ncu(metrics):
        cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all"]
        cmd += ["--launch-count", str(NCU_MAX_LAUNCHES), "--csv", "--page", "raw", "--metrics", ",".join(metrics)]
        cmd += [
            sys.executable,
            "-m",
            "part5_profiling.tools.profile",
            "--child",
            target,
            pass_,
            str(d),
            str(int(causal)),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ.copy())
        return out, *parse_ncu_csv(out.stdout)

    try:
        out, launches, units = run_ncu(list(wanted) + list(stall_metrics))
        refused = "ERR_NVGPUCTRPERM" in out.stdout + out.stderr  # no counters at all: a retry cannot help
        if not launches and stall_metrics and not refused:  # a stall metric this ncu refuses: the rest counts
            out, launches, units = run_ncu(list(wanted))
            stall_metrics = []
    except subprocess.TimeoutExpired:
        return unavailable("ncu timed out")
    if not launches:
        lines = (out.stdout + out.stderr).splitlines()
        why = next((line for line in lines if line.startswith("==ERROR==")), None)
        why = why or next((line for line in lines if "ERR" in line or "rror" in line), "")
        return unavailable(f"ncu exit {out.returncode}: {why.strip()[:150]}")
    rows = []
    for launch in launches:
        kernel = kernel_label(launch.get("Kernel Name", "?"))
        for metric, label in NCU_METRICS.items():
            if metric in launch:
                value = launch[metric].replace(",", "") if ncu_number(launch[metric]) is not None else launch[metric]
                rows.append(dict(base, kernel=kernel, metric=label, value=value, unit=units.get(metric, ""), note=""))
        stalls = [(ncu_number(launch[m]), STALL.match(m).group(1)) for m in stall_metrics if m in launch]
        stalls = sorted(((v, reason) for v, reason in stalls if v is not None), reverse=True)[:TOP_STALLS]
        note = "average warps stalled for this reason per instruction issued"
        rows += [dict(base, kernel=kernel, metric=f"stall #{rank}: {reason}", value=f"{value:.2f}",
                      unit="warps per issue", note=note) for rank, (value, reason) in enumerate(stalls, 1)]  # fmt: skip
    missing = "; ".join(label for metric, label in NCU_METRICS.items() if metric not in wanted)
    base.update(kernel="(all kernels)", metric="not offered by this ncu", value="", unit="", note=missing)
    return rows + ([base] if missing else [])


def child(target, pass_, d, causal):
    """Under ncu: warm up outside the profiled range, then one call between cudaProfilerStart/Stop."""
    impl = target_impl(target)
    with impl.context():
        fn = call_for(impl, pass_, d, bool(causal))
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


# ------------------------------------------------------------------------------------ main
def guarded(base, method, measure, *args):
    """measure(*args)'s rows; if it raises, one row of metric "error" saying why, so the run goes on."""
    try:
        return measure(*args)
    except Exception as e:  # a backend refusing a shape, a compile error: recorded, not fatal
        return [dict(base, method=method, metric="error", note=results.why(e))]


def profile(targets, use_ncu, save=None):
    meta = results.provenance()
    wanted, stall_metrics = [], []
    if use_ncu and shutil.which("ncu"):
        known = ncu_available_metrics(shutil.which("ncu"))
        wanted = [m for m in NCU_METRICS if m.split(".")[0] in known] if known else list(NCU_METRICS)[:5]
        stall_metrics = sorted(f"{m}.ratio" for m in known if STALL.fullmatch(m))
    rows, ncu_final = [], None  # ncu_final: why ncu cannot count on this machine, once it has said so
    for target in targets:
        impl = target_impl(target)
        for pass_, d, causal in itertools.product(passes(target), HEAD_DIMS, (False, True)):
            base = dict(target=target, kernel="(all kernels)", D=d, causal=int(causal), value="", unit="")
            base["pass"] = pass_
            found = guarded(base, "cupti", cupti_rows, target, impl, pass_, d, causal)
            found += guarded(base, "compiler", compiler_rows, target, impl, pass_, d, causal)
            if use_ncu and ncu_final:
                found.append(dict(base, method="ncu", metric="unavailable", note=ncu_final))
            elif use_ncu:
                found += guarded(base, "ncu", ncu_rows, target, pass_, d, causal, wanted, stall_metrics)
                final = [
                    r["note"] for r in found if r["metric"] == "unavailable" and any(s in r["note"] for s in NCU_FINAL)
                ]
                ncu_final = final[0] if final else None
            rows += [dict(r, **meta) for r in found]
            total = next((r["value"] for r in found if r["metric"] == "achieved"), "error")
            counted = any(r["method"] == "ncu" and r["metric"] not in ("unavailable", "error") for r in found)
            errors = "; ".join(f"{r['method']}: {r['note']}" for r in found if r["metric"] == "error")
            print(f"{target:>12} {pass_} D={d:<3} causal={causal:d}  {total:>7} TFLOP/s  "
                  f"({'with' if counted else 'no'} counters)  {errors}", flush=True)  # fmt: skip
            torch.cuda.empty_cache()
            if save is not None:  # after every shape too: a run cut short keeps what it measured
                save(rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable)")
    ap.add_argument(
        "--sdpa",
        action="append",
        choices=[b for b in impls.SDPA_BACKENDS if b != "default"],
        help="an SDPA backend (repeatable)",
    )
    ap.add_argument("--fa4", action="store_true", help="FlashAttention-4 (flash-attn-4), where installed")
    ap.add_argument("--no-ncu", action="store_true", help="skip the hardware counters")
    ap.add_argument("--child", nargs=4, metavar=("TARGET", "PASS", "D", "CAUSAL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        target, pass_, d, causal = args.child
        child(target, pass_, int(d), int(causal))
        return 0
    try:
        targets = [f"part{n}" for n in parts.require(args.part)] if args.part else []
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    pytorch_only = [t for t in targets if not parts.uses_triton(int(t.removeprefix("part")))]
    if pytorch_only:
        print(
            f"{', '.join(pytorch_only)}: PyTorch loops of thousands of small launches, not a kernel to profile "
            "(the benchmark times it); profile the Triton parts, 1 on",
            file=sys.stderr,
        )
        return 2
    targets += [f"sdpa_{b}" for b in args.sdpa or ()]
    if args.fa4 and impls.fa4_impl() is None:
        print("--fa4: flash-attn-4 does not import here (pip install flash-attn-4)", file=sys.stderr)
        return 2
    targets += [impls.FA4] if args.fa4 else []
    if not targets:
        ap.error("name what to profile: --part N, --sdpa BACKEND and/or --fa4")
    if not runtime.COMPILED:
        print(
            "Profiling needs a CUDA GPU: kernels are timed and counted as they run. Without one, part 5's "
            "README and walkthrough show the committed results."
        )
        return 0
    measure = lambda save: profile(targets, use_ncu=not args.no_ncu, save=save)  # noqa: E731
    return results.write_as_measured("part5_profile.csv", FIELDS, measure, lambda r: False, KEY, replaces)


if __name__ == "__main__":
    sys.exit(main())
