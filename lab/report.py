"""Results CSVs -> README tables, results logs and plots; code files -> README excerpts. Nothing here measures.

    python -m lab.report               # from results/h200/ (make report)
    python -m lab.report --gpu rtx-4090   # another GPU: results/rtx-4090/summary.md, not the READMEs

A README, and a part's results log (results/<gpu>/part<N>_log.md: every table about the part, each under a
heading and a sentence saying what it measured; a GPU folder's logs start as copies of results/h200/'s),
carries generated blocks between markers, each marker a line of its own:

    <!-- results:NAME -->  ...a table built from the CSVs...  <!-- /results:NAME -->
    <!-- code:PATH:NAME -->  ...a ```python block...  <!-- /code:PATH:NAME -->

A results block is all_tables()[NAME](gpu_dir) -> markdown: the bench.csv tables here, then each part's report
module's TABLES (part<N>_*/tools/report.py, whose draw(gpu_dir) draws its plots). Every
table starts with its provenance line: the GPU, versions, commits and dates of its rows and the command that
regenerates them.

A code block is the def or class NAME at the top level of the file PATH, decorators included, docstring left
out; PATH may name a ladder's step (part5_profiling/steps/fwd3: the kernel file after that step). A part of it:
NAME:from=TEXT,to=TEXT (either may go), from the one line holding the first text to the one line after it
holding the second; an anchor line stands for its whole statement, and a line opening a block brings the block.
A name, file or anchor not found (or on several lines), a marker not closed, or a results marker no table has,
stops the report before it writes anything: one line per problem naming the page and the marker, exit status 2.
"""

import argparse
import ast
import functools
import importlib
import re
import sys
import textwrap
from pathlib import Path

from common import ROOT, parts, steps
from lab import coldstart, results, targets, train_step
from lab.impls import FLEX, impl_label
from lab.results import PANELS, read_csv, table_block, yes_no  # PANELS, yes_no: for the parts too
from lab.timing import attention_flops

MARKER = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)
CODE = re.compile(r"^(<!-- code:([^\n]+?) -->\n)(?:(.*?)(<!-- /code:\2 -->))?", re.S | re.M)  # 4: None if not closed
MODES = {"fwd": "forward", "fwd+bwd": "forward + backward"}


def tflops(x):
    """TFLOP/s for a table: whole numbers, one decimal below 10, two significant digits below 1."""
    return "—" if x is None else f"{x:.2g}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def percent(a, b):
    share = 100 * a / b if a and b else None
    return "—" if share is None else f"{share:.1g}%" if share < 1 else f"{share:.0f}%"


def times(a, b):
    """How many times b a is ("12x"): a part against a much slower one."""
    return f"{a / b:.0f}x" if a and b else "—"


def per_shape(ns, cells):
    """A table body: [D, causal, N, *cells(d, c, n)] for each shape and N, where cells gives a list (None: no row)."""
    return [[d, yes_no(c), n, *x] for d, c in PANELS for n in ns if (x := cells(d, c, n)) is not None]


# ------------------------------------------------------------------------------------ bench.csv
def tflops_index(rows, column="ms", mode="fwd"):
    """{(impl, D, causal, N): TFLOP/s} for the timed rows of one mode, from a time column (ms or graph_ms)."""

    def tf(r):
        return attention_flops(r["B"], r["H"], r["N"], r["N"], r["D"], r["causal"], mode) / r[column] * 1e-9

    return {
        (r["impl"], r["D"], r["causal"], r["N"]): tf(r) for r in rows if r["mode"] == mode and r.get(column) is not None
    }


def plot(gpu_dir, csv, png, figure):
    """[the path of png], drawn by figure(the rows of csv) in gpu_dir; [] where the CSV is not there."""
    if not (gpu_dir / csv).exists():
        return []
    figure(read_csv(gpu_dir / csv)).savefig(gpu_dir / png, dpi=110)
    return [gpu_dir / png]


PROGRESSION = dict(D=128, causal=1, N=4096)  # the one shape of the progression (B=4, H=8, bf16)
BASE = "sdpa_cudnn"  # the library the progression measures against: the fastest SDPA backend


