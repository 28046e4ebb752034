"""Results CSVs -> README tables and the cross-part plots. Nothing here measures anything.

    python -m common.report               # from results/h200/ (make report)
    python -m common.report --gpu rtx-4090

README files carry generated blocks between markers:

    <!-- results:NAME -->  ...generated...  <!-- /results:NAME -->

Re-running replaces each block with a table built from the CSVs, so a number in a README is never
typed by hand. The tables that read only bench.csv are here: `progression` (one row per part at
one shape, beside SDPA cuDNN), and for every part N `partN` (its forward against the part before
and SDPA), `partN-graph` (do_bench against CUDA-graph replay), `partN-causal` (milliseconds with
and without the mask), and the part's number in four rows beside the part before and cuDNN:
`partN-fwd-4096`, `partN-fwdbwd-4096`, `partN-both-16384`. Everything else belongs to a
part: a part folder with a report.py (at its top, or in its tools/ subfolder with the studies it
reports) gives its TABLES (marker name -> function(gpu_dir) -> markdown) and, if it draws figures
from its CSVs, draw(gpu_dir) -> the files it wrote. Marker names are
global, so two tables with one name are an error, and so is a marker no table has. A part folder
with a figures.py (pictures drawn from code, not from results) gives draw() -> the files it wrote.

Code in a README is extracted the same way, so it cannot drift from the file it shows. A block

    <!-- code:PATH:NAME -->  ...generated...  <!-- /code:PATH:NAME -->

(the closing marker repeats the opening one's text exactly, and each marker is a line of its own)
is filled with a ```python block holding the function or class NAME of the file PATH (relative to
the repository root): its decorators, signature and body as they are in the file, without its
docstring (the README's prose says what it does). NAME is a top-level name, or Outer.inner for a
def inside a class or another def. A part of a function, for the lines that are the idea:

    <!-- code:PATH:NAME:from=TEXT,to=TEXT -->     from the line holding the first TEXT to the line
                                                  holding the second, both included
    <!-- code:PATH:NAME:from=TEXT -->             ... to the end of the function
    <!-- code:PATH:NAME:to=TEXT -->               the function's first line to the line holding TEXT

TEXT is matched as written, a substring of the line (spaces and colons included; it ends at ",to="
or at " -->"). The `from` text must be on exactly one line of the function (decorators included),
the `to` text on exactly one line from the `from` line on. An anchor line stands for its whole
statement: a call spread over several lines is shown whole, and a line that opens an if, for,
with or def brings its block (an if its else too). The part is dedented. For example (the two
inner-loop calls of part 3 and the bounds before them):

    <!-- code:part0_pytorch_reference/flash_attention.py:flash_forward -->
    <!-- code:part3_inner_loop/flash_attention.py:_attn_fwd:from=# Key j is visible,to=True, -->

PATH may also name a step of a part's ladder (common/steps.py), part5_profiling/steps/fwd3: the
kernel file as it is after that step.

A function that is not in its file (renamed, moved), an anchor on no line or on several, or an
opening marker without its closing one stops the report before it writes anything: one line per
problem, naming the README and the marker, and exit status 2.

Each part also gets a results log, results/<gpu>/part<N>_log.md: every table about that part under
a heading and one sentence saying what it measured (the README, a lesson, shows a few and links
the log). Its entries are COMMON_LOG below (this module's tables about part N), then the LOG of
the part's report module, a list of (heading, sentence, table name) in the order the log shows
them (a LOG that names one of COMMON_LOG's tables places it itself); a table of TABLES that LOG
does not name comes last, under its marker name, unless README_ONLY names it (a line the lesson
quotes from a table the log holds whole). Parts without a report module (0 and 1) get
COMMON_LOG's tables alone. A LOG entry that names no table stops the report like a README marker.
"""

import argparse
import ast
import functools
import importlib
import os
import re
import sys
import textwrap
from pathlib import Path

from common import ROOT, coldstart, parts, results, steps, train_step
from common.impls import FA4, FLEX, SDPA_BACKENDS, impl_label
from common.results import markdown_table, provenance_line, read_csv
from common.timing import attention_flops

MARKER = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)
CODE = re.compile(r"^(<!-- code:([^\n]+?) -->\n)(.*?)(<!-- /code:\2 -->)", re.S | re.M)
CODE_OPENING = re.compile(r"^<!-- code:([^\n]+?) -->$", re.M)
PANELS = [(64, 0), (64, 1), (128, 0), (128, 1)]  # (D, causal): the benchmark's four groups


def tflops(x):
    """TFLOP/s for a table: whole numbers, one decimal below 10, two significant digits below 1."""
    return "—" if x is None else f"{x:.2g}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def percent(a, b):
    if not a or not b:
        return "—"
    share = 100 * a / b
    return f"{share:.1g}%" if share < 1 else f"{share:.0f}%"  # below 1%: one significant figure


def yes_no(causal):
    return "yes" if causal else "no"


