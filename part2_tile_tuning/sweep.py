"""Part 2's sweep: tile shapes, warp counts and pipeline depths, each measured on the GPU.

    python -m part2_tile_tuning.sweep              # D 64 and 128, causal and not, bf16, B=4, H=8, N=4096
    python -m part2_tile_tuning.sweep --d 64 --causal 0 --max-minutes 3

BLOCK_M and BLOCK_N in {16 ... 256}, num_warps in {2, 4, 8}, num_stages in {1 ... 5}. Before any
compiling, the budget arithmetic prunes what cannot work: tiles that do not fit in one program's
shared memory (smem_bytes in flash_attention.py) and float32 accumulators that alone would need
more registers than a thread has. The survivors are compiled in parallel worker processes
(compiling costs seconds per configuration; running costs milliseconds), then each one is
checked against the float64 reference and only then timed. A configuration that still fails
(out of resources, failed check) is recorded as such.

Writes results/<gpu>/part2_sweep.csv and part2_device.json, draws part2_heatmaps.png, and prints
the winners last.
"""

import argparse
import csv
import datetime
import itertools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
import triton

from common import bench, parts, runtime
from common.inputs import Shape, make_inputs

BLOCKS = (16, 32, 64, 128, 256)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4, 5)
B, H, N = 4, 8, 4096
MAX_REGS = 255  # registers one thread can address
FIELDS = [
    "D", "causal", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "smem_est", "smem_compiled", "regs_est",
    "regs", "spills", "compile_s", "first_launch_s", "status", "ms", "tflops", "B", "H", "N", "dtype", "gpu", "torch", "triton",
    "commit", "date",
]  # fmt: skip


def regs_estimate(block_m, block_n, d, num_warps):
    """float32 registers per thread for the accumulator O_i (BLOCK_M x D) and S_ij/P_ij (BLOCK_M x BLOCK_N)."""
    return block_m * (d + block_n) / (32 * num_warps)


def plan(d, causal, smem_limit):
    """Every configuration for one (D, causal), with the budget's verdict."""
    fa = parts.load(2)
    rows = []
    for bm, bn, w, s in itertools.product(BLOCKS, BLOCKS, WARPS, STAGES):
        smem = fa.smem_bytes(bm, bn, d, 2, s)
        regs = regs_estimate(bm, bn, d, w)
        status = "pruned: shared memory" if smem > smem_limit else "pruned: registers" if regs > MAX_REGS else "todo"
        rows.append(dict(D=d, causal=int(causal), BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s,
                         smem_est=smem, regs_est=f"{regs:.0f}", status=status))  # fmt: skip
    return rows


def _launch_args(q, k, v, o, lse, row):
    n_q, n_k = q.shape[-2], k.shape[-2]
    fa = parts.load(2)
    args = (q, k, v, o, lse, n_q, n_k, fa.n_bucket(n_q, n_k), row["D"] ** -0.5)
    meta = dict(D=row["D"], IS_CAUSAL=bool(row["causal"]), DOT_PRECISION="tf32", BLOCK_M=row["BLOCK_M"],
                BLOCK_N=row["BLOCK_N"], num_warps=row["num_warps"], num_stages=row["num_stages"])  # fmt: skip
    return args, meta


