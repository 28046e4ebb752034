"""Part 2's tables and figures: the shared-memory and register budget, the sweep, the autotune cost.

Read from part 2's files in results/<gpu>/; `make report` (common/report.py) puts each of TABLES
into the README block of the same name and calls draw() for the heatmaps. The sweep's own tables
and heatmaps are common/sweep_report.py's, given part 2's files.
"""

import functools

from common import sweep_report
from common.results import markdown_table, provenance_line, read_csv
from common.sweep import MAX_REGS, regs_estimate
from part2_tile_tuning.flash_attention import smem_bytes

ADA_SMEM_PER_BLOCK = 99 * 1024  # compute capability 8.9 (the seed's RTX 4070 Super): CUDA guide, per-block opt-in


def draw(gpu_dir):
    if not (gpu_dir / "part2_sweep.csv").exists():
        return []
    return [sweep_report.draw_heatmaps(gpu_dir, "part2", "Part 2")]


def table_budget(gpu_dir):
    """Part 2's budget arithmetic for a few tiles: shared memory (smem_bytes) against the H200's and
    Ada's per-program limits, and float32 registers (regs_estimate) against what a thread can address."""
    dev = sweep_report.device(gpu_dir, "part2")
    limit = dev["shared_memory_per_block_optin"]

    def smem(bm, bn, d, s):
        b = smem_bytes(bm, bn, d, 2, s)
        kb = f"{b / 1024:.0f}"
        return kb if b <= ADA_SMEM_PER_BLOCK else f"**{kb}**" if b <= limit else f"~~{kb}~~"

    def regs(bm, bn, d, w):
        n = regs_estimate(bm, bn, d, w)
        return f"{n:.0f}" if n <= MAX_REGS else f"~~{n:.0f}~~"

    tiles = ((16, 16), (64, 64), (128, 64), (128, 128), (256, 64), (256, 128))
    smem_rows = [[d, f"{bm} x {bn}", *(smem(bm, bn, d, s) for s in range(1, 6))] for d in (64, 128) for bm, bn in tiles]
    reg_tiles = ((64, 64), (128, 64), (128, 128), (256, 64))
    reg_rows = [[d, f"{bm} x {bn}", regs(bm, bn, d, 4), regs(bm, bn, d, 8)] for d in (64, 128) for bm, bn in reg_tiles]
    return "\n".join(
        [
            f"_Limits read off the {dev['name']} by `python -m part2_tile_tuning.sweep` (results/{gpu_dir.name}/part2_device.json): "
            f"{dev['shared_memory_per_multiprocessor'] / 1024:.0f} KB of shared memory per SM, {limit / 1024:.0f} KB per program "
            f"(opt-in), {dev['regs_per_multiprocessor']} 32-bit registers per SM, {dev['multi_processor_count']} SMs. "
            f"Ada (compute capability 8.9): {ADA_SMEM_PER_BLOCK / 1024:.0f} KB per program._",
            "",
            "Shared memory for Q once plus `stages` buffers of K and V, bf16, in KB. "
            "**bold**: fits the H200 but not Ada; ~~struck~~: fits neither.",
            "",
            markdown_table(
                ["D", "BLOCK_M x BLOCK_N", "1 stage", *(f"{s} stages" for s in range(2, 6))], smem_rows, "llrrrrr"
            ),
            "",
            "float32 registers per thread for the accumulator O_i (BLOCK_M x D) plus the score tile S_ij "
            f"(BLOCK_M x BLOCK_N), against the {MAX_REGS} a thread can address (the compiler needs more for "
            "addresses, m_i, l_i and operands); ~~struck~~: more than that, pruned by the sweep:",
            "",
            markdown_table(["D", "BLOCK_M x BLOCK_N", "4 warps", "8 warps"], reg_rows, "llrr"),
        ]
    )


def table_autotune(gpu_dir):
    """What @triton.autotune cost: first calls (cold and warm cache) against the steady state."""
    rows = read_csv(gpu_dir / "part2_autotune.csv")
    body = [[r["scenario"], f"{r['seconds']:.3g}", r["configs"] or "—", r["chosen"] or "—"] for r in rows]
    return "\n".join(
        [
            provenance_line(rows, "python -m common.coldstart --autotune --part 2 && make report"),
            "",
            markdown_table(["what", "seconds", "configurations tried", "chosen"], body, "lrrl"),
        ]
    )


