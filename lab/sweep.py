"""The tile sweep: tile shapes, warp counts and pipeline depths of one kernel, each measured on the GPU.

Part 2 introduces it for its forward (part2_tile_tuning/tools/sweep.py); parts 3 and 4 run it on their own
kernels. A part describes its kernel as a SweepTarget and calls main(target, __doc__). Four steps:
plan (the budget arithmetic prunes tiles that do not fit in one program's shared memory, the target's
budget(), or whose float32 accumulators alone need more registers than a thread has); compile (the
survivors, in parallel worker processes: compiling costs seconds, running milliseconds); measure (each
one runs on outputs poisoned with NaN, is checked against the float64 reference and only then timed);
write (results/<gpu>/<target>_sweep.csv, <target>_device.json and <target>_heatmaps.png; the winners
are printed last, as triton.Config lines).
"""

import argparse
import functools
import itertools
import json
import math
import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from common import launch, parts, runtime, triton_tools
from common.check import check_slices
from common.inputs import Shape, make_inputs
from lab import compiler, results, sweep_report
from lab.timing import attention_flops, time_ms

MAX_REGS = 255  # registers one thread can address
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
FIELDS = """D causal BLOCK_M BLOCK_N num_warps num_stages smem_est smem_compiled regs_est regs spills compile_s
first_launch_s status ms tflops B H N dtype gpu torch triton commit date command""".split()


def regs_estimate(block_m, block_n, d, num_warps):
    """float32 registers per thread for the accumulator O_i (BLOCK_M x D) and S_ij/P_ij (BLOCK_M x BLOCK_N)."""
    return block_m * (d + block_n) / (32 * num_warps)


