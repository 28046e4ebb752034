"""Part 4's tables and figures (lab/report.py puts them in the README and the results log): forward +
backward and backward alone against part 3 (the PyTorch backward) and SDPA, the two backward sweeps, dQ
by a second pass or by atomics, peak memory."""

from lab import sweep_report
from lab.impls import FLEX, impl_label
from lab.report import per_shape, plot, tflops, tflops_index, versus, yes_no
from lab.results import read_csv, table_block
from part4_backward.tools.dq_atomics import REPEATS


def table_mode(gpu_dir, mode):
    """Part 4 in one mode (fwd+bwd or bwd) against part 3 and SDPA flash and cuDNN, at every N; and
    against FlexAttention where the CSV has it (`python -m lab.bench --flex`)."""
    rows = [r for r in read_csv(gpu_dir / "bench.csv") if r["mode"] == mode]
    idx, flex = tflops_index(rows, mode=mode), any(r["impl"] == FLEX for r in rows)
    impls = ["part3", "part4", "sdpa_flash", "sdpa_cudnn", *[FLEX] * flex]
    cols, cells = versus(idx, "part4", impls, [i for i in impls if i != "part4"])
    caption = (
        f"{'Forward + backward' if mode == 'fwd+bwd' else 'Backward alone'}, TFLOP/s (the backward counts 2.5 times "
        "the forward's FLOPs), B=4, H=8, bf16; part 3 runs the tiled PyTorch backward of parts 0-3, up to N = 4096:"
    )
    body = per_shape(sorted({r["N"] for r in rows}), lambda *shape: cells(*shape) if ("part4", *shape) in idx else None)
    compared, command = [r for r in rows if r["impl"] in impls], f"python -m lab.bench --mode {mode} && make report"
    return table_block(compared, command, caption, ["D", "causal", "N", *cols], body, "llr" + "r" * len(cols))


def table_dq(gpu_dir):
    """The backward with dQ by a second pass or by atomics: speed, and whether the bits repeat."""
    rows = read_csv(gpu_dir / "part4_dq_atomics.csv")
    by = {(r["variant"], r["D"], r["causal"], r["N"]): r for r in rows}
    v = list(dict.fromkeys(r["variant"] for r in rows))  # the second pass, then atomics

    def cells(d, c, n):
        if (a := by.get((v[0], d, c, n))) and (b := by.get((v[1], d, c, n))):
            same = [yes_no(x["bitwise_repeatable"]) for x in (a, b)]
            ratio = f"{b['tflops'] / a['tflops']:.2f}x"
            return [tflops(a["tflops"]), tflops(b["tflops"]), ratio, *same, f"{b['max_run_to_run']:.1e}"]

    body = per_shape(sorted({r["N"] for r in rows}), cells)
    header = ["D", "causal", "N", *(f"{x}, TFLOP/s" for x in v), "atomics / second pass"]
    header += [*(f"{x}: same bits, {REPEATS} runs" for x in v), "atomics: largest run-to-run change of dQ"]
    caption = "The backward alone (flash_backward from the saved O and L), bf16, B=4, H=8:"
    return table_block(
        rows, "python -m part4_backward.tools.dq_atomics && make report", caption, header, body, "llrrrrllr"
    )


def table_memory(gpu_dir):
    """Peak GPU memory of one forward + backward beyond the inputs, per implementation and N."""
    rows = read_csv(gpu_dir / "part4_memory.csv")
    impls, r0 = list(dict.fromkeys(r["impl"] for r in rows)), rows[0]
    cell = {(r["impl"], r["N"]): (f"{r['peak_mib']:,.0f}" if r["status"] == "ok" else r["status"]) for r in rows}
    body = [[n, *(cell.get((i, n), "—") for i in impls)] for n in sorted({r["N"] for r in rows})]
    caption = (
        f"Peak GPU memory of one forward + backward beyond the inputs, MiB (B={r0['B']}, H={r0['H']}, "
        f"D={r0['D']}, bf16, non-causal):"
    )
    header = ["N", *map(impl_label, impls)]
    return table_block(
        rows, "python -m part4_backward.tools.memory && make report", caption, header, body, "r" * len(header)
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
    ax.set(xlabel="N (sequence length)", ylabel="peak memory beyond the inputs, MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    title = "Forward + backward, B={B}, H={H}, D={D}, bf16 — {gpu}\nslope 1: memory linear in N; slope 2: quadratic"
    ax.set_title(title.format(**rows[0]), fontsize=9)
    fig.tight_layout()
    return fig


def draw(gpu_dir):
    return [
        *sweep_report.draw_heatmaps(gpu_dir, "part4_dkdv", "Part 4 dK/dV kernel"),
        *sweep_report.draw_heatmaps(gpu_dir, "part4_dq", "Part 4 dQ kernel"),
        *plot(gpu_dir, "part4_memory.csv", "part4_memory.png", memory_figure),
    ]


def table_fp32_dkdv(gpu_dir):
    """The dK/dV kernel's float32 sweep, every configuration fastest first in each group: TFLOP/s, spilled
    registers, compile seconds; the tile part 4 ships for float32 (BWD_DKDV_FLOAT32) in bold."""
    from part4_backward.flash_attention import BWD_DKDV_FLOAT32

    rows, body = sweep_report.sweep_rows(gpu_dir, "part4_dkdv_fp32"), []
    for d, c in sweep_report.groups(rows):
        s = BWD_DKDV_FLOAT32[d, bool(c)]
        shipped = f"{s.kwargs['BLOCK_M']} x {s.kwargs['BLOCK_N']} w{s.num_warps} s{s.num_stages}"
        for r in sweep_report.ranked(rows, d, c):
            label = f"{r['BLOCK_M']} x {r['BLOCK_N']} w{r['num_warps']} s{r['num_stages']}"
            label = f"**{label}**" if label == shipped else label
            body.append([d, yes_no(c), label, f"{r['tflops']:.1f}", r["spills"], f"{r['compile_s']:.1f}"])
    header = ["D", "causal", "configuration", "TFLOP/s", "spilled registers", "compile s"]
    command = "python -m part4_backward.tools.sweep --kernel dkdv --dtype fp32 --configs ... && make report"
    return table_block(rows, command, "", header, body, "lllrrr")


TABLES = {
    "part4-fwd-bwd": lambda g: table_mode(g, "fwd+bwd"),
    "part4-bwd": lambda g: table_mode(g, "bwd"),
    "part4-sweep-dkdv": lambda g: sweep_report.table_sweep(
        g, "part4_dkdv", "part4_backward.tools.sweep --kernel dkdv", "BLOCK_N"
    ),
    "part4-sweep-dq": lambda g: sweep_report.table_sweep(g, "part4_dq", "part4_backward.tools.sweep --kernel dq"),
    "part4-fp32-dkdv": table_fp32_dkdv,
    "part4-dq-atomics": table_dq,
    "part4-memory": table_memory,
}
