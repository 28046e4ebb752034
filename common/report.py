"""Results CSVs -> plots and README tables. Nothing here measures anything.

    python -m common.report               # plots for every results/<gpu>/, README tables from --gpu
    python -m common.report --gpu h200

README files carry generated blocks between markers:

    <!-- results:NAME -->  ...generated...  <!-- /results:NAME -->

NAME is one of the generators in TABLES below. Re-running replaces each block with a table built
from the CSVs, so a number in a README is never typed by hand.
"""

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
ADA_SMEM_PER_BLOCK = 99 * 1024  # compute capability 8.9 (the seed's RTX 4070 Super): CUDA guide, per-block opt-in
SDPA_NAMES = {"sdpa_flash": "SDPA flash (FA2)", "sdpa_cudnn": "SDPA cuDNN", "sdpa_efficient": "SDPA efficient",
              "sdpa_math": "SDPA math", "sdpa_default": "SDPA default"}  # fmt: skip


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def impl_label(impl):
    return SDPA_NAMES.get(impl, impl.replace("part", "part "))


def provenance(rows, command):
    """One line naming the GPU, versions, commits, dates and the command behind a table."""

    def uniq(key):
        return ", ".join(sorted({r[key] for r in rows if r.get(key)}))

    return f"_{uniq('gpu')}; torch {uniq('torch')}; Triton {uniq('triton')}; commit {uniq('commit')}; {uniq('date')[:10]}. Regenerate: `{command}`._"


def _fmt(x):
    """TFLOP/s for a table: whole numbers, one decimal below 10, two significant digits below 1."""
    return "—" if x is None else f"{x:.2g}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _pct(a, b):
    if not a or not b:
        return "—"
    return "<1%" if 100 * a / b < 1 else f"{100 * a / b:.0f}%"


# ------------------------------------------------------------------------------------ bench
def tflops_index(rows, column="ms"):
    """{(impl, D, causal, N): TFLOP/s} for timed forward rows, from the time column (ms or graph_ms)."""
    from common.bench import attention_flops

    index = {}
    for r in rows:
        if r["mode"] == "fwd" and r.get(column):
            flops = attention_flops(int(r["B"]), int(r["H"]), int(r["N"]), int(r["N"]), int(r["D"]), int(r["causal"]))
            index[(r["impl"], int(r["D"]), int(r["causal"]), int(r["N"]))] = flops / float(r[column]) * 1e-9
    return index


def impls_in(rows):
    order = {}
    for r in rows:
        order.setdefault(r["impl"], None)
    parts_ = sorted((i for i in order if i.startswith("part")), key=lambda i: int(i[4:]))
    return parts_ + [i for i in SDPA_NAMES if i in order]