# ------------------------------------------------------------------------------------ bench.csv
def tflops_index(rows, column="ms", mode="fwd"):
    """{(impl, D, causal, N): TFLOP/s} for the timed rows of one mode, from a time column (ms or graph_ms)."""
    index = {}
    for r in rows:
        if r["mode"] == mode and r.get(column) is not None:
            flops = attention_flops(r["B"], r["H"], r["N"], r["N"], r["D"], r["causal"], mode)
            index[(r["impl"], r["D"], r["causal"], r["N"])] = flops / r[column] * 1e-9
    return index


def impls_in(rows):
    """The implementations in rows: parts by number, then SDPA's backends in the benchmark's order."""
    part_of = {r["impl"]: r["part"] for r in rows}
    in_parts = sorted((impl for impl, part in part_of.items() if part is not None), key=part_of.get)
    return (
        in_parts
        + [f"sdpa_{b}" for b in SDPA_BACKENDS if f"sdpa_{b}" in part_of]
        + [name for name in (FLEX, FA4) if name in part_of]
    )


PART_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:cyan")
PART_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
OTHER_STYLES = {  # (colour, line style, marker): SDPA's backends dashed or dotted, each its own way
    "sdpa_flash": ("dimgray", "-.", "x"),
    "sdpa_cudnn": ("black", "--", "*"),
    "sdpa_efficient": ("tab:olive", ":", "+"),
    "sdpa_math": ("darkgoldenrod", (0, (3, 1, 1, 1, 1, 1)), "<"),
    "sdpa_default": ("teal", (0, (6, 2)), ">"),
    FLEX: ("magenta", (0, (1, 1)), "d"),
    FA4: ("crimson", (0, (5, 1)), "p"),
}


def impl_style(impl):
    """How the plots draw an implementation: {color, linestyle, marker}. Every part solid, in its own
    colour and marker; SDPA's backends and FlexAttention each dashed or dotted in a style of their own."""
    m = re.fullmatch(r"part(\d+)", impl)
    if m:
        n = int(m.group(1))
        return dict(
            color=PART_COLOURS[n % len(PART_COLOURS)], linestyle="-", marker=PART_MARKERS[n % len(PART_MARKERS)]
        )
    color, linestyle, marker = OTHER_STYLES.get(impl, ("gray", "--", "."))
    return dict(color=color, linestyle=linestyle, marker=marker)


@functools.cache
def pytorch_backward_parts():
    """The parts whose backward is the tiled PyTorch loop of common/backward.py (read off each part's
    module through the registry, so a table never guesses it from the CSV)."""
    return frozenset(n for n in parts.available() if parts.pytorch_backward(parts.load(n)))


def _panel_figure(draw_panel, ylabel, title):
    """A 2 x 2 figure, one panel per (D, causal), x = N on a log scale; draw_panel(ax, d, c) draws."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2, sharex=True)
    for ax, (d, c) in zip(axes.flat, PANELS):
        draw_panel(ax, d, c)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d}, {'causal' if c else 'non-causal'}")
        ax.set_xlabel("N (sequence length)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    labelled = next((ax for ax in axes.flat if ax.get_legend_handles_labels()[0]), None)
    if labelled is not None:  # the first panel with a line (a mode's rows may not fill every panel)
        labelled.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def tflops_figure(rows, mode="fwd"):
    """TFLOP/s of one mode (fwd or fwd+bwd) against N: one line per implementation in each panel,
    the parts solid and SDPA dashed or dotted, each in a colour and marker of its own (impl_style)."""
    idx, ns = tflops_index(rows, mode=mode), sorted({r["N"] for r in rows if r["mode"] == mode})
    pytorch = pytorch_backward_parts() if mode != "fwd" else frozenset()

    def panel(ax, d, c):
        for impl in impls_in(rows):
            pts = [(n, idx[(impl, d, c, n)]) for n in ns if (impl, d, c, n) in idx]
            if pts:
                mine = any(r["part"] in pytorch for r in rows if r["impl"] == impl)
                label = impl_label(impl) + (" (PyTorch backward)" if mine else "")
                ax.plot(*zip(*pts), label=label, markersize=4, **impl_style(impl))

    what = "Forward" if mode == "fwd" else "Forward + backward (the backward counts 2.5 times the forward's FLOPs)"
    return _panel_figure(panel, "TFLOP/s", f"{what}, B=4, H=8, bf16 — {rows[0]['gpu']}")


def vs_sdpa_figure(rows):
    """Each part's forward as a percentage of SDPA flash (solid) and SDPA cuDNN (dashed), at each N."""
    idx, ns = tflops_index(rows), sorted({r["N"] for r in rows})
    part_impls = {r["impl"] for r in rows if r["part"] is not None}

    def panel(ax, d, c):
        for impl in (i for i in impls_in(rows) if i in part_impls):
            for base, style in (("sdpa_flash", "-o"), ("sdpa_cudnn", "--s")):
                pts = [
                    (n, 100 * idx[(impl, d, c, n)] / idx[(base, d, c, n)])
                    for n in ns
                    if (impl, d, c, n) in idx and (base, d, c, n) in idx
                ]
                if pts:
                    colour = impl_style(impl)["color"]
                    ax.plot(
                        *zip(*pts), style, color=colour, label=f"{impl_label(impl)} / {impl_label(base)}", markersize=4
                    )
        ax.axhline(100, color="gray", lw=0.8)

    title = f"Parts as % of SDPA flash (solid) and SDPA cuDNN (dashed) — {rows[0]['gpu']}"
    return _panel_figure(panel, "% of SDPA backend", title)


