"""Part 3's tables and figures (common/report.py puts them in the README and the results log): its sweep,
the ablation (part 2 -> part 3 one change at a time), the launch order, the cost of casting P, the
tile-skipping picture."""

from common import sweep_report
from common.report import PANELS, per_shape, tflops
from common.results import markdown_table, read_csv, table_block
from part3_inner_loop import tiles
from part3_inner_loop.ablation import LABELS


def _ablation(gpu_dir):
    rows = read_csv(gpu_dir / "part3_ablation.csv")
    return rows, {(r["step"], r["D"], r["causal"], r["N"]): r for r in rows if r["tflops"] is not None}


def table_ablation(gpu_dir):
    """TFLOP/s of every step at N = 4096 and 16384, each (D, causal) a row."""
    rows, index = _ablation(gpu_dir)

    def cells(d, c, n):
        found = [index.get((s, d, c, n)) for s in range(len(LABELS))]
        return [tflops(r and r["tflops"]) for r in found] if any(found) else None

    caption = "Forward TFLOP/s, B=4, H=8, bf16, do_bench (the protocol); each column adds one change to the one before:"
    body, header = per_shape((4096, 16384), cells), ["D", "causal", "N", *LABELS]
    return table_block(
        rows, "python -m part3_inner_loop.ablation && make report", caption, header, body, "llr" + "r" * len(LABELS)
    )


def table_step_gains(gpu_dir):
    """Each step's speed-up over the step before, smallest to largest over N >= 2048."""
    rows, index = _ablation(gpu_dir)
    ns, body = sorted({r["N"] for r in rows if r["N"] >= 2048}), []
    for s in range(1, len(LABELS)):
        cells = []
        for d, c in PANELS:
            keys = [((s, d, c, n), (s - 1, d, c, n)) for n in ns]
            gains = [index[a]["tflops"] / index[b]["tflops"] for a, b in keys if a in index and b in index]
            cells.append(f"{min(gains):.2f}x - {max(gains):.2f}x" if gains else "—")
        body.append([LABELS[s], *cells])
    caption = (
        f"Speed-up of each step over the one before (do_bench), smallest to largest over N = {', '.join(map(str, ns))}:"
    )
    header = ["step", *(f"D={d}{' causal' if c else ''}" for d, c in PANELS)]
    return table_block(rows, "python -m part3_inner_loop.ablation && make report", caption, header, body, "lrrrr")