class SweepTarget:
    """One kernel to sweep. A configuration is a dict with D, causal, BLOCK_M, BLOCK_N, num_warps and
    num_stages (the first columns of the CSV). A subclass, at module level (the compile workers are
    other processes and get the target pickled, which records only its class), names its part and
    kernel and defines: budget(config) -> (shared memory bytes, float32 registers per thread)
    estimated before compiling; tensors(d, causal) -> every input and output tensor, by the kernel's
    parameter names; check(t, causal) -> a common.check.Report of what the launch wrote; and grid(t,
    config) where its programs are laid out otherwise than below (part 2: two grid axes)."""

    part = None  # whose kernel: module() is parts.load(part); files are part<N>_...
    kernel_name = "_attn_fwd"
    held = "BLOCK_M"  # the tile a program holds for its whole loop: one program per such tile and sequence
    B, H, N = 4, 8, 4096
    dtype = torch.bfloat16
    mode = "fwd"  # which FLOPs the kernel does (lab.timing.attention_flops): "bwd" for a backward kernel
    blocks, warps, stages = (16, 32, 64, 128, 256), (2, 4, 8), (1, 2, 3, 4, 5)
    configs = None  # a list of (BLOCK_M, BLOCK_N, num_warps, num_stages) to sweep instead of the product
    outputs = ("O", "L")  # the tensors the kernel writes: poisoned with NaN before each checked launch

    @property
    def name(self):
        return f"part{self.part}"

    def module(self):
        return parts.load(self.part)

    def kernel(self):
        return getattr(self.module(), self.kernel_name)

    def flops(self, d, causal):
        return attention_flops(self.B, self.H, self.N, self.N, d, causal, self.mode)

    def arguments(self, t, config):
        """(positional arguments, keywords) of one launch, as the part's own launcher passes them: the
        kernel's parameters by name (t's tensors flattened to (B*H, N, ...), the lengths, the scale),
        then the constexprs, num_warps and num_stages."""
        n, d = self.N, config["D"]
        scalars = dict(N_QUERIES=n, N_KEYS=n, N_SEQS=self.B * self.H, N_BUCKET=launch.n_bucket(n, n), scale=d**-0.5)
        precision = "ieee" if self.dtype == torch.float32 else "tf32"  # as the parts: IEEE products for float32
        keywords = dict(D=d, IS_CAUSAL=bool(config["causal"]), DOT_PRECISION=precision)
        keywords.update({k: config[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")})
        names = [a for a in triton_tools.arg_names(self.kernel()) if a not in keywords]
        return [t[a].flatten(0, 1) if a in t else scalars[a] for a in names], keywords

    def grid(self, t, config):
        """One grid axis of (held tiles) x (B*H sequences) programs, as parts 3 and 4 launch."""
        return (math.ceil(self.N / config[self.held]) * self.B * self.H,)


class ForwardTarget(SweepTarget):
    """A forward kernel: Q, K and V of the target's shape in, O and L out, checked against the float64
    reference; its budget is the part's smem_bytes and regs_estimate."""

    def tensors(self, d, causal):
        shape = Shape((self.B, self.H), self.N, self.N, d)
        q, k, v, _ = make_inputs(shape, self.dtype, runtime.DEVICE, seed=d + causal)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        return dict(Q=q, K=k, V=v, O=torch.empty_like(q), L=lse)

    def budget(self, config):
        bm, bn, d = config["BLOCK_M"], config["BLOCK_N"], config["D"]
        smem = self.module().smem_bytes(bm, bn, d, self.dtype.itemsize, config["num_stages"])
        return smem, regs_estimate(bm, bn, d, config["num_warps"])

    def check(self, t, causal):
        return check_slices({"O": t["O"], "L": t["L"]}, t["Q"], t["K"], t["V"], causal)


def plan(target, d, causal, smem_limit):
    """Every configuration of one (D, causal) group, with the budget's verdict: "todo", or pruned and why."""
    rows = []
    for bm, bn, w, s in target.configs or itertools.product(target.blocks, target.blocks, target.warps, target.stages):
        config = dict(D=d, causal=int(causal), BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
        smem, regs = target.budget(config)
        status = "pruned: shared memory" if smem > smem_limit else "pruned: registers" if regs > MAX_REGS else "todo"
        rows.append(dict(config, smem_est=smem, regs_est=f"{regs:.0f}", status=status))
    return rows


def _first_line(e):
    return (str(e).strip().splitlines() or [""])[0][:100]


def compile_one(target, config):
    """Worker: compile one configuration into Triton's on-disk cache, on the inputs it will run on (so
    the launch finds it there), load it, and report its resources."""
    t = target.tensors(config["D"], bool(config["causal"]))
    args, keywords = target.arguments(t, config)
    start = time.perf_counter()
    try:
        compiled = compiler.compile_only(target.kernel(), args, target.grid(t, config), **keywords)
        out = dict(compile_s=f"{time.perf_counter() - start:.2f}", smem_compiled=triton_tools.shared_memory(compiled))
        out["regs"], out["spills"] = triton_tools.load(compiled)
        return dict(out, status="compiled")
    except triton_tools.OutOfResources as e:
        return dict(status=f"out of resources: {_first_line(e)}")
    except Exception as e:
        return dict(status=f"compile error: {type(e).__name__}: {_first_line(e)}")


def compile_all(target, todo, workers, deadline):
    """Compile the configurations in parallel worker processes, the largest tiles (the most promising)
    first, so a time limit cuts the least useful ones. The workers are spawned, not forked: a process
    forked after CUDA started cannot use it. Updates each row's status and resources."""
    todo = sorted(todo, key=lambda r: -r["BLOCK_M"] * r["BLOCK_N"])
    start = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(compile_one, target, r): r for r in todo}
    for i, fut in enumerate(as_completed(futures), 1):
        try:
            futures[fut].update(fut.result())
        except Exception as e:  # a worker that died (e.g. the compiler crashed)
            futures[fut]["status"] = f"compile error: {type(e).__name__}"
        if i % 25 == 0 or i == len(todo):
            print(f"  compiled {i}/{len(todo)} in {time.perf_counter() - start:.0f} s", flush=True)
        if time.time() > deadline:
            print("  compile time limit reached: the rest are recorded as not compiled", flush=True)
            break
    pool.shutdown(wait=False, cancel_futures=True)
    for r in todo:
        if r["status"] == "todo":
            r["status"] = "not measured: time limit"


def measure(target, rows, d, causal, deadline, timer=None):
    """Check, then time, every compiled configuration of one (D, causal) group on the same inputs.
    timer(fn) -> milliseconds; default do_bench's median over about 30 ms of runs."""
    timer = timer or (lambda fn: time_ms(fn, rep=30))
    t = target.tensors(d, causal)
    kernel = triton_tools.jit_function(target.kernel())
    todo = sorted((r for r in rows if r["status"] == "compiled"), key=lambda r: -r["BLOCK_M"] * r["BLOCK_N"])
    for row in todo:
        if time.time() > deadline:
            row["status"] = "not measured: time limit"
            continue
        args, keywords = target.arguments(t, row)
        run = functools.partial(kernel[target.grid(t, row)], *args, **keywords)
        try:
            for name in target.outputs:
                t[name].fill_(float("nan"))  # poison: an output the kernel does not write must fail the check
            start = time.perf_counter()
            run()  # loads the binary the workers compiled
            if t[target.outputs[0]].is_cuda:
                torch.cuda.synchronize()
            row["first_launch_s"] = f"{time.perf_counter() - start:.2f}"
            checked = target.check(t, causal)
        except triton_tools.OutOfResources as e:
            row["status"] = f"out of resources: {_first_line(e)}"
            continue
        if not checked.ok:
            row["status"] = f"failed check: {checked}"
            continue
        ms = timer(run)
        row.update(status="ok", ms=f"{ms:.4f}", tflops=f"{target.flops(d, causal) / ms * 1e-9:.1f}")
        config = f"{row['BLOCK_M']}x{row['BLOCK_N']} w{row['num_warps']} s{row['num_stages']}"
        print(f"  D={d} causal={causal:d} {config:<16} {row['tflops']:>7} TFLOP/s", flush=True)


def device_limits():
    """The limits the budget arithmetic needs, read off the GPU by torch and by Triton's driver."""
    props = torch.cuda.get_device_properties(0)
    names = """name major minor multi_processor_count shared_memory_per_block shared_memory_per_block_optin
    shared_memory_per_multiprocessor regs_per_multiprocessor max_threads_per_multi_processor L2_cache_size
    total_memory warp_size"""
    return {**{n: getattr(props, n, None) for n in names.split()}, "triton": compiler.device_properties()}


def sweep(target, groups, workers, max_minutes):
    """plan -> compile -> measure -> write, for the (D, causal) groups. Returns the CSV's path."""
    deadline = time.time() + 60 * max_minutes
    out_dir = results.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = DTYPE_NAMES[target.dtype]
    stem = target.name if dtype == "bf16" else f"{target.name}_{dtype}"  # "part3", "part3_fp32"
    limits = device_limits()
    (out_dir / f"{stem}_device.json").write_text(json.dumps(limits, indent=2) + "\n")
    smem_limit = limits["shared_memory_per_block_optin"] or limits["triton"]["max_shared_mem"]
    print(f"sweep of {target.name} on {runtime.describe()}; shared memory per program {smem_limit} bytes", flush=True)
    rows = {g: plan(target, *g, smem_limit) for g in groups}
    todo = [r for g in groups for r in rows[g] if r["status"] == "todo"]
    print(f"{sum(map(len, rows.values()))} configurations, {len(todo)} to compile with {workers} workers", flush=True)
    compile_all(target, todo, workers, time.time() + 0.6 * 60 * max_minutes)
    for g in groups:
        measure(target, rows[g], *g, deadline)
    meta = dict(B=target.B, H=target.H, N=target.N, dtype=dtype, **results.provenance())
    path = results.write_csv(out_dir / f"{stem}_sweep.csv", [{**meta, **r} for g in groups for r in rows[g]], FIELDS)
    sweep_report.draw_heatmaps(out_dir, stem, label=f"Part {target.part}" + ("" if dtype == "bf16" else f", {dtype}"))
    return path


def parse_config(text):
    """'128x64w4s2' -> (128, 64, 4, 2): BLOCK_M x BLOCK_N, num_warps, num_stages."""
    found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"a configuration is written BLOCK_MxBLOCK_NwWARPSsSTAGES, e.g. 128x64w4s2; got {text!r}"
        )
    return tuple(int(x) for x in found.groups())


def main(target, description, argv=None):
    """The command line of a part's tools/sweep.py: its description and its target, or {--kernel choice:
    target} for a part with several kernels to sweep (part 4's two backward kernels)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if isinstance(target, dict):
        ap.add_argument("--kernel", choices=target, required=True, help="which kernel to sweep")
    ap.add_argument("--d", type=int, action="append", help="head dim (repeatable; default 64 and 128)")
    ap.add_argument("--causal", type=int, action="append", choices=(0, 1), help="0 or 1 (repeatable; default both)")
    ap.add_argument("--max-minutes", type=float, default=30.0, help="stop measuring after this long (rows say so)")
    ap.add_argument("--dtype", choices=DTYPE_NAMES.values(), default="bf16", help="fp16, fp32: files end _fp16, _fp32")
    ap.add_argument("--configs", nargs="+", type=parse_config, metavar="MxNwWsS", help="these instead of the product")
    args = ap.parse_args(argv)
    if not runtime.COMPILED:
        print("The sweep times compiled kernels and needs a CUDA GPU (the interpreter cannot time anything).")
        return 0
    target = target[args.kernel] if isinstance(target, dict) else target
    target.dtype = {name: dtype for dtype, name in DTYPE_NAMES.items()}[args.dtype]
    target.configs = args.configs or target.configs
    groups = [(d, bool(c)) for d in (args.d or [64, 128]) for c in (args.causal or [0, 1])]
    start = time.perf_counter()
    path = sweep(target, groups, max(1, min(16, (os.cpu_count() or 2) - 1)), args.max_minutes)
    print(f"wrote {results.shown(path)} and its heatmaps ({time.perf_counter() - start:.0f} s)")
    print(sweep_report.winners(results.read_csv(path)))
    return 0
