"""Candidate changes to part 4's forward and backward (the `tl` kernels part 5 keeps), each checked and
timed against part 4, and each compiled for the H200 to see what Triton's compiler made of it.

    python -m part5_profiling.tools.candidates              # GPU: results/<gpu>/part5_candidates.csv
    python -m part5_profiling.tools.candidates --backward   # GPU: results/<gpu>/part5_bwd_candidates.csv
    TRITON_INTERPRET=0 python -m part5_profiling.tools.candidates --compile   # any machine: part5_compiled.csv

A candidate is part 5's flash_attention.py with one patch of tools/variants/ applied (CANDIDATES,
common/steps.py's variant()) and its Gluon kernels switched off, so that the patched `tl` kernel
runs. Every candidate must compute the same attention: each is checked against the float64
reference on the inputs it is timed on before it is timed. Shapes: B=4, H=8, D 64 and 128, causal
and not, N = 4096 and 16384, bf16; CUDA-graph replay, median; each candidate autotuned for itself.
The backward's candidates are timed on flash_backward alone, from the forward's O and L.

--compile compiles each forward candidate for sm_90 at every configuration its autotuner could
pick, with Triton's compiler and ptxas on the CPU, and reads off the binary whether it compiled,
whether Triton split the warps (warp specialisation), registers, stack and shared memory.
"""

import functools
import os
import sys

from common import parts, runtime, steps, triton_tools
from lab import compiler, results, study
from lab.bench import each_shape
from lab.timing import attention_flops

B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (4096, 16384)
# name -> its patch in tools/variants/ (None: part 4's kernel, as part 5 ships it)
CANDIDATES = {
    "part 4": None,
    "warp-specialized key loop": "ws_loop",
    "grouped causal order": "grouped_order",
    "one warp-specialized loop": "one_ws_loop",
    "warp-specialized whole tiles": "ws_whole_tiles",
    "Q K^T issued one tile ahead": "qk_ahead",
}
BWD_CANDIDATES = {"part 4": None, "dQ by TMA reduce-add": "dq_by_tma"}  # its patch adds atomic_dq, on by default
FIELDS = ["candidate", *results.SHAPE_FIELDS, "graph_ms", "graph_tflops", "speedup", "config", "repeatable", "check"]
FIELDS += results.PROVENANCE
KEY = ("candidate", "N", "D", "causal")  # a run of some candidates keeps the others' rows


@functools.cache
def load(variant):
    """Part 5's kernel file with the patch `variant` applied (None: as shipped), its Gluon kernels
    off, so its flash_forward and flash_backward run the `tl` kernels of part 4 (patched)."""
    source = parts.path(5).read_text() if variant is None else steps.variant(5, variant)
    module = parts.load_source(f"part5_variant_{variant or 'part4'}", source)
    module.GLUON = False
    return module


def _speedups(rows):
    base = {(r["D"], r["causal"], r["N"]): float(r["graph_ms"]) for r in rows if r["candidate"] == "part 4"}
    for r in rows:
        if r.get("graph_ms") and (r["D"], r["causal"], r["N"]) in base:
            r["speedup"] = f"{base[(r['D'], r['causal'], r['N'])] / float(r['graph_ms']):.3f}"
    return rows


def run(seq_lens, names=None, save=None):
    """Check and time part 4 and the named candidates (default: every one) at each N."""
    names = ["part 4", *(n for n in names or CANDIDATES if n in CANDIDATES and n != "part 4")]
    modules = {name: load(CANDIDATES[name]) for name in names}
    rows = study.time_forwards(
        {name: m.flash_forward for name, m in modules.items()},
        lambda name, causal: dict(candidate=name),
        seq_lens,
        do_bench=False,
        save=save,
        config=lambda name: parts.forward_config(modules[name]),
    )
    return _speedups(rows)