def draw_bench(gpu_dir):
    """bench_tflops.png, bench_fwd_bwd.png (when bench.csv has forward + backward rows),
    bench_vs_sdpa.png and progression.png from bench.csv; returns the files written."""
    rows = read_csv(gpu_dir / "bench.csv")
    figures = [(tflops_figure, "bench_tflops.png"), (vs_sdpa_figure, "bench_vs_sdpa.png")]
    if any(r["mode"] == "fwd+bwd" for r in rows):
        figures.insert(1, (functools.partial(tflops_figure, mode="fwd+bwd"), "bench_fwd_bwd.png"))
    figures.append((progression_figure, "progression.png"))
    written = []
    for figure, name in figures:
        figure(rows).savefig(gpu_dir / name, dpi=110)
        written.append(gpu_dir / name)
    return written


PROGRESSION = dict(D=128, causal=1, N=4096)  # the one shape of the progression (B=4, H=8, bf16)
PROGRESSION_MODES = {"fwd": "forward", "fwd+bwd": "forward + backward"}
PROGRESSION_BASE = "sdpa_cudnn"  # the library the progression measures against: the fastest SDPA backend


def progression(rows):
    """The progression's numbers from bench.csv's do_bench rows: one entry per part (the registry's
    parts and any the CSV has), then SDPA cuDNN, each
    {"impl", mode: (TFLOP/s, N, SDPA cuDNN's TFLOP/s at that N) or None for each mode}.
    At N = PROGRESSION["N"]; a part never timed that long in a mode (part 0, Python loops: only up
    to N = 2048) is taken at its longest N at the progression's D and causal, beside cuDNN's there."""
    d, c, n = PROGRESSION["D"], PROGRESSION["causal"], PROGRESSION["N"]
    numbers = sorted(set(parts.available()) | {r["part"] for r in rows if r["part"] is not None})
    entries, idx = [], {mode: tflops_index(rows, mode=mode) for mode in PROGRESSION_MODES}
    for impl in [f"part{k}" for k in numbers] + [PROGRESSION_BASE]:
        entry = {"impl": impl}
        for mode in PROGRESSION_MODES:
            timed = [r for r in rows if r["impl"] == impl and r["mode"] == mode and r["ms"] is not None]
            at = n
            if timed and max(r["N"] for r in timed) < n:  # never timed this long: its longest N instead
                at = max((r["N"] for r in timed if (r["D"], r["causal"]) == (d, c)), default=n)
            mine = idx[mode].get((impl, d, c, at))
            entry[mode] = None if mine is None else (mine, at, idx[mode].get((PROGRESSION_BASE, d, c, at)))
        entries.append(entry)
    return entries


def _part_number(impl):
    return int(impl[4:]) if re.fullmatch(r"part\d+", impl) else None


def table_progression(gpu_dir):
    """One row per part at one shape: forward, and forward + backward, each beside its share of SDPA
    cuDNN's at the same shape and mode; SDPA cuDNN's own row last."""
    rows = read_csv(gpu_dir / "bench.csv")
    d, c, n = PROGRESSION["D"], PROGRESSION["causal"], PROGRESSION["N"]
    pytorch = pytorch_backward_parts()
    body, shorter, missing, entries = [], [], [], progression(rows)
    for e in entries:
        impl, ns = e["impl"], {x[1] for x in (e["fwd"], e["fwd+bwd"]) if x is not None and x[1] != n}
        at = ", ".join(map(str, sorted(ns)))
        shorter += [f"{impl_label(impl)} was timed only up to N = {at}: its row is at N = {at}"] if ns else []
        number = _part_number(impl)
        name = impl_label(impl) if number is None else f"[{impl_label(impl)}]({parts.folder(number).name}/README.md)"
        cells = [name + (f" (N = {at})" if ns else "")]
        for mode, what in PROGRESSION_MODES.items():
            x = e[mode]
            cells += ["—", "—"] if x is None else [tflops(x[0]), percent(x[0], x[2])]
            missing += [f"{impl_label(impl)} {what}"] if x is None else []
        if number is None:
            cells.append("cuDNN's")
        elif number in pytorch:
            cells.append("the tiled PyTorch loop (`common/backward.py`)")
        else:
            cells.append("its own kernels")
        body.append(cells)
    used = [r for r in rows if (r["D"], r["causal"]) == (d, c) and r["mode"] in PROGRESSION_MODES]
    used = [r for r in used if r["impl"] in {e["impl"] for e in entries}]
    header = [
        "implementation",
        "forward, TFLOP/s",
        "% of cuDNN",
        "forward + backward, TFLOP/s",
        "% of cuDNN",
        "backward",
    ]
    out = [
        provenance_line(used, "make bench && make report"),
        "",
        f"D = {d}, {'causal' if c else 'non-causal'}, N = {n}, B=4, H=8, bf16; TFLOP/s by do_bench (the backward "
        "counts 2.5 times the forward's FLOPs), each beside its share of SDPA cuDNN's at the same shape and mode:",
        "",
        markdown_table(header, body, "lrrrrl"),
    ]
    if shorter:
        note = f"{'; '.join(shorter)}, beside SDPA cuDNN's at that N."
        out += ["", note[:1].upper() + note[1:]]
    if missing:
        out += ["", f"—: not in bench.csv at this shape ({', '.join(missing)})."]
    return "\n".join(out)