def progression(rows):
    """One entry per part (the registry's and the CSV's), then SDPA cuDNN: {"impl", "part" (None for
    cuDNN), "loop" (its backward is common/backward.py's tiled PyTorch loop), mode: (TFLOP/s, N, cuDNN's
    TFLOP/s at that N) or None}, at PROGRESSION's N, or at a part's longest N where it was never timed
    that long (part 0, Python loops: up to N = 2048)."""
    d, c, n = PROGRESSION.values()
    numbers = sorted(set(parts.available()) | {r["part"] for r in rows if r["part"] is not None})
    loops = {k for k in parts.available() if parts.pytorch_backward(parts.load(k))}
    entries, idx = [], {mode: tflops_index(rows, mode=mode) for mode in MODES}
    for k in [*numbers, None]:
        impl = BASE if k is None else f"part{k}"
        entry = {"impl": impl, "part": k, "loop": k in loops}
        for mode in MODES:
            timed = [r for r in rows if r["impl"] == impl and r["mode"] == mode and r["ms"] is not None]
            longest = max((r["N"] for r in timed if (r["D"], r["causal"]) == (d, c)), default=n)
            at = longest if all(r["N"] < n for r in timed) else n  # never timed this long: its longest N instead
            mine = idx[mode].get((impl, d, c, at))
            entry[mode] = None if mine is None else (mine, at, idx[mode].get((BASE, d, c, at)))
        entries.append(entry)
    return entries


def progression_dir(gpu_dir):
    """Where the progression comes from: for the READMEs (gpu_dir is LESSONS_GPU's folder), the results
    folder whose bench.csv holds the newest run of parts 1-5 and cuDNN at PROGRESSION's shape in both
    modes, so that the top README shows the kernels as they are, on the GPU that last measured them all;
    for another GPU's summary, its own folder."""
    if gpu_dir.name != LESSONS_GPU:
        return gpu_dir
    d, c, n = PROGRESSION.values()
    needed = {(impl, mode) for impl in (BASE, *(f"part{k}" for k in parts.available() if k)) for mode in MODES}
    newest = {}
    for folder in sorted(p for p in gpu_dir.parent.iterdir() if (p / "bench.csv").exists()):
        rows = [r for r in read_csv(folder / "bench.csv") if (r["D"], r["causal"], r["N"]) == (d, c, n)]
        timed = [r for r in rows if r["ms"] is not None and (r["impl"], r["mode"]) in needed]
        if {(r["impl"], r["mode"]) for r in timed} == needed:
            newest[folder] = max(str(r["date"]) for r in timed if r["impl"] == "part5")
    return max(newest, key=newest.get, default=gpu_dir)


def table_progression(gpu_dir):
    """One row per part at one shape: forward, and forward + backward, each beside its share of cuDNN's."""
    rows = read_csv(progression_dir(gpu_dir) / "bench.csv")
    d, c, n = PROGRESSION.values()
    entries, body, shorter = progression(rows), [], []
    for e in entries:
        label = impl_label(e["impl"])
        at = ", ".join(map(str, sorted({x[1] for x in (e["fwd"], e["fwd+bwd"]) if x is not None and x[1] != n})))
        shorter += [f"{label} was timed only up to N = {at}: its row is at N = {at}"] if at else []
        name = label if e["part"] is None else f"[{label}]({parts.folder(e['part']).name}/README.md)"
        fwd, both = [(tflops(x[0]), percent(x[0], x[2])) if x else ("—", "—") for x in (e["fwd"], e["fwd+bwd"])]
        backward = "the tiled PyTorch loop (`common/backward.py`)" if e["loop"] else "its own kernels"
        body.append([name + (f" (N = {at})" if at else ""), *fwd, *both, "cuDNN's" if e["part"] is None else backward])
    missing = [f"{impl_label(e['impl'])} {what}" for e in entries for mode, what in MODES.items() if e[mode] is None]
    impls = {e["impl"] for e in entries}
    used = [r for r in rows if (r["D"], r["causal"]) == (d, c) and r["mode"] in MODES and r["impl"] in impls]
    header = ["implementation", "forward, TFLOP/s", "% of cuDNN", "forward + backward, TFLOP/s", "% of cuDNN"]
    caption = (
        f"D = {d}, {'causal' if c else 'non-causal'}, N = {n}, B=4, H=8, bf16; TFLOP/s by do_bench (the backward "
        "counts 2.5 times the forward's FLOPs), each beside its share of SDPA cuDNN's at the same shape and mode:"
    )
    notes = [f"{'; '.join(shorter)}, beside SDPA cuDNN's at that N."] if shorter else []
    notes += [f"—: not in bench.csv at this shape ({', '.join(missing)})."] if missing else []
    table = table_block(used, "make bench && make report", caption, [*header, "backward"], body, "lrrrrl")
    return "\n\n".join([table, *(note[:1].upper() + note[1:] for note in notes)])


