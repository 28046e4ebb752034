"""Results CSVs -> README tables and the cross-part plots. Nothing here measures anything.

    python -m common.report               # from results/h200/ (make report)
    python -m common.report --gpu rtx-4090

README files carry generated blocks between markers:

    <!-- results:NAME -->  ...generated...  <!-- /results:NAME -->

Re-running replaces each block with a table built from the CSVs, so a number in a README is never
typed by hand. The tables that read only bench.csv are here: `overview`, and for every part N
`partN` (its forward against the part before and SDPA), `partN-graph` (do_bench against CUDA-graph
replay) and `partN-causal` (milliseconds with and without the mask). Everything else belongs to a
part: a part folder with a report.py (at its top, or in its tools/ subfolder with the studies it
reports) gives its TABLES (marker name -> function(gpu_dir) -> markdown) and, if it draws figures
from its CSVs, draw(gpu_dir) -> the files it wrote. Marker names are
global, so two tables with one name are an error, and so is a marker no table has.
"""

import argparse
import functools
import importlib
import re
import sys
from pathlib import Path

from common import ROOT, parts, results
from common.impls import FLEX, SDPA_BACKENDS, impl_label
from common.results import markdown_table, provenance_line, read_csv
from common.timing import attention_flops

MARKER = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)
PANELS = [(64, 0), (64, 1), (128, 0), (128, 1)]  # (D, causal): the benchmark's four groups


def tflops(x):
    """TFLOP/s for a table: whole numbers, one decimal below 10, two significant digits below 1."""
    return "—" if x is None else f"{x:.2g}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def percent(a, b):
    if not a or not b:
        return "—"
    return "<1%" if 100 * a / b < 1 else f"{100 * a / b:.0f}%"


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
        + [name for name in (FLEX,) if name in part_of]
    )


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
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def tflops_figure(rows):
    """Forward TFLOP/s against N: one line per implementation (parts solid, SDPA dashed) in each panel."""
    idx, ns = tflops_index(rows), sorted({r["N"] for r in rows})
    part_impls = {r["impl"] for r in rows if r["part"] is not None}

    def panel(ax, d, c):
        for impl in impls_in(rows):
            pts = [(n, idx[(impl, d, c, n)]) for n in ns if (impl, d, c, n) in idx]
            if pts:
                ax.plot(*zip(*pts), "-o" if impl in part_impls else "--", label=impl_label(impl), markersize=4)

    return _panel_figure(panel, "TFLOP/s", f"Forward, B=4, H=8, bf16 — {rows[0]['gpu']}")


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
                    ax.plot(*zip(*pts), style, label=f"{impl_label(impl)} / {impl_label(base)}", markersize=4)
        ax.axhline(100, color="gray", lw=0.8)

    title = f"Parts as % of SDPA flash (solid) and SDPA cuDNN (dashed) — {rows[0]['gpu']}"
    return _panel_figure(panel, "% of SDPA backend", title)


def draw_bench(gpu_dir):
    """bench_tflops.png and bench_vs_sdpa.png from bench.csv; returns the files written."""
    rows = read_csv(gpu_dir / "bench.csv")
    written = []
    for figure, name in ((tflops_figure, "bench_tflops.png"), (vs_sdpa_figure, "bench_vs_sdpa.png")):
        figure(rows).savefig(gpu_dir / name, dpi=110)
        written.append(gpu_dir / name)
    return written


def table_overview(gpu_dir):
    rows = read_csv(gpu_dir / "bench.csv")
    idx = tflops_index(rows)
    header = ["implementation", "D=64", "D=64 causal", "D=128", "D=128 causal"]
    body = [[impl_label(impl), *(tflops(idx.get((impl, d, c, 4096))) for d, c in PANELS)] for impl in impls_in(rows)]
    out = [
        provenance_line(rows, "make bench && make report"),
        "",
        "Forward TFLOP/s at N = 4096 (B=4, H=8, bf16):",
        "",
        markdown_table(header, body, "lrrrr"),
    ]
    untimed = [impl for impl in impls_in(rows) if all(idx.get((impl, d, c, 4096)) is None for d, c in PANELS)]
    if untimed:
        out += ["", f"—: not timed at N = 4096 ({', '.join(map(impl_label, untimed))}; bench.csv has what was timed)."]
    dispatched = sorted({r["backend"] for r in rows if r["impl"] == "sdpa_default" and r["backend"]})
    if dispatched:
        out += ["", f"SDPA's default dispatch ran: {', '.join(dispatched)} (read off the profiler)."]
    return "\n".join(out)


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
    """do_bench (each call launched from Python) against CUDA-graph replay (GPU time alone)."""
    rows = read_csv(gpu_dir / "bench.csv")
    timed, graph = tflops_index(rows), tflops_index(rows, "graph_ms")
    me = f"part{part}"
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


# ------------------------------------------------------------------------------------ the READMEs
REPORT_MODULES = ("report", "tools.report")  # where a part keeps its report module, inside its folder


def part_reports():
    """Each part's own report module (part<N>_<topic>/report.py or part<N>_<topic>/tools/report.py), in
    part order."""
    found = []
    for folder in parts.folders().values():
        for name in REPORT_MODULES:
            if (folder / (name.replace(".", "/") + ".py")).exists():
                found.append(importlib.import_module(f"{folder.name}.{name}"))
    return found


def all_tables(reports):
    """{marker name: function(gpu_dir) -> markdown}: the tables above, then every part report's TABLES.
    ValueError if a name is taken twice."""
    tables = {"overview": table_overview}
    for n in parts.folders():
        tables[f"part{n}"] = functools.partial(table_part, part=n)
        tables[f"part{n}-graph"] = functools.partial(table_graph, part=n)
        tables[f"part{n}-causal"] = functools.partial(table_causal_time, part=n)
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


def fill(text, tables, gpu_dir):
    """text with every marker block rebuilt from the CSVs in gpu_dir. A table whose CSV is missing
    says so in its block instead."""

    def one(m):
        try:
            body = tables[m.group(2)](gpu_dir)
        except FileNotFoundError as e:
            body = f"_No results yet ({Path(e.filename).name} missing): run the command that writes it._"
        return f"{m.group(1)}{body}\n{m.group(4)}"

    return MARKER.sub(one, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h200", help="the results/<gpu>/ folder to read (default: h200)")
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
    texts = {path: path.read_text() for path in readmes()}
    unknown = [f"{results.shown(p)}: {m[1]}" for p, t in texts.items() for m in MARKER.findall(t) if m[1] not in tables]
    if unknown:
        print(f"no table for the README marker(s) {'; '.join(unknown)}", file=sys.stderr)
        return 2
    new = {path: fill(text, tables, gpu_dir) for path, text in texts.items()}

    drawn = draw_bench(gpu_dir) if (gpu_dir / "bench.csv").exists() else []
    for module in reports:
        drawn += module.draw(gpu_dir) if hasattr(module, "draw") else []
    for path in drawn:
        print(f"drew {results.shown(path)}")
    for path, text in new.items():
        if text != texts[path]:
            path.write_text(text)
            print(f"updated {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