def progression_figure(rows):
    """The progression as bars: per part, forward and forward + backward side by side (hatched, and
    labelled so, where the backward is the tiled PyTorch loop), SDPA cuDNN last and as a dashed line across; values on the bars."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    entries = progression(rows)
    pytorch = pytorch_backward_parts()
    d, c, n = PROGRESSION["D"], PROGRESSION["causal"], PROGRESSION["N"]
    colours = {"fwd": "tab:blue", "fwd+bwd": "tab:orange"}
    base_colours = {"fwd": "black", "fwd+bwd": "dimgray"}
    fig = Figure(figsize=(11, 5.5))
    ax = fig.subplots()
    width = 0.4
    for k, (mode, what) in enumerate(PROGRESSION_MODES.items()):
        heights = [0 if e[mode] is None else e[mode][0] for e in entries]
        xs = [i + (k - 0.5) * width for i in range(len(entries))]
        face = [base_colours[mode] if e["impl"] == PROGRESSION_BASE else colours[mode] for e in entries]
        bars = ax.bar(xs, heights, width, color=face, label=what)
        labels = []
        for bar, e in zip(bars, entries):
            x, loop = e[mode], mode == "fwd+bwd" and _part_number(e["impl"]) in pytorch
            if loop:
                bar.set_hatch("//")
            label = "—" if x is None else tflops(x[0]) + (f"\n(N={x[1]})" if x[1] != n else "")
            labels.append(label + ("\nPyTorch\nbackward" if loop and x is not None else ""))
        ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
        base = next((e[mode] for e in entries if e["impl"] == PROGRESSION_BASE), None)
        if base is not None:
            ax.axhline(base[0], color=base_colours[mode], ls="--", lw=0.8)
    ax.set_xticks(range(len(entries)), [impl_label(e["impl"]) for e in entries])
    ax.set_ylabel("TFLOP/s (do_bench)")
    ax.margins(y=0.15)
    handles = [Patch(color=colours[mode], label=what) for mode, what in PROGRESSION_MODES.items()]
    handles += [
        Line2D([], [], color=base_colours[mode], ls="--", lw=0.8, label=f"SDPA cuDNN, {what}")
        for mode, what in PROGRESSION_MODES.items()
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(
        f"One part at a time: D = {d}, {'causal' if c else 'non-causal'}, N = {n}, B=4, H=8, bf16 — {rows[0]['gpu']}"
    )
    fig.tight_layout()
    return fig


def table_part(gpu_dir, part):
    """Part `part`'s forward against the part before it and SDPA flash and cuDNN, at every N."""
    rows = read_csv(gpu_dir / "bench.csv")
    idx = tflops_index(rows)
    me, prev = f"part{part}", f"part{part - 1}"
    ns = sorted({r["N"] for r in rows})
    chosen = {(r["D"], r["causal"], r["N"]): r["backend"] for r in rows if r["impl"] == me and r["mode"] == "fwd"}
    show_cfg = any(chosen.values())
    cols = ([f"part {part - 1}"] if part > 0 else []) + [
        f"**part {part}**",
        "SDPA flash",
        "SDPA cuDNN",
        f"part {part} / flash",
        f"part {part} / cuDNN",
    ]
    cols += ["config"] if show_cfg else []
    body = []
    for d, c in PANELS:
        for n in ns:
            mine = idx.get((me, d, c, n))
            if mine is None:
                continue
            fl, cu = idx.get(("sdpa_flash", d, c, n)), idx.get(("sdpa_cudnn", d, c, n))
            cells = [d, yes_no(c), n]
            cells += [tflops(idx.get((prev, d, c, n)))] if part > 0 else []
            cells += [f"**{tflops(mine)}**", tflops(fl), tflops(cu), percent(mine, fl), percent(mine, cu)]
            cells += [chosen.get((d, c, n)) or ""] if show_cfg else []
            body.append(cells)
    align = "llr" + "r" * (len(cols) - show_cfg) + ("l" if show_cfg else "")
    compared = [r for r in rows if r["impl"] in (me, prev, "sdpa_flash", "sdpa_cudnn")]
    return "\n".join(
        [
            provenance_line(compared, f"make bench PART={part} && make report"),
            "",
            "Forward TFLOP/s, B=4, H=8, bf16" + (" (config: what the autotuner chose)" if show_cfg else "") + ":",
            "",
            markdown_table(["D", "causal", "N", *cols], body, align),
        ]
    )


