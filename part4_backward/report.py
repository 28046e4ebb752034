"""Part 4's tables and figures: forward+backward and backward alone against part 3 (the PyTorch
backward) and SDPA, the two backward sweeps, dQ by a second pass or by atomics, peak memory.
`make report` fills the README blocks named in TABLES and calls draw().
"""

from common import sweep_report
from common.impls import FLEX, impl_label
from common.report import PANELS, percent, tflops, tflops_index, yes_no
from common.results import markdown_table, provenance_line, read_csv
from part4_backward.dq_atomics import REPEATS


def table_mode(gpu_dir, mode):
    """Part 4 in one mode (fwd+bwd or bwd) against part 3 and SDPA flash and cuDNN, at every N; and
    against FlexAttention where the CSV has it (`python -m common.bench --flex`)."""
    rows = [r for r in read_csv(gpu_dir / "bench.csv") if r["mode"] == mode]
    idx = tflops_index(rows, mode=mode)
    has_flex = any(r["impl"] == FLEX for r in rows)
    cols = [
        "part 3",
        "**part 4**",
        "SDPA flash",
        "SDPA cuDNN",
        *(["FlexAttention"] if has_flex else []),
        "part 4 / part 3",
        "part 4 / flash",
        "part 4 / cuDNN",
        *(["part 4 / Flex"] if has_flex else []),
    ]
    body = []
    for d, c in PANELS:
        for n in sorted({r["N"] for r in rows}):
            mine = idx.get(("part4", d, c, n))
            if mine is None:
                continue
            p3, fl, cu, fx = (idx.get((impl, d, c, n)) for impl in ("part3", "sdpa_flash", "sdpa_cudnn", FLEX))
            ratio = f"{mine / p3:.0f}x" if p3 else "—"
            body.append(
                [
                    d,
                    yes_no(c),
                    n,
                    tflops(p3),
                    f"**{tflops(mine)}**",
                    tflops(fl),
                    tflops(cu),
                    *([tflops(fx)] if has_flex else []),
                    ratio,
                    percent(mine, fl),
                    percent(mine, cu),
                    *([percent(mine, fx)] if has_flex else []),
                ]
            )
    compared = [r for r in rows if r["impl"] in ("part3", "part4", "sdpa_flash", "sdpa_cudnn", FLEX)]
    what = "forward + backward" if mode == "fwd+bwd" else "backward alone"
    return "\n".join(
        [
            provenance_line(compared, f"python -m common.bench --mode {mode} && make report"),
            "",
            f"{what.capitalize()}, TFLOP/s (the backward counts 2.5 times the forward's FLOPs), B=4, H=8, "
            "bf16; part 3 runs the tiled PyTorch backward of parts 0-3, up to N = 4096:",
            "",
            markdown_table(["D", "causal", "N", *cols], body, "llr" + "r" * len(cols)),
        ]
    )


def table_dq(gpu_dir):
    rows = read_csv(gpu_dir / "part4_dq_atomics.csv")
    by = {(r["variant"], r["D"], r["causal"], r["N"]): r for r in rows}
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    body = []
    for d, c, n in sorted({(r["D"], r["causal"], r["N"]) for r in rows}):
        a, b = (by.get((v, d, c, n)) for v in variants)
        body.append(
            [
                d,
                yes_no(c),
                n,
                tflops(a["tflops"]),
                tflops(b["tflops"]),
                f"{b['tflops'] / a['tflops']:.2f}x",
                "yes" if a["bitwise_repeatable"] else "no",
                "yes" if b["bitwise_repeatable"] else "no",
                f"{b['max_run_to_run']:.1e}",
            ]
        )
    header = [
        "D",
        "causal",
        "N",
        f"{variants[0]}, TFLOP/s",
        f"{variants[1]}, TFLOP/s",
        "atomics / second pass",
        f"{variants[0]}: same bits, {REPEATS} runs",
        f"{variants[1]}: same bits, {REPEATS} runs",
        "atomics: largest run-to-run change of dQ",
    ]
    return "\n".join(
        [
            provenance_line(rows, "python -m part4_backward.dq_atomics && make report"),
            "",
            "The backward alone (flash_backward from the saved O and L), bf16, B=4, H=8:",
            "",
            markdown_table(header, body, "llrrrrllr"),
        ]
    )


def table_memory(gpu_dir):
    rows = read_csv(gpu_dir / "part4_memory.csv")
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cell = {(r["impl"], r["N"]): (f"{r['peak_mib']:,.0f}" if r["status"] == "ok" else r["status"]) for r in rows}
    body = [[n, *(cell.get((i, n), "—") for i in impls)] for n in sorted({r["N"] for r in rows})]
    r0 = rows[0]
    return "\n".join(
        [
            provenance_line(rows, "python -m part4_backward.memory && make report"),
            "",
            f"Peak GPU memory of one forward + backward beyond the inputs, MiB (B={r0['B']}, H={r0['H']}, "
            f"D={r0['D']}, bf16, non-causal):",
            "",
            markdown_table(["N", *map(impl_label, impls)], body, "r" * (len(impls) + 1)),
        ]
    )