def ablation_figure(rows):
    """TFLOP/s against N, one line per step, one panel per (D, causal)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8))
    for ax, (d, c) in zip(fig.subplots(2, 2, sharex=True).flat, PANELS):
        for s, label in enumerate(LABELS):
            mine = [r for r in rows if (r["step"], r["D"], r["causal"]) == (s, d, c) and r["tflops"] is not None]
            if pts := sorted((r["N"], r["tflops"]) for r in mine):
                ax.plot(*zip(*pts), "-o", markersize=4, label=label)
        ax.set_xscale("log", base=2)
        ax.set(title=f"D={d}, {'causal' if c else 'non-causal'}", xlabel="N (sequence length)", ylabel="TFLOP/s")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    fig.suptitle(f"Part 3's changes one at a time, forward, B=4, H=8, bf16 — {rows[0]['gpu']}")
    fig.tight_layout()
    return fig


def table_launch_order(gpu_dir):
    """TFLOP/s of each launch order (CUDA-graph replay) per (D, causal, N); the shipped one in bold."""
    rows = read_csv(gpu_dir / "part3_launch_order.csv")
    orders = list(dict.fromkeys(r["order"] for r in rows))
    index = {(r["order"], r["D"], r["causal"], r["N"]): r for r in rows}

    def cell(r):
        shown = "—" if r is None or r["graph_tflops"] is None else tflops(r["graph_tflops"])
        return f"**{shown}**" if shown != "—" and r["shipped"] else shown

    def cells(d, c, n):
        found = [index.get((o, d, c, n)) for o in orders]
        return [cell(r) for r in found] if any(found) else None

    caption = (
        "Forward TFLOP/s (CUDA-graph replay), B=4, H=8, bf16, each order with the tiles the autotuner "
        "picked for it; **bold**: the order that commit's kernel used for that case:"
    )
    body, header = per_shape(sorted({r["N"] for r in rows}), cells), ["D", "causal", "N", *orders]
    return table_block(
        rows, "python -m part3_inner_loop.launch_order && make report", caption, header, body, "llr" + "r" * len(orders)
    )


def table_p_cast(gpu_dir):
    """max |O - O_ref| for each variant, dtype, score size and N; then the speed of each variant."""
    rows = read_csv(gpu_dir / "part3_p_cast.csv")
    acc, speed = [r for r in rows if r["what"] == "accuracy"], [r for r in rows if r["what"] == "speed"]
    variants = list(dict.fromkeys(r["variant"] for r in acc))
    err = {(r["variant"], r["dtype"], r["score_std"], r["N"]): r["err"] for r in acc}
    keys = sorted({(r["dtype"], r["score_std"], r["N"]) for r in acc})
    body = [[dt, f"{std:g}", n, *(f"{err[(v, dt, std, n)]:.1e}" for v in variants)] for dt, std, n in keys]
    a, s = acc[0], speed[0]
    caption = (
        f"max abs error of O against the float64 reference (B={a['B']}, H={a['H']}, D={a['D']}, non-causal; "
        "std of S: the scores' standard deviation):"
    )
    return "\n".join(
        [
            table_block(
                rows,
                "python -m part3_inner_loop.p_cast && make report",
                caption,
                ["dtype", "std of S", "N", *variants],
                body,
                "llr" + "r" * len(variants),
            ),
            "",
            f"Speed, forward TFLOP/s (B={s['B']}, H={s['H']}, N={s['N']}, bf16, non-causal):",
            "",
            markdown_table(
                ["variant", "D", "TFLOP/s"], [[r["variant"], r["D"], tflops(r["tflops"])] for r in speed], "lrr"
            ),
        ]
    )


def p_cast_figure(rows):
    from matplotlib.figure import Figure

    acc = [r for r in rows if r["what"] == "accuracy"]
    stds = sorted({r["score_std"] for r in acc})
    fig = Figure(figsize=(12, 4.5 * len(stds)))
    axes = fig.subplots(len(stds), 2, squeeze=False)
    for row_axes, std in zip(axes, stds):
        for ax, dt in zip(row_axes, ("bf16", "fp16")):
            for v in dict.fromkeys(r["variant"] for r in acc):
                pts = sorted(
                    (r["N"], r["err"]) for r in acc if (r["variant"], r["dtype"], r["score_std"]) == (v, dt, std)
                )
                ax.plot(*zip(*pts), "-o", markersize=4, label=v)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set(title=f"{dt} inputs, scores with standard deviation {std:g}", xlabel="N", ylabel="max |O - O_ref|")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"What casting P before P V costs in accuracy — {acc[0]['gpu']}")
    fig.tight_layout()
    return fig


def draw(gpu_dir):
    written = [tiles.draw()]
    if (gpu_dir / "part3_sweep.csv").exists():
        written.append(sweep_report.draw_heatmaps(gpu_dir, "part3", "Part 3"))
    for name, figure in (("part3_ablation", ablation_figure), ("part3_p_cast", p_cast_figure)):
        if (gpu_dir / f"{name}.csv").exists():
            figure(read_csv(gpu_dir / f"{name}.csv")).savefig(gpu_dir / f"{name}.png", dpi=110)
            written.append(gpu_dir / f"{name}.png")
    return written


TABLES = {
    "part3-sweep": lambda g: sweep_report.table_sweep(g, "part3", "part3_inner_loop.sweep"),
    "part3-ablation": table_ablation,
    "part3-step-gains": table_step_gains,
    "part3-launch-order": table_launch_order,
    "part3-p-cast": table_p_cast,
}