def _interleaved_runs(rows, label_field, labels):
    """The table body for the benchmark rows of interleaved runs of two setups (rows labelled by
    label_field, each run a fresh process that autotuned anew): per (part, mode, D, causal) each run's
    TFLOP/s under each label, the ratio of the medians (the second over the first), the same ratio of
    the CUDA-graph replays (the GPU's time alone), and every forward configuration the runs chose."""
    import statistics

    runs = {}
    for r in rows:
        key = (r["part"], r["mode"], r["D"], r["causal"])
        runs.setdefault(key, {}).setdefault(r[label_field], []).append(r)

    def median(rs, field):
        values = [float(r[field]) for r in rs if r[field] not in (None, "")]
        return statistics.median(values) if values else None

    def ratio(by_label, field):
        first, last = (median(by_label.get(label, []), field) for label in (labels[0], labels[-1]))
        return f"{last / first:.2f}" if first and last else "—"

    body = []
    for (part, mode, d, causal), by_label in sorted(runs.items(), key=lambda kv: tuple(map(str, kv[0]))):
        cells = [
            ", ".join(f"{float(r['tflops']):.0f}" for r in sorted(by_label.get(label, []), key=lambda r: r["run"]))
            or "—"
            for label in labels
        ]
        chosen = " / ".join(sorted({r["backend"] for rs in by_label.values() for r in rs}))
        body.append(
            [
                part,
                mode,
                d,
                "yes" if causal else "no",
                *cells,
                ratio(by_label, "tflops"),
                ratio(by_label, "graph_tflops"),
                chosen,
            ]
        )
    return body


def _interleaved_table(rows, label_field, labels, regenerate, caption):
    body = _interleaved_runs(rows, label_field, labels)
    return "\n".join(
        [
            provenance_line(rows, regenerate),
            "",
            caption,
            "",
            markdown_table(
                [
                    "part",
                    "mode",
                    "D",
                    "causal",
                    *(f"{t}, TFLOP/s" for t in labels),
                    "ratio",
                    "graph ratio",
                    "forward chose",
                ],
                body,
                "llrl" + "r" * (len(labels) + 2) + "l",
            ),
        ]
    )


def table_autotune_timer(gpu_dir):
    """The autotuner's timer, Triton's default against a shorter one: the 16-bit benchmark rows at
    N = 4096 from interleaved runs of the two commits, each run a fresh process that autotuned anew."""
    rows = read_csv(gpu_dir / "part2_autotune_timer.csv")
    return _interleaved_table(
        rows,
        "timer",
        list(dict.fromkeys(r["timer"] for r in rows)),
        "python -m common.bench --n 4096 --no-sdpa` at each commit in turn, the runs' rows gathered in one CSV "
        "with `timer` and `run` columns; `make report",
        "TFLOP/s of each run (bf16, B = 4, H = 8, N = 4096), the ratio of the medians (the second timer over "
        "the first) by do_bench and by CUDA-graph replay (the GPU alone), and every forward configuration the "
        "runs chose:",
    )


def table_first_call_check(gpu_dir):
    """The 16-bit benchmark rows before the first-call work and after it: interleaved runs of the two
    commits, three each, each a fresh process that autotuned anew."""
    rows = read_csv(gpu_dir / "first_call_check.csv")
    commits = list(dict.fromkeys(r["commit"] for r in sorted(rows, key=lambda r: r["date"])))
    return _interleaved_table(
        rows,
        "commit",
        commits,
        "python -m common.bench --part 2 --part 3 --part 4 --part 5 --n 4096 --no-sdpa` (then `--part 4 --part 5 "
        "--mode fwd+bwd`) at each commit in turn, three times, the runs' rows gathered in one CSV with a `run` "
        "column; `make report",
        "TFLOP/s of each run (bf16, B = 4, H = 8, N = 4096), the ratio of the medians (after over before) by "
        "do_bench and by CUDA-graph replay (the GPU alone), and every forward configuration the runs chose:",
    )