def progression_figure(rows):
    """The progression as bars: per part, forward and forward + backward side by side (hatched where the
    backward is the tiled PyTorch loop), SDPA cuDNN last and as a dashed line across; values on the bars."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    entries, (d, c, n) = progression(rows), PROGRESSION.values()
    colours, base_colours = {"fwd": "tab:blue", "fwd+bwd": "tab:orange"}, {"fwd": "black", "fwd+bwd": "dimgray"}
    fig = Figure(figsize=(11, 5.5))
    ax = fig.subplots()
    for k, (mode, what) in enumerate(MODES.items()):
        heights = [0 if e[mode] is None else e[mode][0] for e in entries]
        face = [base_colours[mode] if e["impl"] == BASE else colours[mode] for e in entries]
        loops = [mode == "fwd+bwd" and e["loop"] for e in entries]
        at = [i + (k - 0.5) * 0.4 for i in range(len(entries))]
        bars = ax.bar(at, heights, 0.4, color=face, label=what, hatch=["//" if loop else None for loop in loops])
        labels = []
        for e, loop in zip(entries, loops):
            x = e[mode]
            label = "—" if x is None else tflops(x[0]) + (f"\n(N={x[1]})" if x[1] != n else "")
            labels.append(label + ("\nPyTorch\nbackward" if loop and x is not None else ""))
        ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
        if (base := entries[-1][mode]) is not None:
            ax.axhline(base[0], color=base_colours[mode], ls="--", lw=0.8)
    ax.set_xticks(range(len(entries)), [impl_label(e["impl"]) for e in entries])
    ax.set_ylabel("TFLOP/s (do_bench)")
    ax.margins(y=0.15)
    handles = [
        *(Patch(color=colours[mode], label=what) for mode, what in MODES.items()),
        *(Line2D([], [], color=base_colours[m], ls="--", lw=0.8, label=f"SDPA cuDNN, {w}") for m, w in MODES.items()),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(
        f"One part at a time: D = {d}, {'causal' if c else 'non-causal'}, N = {n}, B=4, H=8, bf16 — {rows[0]['gpu']}"
    )
    fig.tight_layout()
    return fig


NAMES = {"sdpa_flash": ("SDPA flash", "flash"), "sdpa_cudnn": ("SDPA cuDNN", "cuDNN"), FLEX: ("FlexAttention", "Flex")}


def versus(idx, me, impls, against, names=NAMES):
    """Columns setting `me` beside other implementations, from idx (tflops_index's): their header, and cells(d, c,
    n): the TFLOP/s of each of impls (me's in bold), then me's share of each of against's (`times` a part's).
    names: {impl: (its column's name, its name in a ratio's)}; a part is "part N" in both."""
    name = {i: names.get(i, (impl_label(i),) * 2) for i in impls + against}
    header = [f"**{name[i][0]}**" if i == me else name[i][0] for i in impls]

    def cells(d, c, n):
        t = {i: idx.get((i, d, c, n)) for i in impls + against}
        ratios = [(times if i.startswith("part") else percent)(t[me], t[i]) for i in against]
        return [f"**{tflops(t[i])}**" if i == me else tflops(t[i]) for i in impls] + ratios

    return header + [f"{name[me][0]} / {name[i][1]}" for i in against], cells


def _bench_block(rows, part, caption, header, body, align):
    return table_block(rows, f"make bench PART={part} && make report", caption, header, body, align)


def table_part(gpu_dir, part):
    """Part `part`'s forward against the part before it and SDPA flash and cuDNN, at every N."""
    rows = read_csv(gpu_dir / "bench.csv")
    idx, me = tflops_index(rows), f"part{part}"
    impls = [f"part{part - 1}"] * (part > 0) + [me, "sdpa_flash", "sdpa_cudnn"]
    chosen = {(r["D"], r["causal"], r["N"]): r["backend"] for r in rows if r["impl"] == me and r["mode"] == "fwd"}
    cfg = any(chosen.values())  # a config column, where the benchmark wrote what the autotuner chose
    cols, cells = versus(idx, me, impls, impls[-2:])

    def row(*shape):
        if (me, *shape) in idx:
            return [*cells(*shape), *[chosen.get(shape) or ""] * cfg]

    caption = "Forward TFLOP/s, B=4, H=8, bf16" + (" (config: what the autotuner chose)" if cfg else "") + ":"
    body = per_shape(sorted({r["N"] for r in rows}), row)
    header = ["D", "causal", "N", *cols, *["config"] * cfg]
    compared = [r for r in rows if r["impl"] in impls]
    return _bench_block(compared, part, caption, header, body, "llr" + "r" * len(cols) + "l" * cfg)


