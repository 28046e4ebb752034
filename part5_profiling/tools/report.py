"""Part 5's tables and figures: the ladder, the profile, the studies behind each choice, the roofline.
`make report` fills the README and results-log blocks named in TABLES and calls draw().
"""

import re
import statistics

from common import parts, steps
from lab import results, sweep_report
from lab.report import PANELS, per_shape, yes_no
from lab.results import markdown_table, provenance_line, read_csv, study_line, table_block
from part5_profiling.tools import roofline


def _table(rows, command, caption, header, body, align=None):
    return table_block(rows, f"{command} && make report", caption, header, body, align)


def _shape(d, c):
    return f"D = {d}{' causal' if c else ''}"


def _by_shape(rows, name_column, cell, first=()):
    """(names, body): one row per (D, causal, N), one column per name (`first` leading), cell(row)."""
    names = list(dict.fromkeys(r[name_column] for r in rows))
    names = [n for n in first if n in names] + [n for n in names if n not in first]
    index = {(r[name_column], r["D"], r["causal"], r["N"]): r for r in rows}

    def cells(d, c, n):
        found = [index.get((name, d, c, n)) for name in names]
        return ["—" if x is None else cell(x) for x in found] if any(found) else None

    return names, per_shape(sorted({r["N"] for r in rows}), cells)


def _timed(row, ratio="speedup"):
    """TFLOP/s (the ratio in brackets), a wrong answer's failing outputs, or why there is no time."""
    if row["graph_tflops"] is None and row["check"].startswith("FAIL"):  # computed a wrong answer: not timed
        return "wrong " + ", ".join(re.findall(r"(\w+) \S+ FAIL", row["check"]))
    if row["graph_tflops"] is None:
        return row["check"].split(":")[0]  # "error": the CSV says why
    return f"{row['graph_tflops']:.0f}" + (f" ({row[ratio]:.2f}x)" if row.get(ratio) is not None else "")


# ------------------------------------------------------------------------------------ the ladder
LADDER = "python -m part5_profiling.tools.ladder"
LADDER_SHAPES = [(64, 0), (128, 1)]  # the lesson's table (and the shapes the ladder is compiled at)
# steps whose change is at other shapes (D = 64 only): their lines show those
STEP_SHAPES = dict.fromkeys(("fwd8", "fwd9", "model5"), [(64, 0), (64, 1)])
STEP_NAMES = [step.name for ladder in steps.ladders(parts.folder(5)).values() for step in ladder]  # fwd1 ... model7
NAMES = {"part4": "part 4's `tl` kernels", "sdpa_cudnn": "SDPA cuDNN"}


def ladder_dir(gpu_dir):
    """Where the ladder's run wrote part5_ladder.csv: gpu_dir, or failing that the results folder of
    the other GPU that ran it (its tables and lines name that GPU)."""
    if (gpu_dir / "part5_ladder.csv").exists():
        return gpu_dir
    found = sorted(p.parent for p in gpu_dir.parent.glob("*/part5_ladder.csv"))
    return found[0] if found else gpu_dir


def _gpu(rows):
    """The GPU of a run's rows, short: "H100"."""
    name = next((r.get("gpu") for r in rows if r.get("gpu")), "") or ""
    return re.sub(r"^NVIDIA |\s.*GB.*$", "", name)


def _ladder(gpu_dir):
    rows = read_csv(ladder_dir(gpu_dir) / "part5_ladder.csv")
    return rows, {(r["step"], r["mode"], r["D"], r["causal"]): r for r in rows if r["mode"]}


def _steps(rows, ladder):
    return list(dict.fromkeys(r["step"] for r in rows if re.fullmatch(ladder + r"\d+", r["step"])))


def _ladder_cell(row):
    if row is None or not row.get("graph_tflops"):
        return "-" if row is None else (row.get("check") or "-").split(":")[0]
    return f"{row['graph_tflops']:.0f}" + (f" ({row['vs_cudnn']:.2f})" if row.get("vs_cudnn") else "")


def _part4_counters(gpu_dir):
    """{(pass, D, causal): (tensor pipe %, top stall)} of part 4's main kernels (part5_profile.csv)."""
    kernels, found = {"fwd": "_attn_fwd", "bwd": "_attn_bwd_dkdv"}, {}
    if not (gpu_dir / "part5_profile.csv").exists():  # a GPU that ran the ladder but not the profile
        return found
    for r in read_csv(gpu_dir / "part5_profile.csv"):
        if r["target"] == "part4" and r["method"] == "ncu" and r["kernel"] == kernels.get(r["pass"]):
            pipe, stall = found.get((r["pass"], r["D"], r["causal"]), (None, None))
            if r["metric"] == "tensor pipe (mma) active, %":
                pipe = r["value"]
            elif str(r["metric"]).startswith("stall #1: "):
                stall = f"{r['metric'].removeprefix('stall #1: ')} {r['value']:.1f}"
            found[(r["pass"], r["D"], r["causal"])] = (pipe, stall)
    return found


def _compiled(gpu_dir):
    """{(step, kernel, D, causal): the binary's counted facts and its PTX fingerprint, without the step's
    name} (the ladder compiled for sm_90: part5_ladder_compiled.csv)."""
    path = gpu_dir.parent / "h200" / "part5_ladder_compiled.csv"  # sm_90, whichever machine compiled it
    skip = {"step", "kernel", "D", "causal", "gpu", "torch", "triton", "commit", "date"}
    return {
        (r["step"], r["kernel"], r["D"], int(r["causal"] == "True")): {k: v for k, v in r.items() if k not in skip}
        for r in (read_csv(path) if path.exists() else [])
    }