TABLES = {
    "part2-budget": table_budget,
    "part2-smem-check": functools.partial(sweep_report.table_smem_check, name="part2"),
    "part2-sweep-corners": functools.partial(
        sweep_report.table_sweep_corners, name="part2", module="part2_tile_tuning.sweep"
    ),
    "part2-sweep": functools.partial(sweep_report.table_sweep, name="part2", module="part2_tile_tuning.sweep"),
    "part2-stages": functools.partial(sweep_report.table_sweep_stages, name="part2", module="part2_tile_tuning.sweep"),
    "part2-autotune": table_autotune,
    "part2-autotune-timer": table_autotune_timer,
    "first-call-check": table_first_call_check,
    "part2-fp32-sweep": functools.partial(
        sweep_report.table_sweep, name="part3_fp32", module="part3_inner_loop.sweep --dtype fp32 --configs ..."
    ),
}

LOG = [  # (heading, what it measured, table): results/<gpu>/part2_log.md, in this order (common/report.py)
    (
        "The budget",
        "Shared memory and float32 registers per thread that each tile shape needs, by the sweep's own "
        "formulas, against what the H200 and Ada give a program.",
        "part2-budget",
    ),
    (
        "The budget against the compiler",
        "The shared-memory formula against what the compiler really allocated, over every configuration "
        "the sweep compiled.",
        "part2-smem-check",
    ),
    (
        "A few tile shapes at their best",
        "The best warps and stages the sweep found for a few tile shapes, the first kernel's 16 x 16 among them.",
        "part2-sweep-corners",
    ),
    (
        "The sweep's winners",
        "The fastest configurations of each (D, causal) group, checked and timed, with the registers, shared "
        "memory, programs per SM and waves the compiler's binary gives them.",
        "part2-sweep",
    ),
    (
        "Pipeline depth",
        "The winning tiles at each number of stages: TFLOP/s, compiled shared memory and programs per SM.",
        "part2-stages",
    ),
    (
        "What autotuning costs",
        "The first call of a new shape class with an empty and a warm compile cache, against a steady-state call.",
        "part2-autotune",
    ),
    (
        "A shorter autotuning timer (tried, not kept)",
        "Each configuration timed for 25 ms after 5 of warm-up instead of Triton's 100 after 25 (commit e0261fa, "
        "against 13da709 with the default), to cut the first call. The benchmark's 16-bit rows, two interleaved "
        "runs of each: every row within 3% but part 4's forward + backward at D = 64, causal, 15% lower in both runs "
        "with the short timer, so it was taken out again. That row turned out to be bound by the host (its GPU work, "
        "0.76 ms, is barely longer than Python's launches through autograd): in the check below, with the default "
        "timer, one run of it reads 284 TFLOP/s where the others read 314-319 and the CUDA-graph replay 319-323. "
        "So the loss may be the host's and not the timer's; the timer has not been measured again. Low single "
        "readings of other rows (part 3's D = 64 causal forward here at 304, in the check at 313) are the same "
        "kind: the graph replay of those runs is the configuration's usual.",
        "part2-autotune-timer",
    ),
    (
        "What the first call costs, every part",
        "The first forward, first backward and second call of every Triton part in a fresh process with an empty "
        "Triton cache, per dtype, causal flag and shape, before and after float32 got tiles of its own.",
        "cold-start",
    ),
    (
        "The 16-bit benchmark before and after the first-call work",
        "The first-call work (float32 tiles, compiling side by side, the backward compiling ahead) must leave the "
        "16-bit kernels as fast as before: the benchmark's 16-bit rows at N = 4096, three interleaved runs of "
        "9761020 (before it) and 8ac7228 (after), each a fresh process. Every row's median is within 3% of "
        "before's.",
        "first-call-check",
    ),
    (
        "Float32: the fastest tiles",
        "Part 3's forward in float32 (IEEE products), the 16-bit tiles and small ones swept together: the three "
        "fastest of each group (every row, with its compile seconds, is in results/h200/part3_fp32_sweep.csv).",
        "part2-fp32-sweep",
    ),
]
