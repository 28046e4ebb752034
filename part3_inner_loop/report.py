"""Part 3's tables and figures: its sweep, the ablation (part 2 -> part 3 one change at a time), the
cost of casting P, and the tile-skipping picture. `make report` fills the README blocks named in
TABLES and calls draw(); the sweep's tables and heatmaps are common/sweep_report.py's, given part 3's files.
"""

from common import sweep_report
from common.report import PANELS, tflops, yes_no
from common.results import markdown_table, provenance_line, read_csv
from part3_inner_loop import tiles
from part3_inner_loop.ablation import LABELS


def _ablation(gpu_dir):
    rows = read_csv(gpu_dir / "part3_ablation.csv")
    return rows, {(r["step"], r["D"], r["causal"], r["N"]): r for r in rows if r["tflops"] is not None}


def table_ablation(gpu_dir, column="tflops"):
    """TFLOP/s of every step at N = 4096 and 16384, each (D, causal) a row; then the gain of each step."""
    rows, index = _ablation(gpu_dir)
    body = []
    for d, c in PANELS:
        for n in (4096, 16384):
            cells = [index.get((s, d, c, n)) for s in range(len(LABELS))]
            if any(cells):
                body.append([d, yes_no(c), n, *(tflops(r and r[column]) for r in cells)])
    what = "do_bench (the protocol)" if column == "tflops" else "CUDA-graph replay"
    return "\n".join(
        [
            provenance_line(rows, "python -m part3_inner_loop.ablation && make report"),
            "",
            f"Forward TFLOP/s, B=4, H=8, bf16, {what}; each column adds one change to the one before:",
            "",
            markdown_table(["D", "causal", "N", *LABELS], body, "llr" + "r" * len(LABELS)),
        ]
    )


def table_step_gains(gpu_dir):
    """Each step's speed-up over the step before, at every N measured: min-max over N >= 2048."""
    rows, index = _ablation(gpu_dir)
    ns = sorted({r["N"] for r in rows if r["N"] >= 2048})
    body = []
    for s in range(1, len(LABELS)):
        cells = []
        for d, c in PANELS:
            gains = [
                index[(s, d, c, n)]["tflops"] / index[(s - 1, d, c, n)]["tflops"]
                for n in ns
                if (s, d, c, n) in index and (s - 1, d, c, n) in index
            ]
            cells.append(f"{min(gains):.2f}x - {max(gains):.2f}x" if gains else "—")
        body.append([LABELS[s], *cells])
    header = ["step", *(f"D={d}{' causal' if c else ''}" for d, c in PANELS)]
    return "\n".join(
        [
            f"Speed-up of each step over the one before (do_bench), smallest to largest over N = "
            f"{', '.join(map(str, ns))}:",
            "",
            markdown_table(header, body, "lrrrr"),
        ]
    )


