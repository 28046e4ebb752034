"""A sweep's tables and heatmaps from its files in results/<gpu>/ (<name>_sweep.csv, <name>_device.json,
written by lab/sweep.py): the fastest configurations with what the compiler made of them, a few tile
shapes at their best, pipeline depth, the budget against the compiled shared memory, a heatmap per (D, causal).
"""

import json
from collections import Counter

from lab.results import PANELS, provenance_line, read_csv, table_block, yes_no

# A heatmap cell with no passing configuration shows why, in a word: the first of these that happened.
REASONS = {
    "failed check": "fail",
    "out of resources": "oor",
    "compile error": "err",
    "not measured": "time",
    "pruned": "budget",
}


def sweep_rows(gpu_dir, name):
    return read_csv(gpu_dir / f"{name}_sweep.csv")


def device(gpu_dir, name):
    return json.loads((gpu_dir / f"{name}_device.json").read_text())


def groups(rows):
    return sorted({(r["D"], r["causal"]) for r in rows})


def ranked(rows, d, c):
    """The configurations of one (D, causal) group that passed, fastest first."""
    return sorted(
        (r for r in rows if r["status"] == "ok" and (r["D"], r["causal"]) == (d, c)), key=lambda r: -r["tflops"]
    )


def best_cells(rows):
    """{(D, causal): {(BLOCK_M, BLOCK_N): the fastest passing row}}: each tile at its best warps and stages."""
    best = {}
    for r in sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["tflops"]):
        best.setdefault((r["D"], r["causal"]), {}).setdefault((r["BLOCK_M"], r["BLOCK_N"]), r)
    return best