def table_summary(gpu_dir, part, n, modes):
    """A part's number in four rows (D x causal) at one N: for each mode in `modes`, the part before,
    the part and SDPA cuDNN in TFLOP/s, and the part's share of cuDNN's."""
    rows = read_csv(gpu_dir / "bench.csv")
    me, prev = f"part{part}", f"part{part - 1}"
    header, body = ["D", "causal"], [[d, yes_no(c)] for d, c in PANELS]
    for mode in modes:
        idx = tflops_index(rows, mode=mode)
        before = [idx.get((prev, d, c, n)) for d, c in PANELS]
        shown = any(x is not None for x in before)  # part 0 was never timed this long: no column for it
        group = ([f"part {part - 1}"] if shown else []) + [f"**part {part}**", "cuDNN", f"part {part} / cuDNN"]
        header += [f"{PROGRESSION_MODES[mode]}: {group[0]}", *group[1:]]
        for cells, x, (d, c) in zip(body, before, PANELS):
            mine, cu = idx.get((me, d, c, n)), idx.get(("sdpa_cudnn", d, c, n))
            cells += [tflops(x)] * shown + [f"**{tflops(mine)}**", tflops(cu), percent(mine, cu)]
    used = [r for r in rows if r["impl"] in (me, prev, "sdpa_cudnn") and r["mode"] in modes and r["N"] == n]
    return "\n".join(
        [
            provenance_line(used, f"make bench PART={part} && make report"),
            "",
            f"TFLOP/s by do_bench at N = {n}, B=4, H=8, bf16"
            + (" (the backward counts 2.5 times the forward's FLOPs)" if "fwd+bwd" in modes else "")
            + ":",
            "",
            markdown_table(header, body, "ll" + "r" * (len(header) - 2)),
        ]
    )


def table_causal_time(gpu_dir, part):
    """Milliseconds with and without the causal mask: the same time means the same work was done."""
    rows = [r for r in read_csv(gpu_dir / "bench.csv") if r["mode"] == "fwd" and r["ms"] is not None]
    ms = {(r["D"], r["causal"], r["N"]): r["ms"] for r in rows if r["impl"] == f"part{part}"}
    flash = {(r["D"], r["causal"], r["N"]): r["ms"] for r in rows if r["impl"] == "sdpa_flash"}
    body = []
    for d in (64, 128):
        for n in sorted({n for _, _, n in ms}):
            if (d, 0, n) in ms and (d, 1, n) in ms and n >= 2048:
                fl = f"{flash[(d, 1, n)] / flash[(d, 0, n)]:.2f}" if (d, 0, n) in flash and (d, 1, n) in flash else "—"
                ratio = f"{ms[(d, 1, n)] / ms[(d, 0, n)]:.2f}"
                body.append([d, n, f"{ms[(d, 0, n)]:.3f}", f"{ms[(d, 1, n)]:.3f}", ratio, fl])
    header = [
        "D",
        "N",
        f"part {part}, non-causal",
        f"part {part}, causal",
        "causal / non-causal",
        "SDPA flash, causal / non-causal",
    ]
    return "\n".join(
        [
            "Milliseconds per forward (B=4, H=8, bf16); causal does half the useful work:",
            "",
            markdown_table(header, body, "lrrrrr"),
        ]
    )


def table_graph(gpu_dir, part):
    """do_bench (each call launched from Python) against CUDA-graph replay (GPU time alone); a line
    saying so for a part timed without a graph (part 0: thousands of small launches per call)."""
    rows = read_csv(gpu_dir / "bench.csv")
    timed, graph = tflops_index(rows), tflops_index(rows, "graph_ms")
    me = f"part{part}"
    if not any(key[0] == me for key in graph):
        return f"_bench.csv has no CUDA-graph times of part {part}'s forward._"
    body = []
    for d, c in PANELS:
        for n in sorted({r["N"] for r in rows}):
            if (me, d, c, n) not in timed:
                continue
            g, fg = graph.get((me, d, c, n)), graph.get(("sdpa_flash", d, c, n))
            body.append(
                [
                    d,
                    yes_no(c),
                    n,
                    tflops(timed[(me, d, c, n)]),
                    tflops(g),
                    tflops(timed.get(("sdpa_flash", d, c, n))),
                    tflops(fg),
                    percent(g, fg),
                ]
            )
    header = [
        "D",
        "causal",
        "N",
        f"part {part}",
        f"part {part}, graph",
        "SDPA flash",
        "SDPA flash, graph",
        f"part {part} / flash, graph",
    ]
    compared = [r for r in rows if r["impl"] in (me, "sdpa_flash")]
    return "\n".join(
        [
            provenance_line(compared, f"make bench PART={part} && make report"),
            "",
            f"Forward TFLOP/s of part {part} and SDPA flash, B=4, H=8, bf16, timed two ways: `do_bench` (the "
            "protocol: each call launched from Python after an L2 flush) and CUDA-graph replay (the launches "
            "recorded once and replayed back to back: no launch cost, and no flush, so inputs that fit in L2 "
            "stay there):",
            "",
            markdown_table(header, body, "llrrrrrr"),
        ]
    )


