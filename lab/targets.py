"""Will each part compile, and fit, on the GPUs readers have? Checked with Triton's own compiler, no GPU needed.

    python -m lab.targets              # every configuration on every target (make targets): a CSV and a table
    python -m lab.targets --quick      # CI: the smallest configuration of each kernel, D and target,
                                          #     bf16, causal (the one that must fit), in minutes

Every Triton part's kernels are compiled for sm_80 (A100), sm_86 (RTX 30), sm_89 (RTX 40), sm_90
(H100, H200), sm_100 (B200) and sm_120 (RTX 50), as a real call launches them: each part's
flash_forward and flash_backward run on small CPU tensors with Triton's launch replaced by a recorder,
which keeps the arguments, the constexprs and the configurations the part's pruning hands
launch.fitting. Each recorded launch is then compiled with the specialisation a launch gets
(16-byte-aligned pointers carry tt.divisibility = 16, which is what lets the compiler vectorise and
pipeline the loads), and the binary's shared memory (metadata.shared, the compiler's own figure for
that architecture) is compared with the target's: on that GPU, launch.fitting keeps the ones that
fit. Part 5's Gluon kernels are compiled for sm_90, the only target they are written for.

It fails, naming part, kernel, input class, configuration, target and bytes, when an input class
keeps no configuration that fits a target, or a kernel does not compile. Nothing is launched: no
GPU, no driver.
"""

import argparse
import contextlib
import multiprocessing
import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

if __name__ == "__main__":  # compile for real, even without a GPU: set before anything imports triton
    os.environ["TRITON_INTERPRET"] = "0"
import torch  # noqa: E402

from common import PROVENANCE, ROOT, launch, parts, triton_tools  # noqa: E402
from lab import results