HOPPER_SM = dict(
    regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472, max_threads_per_multi_processor=2048
)


def programs_per_sm(facts):
    """How many programs of a compiled step (part5_ladder_compiled.csv's row) one Hopper SM holds at once."""
    row = dict(num_warps=int(facts["warps"]), regs=int(facts["registers"]), smem_compiled=int(facts["smem"]))
    return sweep_report.programs_per_sm(row, HOPPER_SM)


def _before(name, kind):
    """The step whose kernel of `kind` step `name` changes: the one before it in its ladder (part 4
    before a lesson ladder's first), or for a model step the last step that changed that kernel."""
    order = [s.name for s in steps.steps_of(5, kind)]
    if name in order:
        return order[order.index(name) - 1] if order.index(name) else "part4"
    before = order[-1]
    for step in steps.steps_of(5, steps.MODEL):
        if step.name == name:
            return before
        if (parts.folder(5) / "steps" / step.path.name).exists() and steps.TARGETS[kind] in steps.split_patch(
            step.path.read_text()
        ):
            before = step.name
    return before


def _same_binary(compiled, name, kind, d, c):
    """The step before whose binary step `name`'s is (none: it changed)."""
    before = _before(name, kind)
    mine, theirs = compiled.get((name, kind, d, c)), compiled.get((before, kind, d, c))
    return before if mine is not None and mine == theirs else None


def _kinds(rows, name):
    return [kind for kind in ("fwd", "bwd") if any(r["step"] == name and r["mode"] == kind for r in rows)]


def table_ladder(gpu_dir):
    """The lesson's progression, then the model ladder's: each step's pass at two shapes with its share
    of cuDNN's speed (or, where it compiles to the step before's code, that step's name), the tensor pipe's
    active share and the top stall (part 4's from the profile of every part)."""
    rows, index = _ladder(gpu_dir)
    part4, compiled, body = _part4_counters(ladder_dir(gpu_dir)), _compiled(gpu_dir), []
    for ladder in ("fwd", "bwd", steps.MODEL):
        order = ["part4", *_steps(rows, ladder), "sdpa_cudnn"] if ladder != steps.MODEL else _steps(rows, ladder)
        for step in order:
            label = NAMES.get(step) or next(r["label"] for r in rows if r["step"] == step)
            kinds = [ladder] if ladder != steps.MODEL else _kinds(rows, step) or ["-"]
            for kind in kinds:
                line = ["" if step in NAMES else f"`{step}`", label, kind]
                for d, c in LADDER_SHAPES:
                    row = index.get((step, kind, d, c))
                    same = _same_binary(compiled, step, kind, d, c) if step not in NAMES else None
                    pipe = (
                        part4.get((kind, d, c), (None,))[0] if step == "part4" else (row or {}).get("tensor_pipe_pct")
                    )
                    if kind == "-":
                        line += ["flash_attention.py only", ""]
                    elif same:
                        line += [f"= `{same}`", ""]
                    else:
                        line += [_ladder_cell(row), "-" if pipe is None else f"{pipe:.0f}%"]
                row = index.get((step, kind, 128, 1)) or {}
                stall = f"{row['stall_1']} {row['stall_1_value']:.1f}" if row.get("stall_1") else "-"
                body.append([*line, part4.get((kind, 128, 1), (None, "-"))[1] if step == "part4" else stall])
    header = ["step", "what it adds", "pass", *(x for d, c in LADDER_SHAPES for x in (_shape(d, c), "tensor pipe"))]
    caption = (
        "N = 4096, B=4, H=8, bf16, CUDA-graph replay, checked first: TFLOP/s and, in brackets, speed over SDPA "
        "cuDNN's; `= step`: compiled, the same PTX instructions as that step's; ncu's tensor-pipe share, and the "
        "top stall at D = 128 causal (warps stalled per instruction issued). A model step's rows: the Gluon kernels it patches:"
    )
    return _table(rows, LADDER, caption, [*header, "top stall"], body, "lll" + "rr" * len(LADDER_SHAPES) + "l")