# ------------------------------------------------------------------------------------ code in the READMEs
class CodeError(ValueError):
    """A code marker whose file, function or anchor is not found, or whose anchor is on several lines.
    Its args are the problems, one line each."""


DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _level(body):
    """The statements of one level of a body, with those of module-level `if`/`try` blocks (a kernel
    defined under `if HAVE_GLUON:`) counted as the level's own."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _level(node.body + node.orelse + node.finalbody)
        else:
            yield node


def find_def(tree, name):
    """The def or class `name` in a parsed file; "Outer.inner" for one defined inside another. A def
    inside an `if` or `try` block at a level (a kernel under `if HAVE_GLUON:`) counts at that level.
    CodeError if it is not there, or defined twice at the same level."""
    node, body = None, tree.body
    for i, part in enumerate(name.split(".")):
        found = [n for n in _level(body) if isinstance(n, DEFS) and n.name == part]
        where = f"in {'.'.join(name.split('.')[:i])}" if i else "at its top level"
        if not found:
            raise CodeError(f"no function or class {part} {where}")
        if len(found) > 1:
            raise CodeError(f"{part} is defined {len(found)} times {where} (lines {_lines(found)})")
        node, body = found[0], found[0].body
    return node


def _lines(found):
    return ", ".join(str(getattr(x, "lineno", x)) for x in found)


def _docstring_lines(node, lines):
    """The line numbers of a def's docstring and the blank lines after it; none if the docstring is
    all of the body (the def would be left empty) or shares the def's line."""
    first = node.body[0]
    if not (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    ):
        return set()
    if len(node.body) == 1 or first.lineno == node.lineno:
        return set()
    end = first.end_lineno
    while end < node.end_lineno and not lines[end].strip():  # lines[end]: the line after line `end`
        end += 1
    return set(range(first.lineno, end + 1))


def _anchors(text):
    """from=TEXT,to=TEXT | from=TEXT | to=TEXT -> (from text or None, to text or None)."""
    if text.startswith("from="):
        start, sep, end = text.removeprefix("from=").partition(",to=")
        end = end if sep else None
    elif text.startswith("to="):
        start, end = None, text.removeprefix("to=")
    else:
        raise CodeError(f"after the name, expected from=TEXT,to=TEXT, from=TEXT or to=TEXT, not {text!r}")
    if start == "" or end == "":
        raise CodeError("an anchor's text is empty")
    return start, end


def code_excerpt(spec, root=None):
    """The source a code marker names: spec is PATH:NAME or PATH:NAME:ANCHORS (see the module's
    docstring), PATH relative to root (default: the repository's). Returns the lines, dedented.
    CodeError says what is missing."""
    root = Path(root or ROOT)
    path, _, rest = spec.partition(":")
    name, _, anchors = rest.partition(":")
    if not path or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise CodeError("expected PATH:NAME or PATH:NAME:from=TEXT,to=TEXT")
    file = (root / path).resolve()
    step = re.fullmatch(r"part(\d+)_\w+/steps/([a-z]*\d+)", path)  # a ladder's step: its kernel file
    if step:
        try:
            ladder, i = steps.find(int(step[1]), step[2])
        except ValueError as e:
            raise CodeError(str(e)) from None
        source = steps.sources(int(step[1]), ladder[0].ladder)[i + 1]
    elif not file.is_relative_to(root.resolve()) or not file.is_file():
        raise CodeError(f"there is no file {path} in the repository")
    else:
        source = file.read_text()
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise CodeError(f"{path} does not parse: {e.msg} (line {e.lineno})") from None
    try:
        node = find_def(tree, name)
    except CodeError as e:
        raise CodeError(f"{path}: {e}") from None
    lines = source.splitlines()
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    last = node.end_lineno
    if not anchors:
        skip = _docstring_lines(node, lines)
        keep = [lines[i - 1] for i in range(first, last + 1) if i not in skip]
    else:
        start, end = _anchors(anchors)
        lo = first if start is None else _statement(node, _line_with(lines, first, last, start, "from", name))[0]
        hi = last if end is None else _statement(node, _line_with(lines, lo, last, end, "to", name))[1]
        keep = lines[lo - 1 : hi]
    return textwrap.dedent("\n".join(keep)).strip("\n")


COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match, *DEFS)


def _statement(node, line):
    """(first, last) line of what an anchor on `line` of the def `node` stands for: the whole simple
    statement around it (a call spread over several lines), and a compound statement (if, for,
    with, def) that starts on it, with its block; the line alone when it is in no statement (a comment)."""
    first, last = line, line
    for s in ast.walk(node):
        if isinstance(s, ast.stmt) and s is not node and s.lineno <= line <= s.end_lineno:
            if not isinstance(s, COMPOUND):
                first, last = min(first, s.lineno), max(last, s.end_lineno)
            elif s.lineno == line:
                last = max(last, s.end_lineno)
    return first, last


def _line_with(lines, lo, hi, text, what, name):
    """The one line number in lo..hi (1-based, inclusive) whose line contains text."""
    found = [i for i in range(lo, hi + 1) if text in lines[i - 1]]
    where = f"{name}" if what == "from" else f"{name} from line {lo} on"
    if not found:
        raise CodeError(f"the {what} text {text!r} is on no line of {where}")
    if len(found) > 1:
        raise CodeError(f"the {what} text {text!r} is on {len(found)} lines of {where} (lines {_lines(found)})")
    return found[0]


def fill_code(text, root=None):
    """text with every code block rebuilt from the file it names. CodeError naming each marker
    whose code is not found, and each opening marker without its closing one."""
    problems = []

    def one(m):
        try:
            code = code_excerpt(m.group(2), root)
        except CodeError as e:
            problems.append(f"<!-- code:{m.group(2)} -->: {e}")
            return m.group(0)
        return f"{m.group(1)}```python\n{code}\n```\n{m.group(4)}"

    new = CODE.sub(one, text)
    closed = {m.start() for m in CODE.finditer(text)}
    for m in CODE_OPENING.finditer(text):
        if m.start() not in closed:
            problems.append(f"<!-- code:{m.group(1)} -->: no closing <!-- /code:{m.group(1)} --> after it")
    if problems:
        raise CodeError(*problems)
    return new


# ------------------------------------------------------------------------------------ the READMEs
REPORT_MODULES = ("report", "tools.report")  # where a part keeps its report module, inside its folder


def _part_modules(names):
    """The modules of each part folder found under any of `names` ("report" or "tools.report": its
    top or its tools/ subfolder), imported, in part order."""
    return [
        importlib.import_module(f"{folder.name}.{name}")
        for folder in parts.folders().values()
        for name in names
        if (folder / (name.replace(".", "/") + ".py")).exists()
    ]


def part_reports():
    """Each part's own report module (part<N>_<topic>/report.py or part<N>_<topic>/tools/report.py), in
    part order."""
    return _part_modules(REPORT_MODULES)


def all_tables(reports):
    """{marker name: function(gpu_dir) -> markdown}: the tables above, then every part report's TABLES.
    ValueError if a name is taken twice."""
    tables = {"cold-start": coldstart.table, "cold-start-summary": coldstart.summary, "train-step": train_step.table}
    tables["progression"] = table_progression
    for n in parts.folders():
        tables[f"part{n}"] = functools.partial(table_part, part=n)
        tables[f"part{n}-graph"] = functools.partial(table_graph, part=n)
        tables[f"part{n}-causal"] = functools.partial(table_causal_time, part=n)
        # A part's number in four rows: the forward, the forward + backward, or both (a README picks one).
        tables[f"part{n}-fwd-4096"] = functools.partial(table_summary, part=n, n=4096, modes=("fwd",))
        tables[f"part{n}-fwdbwd-4096"] = functools.partial(table_summary, part=n, n=4096, modes=("fwd+bwd",))
        tables[f"part{n}-both-16384"] = functools.partial(
            table_summary, part=n, n=16384, modes=tuple(PROGRESSION_MODES)
        )
    owner = dict.fromkeys(tables, __name__)
    for module in reports:
        for name, table in module.TABLES.items():
            if name in tables:
                taken = f"table {name!r} of {module.__name__} is taken by {owner[name]}"
                raise ValueError(f"{taken}: marker names are global")
            tables[name], owner[name] = table, module.__name__
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
    """text with every results block rebuilt from the CSVs in gpu_dir (a table whose CSV is missing
    says so in its block instead) and every code block from the file it names (fill_code: CodeError
    when the code is not found)."""
    text = MARKER.sub(lambda m: f"{m.group(1)}{render(tables[m.group(2)], gpu_dir)}\n{m.group(4)}", text)
    return fill_code(text, root)


FIGURE_MODULES = ("figures", "tools.figures")  # where a part keeps its figures module, inside its folder


def figure_modules():
    """Each part's figures.py, at its top or in its tools/ subfolder (pictures drawn from code, not
    from results: draw() -> the files it wrote), in part order."""
    return _part_modules(FIGURE_MODULES)