def table_summary(gpu_dir, part, n, mode):
    """A part's number in four rows (D x causal) at one N and mode: the part before (where it was timed
    that long), the part and SDPA cuDNN in TFLOP/s, and the part's share of cuDNN's."""
    rows = read_csv(gpu_dir / "bench.csv")
    idx, me, prev = tflops_index(rows, mode=mode), f"part{part}", f"part{part - 1}"
    shown = any((prev, d, c, n) in idx for d, c in PANELS)  # part 0 was never timed this long: no column for it
    cols, cells = versus(idx, me, [prev] * shown + [me, "sdpa_cudnn"], ["sdpa_cudnn"], {"sdpa_cudnn": ("cuDNN",) * 2})
    body = [[d, yes_no(c), *cells(d, c, n)] for d, c in PANELS]
    used = [r for r in rows if r["impl"] in (me, prev, "sdpa_cudnn") and r["mode"] == mode and r["N"] == n]
    flops = " (the backward counts 2.5 times the forward's FLOPs)" * (mode == "fwd+bwd")
    caption = f"TFLOP/s by do_bench at N = {n}, B=4, H=8, bf16{flops}:"
    header = ["D", "causal", f"{MODES[mode]}: {cols[0]}", *cols[1:]]
    return _bench_block(used, part, caption, header, body, "ll" + "r" * len(cols))


def table_causal_time(gpu_dir, part):
    """Milliseconds with and without the causal mask: the same time means the same work was done."""
    rows = [r for r in read_csv(gpu_dir / "bench.csv") if r["mode"] == "fwd" and r["ms"] is not None]
    ms, me = {(r["impl"], r["D"], r["causal"], r["N"]): r["ms"] for r in rows}, f"part{part}"

    def ratio(impl, d, n):
        a, b = ms.get((impl, d, 0, n)), ms.get((impl, d, 1, n))
        return "—" if a is None or b is None else f"{b / a:.2f}"

    ns = sorted({n for i, _, _, n in ms if i == me and n >= 2048})
    body = [
        [d, n, f"{ms[(me, d, 0, n)]:.3f}", f"{ms[(me, d, 1, n)]:.3f}", ratio(me, d, n), ratio("sdpa_flash", d, n)]
        for d in (64, 128)
        for n in ns
        if (me, d, 0, n) in ms and (me, d, 1, n) in ms
    ]
    header = ["D", "N", f"part {part}, non-causal", f"part {part}, causal", "causal / non-causal"]
    used = [r for r in rows if r["impl"] in (me, "sdpa_flash") and r["N"] >= 2048]
    caption = "Milliseconds per forward (B=4, H=8, bf16); causal does half the useful work:"
    return _bench_block(used, part, caption, [*header, "SDPA flash, causal / non-causal"], body, "lrrrrr")


