"""The tile sweep: tile shapes, warp counts and pipeline depths of one kernel, each measured on the GPU.

Part 2 introduces it for its forward (part2_tile_tuning/sweep.py); parts 3 and 4 run it on their
own kernels. A part describes its kernel as a SweepTarget (how to launch one configuration, on
which inputs, what to check, what it costs) and calls main(target=...). Four steps:

- plan: before any compiling, the budget arithmetic prunes what cannot work: tiles that do not fit
  in one program's shared memory (the target's budget()) and float32 accumulators that alone would
  need more registers than a thread has (regs_estimate below);
- compile: the survivors are compiled in parallel worker processes (compiling costs seconds per
  configuration; running costs milliseconds);
- measure: each one runs on outputs poisoned with NaN, is checked against the float64 reference
  and only then timed. A configuration that still fails (out of resources, failed check) is
  recorded as such;
- write: results/<gpu>/<target>_sweep.csv and <target>_device.json, and <target>_heatmaps.png; the
  winners are printed last, as triton.Config lines.
"""

import argparse
import itertools
import json
import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from common import parts, results, runtime, sweep_report, triton_tools
from common.check import check_slices
from common.inputs import Shape, make_inputs
from common.timing import attention_flops, time_ms

BLOCKS = (16, 32, 64, 128, 256)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4, 5)
MAX_REGS = 255  # registers one thread can address
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
FIELDS = [
    "D",
    "causal",
    "BLOCK_M",
    "BLOCK_N",
    "num_warps",
    "num_stages",
    "smem_est",
    "smem_compiled",
    "regs_est",
    "regs",
    "spills",
    "compile_s",
    "first_launch_s",
    "status",
    "ms",
    "tflops",
    "B",
    "H",
    "N",
    "dtype",
    "gpu",
    "torch",
    "triton",
    "commit",
    "date",
    "command",
]


def regs_estimate(block_m, block_n, d, num_warps):
    """float32 registers per thread for the accumulator O_i (BLOCK_M x D) and S_ij/P_ij (BLOCK_M x BLOCK_N)."""
    return block_m * (d + block_n) / (32 * num_warps)


class SweepTarget:
    """One kernel to sweep. A configuration is a dict with D, causal, BLOCK_M, BLOCK_N, num_warps and
    num_stages (the first columns of the CSV). Subclass it at module level: the compile workers are
    other processes and receive the target pickled, which records only its class."""

    part = None  # whose kernel (set by the subclass): module() is parts.load(part); files are part<N>_...
    B, H, N = 4, 8, 4096
    dtype = torch.bfloat16
    mode = "fwd"  # which FLOPs the kernel does (common.timing.attention_flops): "bwd" for a backward kernel
    blocks, warps, stages = BLOCKS, WARPS, STAGES
    blocks_m = blocks_n = None  # BLOCK_M and BLOCK_N values, where they differ from blocks
    configs = None  # a list of (BLOCK_M, BLOCK_N, num_warps, num_stages) to sweep instead of the product
    outputs = ("O", "L")  # the tensors the kernel writes: poisoned with NaN before each checked launch

    @property
    def name(self):
        return f"part{self.part}"

    def module(self):
        return parts.load(self.part)

    def kernel(self):
        """The @triton.jit kernel (an @triton.autotune wrapper around it is fine: it is unwrapped)."""
        raise NotImplementedError

    def budget(self, config):
        """(shared memory in bytes, float32 registers per thread), estimated before compiling."""
        raise NotImplementedError

    def tensors(self, d, causal):
        """Every tensor of one (D, causal) group by name, inputs and outputs, on the GPU."""
        raise NotImplementedError

    def launch(self, t, config):
        """(positional arguments, constexpr keyword arguments) of one launch of this configuration;
        the sweep adds num_warps and num_stages."""
        raise NotImplementedError

    def grid(self, t, config):
        raise NotImplementedError

    def check(self, t, causal):
        """Compare what the launch wrote with the float64 reference: a common.check.Report."""
        raise NotImplementedError

    def flops(self, d, causal):
        return attention_flops(self.B, self.H, self.N, self.N, d, causal, self.mode)