# ------------------------------------------------------------------------------------ the results logs
COMMON_LOG = (  # (heading, what it measured, table name) of the tables above about part {n}
    (
        "The forward against the part before and SDPA",
        "Forward TFLOP/s by `do_bench` at every shape the benchmark timed, beside the part before and SDPA's "
        "flash and cuDNN backends at the same shape.",
        "part{n}",
    ),
    (
        "do_bench against CUDA-graph replay",
        "The same forwards timed two ways: launched from Python one call at a time (`do_bench`), and replayed "
        "from a CUDA graph, which leaves the GPU's time alone.",
        "part{n}-graph",
    ),
    (
        "What the causal mask costs",
        "Milliseconds per forward with and without the causal mask, which halves the useful work, from N = 2048 on.",
        "part{n}-causal",
    ),
)


def part_of(module):
    """The part number of a part's module (part3_inner_loop.report -> 3)."""
    return int(parts.PATTERN.fullmatch(module.__name__.split(".")[0]).group(1))


def log_entries(n, report=None):
    """[(heading, sentence, table name)] of part n's results log: COMMON_LOG for part n (those its
    report's LOG does not place itself), then its report module's LOG, then any table of its TABLES
    that LOG does not name, under its marker name."""
    own = list(getattr(report, "LOG", ()))
    named = {name for _, _, name in own}
    common = [(h, s, t.format(n=n)) for h, s, t in COMMON_LOG if t.format(n=n) not in named]
    named |= set(getattr(report, "README_ONLY", ()))  # lines the lesson quotes from a table the log holds whole
    rest = [(name, "Not described in the part's LOG yet.", name) for name in getattr(report, "TABLES", {})]
    return common + own + [e for e in rest if e[2] not in named]


def part_log(n, folder, entries, tables, gpu_dir):
    """The markdown of part n's results log: a title, a line saying where it comes from and linking
    the part's README, then each entry's heading, sentence and table."""
    topic = folder.name.split("_", 1)[1].replace("_", " ") if "_" in folder.name else folder.name
    readme = Path(os.path.relpath(folder / "README.md", gpu_dir)).as_posix()
    out = [
        f"# Part {n} ({topic}): results log",
        "",
        f"_Every table about part {n}, generated by `make report` from the files in results/{gpu_dir.name}/ "
        f"(do not edit: the report rewrites this file). The lesson is [{folder.name}/README.md]({readme})._",
    ]
    for heading, sentence, name in entries:
        out += ["", f"## {heading}", "", sentence, "", render(tables[name], gpu_dir)]
    return "\n".join(out) + "\n"


def log_path(gpu_dir, n):
    return gpu_dir / f"part{n}_log.md"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h200", help="the results/<gpu>/ folder to read (default: h200)")
    ap.add_argument("--readme", action="append", help="fill only this README (repeatable); default: every README")
    args = ap.parse_args(argv)
    gpu_dir = results.results_dir(args.gpu)
    if not gpu_dir.is_dir():
        print(
            f"there is no results/{args.gpu}/; the results folders are: {', '.join(results.gpu_folders())}",
            file=sys.stderr,
        )
        return 2
    reports = part_reports()
    try:
        tables = all_tables(reports)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    chosen = None if not args.readme else {(ROOT / r).resolve() for r in args.readme}
    texts = {path: path.read_text() for path in readmes() if chosen is None or path.resolve() in chosen}
    unknown = [f"{results.shown(p)}: {m[1]}" for p, t in texts.items() for m in MARKER.findall(t) if m[1] not in tables]
    if unknown:
        print(f"no table for the README marker(s) {'; '.join(unknown)}", file=sys.stderr)
        return 2
    by_part = {part_of(module): module for module in reports}
    logs = {n: log_entries(n, by_part.get(n)) for n in parts.folders()}
    unlisted = [
        f"LOG of {by_part[n].__name__}: {name}" for n, es in logs.items() for _, _, name in es if name not in tables
    ]
    if unlisted:
        print(f"no table for the results log entr(ies) {'; '.join(unlisted)}", file=sys.stderr)
        return 2
    new, missing = {}, []
    for path, text in texts.items():
        try:
            new[path] = fill(text, tables, gpu_dir)
        except CodeError as e:
            missing += [f"{results.shown(path)}: {problem}" for problem in e.args]
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 2
    folders = parts.folders()
    new_logs = {log_path(gpu_dir, n): part_log(n, folders[n], entries, tables, gpu_dir) for n, entries in logs.items()}

    drawn = draw_bench(gpu_dir) if (gpu_dir / "bench.csv").exists() else []
    for module in reports:
        drawn += module.draw(gpu_dir) if hasattr(module, "draw") else []
    for module in figure_modules():
        drawn += module.draw()
    for path in drawn:
        print(f"drew {results.shown(path)}")
    for path, text in new.items():
        if text != texts[path]:
            path.write_text(text)
            print(f"updated {results.shown(path)}")
    for path, text in new_logs.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"updated {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