def table_graph(gpu_dir, part):
    """do_bench (each call launched from Python) against CUDA-graph replay (the GPU's time alone)."""
    rows = read_csv(gpu_dir / "bench.csv")
    timed, graph, me = tflops_index(rows), tflops_index(rows, "graph_ms"), f"part{part}"
    if not any(key[0] == me for key in graph):
        return f"_bench.csv has no CUDA-graph times of part {part}'s forward._"

    def cells(d, c, n):
        if (me, d, c, n) in timed:
            t, ft = timed[(me, d, c, n)], timed.get(("sdpa_flash", d, c, n))
            g, fg = graph.get((me, d, c, n)), graph.get(("sdpa_flash", d, c, n))
            return [tflops(t), tflops(g), tflops(ft), tflops(fg), percent(g, fg)]

    header = ["D", "causal", "N", f"part {part}", f"part {part}, graph", "SDPA flash", "SDPA flash, graph"]
    caption = (
        f"Forward TFLOP/s of part {part} and SDPA flash, B=4, H=8, bf16, timed two ways: `do_bench` (the "
        "protocol: each call launched from Python after an L2 flush) and CUDA-graph replay (the launches "
        "recorded once and replayed back to back: no launch cost, and no flush, so inputs that fit in L2 "
        "stay there):"
    )
    compared = [r for r in rows if r["impl"] in (me, "sdpa_flash")]
    body = per_shape(sorted({r["N"] for r in rows}), cells)
    return _bench_block(compared, part, caption, [*header, f"part {part} / flash, graph"], body, "llrrrrrr")


# ------------------------------------------------------------------------------------ code in the READMEs
class CodeError(ValueError):
    """What stops the report before it writes anything (a marker whose table, file, name or anchor is not
    found, or is found twice); args: one line per problem."""


DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match, *DEFS)
SPEC = re.compile(r"([^:]+):(\w+)(?::(?:from=(.+?)(?:,to=(.+))?|to=(.+)))?")  # PATH:NAME[:from=TEXT][,to=TEXT]


def _level(body):
    """One level's statements, those of module-level if/try blocks (a kernel under `if HAVE_GLUON:`) included."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            yield from _level(node.body + node.orelse + getattr(node, "finalbody", []))
        else:
            yield node


def _one(found, none, many):
    """The one line number in found; CodeError saying `none`, or `many` and the lines, otherwise."""
    if len(found) != 1:
        raise CodeError(f"{many} (lines {', '.join(map(str, found))})" if found else none)
    return found[0]


def _anchor(lines, lo, hi, text, what, name):
    """The one line number in lo..hi (1-based) holding text."""
    where = name if what == "from" else f"{name} from line {lo} on"
    found = [i for i in range(lo, hi + 1) if text in lines[i - 1]]
    said = f"the {what} text {text!r} is on"
    return _one(found, f"{said} no line of {where}", f"{said} {len(found)} lines of {where}")


def _statement(node, line):
    """(first, last) line of what an anchor on `line` stands for: its whole simple statement, and the
    block of a compound statement that starts on it; the line alone outside any statement (a comment)."""
    around = [
        s for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node and s.lineno <= line <= s.end_lineno
    ]
    simple = [s for s in around if not isinstance(s, COMPOUND)]
    opened = [s for s in around if isinstance(s, COMPOUND) and s.lineno == line]
    return min([line, *(s.lineno for s in simple)]), max([line, *(s.end_lineno for s in simple + opened)])


def code_excerpt(spec, root=None):
    """The dedented source a code marker names (SPEC); CodeError if not found."""
    root, m = Path(root or ROOT), SPEC.fullmatch(spec)
    if not m:
        raise CodeError("expected PATH:NAME or PATH:NAME:from=TEXT,to=TEXT (or from=TEXT, or to=TEXT)")
    path, name, start, end = m[1], m[2], m[3], m[4] or m[5]
    if step := re.fullmatch(r"part(\d+)_\w+/steps/([a-z]*\d+)", path):  # a ladder's step: its kernel file
        try:
            ladder, i = steps.find(int(step[1]), step[2])
        except ValueError as e:
            raise CodeError(str(e)) from None
        source = steps.sources(int(step[1]), ladder[0].ladder)[i + 1]
    elif (root / path).resolve().is_relative_to(root.resolve()) and (root / path).is_file():
        source = (root / path).read_text()
    else:
        raise CodeError(f"there is no file {path} in the repository")
    try:
        defs = {n.lineno: n for n in _level(ast.parse(source).body) if isinstance(n, DEFS) and n.name == name}
    except SyntaxError as e:
        raise CodeError(f"{path} does not parse: {e.msg} (line {e.lineno})") from None
    node = defs[
        _one(list(defs), f"{path}: no function or class {name}", f"{path}: {name} is defined {len(defs)} times")
    ]
    lines, lo, hi = source.splitlines(), min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno
    lo = lo if start is None else _statement(node, _anchor(lines, lo, hi, start, "from", name))[0]
    hi = hi if end is None else _statement(node, _anchor(lines, lo, hi, end, "to", name))[1]
    keep, doc = lines[lo - 1 : hi], node.body[0]
    if not (start or end) and ast.get_docstring(node) is not None and len(node.body) > 1 and doc.lineno != node.lineno:
        # the whole def, without its docstring and the blank lines after it (a statement follows: not all blank)
        after = next(i for i in range(doc.end_lineno, hi) if lines[i].strip())
        keep = lines[lo - 1 : doc.lineno - 1] + lines[after:hi]
    return textwrap.dedent("\n".join(keep)).strip("\n")


# ------------------------------------------------------------------------------------ READMEs and logs
def _part_modules(names):
    """The modules `names` (e.g. "report", "tools.report") of each part folder that has them, in part order."""
    found = [(f, n) for f in parts.folders().values() for n in names if (f / (n.replace(".", "/") + ".py")).exists()]
    return [importlib.import_module(f"{folder.name}.{name}") for folder, name in found]


def part_reports():
    """Each part's report module (part<N>_*/tools/report.py), in part order."""
    return _part_modules(("tools.report",))