KB = 1024
TARGETS = {  # name: (compute capability, shared memory one program may use (opt-in), the GPUs)
    "sm_80": (80, 163 * KB, "A100"),
    "sm_86": (86, 99 * KB, "RTX 3090, A6000"),
    "sm_89": (89, 99 * KB, "RTX 4090, RTX 4070, L40S"),
    "sm_90": (90, 227 * KB, "H100, H200"),
    "sm_100": (100, 227 * KB, "B200"),
    "sm_120": (120, 99 * KB, "RTX 5090, RTX 5080"),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEAD_DIMS = (64, 128)
N = 200  # a length that is no multiple of a tile; the configurations do not depend on it
CSV = ROOT / "results" / "targets.csv"  # one file for every GPU: nothing here runs on one
FIELDS = ["part", "kernel", "dtype", "D", "causal", "target", "config", "kept", "shared", "limit", "fits", "status"]


@contextlib.contextmanager
def recording(launches):
    """Triton's launch path replaced: each launch appends (jit function, bound arguments, constexprs,
    configurations or None) to `launches` and runs nothing. For an autotuned kernel the configurations
    are those its pruning hands launch.fitting, which decides per GPU by compiling them.
    3.6 to 3.9: a launch is JITFunction.run(*args, grid=..., **kwargs) or Autotuner.run(*args, **kwargs),
    and Autotuner.prune_configs(kwargs) applies early_config_prune to self.configs with self.nargs."""
    from triton.runtime import Autotuner, JITFunction

    def jit_run(self, *args, grid=None, warmup=False, **kwargs):
        if not warmup:
            launches.append((self, dict(zip(self.arg_names, args)), kwargs, None))
        return types.SimpleNamespace(run=None, function=None, packed_metadata=None)  # what a fast path keeps

    def tuned_run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        kept = self.prune_configs(kwargs)
        launches.append((self.fn, self.nargs, kwargs, kept))
        self.best_config = kept[0]
        return types.SimpleNamespace(run=None, function=None, packed_metadata=None)

    saved = JITFunction.run, Autotuner.run, JITFunction.warmup, Autotuner.warmup, triton_tools.direct_launcher
    fitting = launch.fitting
    launch.fitting = lambda kernel, configs, *_: configs  # what the compiler says per target comes after
    JITFunction.run, Autotuner.run = jit_run, tuned_run
    JITFunction.warmup = Autotuner.warmup = lambda *a, **k: None  # compiling ahead: nothing to compile here
    triton_tools.direct_launcher = lambda *a, **k: lambda *a, **k: None  # a fast path keeps a launcher: a no-op
    try:
        yield launches
    finally:
        JITFunction.run, Autotuner.run, JITFunction.warmup, Autotuner.warmup, triton_tools.direct_launcher = saved
        launch.fitting = fitting


def calls(module, dtypes=tuple(DTYPES), dims=HEAD_DIMS, causals=(False, True)):
    """[(kernel name, dtype, D, causal, jit function, arguments, constexprs, kept)] for every kernel a
    part's module launches in a forward and a backward, for each input class."""
    found = []
    for dtype_name in dtypes:
        for d in dims:
            for causal in causals:
                g = torch.Generator().manual_seed(0)
                q, k, v = (torch.randn(1, 2, N, d, generator=g).to(DTYPES[dtype_name]) for _ in range(3))
                launches = []
                with recording(launches):
                    o, lse = module.flash_forward(q, k, v, causal)
                    if not parts.pytorch_backward(module):
                        module.flash_backward(q, k, v, o.normal_(), lse.zero_(), torch.randn_like(q), causal)
                for fn, args, constexprs, kept in launches:
                    found.append((fn.__name__, dtype_name, d, causal, fn, args, constexprs, kept))
    return found


def signature(fn, args, constexprs):
    """(signature, constexprs, attrs) of a launch as Triton specialises it: tensors as typed pointers,
    16-byte-aligned ones divisible by 16; integers as i32 (i64 when large), divisible by 16 when they
    are and the kernel does not say do_not_specialize; floats as fp32.
    3.6 to 3.9: ASTSource(fn, signature, constexprs, attrs), attrs {(index,): [["tt.divisibility", 16]]}."""
    types_of = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32"}
    dont = {fn.arg_names[i] if isinstance(i, int) else i for i in getattr(fn, "do_not_specialize", ())}
    sig, attrs, const = {}, {}, dict(constexprs)
    for i, name in enumerate(fn.arg_names):
        if i in fn.constexprs:
            sig[name] = "constexpr"
            continue
        value = args[name]
        if isinstance(value, torch.Tensor):
            sig[name] = types_of[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i64" if abs(value) >= 2**31 else "i32"
            if name not in dont and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return sig, {name: const[name] for name in sig if sig[name] == "constexpr"}, attrs


_TODO = []  # the compile jobs, which the worker processes inherit (a jit function does not pickle)


def compile_one(index):
    """Compile job _TODO[index]; returns (shared memory in bytes, "") or (None, why it failed)."""
    fn, sig, const, attrs, options, capability, gluon = _TODO[index][1]
    try:
        kernel = triton_tools.compile_for(fn, sig, const, capability, options, attrs, gluon)
    except Exception as e:  # noqa: BLE001  (the compiler refused: its last line says why)
        lines = [line for line in str(e).splitlines() if line.strip()]
        return None, f"compile error: {lines[-1][:150] if lines else type(e).__name__}"
    return kernel.metadata.shared, ""


def label(config):
    if config is None:
        return "fixed"
    blocks = "x".join(str(v) for k, v in sorted(config.kwargs.items()) if k.startswith("BLOCK"))
    return f"{blocks} w{config.num_warps} s{config.num_stages}"


def jobs(n, module, quick, targets=tuple(TARGETS), **classes):
    """(row without its result, compile job) for every compile of the check of part n (its module)."""
    out = []
    for kernel, dtype, d, causal, fn, args, constexprs, kept in calls(module, **classes):
        for target in targets:
            capability, limit, _ = TARGETS[target]
            configs = [None] if kept is None else kept
            if quick and kept is not None:  # the smallest: the one that must fit, if any is to
                configs = [min(configs, key=_estimate)]
            for config in configs:
                meta = dict(constexprs, **(config.kwargs if config else {}))
                options = dict(num_warps=meta.pop("num_warps", 4), num_stages=meta.pop("num_stages", 3))
                if config is not None:
                    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
                sig, const, attrs = signature(fn, args, meta)
                row = dict(part=n, kernel=kernel, dtype=dtype, D=d, causal=int(causal), target=target)
                row.update(config=label(config), kept=len(configs) if kept is not None else 1, limit=limit)
                out.append((row, (fn, sig, const, attrs, options, capability, False)))
    return out


def _estimate(config):
    """What a configuration's tiles weigh, to pick the smallest: rows of the tiles times stages."""
    return sum(v for k, v in config.kwargs.items() if k.startswith("BLOCK")) * config.num_stages


def gluon_jobs(n):
    """Part n's Gluon kernels (the modules it routes to that define constexprs()), for sm_90 only."""
    module, out = parts.load(n), []
    for sub in vars(module).values():
        if not (isinstance(sub, types.ModuleType) and hasattr(sub, "constexprs") and hasattr(sub, "supported")):
            continue
        fn = next(v for k, v in vars(sub).items() if k.endswith("_gluon") and hasattr(v, "arg_names"))
        for dtype in ("bf16", "fp16"):
            for d in HEAD_DIMS:
                for causal in (False, True):
                    const = sub.constexprs(d, causal)
                    sig = {a: "constexpr" if a in const else _gluon_type(a, dtype) for a in fn.arg_names}
                    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a][0] == "*"}
                    row = dict(part=n, kernel=fn.__name__, dtype=dtype, D=d, causal=int(causal), target="sm_90")
                    row.update(config="fixed", kept=1, limit=TARGETS["sm_90"][1])
                    out.append((row, (fn, sig, const, attrs, dict(num_warps=4), 90, True)))
    return out