def draw_heatmaps(gpu_dir, name, label):
    """[<name>_heatmaps.png] from <name>_sweep.csv ([] where there is none), one heatmap per (D, causal): BLOCK_M
    down, BLOCK_N across, the best TFLOP/s over warps and stages (with that configuration's w and s), or why
    nothing ran (REASONS)."""
    import numpy as np
    from matplotlib.figure import Figure

    if not (gpu_dir / f"{name}_sweep.csv").exists():
        return []
    rows, path = sweep_rows(gpu_dir, name), gpu_dir / f"{name}_heatmaps.png"
    best, grps = best_cells(rows), groups(rows)
    ms_, ns_ = sorted({r["BLOCK_M"] for r in rows}), sorted({r["BLOCK_N"] for r in rows})
    cols = 2 if len(grps) > 1 else 1
    fig = Figure(figsize=(5.6 * cols, 5.2 * -(-len(grps) // cols)))
    axes = fig.subplots(-(-len(grps) // cols), cols, squeeze=False)
    vmax = max((r["tflops"] for cells in best.values() for r in cells.values()), default=1.0)
    for ax, (d, c) in zip(axes.flat, grps):
        cells = best.get((d, c), {})
        grid = [[cells[bm, bn]["tflops"] if (bm, bn) in cells else np.nan for bn in ns_] for bm in ms_]
        ax.imshow(np.array(grid, dtype=float), cmap="viridis", vmin=0, vmax=vmax, origin="lower")
        for i, bm in enumerate(ms_):
            for j, bn in enumerate(ns_):
                if r := cells.get((bm, bn)):
                    text = f"{r['tflops']:.0f}\nw{r['num_warps']} s{r['num_stages']}"
                    colour = "white" if r["tflops"] < 0.6 * vmax else "black"
                else:
                    tile = [r for r in rows if (r["D"], r["causal"], r["BLOCK_M"], r["BLOCK_N"]) == (d, c, bm, bn)]
                    here = {r["status"].split(":")[0] for r in tile}
                    text, colour = next((short for status, short in REASONS.items() if status in here), ""), "gray"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(ns_)), ns_)
        ax.set_yticks(range(len(ms_)), ms_)
        causal = "causal" if c else "non-causal"
        ax.set(xlabel="BLOCK_N (keys per step)", ylabel="BLOCK_M (queries per program)", title=f"D={d}, {causal}")
    shape = "B={B}, H={H}, N={N}, {dtype} — {gpu}".format(**rows[0])
    fig.suptitle(f"{label} sweep: best TFLOP/s over warps (w) and stages (s)\n{shape}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return [path]


def winners(rows):
    """Plain text: the best configurations of each group, as triton.Config lines to paste into CONFIGS."""
    config = (
        '    triton.Config({{"BLOCK_M": {BLOCK_M}, "BLOCK_N": {BLOCK_N}}}, num_warps={num_warps}, '
        "num_stages={num_stages}),  # {tflops} TFLOP/s"
    )
    out = []
    for d, c in groups(rows):
        out += [f"D={d} causal={c}:", *(config.format(**r) for r in ranked(rows, d, c)[:3])]
    return "\n".join(out)


def programs_per_sm(row, dev):
    """Resident programs per SM from the compiled registers and shared memory (CUDA's occupancy rules: registers
    allocated per warp in units of 256, 1 KB of shared memory reserved per program, at most 64 warps, 32 programs)."""
    warps, per_warp = row["num_warps"], -(-row["regs"] * 32 // 256) * 256
    return min(
        dev["regs_per_multiprocessor"] // (per_warp * warps),
        dev["shared_memory_per_multiprocessor"] // (row["smem_compiled"] + 1024),
        dev["max_threads_per_multi_processor"] // 32 // warps,
        32,
    )


def table_sweep(gpu_dir, name, module, grid_block="BLOCK_M"):
    """The three fastest configurations of each group, with what the compiler made of them; grid_block:
    the tile dimension the launch has one program per (BLOCK_N for the dK/dV kernel), for the waves."""
    rows, dev = sweep_rows(gpu_dir, name), device(gpu_dir, name)
    counts = Counter(r["status"].split(":")[0] for r in rows).most_common()  # ties in the order first seen
    sms, body = dev["multi_processor_count"], []
    for d, c in groups(rows):
        for rank, r in enumerate(ranked(rows, d, c)[:3], 1):
            per_sm, programs = programs_per_sm(r, dev), r["B"] * r["H"] * -(-r["N"] // r[grid_block])
            body.append([d, yes_no(c), rank, f"{r['BLOCK_M']} x {r['BLOCK_N']}", r["num_warps"], r["num_stages"],
                         f"{r['tflops']:.0f}", f"{r['smem_compiled'] / 1024:.0f} KB", r["regs"], per_sm,
                         f"{programs / (per_sm * sms):.1f}"])  # fmt: skip
    header = ["D", "causal", "rank", "BLOCK_M x BLOCK_N", "warps", "stages", "TFLOP/s", "shared memory"]
    header += ["registers / thread", "programs / SM", "waves"]
    caption = (
        f"{len(rows)} configurations: {', '.join(f'{n} {s}' for s, n in counts)}. Programs per SM follow from the "
        f"compiled registers and shared memory; waves = programs in the launch / (programs per SM x {sms} SMs)."
    )
    return table_block(rows, f"python -m {module} && make report", caption, header, body, "llrlrrrrrrr")


def table_sweep_corners(gpu_dir, name, module):
    """The best configuration for a few tile shapes, the seed's 16 x 16 among them."""
    rows, tiles = sweep_rows(gpu_dir, name), ((16, 16), (32, 32), (64, 64), (64, 128), (128, 64), (128, 128), (256, 64))
    best = best_cells(rows)
    cell = lambda r: f"{r['tflops']:.0f} (w{r['num_warps']} s{r['num_stages']})" if r else "—"  # noqa: E731
    body = [[f"{bm} x {bn}", *(cell(best.get(g, {}).get((bm, bn))) for g in PANELS)] for bm, bn in tiles]
    header = ["BLOCK_M x BLOCK_N", *(f"D={d}{' causal' if c else ''}" for d, c in PANELS)]
    caption = f"Best TFLOP/s for a tile shape, over warps and stages (N={rows[0]['N']}, {rows[0]['dtype']}):"
    return table_block(rows, f"python -m {module} && make report", caption, header, body, "lrrrr")


def table_sweep_stages(gpu_dir, name, module):
    """Pipeline depth at each group's winning tile and warps: TFLOP/s, compiled shared memory and programs
    per SM for each num_stages; a winner already shown at its D (D=64 causal and not) adds no row."""
    rows, dev = sweep_rows(gpu_dir, name), device(gpu_dir, name)
    stages, picks = sorted({r["num_stages"] for r in rows}), {}
    for d, c in groups(rows):
        if w := next(iter(ranked(rows, d, c)), None):
            picks.setdefault((d, w["BLOCK_M"], w["BLOCK_N"], w["num_warps"]), c)
    config = {(r["D"], r["causal"], r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"]): r for r in rows}

    def cell(r):
        if r is None or r["status"] != "ok":
            head, _, why = r["status"].partition(":") if r else ("—", "", "")
            return f"{head} ({why.strip()})" if why else head
        return f"{r['tflops']:.0f} ({r['smem_compiled'] / 1024:.0f} KB, {programs_per_sm(r, dev)})"

    body = [
        [d, yes_no(c), f"{bm} x {bn}, {w} warps", *(cell(config.get((d, c, bm, bn, w, s))) for s in stages)]
        for (d, bm, bn, w), c in picks.items()
    ]
    header = ["D", "causal", "tile, warps", *(f"{s} stage{'s' if s > 1 else ''}" for s in stages)]
    caption = f"TFLOP/s (shared memory, programs per SM) by pipeline depth, N={rows[0]['N']}, {rows[0]['dtype']}:"
    return table_block(rows, f"python -m {module} && make report", caption, header, body, "lll" + "r" * len(stages))


def table_smem_check(gpu_dir, name, module):
    """The budget's estimate against what the compiler allocated, over every compiled configuration, split
    by whether it can use Hopper's warpgroup MMA (BLOCK_M >= 64, warps a multiple of 4)."""
    rows = [r for r in sweep_rows(gpu_dir, name) if r["smem_compiled"] is not None]

    def summary(what, group):
        ratio = sorted(r["smem_compiled"] / r["smem_est"] for r in group)
        over = [r["smem_compiled"] - r["smem_est"] for r in group if r["smem_compiled"] > r["smem_est"]]
        text = f"{what}: {len(group)} configurations, compiled / estimated from {ratio[0]:.2f} to {ratio[-1]:.2f}"
        return text + (f", over the estimate by at most {max(over)} bytes." if over else ", never over the estimate.")

    wgmma = [r["BLOCK_M"] >= 64 and r["num_warps"] % 4 == 0 for r in rows]
    split = [
        ("Tiles that can use warpgroup MMA (BLOCK_M >= 64, 4 or 8 warps)", [r for r, w in zip(rows, wgmma) if w]),
        ("The rest (BLOCK_M < 64 or 2 warps)", [r for r, w in zip(rows, wgmma) if not w]),
    ]
    out = " ".join(summary(what, group) for what, group in split if group)
    return provenance_line(rows, f"python -m {module} && make report") + "\n\n" + out