def all_tables(reports):
    """{marker name: function(gpu_dir) -> markdown}: the tables above, then every part report's TABLES.
    CodeError if a name is taken twice (marker names are global)."""
    tables = {"cold-start": coldstart.table, "train-step": train_step.table, "train-step-summary": train_step.summary}
    tables |= {"targets": targets.table, "progression": table_progression}
    for n in parts.folders():
        tables |= {
            f"part{n}": functools.partial(table_part, part=n),
            f"part{n}-graph": functools.partial(table_graph, part=n),
            f"part{n}-causal": functools.partial(table_causal_time, part=n),
            f"part{n}-fwd-4096": functools.partial(table_summary, part=n, n=4096, mode="fwd"),
            f"part{n}-fwdbwd-4096": functools.partial(table_summary, part=n, n=4096, mode="fwd+bwd"),
        }
    for module in reports:
        if taken := sorted(tables.keys() & module.TABLES.keys()):
            raise CodeError(f"{module.__name__}: table {', '.join(taken)} is taken already (marker names are global)")
        tables |= module.TABLES
    return tables


def readmes():
    return [p for p in (ROOT / "README.md", *sorted(ROOT.glob("part*/README.md"))) if p.exists()]


def render(table, gpu_dir):
    """A table's markdown from the CSVs in gpu_dir, or, when its CSV is missing, a line saying so."""
    try:
        return table(gpu_dir)
    except FileNotFoundError as e:
        return f"_No results yet ({Path(e.filename).name} missing): run the command that writes it._"


def fill(text, tables, gpu_dir, root=None):
    """text with every results block rebuilt from the CSVs and every code block from its file; CodeError
    naming each marker with no table, not found or not closed."""
    problems = []

    def results_block(m):
        if m[2] not in tables:
            problems.append(f"no table for <!-- results:{m[2]} -->")
            return m[0]
        return f"{m[1]}{render(tables[m[2]], gpu_dir)}\n{m[4]}"

    def code_block(m):
        try:
            if m[4] is not None:
                return f"{m[1]}```python\n{code_excerpt(m[2], root)}\n```\n{m[4]}"
            problems.append(f"<!-- code:{m[2]} -->: no closing <!-- /code:{m[2]} --> after it")
        except CodeError as e:
            problems.append(f"<!-- code:{m[2]} -->: {e}")
        return m[0]

    new = CODE.sub(code_block, MARKER.sub(results_block, text))
    if problems:
        raise CodeError(*problems)
    return new