def _gluon_type(name, dtype):
    """The Gluon kernels' parameters by name: tensors of the input dtype, float32 statistics and dQ."""
    if name in ("Q", "K", "V", "O", "DO", "DK", "DV"):
        return f"*{dtype}"
    if name in ("L", "L2", "DELTA", "DQ"):
        return "*fp32"
    return "fp32" if name == "scale" else "i32"


def check(rows):
    """The problems in checked rows, one line each; empty when every part has a configuration that fits
    every target for every input class (the pruning drops the others there) and every kernel compiles."""
    problems, fit = [], {}
    for r in rows:
        group = (r["part"], r["kernel"], r["dtype"], r["D"], r["causal"], r["target"])
        fit[group] = fit.get(group, False) or bool(r["fits"])
    for r in rows:
        where = f"part {r['part']} {r['kernel']} ({r['dtype']}, D={r['D']}, causal={r['causal']}) {r['config']}"
        if r["status"]:
            problems.append(f"{where} on {r['target']}: {r['status']}")
        elif not fit[(r["part"], r["kernel"], r["dtype"], r["D"], r["causal"], r["target"])]:
            problems.append(f"{where} on {r['target']}: {r['shared']} bytes of shared memory, {r['limit']} there")
    return problems


QUICK = dict(dtypes=("bf16",), causals=(True,))  # fp16 compiles to the same sizes; float32 tiles are small


def run(numbers, quick=False, workers=None):
    """Every compile of the check of parts `numbers`, on every target: the CSV's rows."""
    todo = [job for n in numbers for job in jobs(n, parts.load(n), quick, **(QUICK if quick else {}))]
    todo += [
        job for n in numbers for job in gluon_jobs(n) if not quick or (job[0]["causal"] and job[0]["dtype"] == "bf16")
    ]
    return compile_all(todo, workers)