def compile_one(row):
    """Worker: compile one configuration into Triton's on-disk cache; report its resources."""
    from triton.runtime.errors import OutOfResources

    fa = parts.load(2)
    t = torch.empty((1, N, row["D"]), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((1, N), dtype=torch.float32, device="cuda")
    args, meta = _launch_args(t, t, t, t, lse, row)
    start = time.perf_counter()
    out = {}
    try:
        kernel = fa._attn_fwd.fn.warmup(*args, grid=(1,), **meta)
        out["compile_s"] = f"{time.perf_counter() - start:.2f}"
        out["smem_compiled"] = kernel.metadata.shared
        kernel._init_handles()  # loads the binary: raises OutOfResources when it cannot fit
        out["regs"], out["spills"] = kernel.n_regs, kernel.n_spills
        out["status"] = "compiled"
    except OutOfResources as e:
        out["status"] = f"out of resources: {str(e).splitlines()[0][:100]}"
    except Exception as e:
        out["status"] = (
            f"compile error: {type(e).__name__}: {str(e).strip().splitlines()[0][:100] if str(e).strip() else ''}"
        )
    return out


def measure(rows, d, causal, deadline):
    """Check, then time, every compiled configuration for one (D, causal) on the real inputs."""
    from triton.runtime.errors import OutOfResources

    fa = parts.load(2)
    q4, k4, v4, _ = make_inputs(Shape((B, H), N, N, d), torch.bfloat16, runtime.DEVICE, seed=d + causal)
    q, k, v = (fa._as_sequences(t) for t in (q4, k4, v4))
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    flops = bench.attention_flops(B, H, N, N, d, causal)
    best = 0.0
    todo = sorted((r for r in rows if r["status"] == "compiled"), key=lambda r: -r["BLOCK_M"] * r["BLOCK_N"])
    for i, row in enumerate(todo, 1):
        if time.time() > deadline:
            row["status"] = "not measured: time limit"
            continue
        args, meta = _launch_args(q, k, v, o, lse, row)
        grid = (triton.cdiv(N, row["BLOCK_M"]), q.shape[0])
        try:
            o.fill_(float("nan"))  # poison: an unwritten output must fail the check
            lse.fill_(float("nan"))
            launch = time.perf_counter()
            fa._attn_fwd.fn[grid](*args, **meta)  # loads the binary the workers compiled
            torch.cuda.synchronize()
            row["first_launch_s"] = f"{time.perf_counter() - launch:.2f}"
            report = bench._check_forward(o.view(q4.shape), lse.view(q4.shape[:-1]), q4, k4, v4, causal)
        except OutOfResources as e:
            row["status"] = f"out of resources: {str(e).splitlines()[0][:100]}"
            continue
        if not report.ok:
            row["status"] = f"failed check: {report}"
            continue
        ms = bench.time_ms(lambda args=args, meta=meta, grid=grid: fa._attn_fwd.fn[grid](*args, **meta), rep=30)
        row.update(status="ok", ms=f"{ms:.4f}", tflops=f"{flops / ms * 1e-9:.1f}")
        best = max(best, float(row["tflops"]))
        name = f"{row['BLOCK_M']}x{row['BLOCK_N']} w{row['num_warps']} s{row['num_stages']}"
        print(f"  [{i:>3}/{len(todo)}] D={d} causal={causal:d} {name:<16} {float(row['tflops']):7.1f} TFLOP/s"
              f"   (best so far {best:.1f})", flush=True)  # fmt: skip


def device_limits():
    """The limits the budget arithmetic needs, read off the GPU by torch and by Triton's driver."""
    props = torch.cuda.get_device_properties(0)
    names = ["name", "major", "minor", "multi_processor_count", "shared_memory_per_block",
             "shared_memory_per_block_optin", "shared_memory_per_multiprocessor", "regs_per_multiprocessor",
             "max_threads_per_multi_processor", "L2_cache_size", "total_memory", "warp_size"]  # fmt: skip
    info = {n: getattr(props, n, None) for n in names}
    info["triton"] = dict(triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device()))
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, action="append", help="head dim (repeatable; default 64 and 128)")
    ap.add_argument("--causal", type=int, action="append", help="0 or 1 (repeatable; default both)")
    ap.add_argument("--workers", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--max-minutes", type=float, default=30.0, help="stop measuring after this long (rows say so)")
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The sweep times compiled kernels and needs a CUDA GPU (the interpreter cannot time anything).")
        return 0
    deadline = time.time() + 60 * args.max_minutes
    out_dir = bench.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    limits = device_limits()
    (out_dir / "part2_device.json").write_text(json.dumps(limits, indent=2) + "\n")
    smem_limit = limits["shared_memory_per_block_optin"] or limits["triton"]["max_shared_mem"]
    print(f"sweep on {runtime.describe()}; shared memory per program {smem_limit} bytes, "
          f"{limits['multi_processor_count']} SMs", flush=True)  # fmt: skip

    groups = [(d, bool(c)) for d in (args.d or [64, 128]) for c in (args.causal or [0, 1])]
    rows = {g: plan(*g, smem_limit) for g in groups}
    todo = [r for g in groups for r in rows[g] if r["status"] == "todo"]
    pruned = sum(len(rows[g]) for g in groups) - len(todo)
    print(f"{sum(len(r) for r in rows.values())} configurations, {pruned} pruned by the budget, "
          f"{len(todo)} to compile with {args.workers} workers", flush=True)  # fmt: skip

    # Compile the most promising (largest) tiles first, so a time limit cuts the least useful ones.
    todo.sort(key=lambda r: -r["BLOCK_M"] * r["BLOCK_N"])
    start = time.perf_counter()
    compile_deadline = time.time() + 0.6 * 60 * args.max_minutes
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx)
    futures = {pool.submit(compile_one, r): r for r in todo}
    for i, fut in enumerate(as_completed(futures), 1):
        r = futures[fut]
        try:
            r.update(fut.result())
        except Exception as e:  # a worker that died (e.g. the compiler crashed)
            r["status"] = f"compile error: {type(e).__name__}"
        if i % 25 == 0 or i == len(todo):
            print(f"  compiled {i}/{len(todo)} in {time.perf_counter() - start:.0f} s", flush=True)
        if time.time() > compile_deadline:
            print("  compile time limit reached: the rest are recorded as not compiled", flush=True)
            break
    pool.shutdown(wait=False, cancel_futures=True)
    for r in todo:
        if r["status"] == "todo":
            r["status"] = "not measured: time limit"

    for g in groups:
        print(f"measuring D={g[0]} causal={g[1]:d}", flush=True)
        measure(rows[g], *g, deadline)

    meta = dict(B=B, H=H, N=N, dtype="bf16", gpu=runtime.gpu_name(), torch=torch.__version__,
                triton=runtime.TRITON_VERSION, commit=bench.commit(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))  # fmt: skip
    path = out_dir / "part2_sweep.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for g in groups:
            writer.writerows({**meta, **r} for r in rows[g])
    from common.report import draw_sweep_heatmaps, sweep_winners

    draw_sweep_heatmaps(path, out_dir / "part2_heatmaps.png")
    print(f"wrote {path} and {out_dir / 'part2_heatmaps.png'} ({time.perf_counter() - start:.0f} s)")
    print(sweep_winners(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