def step_line(name):
    """The README's line under step `name`: its kernel's TFLOP/s at the two shapes (LADDER_SHAPES, or
    STEP_SHAPES[name]) with the change on the step before (part 4 before the first), or that the
    code is the step before's (the same PTX instructions); the tensor pipe and the top stall at the second
    shape."""
    shapes = STEP_SHAPES.get(name, LADDER_SHAPES)

    def line(gpu_dir):
        rows, index = _ladder(gpu_dir)
        compiled = _compiled(gpu_dir)
        kinds = _kinds(rows, name)
        if not kinds:
            step = next(s for s in steps.steps_of(5, re.sub(r"\d+$", "", name)) if s.name == name)
            patched = steps.split_patch(step.path.read_text()) if step.path.suffix == ".diff" else {"": ""}
            if not set(patched) & {steps.TARGETS["fwd"], steps.TARGETS["bwd"]}:
                return "_No kernel changes: flash_attention.py only._"
            return f"_{name}: not measured._"
        parts_ = []
        for kind in kinds:
            before = _before(name, kind)
            cells, last = [], None
            for d, c in shapes:
                row, prev = index.get((name, kind, d, c)), index.get((before, kind, d, c))
                same = _same_binary(compiled, name, kind, d, c)
                unit = "" if cells else " TFLOP/s"
                if same:
                    cells.append(f"at {_shape(d, c)} it compiles to {same}'s code")
                elif row and row.get("graph_tflops") and prev and prev.get("graph_tflops"):
                    change = row["graph_tflops"] / prev["graph_tflops"] - 1
                    change = "±0%" if abs(change) < 0.005 else f"{change:+.0%}"
                    cells.append(f"{row['graph_tflops']:.0f}{unit} at {_shape(d, c)} ({change})")
                    last = row
                else:
                    return f"_{name}: not measured._"
            pass_ = ("backward " if kind == "bwd" else "forward ") if name.startswith(steps.MODEL) else ""
            text = f"{pass_}on {before.replace('part4', 'part 4')} ({_gpu(rows)}): "
            text += ", ".join(cells)
            if last is not None and last.get("tensor_pipe_pct") is not None:
                text += f"; tensor pipe {last['tensor_pipe_pct']:.0f}%, top stall {last['stall_1']} {last['stall_1_value']:.1f}"
                if last.get("warps_active_pct") is not None:  # achieved occupancy, of the SM's 64 warps
                    text += f", warps active {last['warps_active_pct']:.0f}%"
            moved = []
            for d, c in shapes:
                now, prev = compiled.get((name, kind, d, c)), compiled.get((before, kind, d, c))
                if now and prev and programs_per_sm(now) != programs_per_sm(prev):
                    moved.append(f"{programs_per_sm(prev)} to {programs_per_sm(now)} at {_shape(d, c)}")
                    facts = f"{now['registers']} registers a thread x {now['warps']} warps"
            if moved:
                text += f"; programs per SM {', '.join(moved)} ({facts})"
            parts_.append(text)
        text = "; ".join(parts_)
        return f"_{text[0].upper()}{text[1:]}._"

    return line


def table_ladder_all(gpu_dir):
    """The log's table: every step at every shape and mode, the shipped kernels of earlier commits too."""
    rows, index = _ladder(gpu_dir)
    body = []
    for step in dict.fromkeys(r["step"] for r in rows):
        label = NAMES.get(step) or next(r["label"] for r in rows if r["step"] == step)
        for mode in ("fwd", "bwd", "fwd+bwd"):
            cells = [index.get((step, mode, d, c)) for d, c in PANELS]
            if any(cells):
                body.append([step, label, mode, *(_ladder_cell(x) for x in cells)])
        body += [[step, label, "", r["check"][:80], "", "", ""] for r in rows if r["step"] == step and not r["mode"]]
    caption = (
        "N = 4096, B=4, H=8, bf16: TFLOP/s by CUDA-graph replay and, in brackets, the speed over SDPA cuDNN's in the "
        "same mode; a backward's fwd+bwd is part 5's forward followed by it. `fwd_before` and `bwd_before` are the "
        "shipped kernels of the commit before the rewrite (positional state, before the ladders were rebuilt), timed "
        "in the same run:"
    )
    header = ["step", "what", "mode", *(_shape(d, c) for d, c in PANELS)]
    return _table(rows, LADDER, caption, header, body, "lll" + "r" * len(PANELS))


def table_ladder_compiled(gpu_dir):
    rows = read_csv(gpu_dir / "part5_ladder_compiled.csv")
    fields = ["partitions", "warps", "smem", "params", "registers", "stack", "wgmma", "wgmma_waits", "barrier_waits"]
    body = [[r["step"], r["kernel"], r["D"], yes_no(r["causal"] == "True"), *(r[f] for f in fields)] for r in rows]
    header = ["step", "kernel", "D", "causal", "warp_specialize", "warps", "shared memory", "parameters", "registers"]
    header += ["stack bytes", "wgmma", "wgmma waits (leaving n: count)", "mbarrier waits"]
    caption = (
        "Each step's Gluon kernels (a model step's: those it patches) compiled for sm_90 (Hopper) with Triton's "
        "compiler and ptxas on a CPU, read off the binary: registers per thread at launch (setmaxnreg then moves them "
        "between partitions), stack bytes (spills), the kernel's parameters, the products, and the waits on products "
        "and barriers in the PTX:"
    )
    return _table(rows, f"TRITON_INTERPRET=0 {LADDER} --compile --save", caption, header, body, "llll" + "r" * 9)