def compile_all(todo, workers=None):
    """The rows of (row, job) pairs, each distinct job compiled once (part 5 launches part 4's Triton
    kernels unchanged), in a pool of processes."""
    keys = [_key(job) for _, job in todo]
    first = {key: i for i, key in reversed(list(enumerate(keys)))}
    _TODO[:] = todo
    with ProcessPoolExecutor(workers or os.cpu_count(), mp_context=multiprocessing.get_context("fork")) as pool:
        done = dict(zip(sorted(set(first.values())), pool.map(compile_one, sorted(set(first.values())), chunksize=2)))
    rows = []
    for (row, _), key in zip(todo, keys):
        shared, status = done[first[key]]
        rows.append(dict(row, shared=shared, fits=int(shared is not None and shared <= row["limit"]), status=status))
    return rows


def _key(job):
    """What decides a compile's result: the function's source (and what it calls), the specialisation, the target."""
    fn, sig, const, attrs, options, capability, _ = job
    return (
        fn.cache_key,
        repr(sorted(sig.items())),
        repr(sorted(const.items())),
        repr(sorted(attrs.items())),
        repr(sorted(options.items())),
        capability,
    )


def table(gpu_dir=None):
    """Which part runs which kernels on which GPU, with what shared memory: from results/targets.csv."""
    rows = results.read_csv(CSV)
    head = [f"{TARGETS[t][2].split(',')[0]} ({t}, {TARGETS[t][1] // KB} KB)" for t in TARGETS]
    body = []
    for part, kernel in dict.fromkeys((r["part"], r["kernel"]) for r in rows):
        if part == 5 and not kernel.endswith("_gluon"):
            continue  # part 4's kernels with grouped heads added: their rows are in the CSV
        cells = []
        for target in TARGETS:
            mine = [r for r in rows if (r["part"], r["kernel"], r["target"]) == (part, kernel, target)]
            sizes = sorted(-(-r["shared"] // KB) for r in mine if r["fits"])
            span = "" if not sizes else f"{sizes[0]} KB" if sizes[0] == sizes[-1] else f"{sizes[0]}-{sizes[-1]} KB"
            dropped = len(mine) - len(sizes)
            cells.append("—" if not mine else span + (f" (-{dropped})" if dropped else ""))
        body.append([part, f"`{kernel}`", *cells])
    caption = (
        "Shared memory the compiler allocates for one program, over the configurations each part's pruning keeps "
        "on that GPU (those that fit; (-n): n more that it drops there), for bf16, fp16 and float32, "
        "D = 64 and 128, causal or not; — where a kernel is not built "
        "(part 5's Gluon kernels are written for sm_90; elsewhere part 5 runs part 4's Triton kernels with "
        "grouped heads added). Compiled, not run: none of these GPUs but the H200 timed anything here."
    )
    return results.table_block(rows, "make targets && make report", caption, ["part", "kernel", *head], body)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="a Triton part (default: every one)")
    ap.add_argument("--quick", action="store_true", help="only what bounds the rest (CI)")
    ap.add_argument("--csv", help=f"write the rows here (default without --bound: {results.RESULTS}/targets.csv)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said (it warns otherwise)
    if os.environ.get("TRITON_INTERPRET") != "0":
        raise SystemExit("lab.targets compiles for real: run it as `python -m lab.targets` (TRITON_INTERPRET=0)")
    numbers = args.part or [n for n in parts.available() if parts.uses_triton(n)]
    rows = run(numbers, args.quick)
    path = args.csv or (None if args.quick else CSV)
    if path:
        meta = dict(results.provenance(), gpu="none (compiled only)")
        results.write_csv(Path(path), [dict(r, **meta) for r in rows], FIELDS + list(PROVENANCE))
    problems = check(rows)
    print(f"{len(rows)} compiles, parts {numbers}, targets {', '.join(TARGETS)}: {len(problems)} problems")
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