LESSONS_GPU = "h200"  # the GPU whose tables the READMEs show
SUMMARY = """# {gpu}: every part measured on this GPU

The READMEs' tables are from the {lessons}; these are from this GPU, in this folder's CSVs
(`make bench`, `make sweep`, then `make report GPU={slug}`). `make report GPU={slug}` rewrites this
page and nothing else.

## Each part at one shape

<!-- results:progression -->
<!-- /results:progression -->

![Each part's forward and forward + backward TFLOP/s beside SDPA cuDNN](progression.png)
{parts}"""
SWEEP = """
## Part 2's sweep

![The sweep: best TFLOP/s per tile shape](part2_heatmaps.png)

<!-- results:part2-sweep -->
<!-- /results:part2-sweep -->
"""


def fill_pages(gpu_dir, lessons, tables):
    """{page: its text filled}: the READMEs (lessons), or else the GPU's summary.md, rebuilt from SUMMARY on every
    run so that a CSV added later shows (the progression, each part in bench.csv, part 2's sweep where
    part2_sweep.csv is there); and the GPU's results logs. CodeError with one line per problem, naming its page."""
    pages = {p: p.read_text() for p in readmes()} if lessons else {}
    if not lessons and (gpu_dir / "bench.csv").exists():  # another GPU's tables go to its own folder, never the lessons
        rows = read_csv(gpu_dir / "bench.csv")
        found = sorted({r["part"] for r in rows if r["part"] is not None})
        blocks = "".join(f"\n## Part {n}\n\n<!-- results:part{n} -->\n<!-- /results:part{n} -->\n" for n in found)
        blocks += SWEEP if (gpu_dir / "part2_sweep.csv").exists() else ""
        lessons_page = f"{LESSONS_GPU.upper()} (results/{LESSONS_GPU}/)"
        pages[gpu_dir / "summary.md"] = SUMMARY.format(
            gpu=rows[0]["gpu"], lessons=lessons_page, slug=gpu_dir.name, parts=blocks
        )
    pages |= {p: p.read_text() for p in sorted(gpu_dir.glob("part*_log.md"))}
    new, problems = {}, []
    for path, text in pages.items():
        try:
            new[path] = fill(text, tables, gpu_dir)
        except CodeError as e:
            problems += [f"{results.shown(path)}: {problem}" for problem in e.args]
    if problems:
        raise CodeError(*problems)
    # a page in results/<gpu>/: its links to the parts go up two folders
    return {p: re.sub(r"\]\((part\d+_\w+/)", r"](../../\1", t) if p.parent == gpu_dir else t for p, t in new.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h200", help="the results/<gpu>/ folder to read (default: h200)")
    gpu = ap.parse_args(argv).gpu
    gpu_dir, reports = results.results_dir(gpu), part_reports()
    try:
        if not gpu_dir.is_dir():
            folders = ", ".join(sorted(p.name for p in results.RESULTS.iterdir() if p.is_dir()))
            raise CodeError(f"there is no results/{gpu}/; the results folders are: {folders}")
        new = fill_pages(gpu_dir, gpu == LESSONS_GPU, all_tables(reports))
    except CodeError as e:
        print("\n".join(e.args), file=sys.stderr)
        return 2
    drawn = [
        *plot(progression_dir(gpu_dir), "bench.csv", "progression.png", progression_figure),  # the top README's chart
        *(train_step.draw(gpu_dir) if (gpu_dir / "train_step.csv").exists() else []),
        *(path for module in reports for path in module.draw(gpu_dir)),
        # pictures drawn from code: draw() -> files
        *(path for module in _part_modules(("figures",)) for path in module.draw()),
    ]
    for path in drawn:
        print(f"drew {results.shown(path)}")
    for path, text in new.items():
        if not path.exists() or text != path.read_text():
            path.write_text(text)
            print(f"updated {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
