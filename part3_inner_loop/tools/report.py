"""Part 3's tables and figures (lab/report.py puts them in the README and the results log): its sweep,
the ablation (part 2 -> part 3 one change at a time), the tile-skipping picture."""

from lab import sweep_report
from lab.report import PANELS, per_shape, plot, tflops
from lab.results import read_csv, table_block
from part3_inner_loop.tools.ablation import LABELS


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
        rows,
        "python -m part3_inner_loop.tools.ablation && make report",
        caption,
        header,
        body,
        "llr" + "r" * len(LABELS),
    )


def table_step_gains(gpu_dir):
    """Each step's speed-up over the step before, smallest to largest over N >= 2048."""
    rows, index = _ablation(gpu_dir)
    ns = sorted({r["N"] for r in rows if r["N"] >= 2048})

    def gains(s, d, c):
        over = [(index.get((s, d, c, n)), index.get((s - 1, d, c, n))) for n in ns]
        gain = [a["tflops"] / b["tflops"] for a, b in over if a and b]
        return f"{min(gain):.2f}x - {max(gain):.2f}x" if gain else "—"

    body = [[LABELS[s], *(gains(s, d, c) for d, c in PANELS)] for s in range(1, len(LABELS))]
    caption = (
        f"Speed-up of each step over the one before (do_bench), smallest to largest over N = {', '.join(map(str, ns))}:"
    )
    header = ["step", *(f"D={d}{' causal' if c else ''}" for d, c in PANELS)]
    return table_block(rows, "python -m part3_inner_loop.tools.ablation && make report", caption, header, body, "lrrrr")


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


def draw(gpu_dir):
    return [
        *sweep_report.draw_heatmaps(gpu_dir, "part3", "Part 3"),
        *plot(gpu_dir, "part3_ablation.csv", "part3_ablation.png", ablation_figure),
    ]


TABLES = {
    "part3-sweep": lambda g: sweep_report.table_sweep(g, "part3", "part3_inner_loop.tools.sweep"),
    "part3-ablation": table_ablation,
    "part3-step-gains": table_step_gains,
}