class ForwardTarget(SweepTarget):
    """A forward kernel: Q, K and V of the target's shape in, O and L out, checked against the float64
    reference. A part's forward sweep subclasses it and says how its kernel is launched."""

    def tensors(self, d, causal):
        q, k, v, _ = make_inputs(
            Shape((self.B, self.H), self.N, self.N, d), self.dtype, runtime.DEVICE, seed=d + causal
        )
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        return dict(Q=q, K=k, V=v, O=torch.empty_like(q), L=lse)

    def check(self, t, causal):
        return check_slices({"O": t["O"], "L": t["L"]}, t["Q"], t["K"], t["V"], causal)


# ------------------------------------------------------------------------------------ plan
def plan(target, d, causal, smem_limit):
    """Every configuration of one (D, causal) group, with the budget's verdict: "todo", or pruned and why."""
    rows = []
    blocks_m, blocks_n = target.blocks_m or target.blocks, target.blocks_n or target.blocks
    space = target.configs or itertools.product(blocks_m, blocks_n, target.warps, target.stages)
    for bm, bn, w, s in space:
        config = dict(D=d, causal=int(causal), BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
        smem, regs = target.budget(config)
        status = "pruned: shared memory" if smem > smem_limit else "pruned: registers" if regs > MAX_REGS else "todo"
        rows.append(dict(config, smem_est=smem, regs_est=f"{regs:.0f}", status=status))
    return rows


# ------------------------------------------------------------------------------------ compile
def _first_line(e):
    return str(e).strip().splitlines()[0][:100] if str(e).strip() else ""


def compile_one(target, config):
    """Worker: compile one configuration into Triton's on-disk cache, on the inputs it will run on (so
    the launch finds it there), load it, and report its resources."""
    t = target.tensors(config["D"], bool(config["causal"]))
    args, constexprs = target.launch(t, config)
    out = {}
    start = time.perf_counter()
    try:
        compiled = triton_tools.compile_only(
            target.kernel(),
            args,
            target.grid(t, config),
            num_warps=config["num_warps"],
            num_stages=config["num_stages"],
            **constexprs,
        )
        out["compile_s"] = f"{time.perf_counter() - start:.2f}"
        out["smem_compiled"] = triton_tools.shared_memory(compiled)
        out["regs"], out["spills"] = triton_tools.load(compiled)
        out["status"] = "compiled"
    except triton_tools.OutOfResources as e:
        out["status"] = f"out of resources: {_first_line(e)}"
    except Exception as e:
        out["status"] = f"compile error: {type(e).__name__}: {_first_line(e)}"
    return out


def compile_all(target, todo, workers, deadline):
    """Compile the configurations in parallel worker processes, the largest tiles (the most promising)
    first, so a time limit cuts the least useful ones. The workers are spawned, not forked: a process
    forked after CUDA started cannot use it. Updates each row's status and resources."""
    todo = sorted(todo, key=lambda r: -r["BLOCK_M"] * r["BLOCK_N"])
    start = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(compile_one, target, r): r for r in todo}
    for i, fut in enumerate(as_completed(futures), 1):
        r = futures[fut]
        try:
            r.update(fut.result())
        except Exception as e:  # a worker that died (e.g. the compiler crashed)
            r["status"] = f"compile error: {type(e).__name__}"
        if i % 25 == 0 or i == len(todo):
            print(f"  compiled {i}/{len(todo)} in {time.perf_counter() - start:.0f} s", flush=True)
        if time.time() > deadline:
            print("  compile time limit reached: the rest are recorded as not compiled", flush=True)
            break
    pool.shutdown(wait=False, cancel_futures=True)
    for r in todo:
        if r["status"] == "todo":
            r["status"] = "not measured: time limit"