def run_backward(seq_lens, names=None, save=None):
    """Check and time part 4's backward and the named backward candidates (study.backward_row)."""
    names = ["part 4", *(n for n in names or BWD_CANDIDATES if n in BWD_CANDIDATES and n != "part 4")]
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, HEAD_DIMS, b=B, h=H):
        flops = attention_flops(B, H, n, n, d, causal, "bwd")
        o, lse = load(None).flash_forward(q, k, v, causal)
        for name in names:
            module = load(BWD_CANDIDATES[name])
            row = dict(candidate=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                call = functools.partial(module.flash_backward, q, k, v, o, lse, do, causal)
                row.update(study.backward_row(call, o, lse, q, k, v, do, causal, flops))
                row["config"] = triton_tools.chosen_label(module._attn_bwd_dkdv)
            except Exception as e:  # a variant the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            rows.append(row)
            print(f"{name:<24} D={d:<3} causal={causal:d} N={n:>5}  {row.get('graph_tflops') or '-':>7} TFLOP/s  "
                  f"{row.get('config', '')}  repeatable={row.get('repeatable', '-')}  {row['check'][:40]}", flush=True)  # fmt: skip
        if save is not None:
            save(_speedups(rows))
    return _speedups(rows)


# ------------------------------------------------------------------------------------ --compile
COMPILED_FIELDS = ["candidate", "D", "causal", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "status"]
COMPILED_FIELDS += ["warp_specialized", "warps_launched", "registers", "stack_bytes", "smem_bytes", "arch"]
COMPILED_KEY = ("candidate", "D", "causal", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
TYPES = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "L": "*fp32", "scale": "fp32"}  # the rest: i32


def compile_forward(module, d, causal, config):
    """One row: the module's _attn_fwd compiled for sm_90 at this D, mask and configuration (the
    whole-tiles candidate as a non-causal call of whole tiles runs it: the benchmark's shapes)."""
    fn = triton_tools.jit_function(module._attn_fwd)
    names = {fn.arg_names[i] for i in fn.constexprs}
    values = dict(D=d, IS_CAUSAL=causal, DOT_PRECISION="tf32", WHOLE_TILES=not causal, **config.kwargs)
    signature = {n: "constexpr" if n in names else TYPES.get(n, "i32") for n in fn.arg_names}
    row = dict(D=d, causal=int(causal), **config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
    row["arch"] = "sm_90"
    try:
        options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
        kernel = triton_tools.compile_for(fn, signature, {n: values[n] for n in names}, 90, options)
    except Exception as e:  # the compiler refuses: its last line says why
        lines = [line for line in str(e).splitlines() if line.strip()]
        return dict(row, status=f"error: {lines[-1][:120] if lines else type(e).__name__}")
    registers, stack = compiler.binary_resources(kernel.asm["cubin"])
    specialized = int("ttg.warp_specialize(" in kernel.asm["ttgir"])
    return dict(row, status="ok", warp_specialized=specialized, warps_launched=kernel.metadata.num_warps,
                registers=registers, stack_bytes=stack, smem_bytes=kernel.metadata.shared)  # fmt: skip


def run_compile(names, save=None):
    meta, rows = results.provenance(), []
    for name in names:
        module = load(CANDIDATES[name])
        for d in HEAD_DIMS:
            for causal in (False, True):
                tuned = [c for c in module.CONFIGS if all(c is not f for f in module.FLOAT32.values())]
                for config in tuned:  # every one fits the H200 (a compile that does not says so in its status)
                    rows.append(dict(compile_forward(module, d, causal, config), candidate=name, **meta))
                    r = rows[-1]
                    print(f"{name:<30} D={d:<3} causal={causal:d} {triton_tools.config_label(config)}  {r['status'][:60]:<8} "
                          f"ws={r.get('warp_specialized', '-')} regs={r.get('registers', '-')} stack={r.get('stack_bytes', '-')}", flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    extra = [
        (("--candidate",), dict(action="append", choices=[*CANDIDATES, *BWD_CANDIDATES], help="this one (repeatable)")),
        (("--backward",), dict(action="store_true", help="the backward's candidates: part5_bwd_candidates.csv")),
        (("--compile",), dict(action="store_true", help="compile for sm_90 (any machine): part5_compiled.csv")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, extra=extra)
    if args.compile:
        if runtime.INTERPRET:
            print("Triton's interpreter is on, which compiles nothing: run with TRITON_INTERPRET=0.")
            return 2
        # sm_90 is the H200's architecture, whichever machine compiles: its results folder by default
        os.environ["RESULTS_DIR"] = str(os.environ.get("RESULTS_DIR") or results.results_dir("h200"))
        names = args.candidate or list(CANDIDATES)
        broken = lambda r: r["candidate"] == "part 4" and r["status"] != "ok"  # noqa: E731  (a candidate may fail)
        measure = lambda save: run_compile(names, save)  # noqa: E731
        return results.write_as_measured("part5_compiled.csv", COMPILED_FIELDS, measure, broken, key=COMPILED_KEY)
    if not study.on_gpu("The candidates are timed (on a CPU the tests check that each computes attention)"):
        return 0
    if args.backward:
        measure = lambda save: run_backward(args.n, args.candidate, save)  # noqa: E731
        return results.write_as_measured("part5_bwd_candidates.csv", FIELDS, measure, key=KEY)
    return results.write_as_measured(
        "part5_candidates.csv", FIELDS, lambda save: run(args.n, args.candidate, save), key=KEY
    )


if __name__ == "__main__":
    sys.exit(main())