def memory_figure(rows):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 5))
    ax = fig.subplots()
    for impl in dict.fromkeys(r["impl"] for r in rows):
        pts = sorted((r["N"], r["peak_mib"]) for r in rows if r["impl"] == impl and r["status"] == "ok")
        ax.plot(*zip(*pts), "-o" if impl.startswith("part") else "--s", markersize=4, label=impl_label(impl))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("N (sequence length)")
    ax.set_ylabel("peak memory beyond the inputs, MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        f"Forward + backward, B={rows[0]['B']}, H={rows[0]['H']}, D={rows[0]['D']}, bf16 — {rows[0]['gpu']}\n"
        "slope 1: memory linear in N; slope 2: quadratic",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def draw(gpu_dir):
    written = [
        sweep_report.draw_heatmaps(gpu_dir, name, f"Part 4 {what}")
        for name, what in (("part4_dkdv", "dK/dV kernel"), ("part4_dq", "dQ kernel"))
        if (gpu_dir / f"{name}_sweep.csv").exists()
    ]
    if (gpu_dir / "part4_memory.csv").exists():
        memory_figure(read_csv(gpu_dir / "part4_memory.csv")).savefig(gpu_dir / "part4_memory.png", dpi=110)
        written.append(gpu_dir / "part4_memory.png")
    return written


def table_fp32_dkdv(gpu_dir):
    """The dK/dV kernel's float32 sweep, every configuration: TFLOP/s, spilled registers and the
    seconds it took to compile, fastest first in each (D, causal) group; the tile part 4 ships for
    float32 (BWD_DKDV_FLOAT32) in bold."""
    from part4_backward.flash_attention import BWD_DKDV_FLOAT32

    rows = sweep_report.sweep_rows(gpu_dir, "part4_dkdv_fp32")
    body = []
    for d, c in sweep_report.groups(rows):
        shipped = BWD_DKDV_FLOAT32[d, bool(c)]
        for r in sweep_report.ranked(rows, d, c):
            label = f"{r['BLOCK_M']} x {r['BLOCK_N']} w{r['num_warps']} s{r['num_stages']}"
            if (r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"]) == (
                shipped.kwargs["BLOCK_M"],
                shipped.kwargs["BLOCK_N"],
                shipped.num_warps,
                shipped.num_stages,
            ):
                label = f"**{label}**"
            body.append([d, yes_no(c), label, f"{r['tflops']:.1f}", r["spills"], f"{r['compile_s']:.1f}"])
    header = ["D", "causal", "configuration", "TFLOP/s", "spilled registers", "compile s"]
    return "\n".join(
        [
            provenance_line(rows, "python -m part4_backward.sweep --kernel dkdv --dtype fp32 --configs ..."),
            "",
            markdown_table(header, body, "lllrrr"),
        ]
    )


TABLES = {
    "part4-fwd-bwd": lambda g: table_mode(g, "fwd+bwd"),
    "part4-bwd": lambda g: table_mode(g, "bwd"),
    "part4-sweep-dkdv": lambda g: sweep_report.table_sweep(
        g, "part4_dkdv", "part4_backward.sweep --kernel dkdv", grid_block="BLOCK_N"
    ),
    "part4-sweep-dq": lambda g: sweep_report.table_sweep(g, "part4_dq", "part4_backward.sweep --kernel dq"),
    "part4-fp32-dkdv": table_fp32_dkdv,
    "part4-dq-atomics": table_dq,
    "part4-memory": table_memory,
}

LOG = [  # (heading, what it measured, table): results/<gpu>/part4_log.md, in this order (common/report.py)
    (
        "Forward + backward",
        "Forward + backward TFLOP/s by `do_bench` at every shape, against part 3 (the tiled PyTorch backward) "
        "and SDPA's flash and cuDNN backends, checked on dQ, dK and dV before they were timed.",
        "part4-fwd-bwd",
    ),
    (
        "The backward alone",
        "The backward alone, from a retained forward, against the same implementations.",
        "part4-bwd",
    ),
    (
        "dQ: a second pass or atomics",
        "The backward with dQ written by a second pass or added with atomics: speed, and whether the same "
        "inputs give the same bits run after run.",
        "part4-dq-atomics",
    ),
    (
        "The dK/dV kernel's sweep",
        "The sweep of the dK/dV kernel's tiles, warps and stages: the fastest configurations of each group, "
        "checked on dQ, dK and dV and timed.",
        "part4-sweep-dkdv",
    ),
    (
        "The dQ kernel's sweep",
        "The same sweep for the dQ kernel.",
        "part4-sweep-dq",
    ),
    (
        "Float32: the dK/dV kernel's tiles",
        "The dK/dV kernel on float32 inputs (IEEE products), B = 4, H = 8, N = 4096: every configuration "
        "swept, with the registers it spilled and its compile time, which is most of a float32 first backward.",
        "part4-fp32-dkdv",
    ),
    (
        "Memory",
        "Peak GPU memory of one forward + backward beyond the inputs, against N.",
        "part4-memory",
    ),
    (
        "The forward (part 3's)",
        "Forward TFLOP/s by `do_bench` at every shape, beside part 3 and SDPA's flash and cuDNN backends: "
        "part 4 keeps part 3's forward kernel.",
        "part4",
    ),
    (
        "The forward: do_bench against CUDA-graph replay",
        "The same forwards launched from Python one call at a time (`do_bench`) and replayed from a CUDA graph, "
        "which leaves the GPU's time alone.",
        "part4-graph",
    ),
    (
        "What the causal mask costs",
        "Milliseconds per forward with and without the causal mask, which halves the useful work, from N = 2048 on.",
        "part4-causal",
    ),
]
