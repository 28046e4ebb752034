"""What the compiler makes of part 4's forward and of each candidate, on any machine, GPU or not.

    TRITON_INTERPRET=0 python -m part5_profiling.tools.compiled    # results/h200/part5_compiled.csv
    TRITON_INTERPRET=0 python -m part5_profiling.tools.compiled --backward   # part5_compiled_bwd.csv

Triton's compiler and the ptxas it ships run on the CPU: this compiles each candidate's forward
(candidates.py: forward_variants.py with its CANDIDATE switch) for sm_90, the H200's architecture, at every configuration its autotuner could
pick (those that fit in shared memory), and reads off the binary what a profiler would need the GPU
for: whether it compiled, whether Triton split the warps into a producer and consumers (warp
specialization), how many warps it launches, registers per thread, bytes spilled to the stack, and
shared memory. The numbers depend on the Triton version (the CSV says which); the H200 runs 3.6.

With --backward: part 5's Gluon backward (gluon_backward._attn_bwd_gluon) at each D and mask, with
the shared-memory addresses of K, V and dS^T worked out in the loop (part 5's) and hoisted out of
it (ADDRESSES_IN_LOOP=False, what the compiler does by itself): its registers and the stack its
spills take.

TRITON_INTERPRET=0 is needed on a machine without a GPU, where the project otherwise switches on
Triton's interpreter (which compiles nothing).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from common import results, runtime, triton_tools

ARCH = 90  # sm_90: Hopper, the H200
HEAD_DIMS = (64, 128)
TYPES = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "L": "*fp32", "scale": "fp32"}  # the rest: i32
FIELDS = [
    "candidate",
    "D",
    "causal",
    "BLOCK_M",
    "BLOCK_N",
    "num_warps",
    "num_stages",
    "status",
    "warp_specialized",
    "warps_launched",
    "registers",
    "stack_bytes",
    "smem_bytes",
    "arch",
    *results.PROVENANCE,
]
KEY = ("candidate", "D", "causal", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
BWD_FIELDS = ["kernel", "D", "causal", "addresses", "status", "registers", "stack_bytes", "smem_bytes", "arch"]
BWD_FIELDS += results.PROVENANCE
BWD_KEY = ("kernel", "D", "causal", "addresses")
BWD_TYPES = {**dict.fromkeys(("Q", "K", "V", "DO", "DK", "DV"), "*bf16"), "DQ": "*fp32", "L2": "*fp32"}
BWD_TYPES.update(DELTA="*fp32", scale="fp32")  # the rest: i32
ADDRESSES = {"in the loop": True, "hoisted": False}  # the addresses column -> ADDRESSES_IN_LOOP


def resources(cubin):
    """Registers per thread and stack bytes of a compiled kernel, read with the cuobjdump Triton ships."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {out[-200:]!r}")
    return int(found[1]), int(found[2])