# ------------------------------------------------------------------------------------ measure
def measure(target, rows, d, causal, deadline, timer=None):
    """Check, then time, every compiled configuration of one (D, causal) group on the same inputs.
    timer(fn) -> milliseconds; default do_bench's median over about 30 ms of runs."""
    timer = timer or (lambda fn: time_ms(fn, rep=30))
    t = target.tensors(d, causal)
    kernel = triton_tools.jit_function(target.kernel())
    flops = target.flops(d, causal)
    best = 0.0
    todo = sorted((r for r in rows if r["status"] == "compiled"), key=lambda r: -r["BLOCK_M"] * r["BLOCK_N"])
    for i, row in enumerate(todo, 1):
        if time.time() > deadline:
            row["status"] = "not measured: time limit"
            continue
        args, constexprs = target.launch(t, row)
        grid = target.grid(t, row)

        def run(args=args, constexprs=constexprs, grid=grid, row=row):
            kernel[grid](*args, **constexprs, num_warps=row["num_warps"], num_stages=row["num_stages"])

        try:
            for name in target.outputs:
                t[name].fill_(float("nan"))  # poison: an output the kernel does not write must fail the check
            launch = time.perf_counter()
            run()  # loads the binary the workers compiled
            if t[target.outputs[0]].is_cuda:
                torch.cuda.synchronize()
            row["first_launch_s"] = f"{time.perf_counter() - launch:.2f}"
            checked = target.check(t, causal)
        except triton_tools.OutOfResources as e:
            row["status"] = f"out of resources: {_first_line(e)}"
            continue
        if not checked.ok:
            row["status"] = f"failed check: {checked}"
            continue
        ms = timer(run)
        row.update(status="ok", ms=f"{ms:.4f}", tflops=f"{flops / ms * 1e-9:.1f}")
        best = max(best, float(row["tflops"]))
        name = f"{row['BLOCK_M']}x{row['BLOCK_N']} w{row['num_warps']} s{row['num_stages']}"
        print(
            f"  [{i:>3}/{len(todo)}] D={d} causal={causal:d} {name:<16} {float(row['tflops']):7.1f} TFLOP/s"
            f"   (best so far {best:.1f})",
            flush=True,
        )


# ------------------------------------------------------------------------------------ write
def device_limits():
    """The limits the budget arithmetic needs, read off the GPU by torch and by Triton's driver."""
    props = torch.cuda.get_device_properties(0)
    names = [
        "name",
        "major",
        "minor",
        "multi_processor_count",
        "shared_memory_per_block",
        "shared_memory_per_block_optin",
        "shared_memory_per_multiprocessor",
        "regs_per_multiprocessor",
        "max_threads_per_multi_processor",
        "L2_cache_size",
        "total_memory",
        "warp_size",
    ]
    info = {n: getattr(props, n, None) for n in names}
    info["triton"] = triton_tools.device_properties()
    return info


def stem(target):
    """The prefix of a sweep's files: the target's name, and its dtype unless bf16 ("part3", "part3_fp32")."""
    return target.name if target.dtype == torch.bfloat16 else f"{target.name}_{DTYPE_NAMES[target.dtype]}"


def write(target, rows, out_dir):
    """The sweep's CSV, every configuration with its provenance, and its heatmaps. Returns the CSV's path."""
    meta = dict(B=target.B, H=target.H, N=target.N, dtype=DTYPE_NAMES[target.dtype], **results.provenance())
    path = results.write_csv(out_dir / f"{stem(target)}_sweep.csv", [{**meta, **r} for r in rows], FIELDS)
    label = f"Part {target.part}" + ("" if target.dtype == torch.bfloat16 else f", {DTYPE_NAMES[target.dtype]}")
    sweep_report.draw_heatmaps(out_dir, stem(target), label=label)
    return path