def ablation_figure(rows):
    """TFLOP/s against N, one line per step, one panel per (D, causal)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8))
    for ax, (d, c) in zip(fig.subplots(2, 2, sharex=True).flat, PANELS):
        for s, label in enumerate(LABELS):
            pts = sorted(
                (r["N"], r["tflops"])
                for r in rows
                if (r["step"], r["D"], r["causal"]) == (s, d, c) and r["tflops"] is not None
            )
            if pts:
                ax.plot(*zip(*pts), "-o", markersize=4, label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d}, {'causal' if c else 'non-causal'}")
        ax.set_xlabel("N (sequence length)")
        ax.set_ylabel("TFLOP/s")
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
    body = []
    for d, c in PANELS:
        for n in sorted({r["N"] for r in rows}):
            cells = [index.get((o, d, c, n)) for o in orders]
            if any(cells):
                body.append([d, yes_no(c), n, *(_marked(r) for r in cells)])
    return "\n".join(
        [
            provenance_line(rows, "python -m part3_inner_loop.launch_order && make report"),
            "",
            "Forward TFLOP/s (CUDA-graph replay), B=4, H=8, bf16, each order with the tiles the autotuner "
            "picked for it; **bold**: the order that commit's kernel used for that case:",
            "",
            markdown_table(["D", "causal", "N", *orders], body, "llr" + "r" * len(orders)),
        ]
    )


def _marked(row):
    if row is None or row["graph_tflops"] is None:
        return "—"
    return f"**{tflops(row['graph_tflops'])}**" if row["shipped"] else tflops(row["graph_tflops"])


def table_p_cast(gpu_dir):
    """max |O - O_ref| for each variant, dtype, score size and N; then the speed of each variant."""
    rows = read_csv(gpu_dir / "part3_p_cast.csv")
    acc = [r for r in rows if r["what"] == "accuracy"]
    variants = list(dict.fromkeys(r["variant"] for r in acc))
    keys = sorted({(r["dtype"], r["score_std"], r["N"]) for r in acc}, key=lambda k: (k[0], k[1], k[2]))
    err = {(r["variant"], r["dtype"], r["score_std"], r["N"]): r["err"] for r in acc}
    body = [[dt, f"{std:g}", n, *(f"{err[(v, dt, std, n)]:.1e}" for v in variants)] for dt, std, n in keys]
    speed = [r for r in rows if r["what"] == "speed"]
    speed_body = [[r["variant"], r["D"], tflops(r["tflops"])] for r in speed]
    return "\n".join(
        [
            provenance_line(rows, "python -m part3_inner_loop.p_cast && make report"),
            "",
            f"max abs error of O against the float64 reference (B={acc[0]['B']}, H={acc[0]['H']}, "
            f"D={acc[0]['D']}, non-causal; std of S: the scores' standard deviation):",
            "",
            markdown_table(["dtype", "std of S", "N", *variants], body, "llr" + "r" * len(variants)),
            "",
            f"Speed, forward TFLOP/s (B={speed[0]['B']}, H={speed[0]['H']}, N={speed[0]['N']}, bf16, non-causal):",
            "",
            markdown_table(["variant", "D", "TFLOP/s"], speed_body, "lrr"),
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
            ax.set_title(f"{dt} inputs, scores with standard deviation {std:g}")
            ax.set_xlabel("N")
            ax.set_ylabel("max |O - O_ref|")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"What casting P before P V costs in accuracy — {acc[0]['gpu']}")
    fig.tight_layout()
    return fig


def draw(gpu_dir):
    written = [tiles.draw()]
    if (gpu_dir / "part3_sweep.csv").exists():
        written.append(sweep_report.draw_heatmaps(gpu_dir, "part3", "Part 3"))
    for csv, figure, png in (
        ("part3_ablation.csv", ablation_figure, "part3_ablation.png"),
        ("part3_p_cast.csv", p_cast_figure, "part3_p_cast.png"),
    ):
        if (gpu_dir / csv).exists():
            figure(read_csv(gpu_dir / csv)).savefig(gpu_dir / png, dpi=110)
            written.append(gpu_dir / png)
    return written


TABLES = {
    "part3-sweep": lambda g: sweep_report.table_sweep(g, "part3", "part3_inner_loop.sweep"),
    "part3-ablation": table_ablation,
    "part3-step-gains": table_step_gains,
    "part3-launch-order": table_launch_order,
    "part3-p-cast": table_p_cast,
}

LOG = [  # (heading, what it measured, table): results/<gpu>/part3_log.md, in this order (common/report.py)
    (
        "The sweep, on part 3's kernel",
        "Part 2's tile, warp and stage sweep run again on part 3's kernel: the fastest configurations of each "
        "(D, causal) group, checked and timed.",
        "part3-sweep",
    ),
    (
        "One change at a time",
        "Part 2's kernel turned into part 3's one change at a time, every step checked and timed on the same "
        "inputs in one run.",
        "part3-ablation",
    ),
    (
        "What each change gains",
        "Each step of the ablation's speed-up over the step before, smallest to largest over the N measured.",
        "part3-step-gains",
    ),
    (
        "Which program runs first",
        "Part 3's kernel with several maps from program index to (query tile, sequence), each autotuned for "
        "itself and timed by CUDA-graph replay.",
        "part3-launch-order",
    ),
    (
        "What casting P costs",
        "The error of O against the float64 reference with P rounded to the input dtype or kept in float32, "
        "and the speed of each variant.",
        "part3-p-cast",
    ),
]