def _panel_figure(plot_panel, ylabel, title, path):
    """A 2 x 2 figure, one panel per (D, causal), x = N on a log scale; plot_panel(ax, d, c) draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for ax, (d, c) in zip(axes.flat, [(d, c) for d in (64, 128) for c in (0, 1)]):
        plot_panel(ax, d, c)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d}, {'causal' if c else 'non-causal'}")
        ax.set_xlabel("N (sequence length)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bench(rows, out_dir):
    idx = tflops_index(rows)
    impls = impls_in(rows)
    ns = sorted({int(r["N"]) for r in rows})

    def tflops(ax, d, c):
        for impl in impls:
            pts = [(n, idx[(impl, d, c, n)]) for n in ns if (impl, d, c, n) in idx]
            if pts:
                ax.plot(*zip(*pts), "-o" if impl.startswith("part") else "--", label=impl_label(impl), markersize=4)

    def share(ax, d, c):
        for impl in (i for i in impls if i.startswith("part")):
            for base, style in (("sdpa_flash", "-o"), ("sdpa_cudnn", "--s")):
                pts = [(n, 100 * idx[(impl, d, c, n)] / idx[(base, d, c, n)]) for n in ns
                       if (impl, d, c, n) in idx and (base, d, c, n) in idx]  # fmt: skip
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{impl_label(impl)} / {impl_label(base)}", markersize=4)
        ax.axhline(100, color="gray", lw=0.8)

    gpu = rows[0]["gpu"]
    _panel_figure(tflops, "TFLOP/s", f"Forward, B=4, H=8, bf16 — {gpu}", out_dir / "bench_tflops.png")
    _panel_figure(share, "% of SDPA backend", f"Parts as % of SDPA flash (solid) and SDPA cuDNN (dashed) — {gpu}",
                  out_dir / "bench_vs_sdpa.png")  # fmt: skip


def table_overview(gpu_dir):
    rows = read_csv(gpu_dir / "bench.csv")
    idx = tflops_index(rows)
    cols = [(64, 0), (64, 1), (128, 0), (128, 1)]
    out = [provenance(rows, "make bench && make report"), "",
           "Forward TFLOP/s at N = 4096 (B=4, H=8, bf16):", "",
           "| implementation | D=64 | D=64 causal | D=128 | D=128 causal |", "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for impl in impls_in(rows):
        out.append(f"| {impl_label(impl)} | " + " | ".join(_fmt(idx.get((impl, d, c, 4096))) for d, c in cols) + " |")
    untimed = [impl for impl in impls_in(rows) if all(idx.get((impl, d, c, 4096)) is None for d, c in cols)]
    if untimed:
        out += ["", f"—: not timed at N = 4096 ({', '.join(map(impl_label, untimed))}: see its own table)."]
    dispatched = sorted({r["backend"] for r in rows if r["impl"] == "sdpa_default" and r["backend"]})
    if dispatched:
        out += ["", f"SDPA's default dispatch ran: {', '.join(dispatched)} (read off the profiler)."]
    return "\n".join(out)


def table_part(gpu_dir, part):
    rows = read_csv(gpu_dir / "bench.csv")
    idx = tflops_index(rows)
    me, prev = f"part{part}", f"part{part - 1}"
    ns = sorted({int(r["N"]) for r in rows})
    chosen = {(int(r["D"]), int(r["causal"]), int(r["N"])): r["backend"] for r in rows if r["impl"] == me}
    show_cfg = any(chosen.values())
    cols = ([f"part {part - 1}"] if part > 0 else []) + [f"**part {part}**", "SDPA flash", "SDPA cuDNN",
                                                         f"part {part} / flash", f"part {part} / cuDNN"]  # fmt: skip
    cols += ["config"] if show_cfg else []
    out = [provenance([r for r in rows if r["impl"] in (me, prev, "sdpa_flash", "sdpa_cudnn")], f"make bench PART={part} && make report"),
           "", "Forward TFLOP/s, B=4, H=8, bf16" + (" (config: what the autotuner chose)" if show_cfg else "") + ":", "",
           "| D | causal | N | " + " | ".join(cols) + " |",
           "| --- | --- | ---: |" + " ---: |" * (len(cols) - show_cfg) + (" --- |" if show_cfg else "")]  # fmt: skip
    for d in (64, 128):
        for c in (0, 1):
            for n in ns:
                mine = idx.get((me, d, c, n))
                if mine is None:
                    continue
                fl, cu = idx.get(("sdpa_flash", d, c, n)), idx.get(("sdpa_cudnn", d, c, n))
                cells = [str(d), "yes" if c else "no", str(n)]
                cells += [_fmt(idx.get((prev, d, c, n)))] if part > 0 else []
                cells += [f"**{_fmt(mine)}**", _fmt(fl), _fmt(cu), _pct(mine, fl), _pct(mine, cu)]
                cells += [chosen.get((d, c, n), "")] if show_cfg else []
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def table_causal_time(gpu_dir, part):
    """Milliseconds with and without the causal mask: the same time means the same work was done."""
    rows = read_csv(gpu_dir / "bench.csv")
    ms = {
        (int(r["D"]), int(r["causal"]), int(r["N"])): float(r["ms"])
        for r in rows
        if r["impl"] == f"part{part}" and r["ms"]
    }
    flash = {
        (int(r["D"]), int(r["causal"]), int(r["N"])): float(r["ms"])
        for r in rows
        if r["impl"] == "sdpa_flash" and r["ms"]
    }
    out = ["Milliseconds per forward (B=4, H=8, bf16); causal does half the useful work:", "",
           f"| D | N | part {part}, non-causal | part {part}, causal | causal / non-causal | SDPA flash, causal / non-causal |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for d in (64, 128):
        for n in sorted({n for _, _, n in ms}):
            if (d, 0, n) in ms and (d, 1, n) in ms and n >= 2048:
                fl = f"{flash[(d, 1, n)] / flash[(d, 0, n)]:.2f}" if (d, 0, n) in flash and (d, 1, n) in flash else "—"
                out.append(
                    f"| {d} | {n} | {ms[(d, 0, n)]:.3f} | {ms[(d, 1, n)]:.3f} | {ms[(d, 1, n)] / ms[(d, 0, n)]:.2f} | {fl} |"
                )
    return "\n".join(out)


def table_graph(gpu_dir, part):
    """do_bench (each call launched from Python) against CUDA-graph replay (GPU time alone)."""
    rows = read_csv(gpu_dir / "bench.csv")
    timed, graph = tflops_index(rows), tflops_index(rows, "graph_ms")
    me = f"part{part}"
    out = [provenance([r for r in rows if r["impl"] in (me, "sdpa_flash")], f"make bench PART={part} && make report"), "",
           f"Forward TFLOP/s of part {part} and SDPA flash, B=4, H=8, bf16, timed two ways: `do_bench` (the protocol: "
           "each call launched from Python after an L2 flush) and CUDA-graph replay (the launches recorded once and "
           "replayed back to back: no launch cost, and no flush, so inputs that fit in L2 stay there):", "",
           f"| D | causal | N | part {part} | part {part}, graph | SDPA flash | SDPA flash, graph | part {part} / flash, graph |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for d in (64, 128):
        for c in (0, 1):
            for n in sorted({int(r["N"]) for r in rows}):
                if (me, d, c, n) not in timed:
                    continue
                g, fg = graph.get((me, d, c, n)), graph.get(("sdpa_flash", d, c, n))
                ratio = _pct(g, fg)
                cells = [str(d), "yes" if c else "no", str(n), _fmt(timed.get((me, d, c, n))), _fmt(g),
                         _fmt(timed.get(("sdpa_flash", d, c, n))), _fmt(fg), ratio]  # fmt: skip
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ sweep
def _best_cells(rows):
    """{(D, causal): {(BLOCK_M, BLOCK_N): best ok row}}"""
    best = defaultdict(dict)
    for r in rows:
        key, cell = (int(r["D"]), int(r["causal"])), (int(r["BLOCK_M"]), int(r["BLOCK_N"]))
        if r["status"] == "ok" and (cell not in best[key] or float(r["tflops"]) > float(best[key][cell]["tflops"])):
            best[key][cell] = r
    return best


def _cell_reason(rows, d, c, bm, bn):
    statuses = {
        r["status"].split(":")[0]
        for r in rows
        if (int(r["D"]), int(r["causal"]), int(r["BLOCK_M"]), int(r["BLOCK_N"])) == (d, c, bm, bn)
    }
    for status, short in (("failed check", "fail"), ("out of resources", "oor"), ("compile error", "err"),
                          ("not measured", "time"), ("pruned", "budget")):  # fmt: skip
        if status in statuses:
            return short
    return ""


def draw_sweep_heatmaps(csv_path, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = read_csv(csv_path)
    best = _best_cells(rows)
    groups = sorted({(int(r["D"]), int(r["causal"])) for r in rows})
    ms_ = sorted({int(r["BLOCK_M"]) for r in rows})
    ns_ = sorted({int(r["BLOCK_N"]) for r in rows})
    cols = 2 if len(groups) > 1 else 1
    rows_ = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5.6 * cols, 5.2 * rows_), squeeze=False)
    vmax = max((float(r["tflops"]) for cells in best.values() for r in cells.values()), default=1.0)
    for ax, (d, c) in zip(axes.flat, groups):
        grid = np.full((len(ms_), len(ns_)), np.nan)
        for (bm, bn), r in best[(d, c)].items():
            grid[ms_.index(bm), ns_.index(bn)] = float(r["tflops"])
        ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, origin="lower")
        for i, bm in enumerate(ms_):
            for j, bn in enumerate(ns_):
                r = best[(d, c)].get((bm, bn))
                if r:
                    light = float(r["tflops"]) < 0.6 * vmax
                    ax.text(j, i, f"{float(r['tflops']):.0f}\nw{r['num_warps']} s{r['num_stages']}", ha="center",
                            va="center", fontsize=7, color="white" if light else "black")  # fmt: skip
                else:
                    ax.text(j, i, _cell_reason(rows, d, c, bm, bn), ha="center", va="center", fontsize=7, color="gray")
        ax.set_xticks(range(len(ns_)), ns_)
        ax.set_yticks(range(len(ms_)), ms_)
        ax.set_xlabel("BLOCK_N (keys per step)")
        ax.set_ylabel("BLOCK_M (queries per program)")
        ax.set_title(f"D={d}, {'causal' if c else 'non-causal'}")
    fig.suptitle(f"Part 2 sweep: best TFLOP/s over warps (w) and stages (s)\nB=4, H=8, N=4096, bf16 — {rows[0]['gpu']}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def _ranked(rows, d, c):
    ok = [r for r in rows if r["status"] == "ok" and (int(r["D"]), int(r["causal"])) == (d, c)]
    return sorted(ok, key=lambda r: -float(r["tflops"]))


def sweep_winners(csv_path, top=3):
    """Plain text: the best configurations of each group, as triton.Config lines."""
    rows = read_csv(csv_path)
    out = []
    for d, c in sorted({(int(r["D"]), int(r["causal"])) for r in rows}):
        out.append(f"D={d} causal={c}:")
        for r in _ranked(rows, d, c)[:top]:
            out.append(f"    triton.Config({{\"BLOCK_M\": {r['BLOCK_M']}, \"BLOCK_N\": {r['BLOCK_N']}}}, "
                       f"num_warps={r['num_warps']}, num_stages={r['num_stages']}),  # {r['tflops']} TFLOP/s")  # fmt: skip
    return "\n".join(out)


def programs_per_sm(row, dev):
    """Resident programs per SM, from the compiled kernel's registers and shared memory (the CUDA
    occupancy rules: registers allocated per warp in units of 256, 1 KB of shared memory reserved
    per program, at most 64 warps and 32 programs per SM)."""
    warps, regs, smem = int(row["num_warps"]), int(row["regs"]), int(row["smem_compiled"])
    per_warp = -(-regs * 32 // 256) * 256
    return min(dev["regs_per_multiprocessor"] // (per_warp * warps), dev["shared_memory_per_multiprocessor"] // (smem + 1024),
               dev["max_threads_per_multi_processor"] // 32 // warps, 32)  # fmt: skip


def table_sweep(gpu_dir):
    rows = read_csv(gpu_dir / "part2_sweep.csv")
    dev = json.loads((gpu_dir / "part2_device.json").read_text())
    counts = defaultdict(int)
    for r in rows:
        counts[r["status"].split(":")[0]] += 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    out = [provenance(rows, "python -m part2_tile_tuning.sweep && make report"), "",
           f"{len(rows)} configurations: {summary}. Programs per SM follow from the compiled registers and shared "
           f"memory; waves = programs in the launch / (programs per SM x {dev['multi_processor_count']} SMs).", "",
           "| D | causal | rank | BLOCK_M x BLOCK_N | warps | stages | TFLOP/s | shared memory | registers / thread | programs / SM | waves |",
           "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for d, c in sorted({(int(r["D"]), int(r["causal"])) for r in rows}):
        for rank, r in enumerate(_ranked(rows, d, c)[:3], 1):
            per_sm = programs_per_sm(r, dev)
            programs = int(r["B"]) * int(r["H"]) * -(-int(r["N"]) // int(r["BLOCK_M"]))
            out.append(f"| {d} | {'yes' if c else 'no'} | {rank} | {r['BLOCK_M']} x {r['BLOCK_N']} | {r['num_warps']} | "
                       f"{r['num_stages']} | {float(r['tflops']):.0f} | {int(r['smem_compiled']) / 1024:.0f} KB | {r['regs']} | "
                       f"{per_sm} | {programs / (per_sm * dev['multi_processor_count']):.1f} |")  # fmt: skip
    return "\n".join(out)


def table_sweep_corners(gpu_dir):
    """The best configuration for a few tile shapes, the seed's 16x16 among them."""
    rows = read_csv(gpu_dir / "part2_sweep.csv")
    best = _best_cells(rows)
    shapes = ((16, 16), (32, 32), (64, 64), (64, 128), (128, 64), (128, 128), (256, 64))
    out = ["Best TFLOP/s for a tile shape, over warps and stages (N=4096, bf16):", "",
           "| BLOCK_M x BLOCK_N | " + " | ".join(f"D={d}{' causal' if c else ''}" for d in (64, 128) for c in (0, 1)) + " |",
           "| --- |" + " ---: |" * 4]  # fmt: skip
    for bm, bn in shapes:
        cells = []
        for d in (64, 128):
            for c in (0, 1):
                r = best[(d, c)].get((bm, bn))
                cells.append(f"{float(r['tflops']):.0f} (w{r['num_warps']} s{r['num_stages']})" if r else "—")
        out.append(f"| {bm} x {bn} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def table_sweep_stages(gpu_dir):
    """Pipeline depth for the winning tiles: TFLOP/s and compiled shared memory per num_stages."""
    rows = read_csv(gpu_dir / "part2_sweep.csv")
    dev = json.loads((gpu_dir / "part2_device.json").read_text())
    picks = ((64, 0, 64, 128, 4), (128, 0, 128, 128, 8), (128, 1, 128, 64, 4))
    out = ["TFLOP/s (shared memory, programs per SM) by pipeline depth, N=4096, bf16:", "",
           "| D | causal | tile, warps | 1 stage | 2 stages | 3 stages | 4 stages | 5 stages |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for d, c, bm, bn, w in picks:
        cells = []
        for st in range(1, 6):
            match = [r for r in rows if (int(r["D"]), int(r["causal"]), int(r["BLOCK_M"]), int(r["BLOCK_N"]),
                                         int(r["num_warps"]), int(r["num_stages"])) == (d, c, bm, bn, w, st)]  # fmt: skip
            r = match[0] if match else None
            if r is None or r["status"] != "ok":
                head, _, why = r["status"].partition(":") if r else ("—", "", "")
                cells.append(f"{head} ({why.strip()})" if why else head)
            else:
                cells.append(
                    f"{float(r['tflops']):.0f} ({int(r['smem_compiled']) / 1024:.0f} KB, {programs_per_sm(r, dev)})"
                )
        out.append(f"| {d} | {'yes' if c else 'no'} | {bm} x {bn}, {w} warps | " + " | ".join(cells) + " |")
    return "\n".join(out)


def table_smem_check(gpu_dir):
    """Budget estimate against what the compiler really allocated, over every compiled configuration,
    split by whether the configuration can use Hopper's warpgroup MMA (BLOCK_M >= 64, warps a multiple of 4)."""
    rows = [r for r in read_csv(gpu_dir / "part2_sweep.csv") if r["smem_compiled"]]

    def summary(group):
        ratio = sorted(int(r["smem_compiled"]) / int(r["smem_est"]) for r in group)
        over = [
            int(r["smem_compiled"]) - int(r["smem_est"]) for r in group if int(r["smem_compiled"]) > int(r["smem_est"])
        ]
        text = f"{len(group)} configurations, compiled / estimated from {ratio[0]:.2f} to {ratio[-1]:.2f}"
        return text + (f", over the estimate by at most {max(over)} bytes" if over else ", never over the estimate")

    wgmma = [r for r in rows if int(r["BLOCK_M"]) >= 64 and int(r["num_warps"]) % 4 == 0]
    other = [r for r in rows if r not in wgmma]
    out = []
    if wgmma:
        out.append(f"Tiles that can use warpgroup MMA (BLOCK_M >= 64, 4 or 8 warps): {summary(wgmma)}.")
    if other:
        out.append(f"The rest (BLOCK_M < 64 or 2 warps): {summary(other)}.")
    return " ".join(out)


def table_budget(gpu_dir):
    from common import parts

    fa = parts.load(2)
    dev = json.loads((gpu_dir / "part2_device.json").read_text())
    limit = dev["shared_memory_per_block_optin"]
    out = [f"_Limits read off the {dev['name']} by `python -m part2_tile_tuning.sweep` (results/{gpu_dir.name}/part2_device.json): "
           f"{dev['shared_memory_per_multiprocessor'] / 1024:.0f} KB of shared memory per SM, {limit / 1024:.0f} KB per program "
           f"(opt-in), {dev['regs_per_multiprocessor']} 32-bit registers per SM, {dev['multi_processor_count']} SMs. "
           f"Ada (compute capability 8.9): {ADA_SMEM_PER_BLOCK / 1024:.0f} KB per program._", "",
           "Shared memory for Q once plus `stages` buffers of K and V, bf16, in KB. "
           "**bold**: fits the H200 but not Ada; ~~struck~~: fits neither.", "",
           "| D | BLOCK_M x BLOCK_N | 1 stage | 2 stages | 3 stages | 4 stages | 5 stages |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for d in (64, 128):
        for bm, bn in ((16, 16), (64, 64), (128, 64), (128, 128), (256, 64), (256, 128)):
            cells = []
            for s in range(1, 6):
                b = fa.smem_bytes(bm, bn, d, 2, s)
                kb = f"{b / 1024:.0f}"
                cells.append(kb if b <= ADA_SMEM_PER_BLOCK else f"**{kb}**" if b <= limit else f"~~{kb}~~")
            out.append(f"| {d} | {bm} x {bn} | " + " | ".join(cells) + " |")
    from part2_tile_tuning.sweep import MAX_REGS, regs_estimate

    out += ["", "float32 registers per thread for the accumulator O_i (BLOCK_M x D) plus the score tile S_ij "
            f"(BLOCK_M x BLOCK_N), against the {MAX_REGS} a thread can address (the compiler needs more for "
            "addresses, m_i, l_i and operands); ~~struck~~: more than that, pruned by the sweep:", "",
            "| D | BLOCK_M x BLOCK_N | 4 warps | 8 warps |", "| --- | --- | ---: | ---: |"]  # fmt: skip

    def regs(bm, bn, d, w):
        n = regs_estimate(bm, bn, d, w)
        return f"{n:.0f}" if n <= MAX_REGS else f"~~{n:.0f}~~"

    for d in (64, 128):
        for bm, bn in ((64, 64), (128, 64), (128, 128), (256, 64)):
            out.append(f"| {d} | {bm} x {bn} | {regs(bm, bn, d, 4)} | {regs(bm, bn, d, 8)} |")
    return "\n".join(out)


def table_autotune(gpu_dir):
    rows = read_csv(gpu_dir / "part2_autotune.csv")
    out = [provenance(rows, "python -m part2_tile_tuning.autotune_cost && make report"), "",
           "| what | seconds | configurations tried | chosen |", "| --- | ---: | ---: | --- |"]  # fmt: skip
    for r in rows:
        tried = r["configs"] if r["configs"] not in ("", "0") else "—"
        out.append(f"| {r['scenario']} | {float(r['seconds']):.3g} | {tried} | {r['chosen'] or '—'} |")
    return "\n".join(out)


TABLES = {
    "overview": table_overview,
    "part0": lambda g: table_part(g, 0),
    "part1": lambda g: table_part(g, 1),
    "part1-causal": lambda g: table_causal_time(g, 1),
    "part2": lambda g: table_part(g, 2),
    "part2-graph": lambda g: table_graph(g, 2),
    "part2-sweep": table_sweep,
    "part2-sweep-corners": table_sweep_corners,
    "part2-stages": table_sweep_stages,
    "part2-smem-check": table_smem_check,
    "part2-budget": table_budget,
    "part2-autotune": table_autotune,
}
MARKER = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def update_readmes(gpu_dir):
    files = [ROOT / "README.md", *sorted(ROOT.glob("part*/README.md"))]
    for path in (p for p in files if p.exists()):
        text = path.read_text()

        def fill(m):
            try:
                body = TABLES[m.group(2)](gpu_dir)
            except FileNotFoundError as e:
                body = f"_No results yet ({Path(e.filename).name} missing): run the command that writes it._"
            return f"{m.group(1)}{body}\n{m.group(4)}"

        new = MARKER.sub(fill, text)
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h200", help="results/<gpu>/ folder the README tables come from")
    args = ap.parse_args(argv)
    for gpu_dir in sorted(p for p in RESULTS.glob("*") if p.is_dir()):
        if (gpu_dir / "bench.csv").exists():
            plot_bench(read_csv(gpu_dir / "bench.csv"), gpu_dir)
            print(f"drew {gpu_dir.relative_to(ROOT)}/bench_tflops.png and bench_vs_sdpa.png")
        if (gpu_dir / "part2_sweep.csv").exists():
            draw_sweep_heatmaps(gpu_dir / "part2_sweep.csv", gpu_dir / "part2_heatmaps.png")
            print(f"drew {gpu_dir.relative_to(ROOT)}/part2_heatmaps.png")
    update_readmes(RESULTS / args.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