def compile_forward(candidate, d, causal, config):
    """One row: forward_variants' _attn_fwd with this CANDIDATE compiled for sm_90 at this D, mask and
    configuration (WS_WHOLE_TILES runs a non-causal call of whole tiles: the benchmark's shapes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from part5_profiling.tools import forward_variants as fv

    fn = triton_tools.jit_function(fv._attn_fwd)
    names = fn.arg_names
    constexpr_names = {names[i] for i in fn.constexprs}
    whole = candidate == fv.WS_WHOLE_TILES and not causal
    values = dict(
        D=d,
        IS_CAUSAL=causal,
        DOT_PRECISION="tf32",
        STAGE=fv.ORIGINAL,
        CANDIDATE=candidate,
        WHOLE_TILES=whole,
        **config.kwargs,
    )
    signature = {n: "constexpr" if n in constexpr_names else TYPES.get(n, "i32") for n in names}
    constexprs = {n: values[n] for n in names if n in constexpr_names}
    row = dict(
        D=d,
        causal=int(causal),
        **config.kwargs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        arch=f"sm_{ARCH}",
    )
    try:
        kernel = triton.compile(
            ASTSource(fn=fn, signature=signature, constexprs=constexprs),
            target=GPUTarget("cuda", ARCH, 32),
            options=dict(num_warps=config.num_warps, num_stages=config.num_stages),
        )
    except Exception as e:  # the compiler refuses: its last line says why
        lines = [line for line in str(e).splitlines() if line.strip()]
        return dict(row, status=f"error: {lines[-1][:120] if lines else type(e).__name__}")
    registers, stack = resources(kernel.asm["cubin"])
    return dict(
        row,
        status="ok",
        warp_specialized=int("ttg.warp_specialize(" in kernel.asm["ttgir"]),
        warps_launched=kernel.metadata.num_warps,
        registers=registers,
        stack_bytes=stack,
        smem_bytes=kernel.metadata.shared,
    )


def gluon_backward_kernel(d, causal, order=None, addresses_in_loop=True):
    """Part 5's Gluon backward (gluon_backward._attn_bwd_gluon) compiled for sm_90 at this D and mask,
    its programs in `order` (part 5's by default), its operand addresses in the loop or hoisted."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from part5_profiling import gluon_backward as gb

    fn = gb._attn_bwd_gluon
    constexprs = gb.constexprs(d, causal, order=order, addresses_in_loop=addresses_in_loop)
    signature = {n: "constexpr" if n in constexprs else BWD_TYPES.get(n, "i32") for n in fn.arg_names}
    source = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", ARCH, 32), options=dict(num_warps=4))


def compile_gluon_backward(d, causal, addresses_in_loop):
    """One row: gluon_backward_kernel's registers, stack and shared memory, or why it did not compile."""
    row = dict(kernel="_attn_bwd_gluon", D=d, causal=int(causal), arch=f"sm_{ARCH}")
    try:
        kernel = gluon_backward_kernel(d, causal, addresses_in_loop=addresses_in_loop)
    except Exception as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        return dict(row, status=f"error: {lines[-1][:120] if lines else type(e).__name__}")
    registers, stack = resources(kernel.asm["cubin"])
    return dict(row, status="ok", registers=registers, stack_bytes=stack, smem_bytes=kernel.metadata.shared)


def run_backward(save=None):
    meta, rows = results.provenance(), []
    for d in HEAD_DIMS:
        for causal in (False, True):
            for name, in_loop in ADDRESSES.items():
                row = dict(compile_gluon_backward(d, causal, in_loop), addresses=name, **meta)
                rows.append(row)
                print(
                    f"_attn_bwd_gluon D={d:<3} causal={causal:d} addresses {name:<12} {row['status'][:60]:<8} "
                    f"regs={row.get('registers', '-')} stack={row.get('stack_bytes', '-')}",
                    flush=True,
                )
                if save is not None:
                    save(rows)
    return rows


def run(names, save=None):
    from part5_profiling.tools import forward_variants as fv

    meta, rows = results.provenance(), []
    for name in names:
        candidate = fv.CANDIDATES[name]
        for d in HEAD_DIMS:
            for causal in (False, True):
                bf16 = dict(Q=torch.empty(0, dtype=torch.bfloat16))
                for config in fv.fits_in_smem(fv.configs(candidate), bf16, D=d):  # the autotuner's own pruning
                    row = dict(compile_forward(candidate, d, causal, config), candidate=name, **meta)
                    rows.append(row)
                    print(
                        f"{name:<30} D={d:<3} causal={causal:d} {triton_tools.config_label(config)}  "
                        f"{row['status'][:60]:<8} ws={row.get('warp_specialized', '-')} "
                        f"warps={row.get('warps_launched', '-')} regs={row.get('registers', '-')} "
                        f"stack={row.get('stack_bytes', '-')}",
                        flush=True,
                    )
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    from part5_profiling.tools import forward_variants as fv

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--candidate",
        action="append",
        choices=list(fv.CANDIDATES),
        help="compile this candidate (repeatable); default: all",
    )
    ap.add_argument("--backward", action="store_true", help="part 5's Gluon backward: part5_compiled_bwd.csv")
    ap.add_argument("--out", help="folder for the CSV (default: $RESULTS_DIR, else results/h200)")
    args = ap.parse_args(argv)
    if runtime.INTERPRET:
        print("Triton's interpreter is on, which compiles nothing: run with TRITON_INTERPRET=0.")
        return 2
    # sm_90 is the H200's architecture, whichever machine compiles: its results folder by default.
    os.environ["RESULTS_DIR"] = str(args.out or os.environ.get("RESULTS_DIR") or results.results_dir("h200"))
    if args.backward:
        broken = lambda r: r["status"] != "ok"  # noqa: E731
        return results.write_as_measured("part5_compiled_bwd.csv", BWD_FIELDS, run_backward, broken, key=BWD_KEY)
    names = args.candidate or list(fv.CANDIDATES)
    broken = lambda r: r["candidate"] == "part 4" and r["status"] != "ok"  # noqa: E731  (a candidate may fail: a finding)
    return results.write_as_measured("part5_compiled.csv", FIELDS, lambda save: run(names, save), broken, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