def ladder_figure(rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = {(r["step"], r["mode"], r["D"], r["causal"]): r for r in rows if r["mode"]}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (ladder, title) in zip(axes, (("fwd", "forward"), ("bwd", "backward alone"))):
        shipped = [s for s in _steps(rows, steps.MODEL) if ladder in _kinds(rows, s)][-1:]  # its last change
        order = ["part4", *_steps(rows, ladder), *shipped]
        for i, (d, c) in enumerate(PANELS):
            ys = [(index.get((s, ladder, d, c)) or {}).get("graph_tflops") for s in order]
            if not any(ys):
                continue  # a shape the run did not time (--table-shapes)
            ax.plot(range(len(order)), ys, "o-", color=f"C{i}", label=_shape(d, c))
            cudnn = (index.get(("sdpa_cudnn", ladder, d, c)) or {}).get("graph_tflops")
            if cudnn:
                ax.axhline(cudnn, color=f"C{i}", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(order)), ["part 4", *order[1 : len(order) - len(shipped)], *["shipped"] * len(shipped)])
        ax.set_title(f"{_gpu(rows)}, {title}: each step, N = 4096 (dotted: SDPA cuDNN)", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (CUDA-graph replay)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------ the profile
def table_ceilings(gpu_dir):
    """What the roofline's roofs are: the GPU's measured matrix-product and copy rates beside the datasheet."""
    rows = read_csv(gpu_dir / "part5_ceilings.csv")
    body = [[r["ceiling"], r["shape"], f"{r['value']:,}", r["unit"], r["method"]] for r in rows]
    command = "python -m part5_profiling.tools.ceilings"
    return _table(rows, command, "What this GPU reaches:", ["ceiling", "shape", "value", "unit", "how"], body, "llrll")


def _profile_cells(mine):
    """(registers, spills, tensor pipe, top stall) of one target's pass at one shape, per kernel."""
    compiled = [r for r in mine if r["method"] == "compiler"]
    regs = sorted({f"{r['kernel']} {r['value']}" for r in compiled if r["metric"] == "registers per thread"})
    spills = sum(int(r["value"]) for r in mine if r["metric"] == "spilled registers")
    pipe, stall = [], []
    for kernel in dict.fromkeys(r["kernel"] for r in mine if r["method"] == "ncu" and r["kernel"] != "(all kernels)"):
        own = {r["metric"]: r["value"] for r in mine if r["method"] == "ncu" and r["kernel"] == kernel}
        short = kernel.removeprefix("_attn_").removeprefix("bwd_")
        value = own.get("tensor pipe (wgmma) active, %", own.get("tensor pipe (mma) active, %"))
        pipe += [] if value is None else [f"{short} {float(value):.0f}" if float(value) >= 1 else f"{short} <1"]
        stall += [f"{short} {m.split(': ', 1)[1]}" for m in own if m.startswith("stall #1")]
    return "; ".join(regs) or "—", spills if regs else "—", "; ".join(pipe) or "—", "; ".join(stall) or "—"


def _every_gpu(gpu_dir, csv):
    """gpu_dir, then each other GPU folder of results/ holding `csv` (a later run on the GPU that came);
    gpu_dir alone when it is not a folder of results/ (a test's own)."""
    home = gpu_dir.parent == results.RESULTS
    return [gpu_dir, *sorted(p.parent for p in gpu_dir.parent.glob(f"*/{csv}") if home and p.parent != gpu_dir)]


def table_profile(gpu_dir):
    """Each GPU folder's profile table (_every_gpu), each naming its GPU."""
    tables = [_profile_table(d) for d in _every_gpu(gpu_dir, "part5_profile.csv") if (d / "part5_profile.csv").exists()]
    return "\n\n".join(tables) if tables else _profile_table(gpu_dir)  # none: the missing CSV's line


def _profile_table(gpu_dir):
    """Per target, pass and shape: GPU time, TFLOP/s, registers and spills, and ncu's tensor pipe and top stall
    per kernel ("dkdv 59; dq 67": a backward pass has several)."""
    rows = read_csv(gpu_dir / "part5_profile.csv")
    body = []
    for key in dict.fromkeys((r["target"], r["pass"], r["D"], r["causal"]) for r in rows):
        mine = [r for r in rows if (r["target"], r["pass"], r["D"], r["causal"]) == key]
        total = {r["metric"]: r["value"] for r in mine if r["method"] == "cupti" and r["kernel"] == "(all kernels)"}
        failed = "error" if any(r["metric"] == "error" for r in mine) else "—"
        ncu = "yes" if any(r["method"] == "ncu" and r["metric"] != "unavailable" for r in mine) else "no"
        times = [total.get("time per call", failed), total.get("achieved", failed)]
        body.append([*key[:3], yes_no(key[3]), *times, *_profile_cells(mine), ncu])
    header = ["target", "pass", "D", "causal", "GPU us per call", "TFLOP/s", "registers per thread", "spills"]
    caption = (
        "B=4, H=8, N=4096, bf16. GPU time: CUPTI kernel records, all of a pass's kernels; registers: the compiled "
        "Triton kernels; tensor pipe and stalls: ncu, where it could read the counters."
    )
    header += ["tensor pipe %", "top stall", "counters"]
    return _table(rows, "python -m part5_profiling.tools.profile --part N", caption, header, body, "llrlrrlrrll")


def table_stages(gpu_dir):
    rows = read_csv(gpu_dir / "part5_stages.csv")
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    index = {(r["variant"], r["D"], r["causal"]): r for r in rows}

    def cell(row):
        if row is None or row["graph_ms"] is None:
            return "—" if row is None else row["check"].split(":")[0]
        return f"{row['graph_ms'] * 1e3:.0f}" + ("" if row["delta_us"] is None else f" ({row['delta_us']:+.0f})")

    body = [[d, yes_no(c), *(cell(index.get((v, d, c))) for v in variants)] for d, c in PANELS]
    caption = (
        f"Part 4's forward, N={rows[0]['N']}, B=4, H=8, bf16: microseconds (CUDA-graph replay), and in brackets the "
        "difference from the original:"
    )
    header, align = ["D", "causal", *variants], "ll" + "r" * len(variants)
    return _table(rows, "python -m part5_profiling.tools.stages", caption, header, body, align)


# ------------------------------------------------------------------------------------ against cuDNN
# The targets for part 5 against SDPA cuDNN, by do_bench: (mode, shortest N it applies to, longest,
# the ratio of speeds to reach). A shape's verdict is the median of the runs in bench_runs.csv.
TARGETS = [
    ("fwd", 4096, None, 1.0),
    ("bwd", 4096, None, 1.0),
    ("fwd+bwd", 4096, None, 1.0),
    ("fwd+bwd", 1024, 2048, 0.85),
]
TARGETS_COMMAND = (
    "python -m lab.bench --part 5 --sdpa cudnn --mode fwd --mode fwd+bwd --mode bwd "
    "--n 1024 --n 2048 --n 4096 --n 8192 --n 16384 --repeat 3"
)


def met(mode, n, ratios):
    """Whether the median of the runs' ratios (to two places) reaches its target; None without one."""
    for m, low, high, target in TARGETS:
        if m == mode and n >= low and (high is None or n <= high):
            return round(statistics.median(ratios), 2) >= target
    return None


def run_ratios(rows, column="ms"):
    """{(mode, D, causal, N): [cuDNN's time / part 5's, one per run]}: each run's part 5 row against the
    cuDNN row of the same run (run and run_id), never one another invocation left (above 1: faster)."""
    index = {(r["run"], r["run_id"], r["impl"], r["mode"], r["D"], r["causal"], r["N"]): r[column] for r in rows}
    out = {}
    for (run, run_id, impl, *shape), ms in sorted(index.items(), key=lambda kv: (kv[0][0], *kv[0][3:])):
        sdpa = index.get((run, run_id, "sdpa_cudnn", *shape))
        if impl == "part5" and ms and sdpa:
            out.setdefault(tuple(shape), []).append(sdpa / ms)
    return out


def table_targets(gpu_dir):
    """Part 5 over SDPA cuDNN, the median of bench_runs.csv's runs (with their range), by do_bench and by
    CUDA-graph replay; by do_bench each target met or missed by the median."""
    rows = [r for r in read_csv(gpu_dir / "bench_runs.csv") if r["impl"] in ("part5", "sdpa_cudnn")]
    runs = max(map(len, run_ratios(rows).values()), default=0)
    seq_lens = sorted({r["N"] for r in rows})
    out = [provenance_line(rows, f"{TARGETS_COMMAND} && make report"), ""]
    for column, how in (("ms", "do_bench"), ("graph_ms", "CUDA-graph replay")):
        ratios, body = run_ratios(rows, column), []
        for mode in ("fwd", "bwd", "fwd+bwd"):
            for d, c in PANELS:
                cells = []
                for n in seq_lens:
                    xs = ratios.get((mode, d, c, n)) or [None]
                    cell = "—" if xs == [None] else f"{statistics.median(xs):.2f}"
                    cell += f" ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else ""
                    cells.append(
                        f"**{cell}**" if cell != "—" and column == "ms" and met(mode, n, xs) is False else cell
                    )
                if any(x != "—" for x in cells):
                    body.append([mode, d, yes_no(c), *cells])
        targets = "; ".join(
            f"{m} {r}x " + (f"from N = {lo}" if hi is None else f"at N = {lo}-{hi}") for m, lo, hi, r in TARGETS
        )
        out += [
            f"Part 5's speed over SDPA cuDNN's by {how}, the median of {runs} runs (the lowest and highest in brackets), "
            f"B=4, H=8, bf16; each run's part 5 against the same run's cuDNN"
            + (f". In bold, a median under its target ({targets}):" if column == "ms" else ": the GPU's time alone:"),
            "",
            markdown_table(["mode", "D", "causal", *(f"N = {n}" for n in seq_lens)], body, "llr" + "r" * len(seq_lens)),
            "",
        ]
    verdicts = [v for (mode, _, _, n), xs in run_ratios(rows).items() if (v := met(mode, n, xs)) is not None]
    return "\n".join([*out, f"Targets met by the median: {sum(verdicts)} of {len(verdicts)} shapes."])


def table_fa4(gpu_dir):
    """Each GPU folder's FlashAttention-4 table (_every_gpu) where it has FA4 rows, each naming its GPU."""
    tables = [table for d in _every_gpu(gpu_dir, "bench.csv") if (table := _fa4_table(d))]
    return (
        "\n\n".join(tables) or "No FlashAttention-4 rows in bench.csv: `python -m lab.bench --fa4 ...` where installed."
    )


def _fa4_table(gpu_dir):
    """FlashAttention-4 (`--fa4`), SDPA cuDNN and part 5 in TFLOP/s from bench.csv, each shape's three rows
    from the same invocation of the benchmark (run_id); where that invocation repeated (`--repeat`), the
    median of its runs in bench_runs.csv, part 5 over FA4 as the median of each run's ratio (range in
    brackets). None where bench.csv has no FA4 rows."""
    if not (gpu_dir / "bench.csv").exists():
        return None
    impls, modes = ("fa4", "sdpa_cudnn", "part5"), ("fwd", "bwd", "fwd+bwd")
    rows = [r for r in read_csv(gpu_dir / "bench.csv") if r["impl"] in impls and r["mode"] in modes]
    if not any(r["impl"] == "fa4" for r in rows):
        return None
    shape = ("mode", "D", "causal", "N")
    index = {(r["run_id"], r["impl"], *(r[c] for c in shape)): r for r in rows}
    # bench_runs.csv: each run of a --repeat has its own run_id; the invocation is its command and commit
    runs, invocation = {}, {}  # (command, commit, impl, *shape) -> {(run, run_id): row}; (run_id, impl, *shape) -> it
    if (gpu_dir / "bench_runs.csv").exists():
        for r in read_csv(gpu_dir / "bench_runs.csv"):
            if r["impl"] in impls and r["tflops"]:
                key = (r["command"], r["commit"], r["impl"], *(r[c] for c in shape))
                runs.setdefault(key, {})[(r["run"], r["run_id"])] = r
                invocation[(r["run_id"], r["impl"], *(r[c] for c in shape))] = key[:2]
    body, used, repeats = [], [], set()
    for r in sorted(rows, key=lambda r: (modes.index(r["mode"]), r["D"], r["causal"], r["N"])):
        if r["impl"] != "fa4":
            continue
        keys = [(r["run_id"], i, *(r[c] for c in shape)) for i in impls]
        three = [index.get(k) for k in keys]
        at = invocation.get(keys[0])
        each = [runs.get((*at, i, *(r[c] for c in shape)), {}) for i in impls] if at else [{}, {}, {}]
        common = sorted(set(each[0]) & set(each[1]) & set(each[2]))  # the runs all three made, paired by run
        if len(common) > 1:  # a repeated invocation: medians of its runs (bench.csv keeps one row per shape)
            repeats.add(len(common))
            used += [e[n] for e in each for n in common]
            fa4, cudnn, ours = (statistics.median(e[n]["tflops"] for n in common) for e in each)
            mine = [each[2][n]["tflops"] / each[0][n]["tflops"] for n in common]
            vs_fa4 = f"{statistics.median(mine):.2f}x ({min(mine):.2f}-{max(mine):.2f})"
            vs_cudnn = statistics.median(each[0][n]["tflops"] / each[1][n]["tflops"] for n in common)
            graphs = [(each[2][n]["graph_tflops"], each[0][n]["graph_tflops"]) for n in common]
        elif all(x and x["tflops"] for x in three):
            used += three
            fa4, cudnn, ours = (x["tflops"] for x in three)
            vs_fa4, vs_cudnn = f"{ours / fa4:.2f}x", fa4 / cudnn
            graphs = [(three[2]["graph_tflops"], three[0]["graph_tflops"])]
        else:
            continue
        by_graph = [g / f for g, f in graphs if g and f]  # the same ratio by CUDA-graph replay: no host time in it
        body.append([*(r[c] for c in ("mode", "D")), yes_no(r["causal"]), r["N"]])
        body[-1] += [f"{fa4:.0f}", f"{cudnn:.0f}", f"{ours:.0f}", f"{vs_cudnn:.2f}x", vs_fa4]
        body[-1].append(f"{statistics.median(by_graph):.2f}x" if len(by_graph) == len(graphs) else "—")
    if not body:
        return None
    how = (
        f"the median of {' or '.join(map(str, sorted(repeats)))} runs where the invocation repeated" if repeats else ""
    )
    caption = (
        "B=4, H=8, bf16, TFLOP/s by `do_bench`, each shape's three rows from one invocation of the benchmark"
        + (f" ({how}; part 5 / FA4 as the median of each run's ratio, the range in brackets)" if how else "")
        + "; the last column is the same ratio by CUDA-graph replay, which leaves the host's launch time out"
        " (where the two ratios differ, one of the kernels waited on its host in `do_bench`):"
    )
    header = ["mode", "D", "causal", "N", "FA4", "SDPA cuDNN", "part 5", "FA4 / cuDNN", "part 5 / FA4"]
    header.append("part 5 / FA4, graph replay")
    return _table(used, "python -m lab.bench --fa4 ...", caption, header, body, "llrr" + "r" * 6)


# ------------------------------------------------------------------------------------ the host path
def _paired(rows, key, us, ratio, low=None, high=None):
    """(targets, lengths, cell(target, N)): host us per call of paired rounds and the ratio to SDPA cuDNN's."""
    cells = {(r[key], r["N"], r["group"] if "group" in r else r["what"]): r["us"] for r in rows}
    lens = list(dict.fromkeys(r["N"] for r in rows))

    def cell(target, n):
        x, x_ratio = cells.get((target, n, us)), cells.get((target, n, ratio))
        span = f", {cells[(target, n, low)]:.2f}-{cells[(target, n, high)]:.2f}" if low and x_ratio else ""
        return "—" if x is None else f"{x:.0f}" + (f" ({x_ratio:.2f}x{span})" if x_ratio is not None else "")

    return list(dict.fromkeys(r[key] for r in rows)), lens, cell


def table_launch_cost(gpu_dir):
    """Per part, mode and N: GPU time (graph replay), the host's time issuing calls, do_bench's; then the
    paired measure (part5_launch_paired.csv): each target's host time over SDPA cuDNN's round by round."""
    rows = read_csv(gpu_dir / "part5_launch_cost.csv")
    timing = [r for r in rows if r["what"] in ("gpu_us", "host_us", "call_us")]
    index = {(r["part"], r.get("mode") or "fwd", r["N"], r["what"]): r["us"] for r in timing}
    keys = dict.fromkeys((r["part"], r.get("mode") or "fwd", r["N"]) for r in timing)
    body = [[p, m, n, *(index.get((p, m, n, w), "—") for w in ("gpu_us", "host_us", "call_us"))] for p, m, n in keys]
    caption = (
        "D=128, non-causal, bf16, B=4, H=8; microseconds per call (bwd: flash_backward called directly; fwd+bwd: the "
        "forward and torch.autograd.grad; floor: a Python autograd.Function that launches nothing):"
    )
    header = ["part", "mode", "N", "GPU (graph replay)", "host (issuing calls)", "do_bench"]
    out = _table(rows, "python -m part5_profiling.tools.launch_cost", caption, header, body, "llrrrr")
    if not (gpu_dir / "part5_launch_paired.csv").exists():
        return out
    paired = [r for r in read_csv(gpu_dir / "part5_launch_paired.csv") if r["what"] == "host, paired"]
    ratio = "over SDPA cuDNN ({})"
    targets, lens, cell = _paired(paired, "part", "us (median of rounds)", *(ratio.format(x) for x in PAIRED_STATS))
    caption = (
        "The host's time against SDPA cuDNN's, paired: a forward + backward through autograd of every target in turn, "
        "round after round. Host us per call, the median of the rounds (in brackets its time over SDPA cuDNN's in the "
        "same round: the median, and the lowest and highest round):"
    )
    body, header = [[p, *(cell(p, n) for n in lens)] for p in targets], ["part", *(f"N = {n}" for n in lens)]
    command = "python -m part5_profiling.tools.launch_cost --part 5 --paired-only"
    return out + "\n\n" + _table(paired, command, caption, header, body, "l" + "r" * len(lens))


PAIRED_STATS = ("median", "lowest", "highest")
RUNGS = ["floor", "tensors", "tensors + torch launches", "tensors + Triton launches", "part 5"]


def table_host_parts(gpu_dir):
    """tools/host_parts.py: part 5 beside Functions doing a growing share of its work, each over SDPA cuDNN's
    forward + backward of the same round, and the single operations of a call."""
    rows = read_csv(gpu_dir / "part5_host_parts.csv")
    ladder = [dict(r, key=(r["target"], r["threads"])) for r in rows if r["section"] == "ladder"]
    keys, lens, cell = _paired(ladder, "key", "us (median of rounds)", "over SDPA cuDNN (median of rounds)")
    keys.sort(key=lambda k: RUNGS.index(k[0]) if k[0] in RUNGS else len(RUNGS) + (k[0] == "SDPA cuDNN"))
    caption = (
        "A forward + backward through autograd, D = 128, non-causal, bf16, B=4, H=8, on autograd's device thread and on "
        "one thread: host us per call, the median of the rounds, and in brackets its time over SDPA cuDNN's in the same "
        "round. Each rung adds one ingredient of part 5's call: the floor (a Function that allocates O and returns dO), "
        "part 5's tensors, its four launches made by PyTorch or by Triton's launcher, then part 5 itself:"
    )
    body, header = [[*k, *(cell(k, n) for n in lens)] for k in keys], ["target", "thread", *(f"N = {n}" for n in lens)]
    table = _table(ladder, "python -m part5_profiling.tools.host_parts", caption, header, body, "ll" + "r" * len(lens))
    pieces = sorted((r for r in rows if r["section"] == "piece"), key=lambda r: r["date"], reverse=True)
    caption = "The pieces, each issued back to back at N = 512 (host us per call; compare pieces of one commit):"
    body = [[r["target"], f"{r['us']:.1f}", r["commit"]] for r in pieces]
    return "\n".join([table, "", caption, "", markdown_table(["piece", "us", "commit"], body, "lrl")])


def table_step_profile(gpu_dir):
    """tools/step_profile.py: where a training step's time goes, SDPA default beside part 5."""
    rows = sorted(
        read_csv(gpu_dir / "part5_step_profile.csv"), key=lambda r: (r["N"], r["mode"], r["impl"] != "sdpa_default")
    )
    name = {"sdpa_default": "SDPA default"}

    def ms(value):
        return "—" if value is None else f"{value:.2f}"

    body = [[r["N"], r["mode"], name.get(r["impl"], r["impl"].replace("part", "part ")), ms(r["step_ms"]), ms(r["host_ms"]),
             ms(r["gpu_ms"]), r["kernels"], ms(r["attn_gpu_ms"]), ms(r["other_gpu_ms"]),
             ms(r["attn_host_ms"]) if r["mode"] == "eager" else "—"] for r in rows]  # fmt: skip
    caption = (
        "The training benchmark's step (lab/train_step.py's model, B=8), per step: its time (CUDA events, median of "
        "10), the host's time to issue it (no synchronisation), then from PyTorch's profiler over 3 steps: the kernels' "
        "GPU time and count, attention's kernels and the rest, and (eager) the host's time inside the attention calls, "
        "forward and backward, profiled:"
    )
    header = ["N", "mode", "attention", "step ms", "host ms", "GPU ms", "kernels", "attention GPU ms", "other GPU ms",
              "attention host ms"]  # fmt: skip
    return _table(rows, "python -m part5_profiling.tools.step_profile", caption, header, body, "llrrrrrrrr")


# ------------------------------------------------------------------------------------ the studies
def _study(gpu_dir, csv, command, caption, first=(), ratio="speedup", keep=None):
    """A study's table: one row per shape, one column per candidate or variant (`first` leading); only
    the rows keep(rows) returns, where given."""
    rows = read_csv(gpu_dir / csv)
    rows = keep(rows) if keep else rows
    name = "variant" if "variant" in rows[0] else "candidate"
    names, body = _by_shape(rows, name, lambda r: _timed(r, ratio), first)
    return _table(rows, command, caption, ["D", "causal", "N", *names], body, "llr" + "r" * len(names))


def table_candidates(gpu_dir):
    caption = "Forward TFLOP/s (CUDA-graph replay), B=4, H=8, bf16, and the speed-up over part 4's kernel:"
    return _study(gpu_dir, "part5_candidates.csv", "python -m part5_profiling.tools.candidates", caption, ["part 4"])


GLUON_STUDY = "python -m part5_profiling.tools.gluon_study"


def table_gluon(gpu_dir):
    from part5_profiling.gluon_attention import SHORT_UP_TO

    caption = (
        "Forward TFLOP/s (CUDA-graph replay), B=4, H=8, bf16, and in brackets the speed over SDPA cuDNN's in the same "
        "run: the Gluon kernel with its warpgroups free or taking turns (ping-pong), part 4's `tl` kernel and the "
        "variants of earlier versions of the study (a program per query tile: now the ladder's fwd4). Part 5 runs at "
        f"D = 64 two warpgroups with ping-pong up to N = {SHORT_UP_TO[False]} ({SHORT_UP_TO[True]} causal; model5) and "
        "three from there, at D = 128 two without:"
    )
    return _study(gpu_dir, "part5_gluon.csv", GLUON_STUDY, caption, ["part 4"], "vs_cudnn")


def _beside_the_shipped(rows):
    """The rows of each shape's newest run: those of the commit its shipped forward was last timed at (a
    candidate timed against an earlier shipped forward, one now in it say, stays in the CSV only)."""
    newest = {(r["D"], r["causal"], r["N"]): r["commit"] for r in rows if r["variant"] == "shipped"}
    return [r for r in rows if newest.get((r["D"], r["causal"], r["N"])) == r["commit"]]


def table_gluon_candidates(gpu_dir):
    """Each GPU folder's forward candidates (_every_gpu), each naming its GPU and how many rounds it ran."""
    caption = (
        "Forward TFLOP/s (CUDA-graph replay, the median of {} interleaved rounds), B=4, H=8, bf16, and in "
        "brackets the speed over the shipped forward's (the median of each round's own ratio): exponentials partly "
        "by a polynomial on the FMA units (tools/variants/exp2_poly.diff), O rescaled only when a row's maximum moved "
        "by more than 2^8 (tools/variants/cond_rescale.diff), K_j and V_{{j-1}} in one ring stage, one barrier wait and "
        "one release a key step (tools/variants/kv_stage.diff) and, at D = 128, what D = 64 ships: O by a TMA store "
        "(O_BY_TMA), P packed to bf16 when its product is issued (PACK_LATE), both (a column once a run has timed it), "
        "and ping-pong:"
    )
    command, csv = f"{GLUON_STUDY} --candidates", "part5_gluon_candidates.csv"
    found = [d for d in _every_gpu(gpu_dir, csv) if (d / csv).exists()]  # each GPU's, naming it
    rounds = {d: max(int(r["rounds"] or 0) for r in read_csv(d / csv)) for d in found}
    tables = [
        _study(d, csv, command, caption.format(rounds[d]), ["shipped"], "vs_shipped", _beside_the_shipped)
        for d in found
    ]
    return "\n\n".join(tables) if tables else _study(gpu_dir, csv, command, caption)  # none: the missing CSV's line


def _line(csv, command):
    """The log's line for a study no README shows: its CSV's provenance, no table."""
    return lambda gpu_dir: study_line(gpu_dir / csv, f"{command} && make report")


def draw(gpu_dir):
    drawn = [roofline.draw(gpu_dir)]
    if (ladder_dir(gpu_dir) / "part5_ladder.csv").exists():
        drawn.append(ladder_dir(gpu_dir) / "part5_ladder.png")
        ladder_figure(read_csv(drawn[-1].with_suffix(".csv"))).savefig(drawn[-1], dpi=110)
    return [path for path in drawn if path is not None]


TABLES = {
    **{f"part5-step-{name}": step_line(name) for name in STEP_NAMES},
    "part5-ladder": table_ladder,
    "part5-ladder-all": table_ladder_all,
    "part5-ladder-compiled": table_ladder_compiled,
    "part5-ceilings": table_ceilings,
    "part5-profile": table_profile,
    "part5-stages": table_stages,
    "part5-targets": table_targets,
    "part5-fa4": table_fa4,
    "part5-launch-cost": table_launch_cost,
    "part5-host-parts": table_host_parts,
    "part5-step-profile": table_step_profile,
    "part5-candidates": table_candidates,
    "part5-bwd-candidates": _line("part5_bwd_candidates.csv", "python -m part5_profiling.tools.candidates --backward"),
    "part5-compiled": _line(
        "part5_compiled.csv", "TRITON_INTERPRET=0 python -m part5_profiling.tools.candidates --compile"
    ),
    "part5-gluon": table_gluon,
    "part5-gluon-candidates": table_gluon_candidates,
    "part5-gluon-order": _line("part5_gluon_order.csv", f"{GLUON_STUDY} --order"),
    "part5-gluon-bwd": _line("part5_gluon_bwd.csv", f"{GLUON_STUDY} --backward"),
}