def sweep(target, groups, workers, max_minutes):
    """plan -> compile -> measure -> write, for the (D, causal) groups. Returns the CSV's path."""
    deadline = time.time() + 60 * max_minutes
    out_dir = results.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    limits = device_limits()
    (out_dir / f"{stem(target)}_device.json").write_text(json.dumps(limits, indent=2) + "\n")
    smem_limit = limits["shared_memory_per_block_optin"] or limits["triton"]["max_shared_mem"]
    print(
        f"sweep of {target.name} on {runtime.describe()}; shared memory per program {smem_limit} bytes, "
        f"{limits['multi_processor_count']} SMs",
        flush=True,
    )

    rows = {g: plan(target, *g, smem_limit) for g in groups}
    todo = [r for g in groups for r in rows[g] if r["status"] == "todo"]
    total = sum(len(r) for r in rows.values())
    print(
        f"{total} configurations, {total - len(todo)} pruned by the budget, "
        f"{len(todo)} to compile with {workers} workers",
        flush=True,
    )
    compile_all(target, todo, workers, time.time() + 0.6 * 60 * max_minutes)
    for g in groups:
        print(f"measuring D={g[0]} causal={g[1]:d}", flush=True)
        measure(target, rows[g], *g, deadline)
    return write(target, [r for g in groups for r in rows[g]], out_dir)


def parse_config(text):
    """'128x64w4s2' -> (128, 64, 4, 2): BLOCK_M x BLOCK_N, num_warps, num_stages."""
    found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    if found is None:
        raise ValueError(f"a configuration is written BLOCK_MxBLOCK_NwWARPSsSTAGES, e.g. 128x64w4s2; got {text!r}")
    return tuple(int(x) for x in found.groups())


def main(target, description, argv=None):
    """The command line of a part's sweep.py: its target and its description."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, action="append", help="head dim (repeatable; default 64 and 128)")
    ap.add_argument("--causal", type=int, action="append", help="0 or 1 (repeatable; default both)")
    ap.add_argument("--workers", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--max-minutes", type=float, default=30.0, help="stop measuring after this long (rows say so)")
    ap.add_argument(
        "--dtype",
        choices=list(DTYPE_NAMES.values()),
        default="bf16",
        help="the inputs' dtype (default bf16); files of another dtype end in _fp16 or _fp32",
    )
    ap.add_argument("--block-m", type=int, nargs="+", help="BLOCK_M values (default: the target's)")
    ap.add_argument("--block-n", type=int, nargs="+", help="BLOCK_N values (default: the target's)")
    ap.add_argument("--warps", type=int, nargs="+", help="num_warps values (default: the target's)")
    ap.add_argument("--stages", type=int, nargs="+", help="num_stages values (default: the target's)")
    ap.add_argument(
        "--configs",
        nargs="+",
        metavar="MxNwWsS",
        help="these configurations instead of the product above, e.g. 128x64w4s2 64x64w4s1",
    )
    args = ap.parse_args(argv)
    if not runtime.COMPILED:
        print("The sweep times compiled kernels and needs a CUDA GPU (the interpreter cannot time anything).")
        return 0
    target.dtype = {name: dtype for dtype, name in DTYPE_NAMES.items()}[args.dtype]
    for attribute, values in (
        ("blocks_m", args.block_m),
        ("blocks_n", args.block_n),
        ("warps", args.warps),
        ("stages", args.stages),
    ):
        if values:
            setattr(target, attribute, tuple(values))
    if args.configs:
        target.configs = [parse_config(c) for c in args.configs]
    groups = [(d, bool(c)) for d in (args.d or [64, 128]) for c in (args.causal or [0, 1])]
    start = time.perf_counter()
    path = sweep(target, groups, args.workers, args.max_minutes)
    print(f"wrote {results.shown(path)} and its heatmaps ({time.perf_counter() - start:.0f} s)")
    print(sweep_report.winners(results.read_csv(path)))
    return 0
