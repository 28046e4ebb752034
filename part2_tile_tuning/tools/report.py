"""Part 2's tables (lab/report.py puts them in the README and the results log): the budget, the sweep
(lab/sweep_report.py's tables and heatmaps, given part 2's files), the autotuner's cost."""

import functools

from lab import sweep_report
from lab.results import markdown_table, read_csv, table_block
from lab.sweep import MAX_REGS, regs_estimate
from part2_tile_tuning.flash_attention import smem_bytes

ADA_SMEM_PER_BLOCK = 99 * 1024  # compute capability 8.9 (the seed's RTX 4070 Super): CUDA guide, per-block opt-in
SWEEP = "part2_tile_tuning.tools.sweep"


def draw(gpu_dir):
    return sweep_report.draw_heatmaps(gpu_dir, "part2", "Part 2")


def table_budget(gpu_dir):
    """Shared memory (smem_bytes) against the H200's and Ada's per-program limits, and float32 registers
    (regs_estimate) against what a thread can address, for a few tiles."""
    dev = sweep_report.device(gpu_dir, "part2")
    limit = dev["shared_memory_per_block_optin"]

    def smem(bm, bn, d, s):
        b = smem_bytes(bm, bn, d, 2, s)
        mark = "" if b <= ADA_SMEM_PER_BLOCK else "**" if b <= limit else "~~"
        return f"{mark}{b / 1024:.0f}{mark}"

    def regs(bm, bn, d, w):
        n = regs_estimate(bm, bn, d, w)
        return f"{n:.0f}" if n <= MAX_REGS else f"~~{n:.0f}~~"

    tiles = ((16, 16), (64, 64), (128, 64), (128, 128), (256, 64), (256, 128))
    smem_rows = [[d, f"{bm} x {bn}", *(smem(bm, bn, d, s) for s in range(1, 6))] for d in (64, 128) for bm, bn in tiles]
    reg_tiles = ((64, 64), (128, 64), (128, 128), (256, 64))
    reg_rows = [[d, f"{bm} x {bn}", regs(bm, bn, d, 4), regs(bm, bn, d, 8)] for d in (64, 128) for bm, bn in reg_tiles]
    return f"""\
_Limits read off the {dev["name"]} by `python -m {SWEEP}` (results/{gpu_dir.name}/part2_device.json): \
{dev["shared_memory_per_multiprocessor"] / 1024:.0f} KB of shared memory per SM, {limit / 1024:.0f} KB per program \
(opt-in), {dev["regs_per_multiprocessor"]} 32-bit registers per SM, {dev["multi_processor_count"]} SMs. \
Ada (compute capability 8.9): {ADA_SMEM_PER_BLOCK / 1024:.0f} KB per program. Regenerate: `make report`._

Shared memory for Q once plus `stages` buffers of K and V (Hopper's count), bf16, in KB. \
**bold**: over Ada's 99 KB; ~~struck~~: over the H200's too.

{markdown_table(["D", "BLOCK_M x BLOCK_N", "1 stage", *(f"{s} stages" for s in range(2, 6))], smem_rows, "llrrrrr")}

float32 registers per thread for the accumulator O_i (BLOCK_M x D) plus the score tile S_ij \
(BLOCK_M x BLOCK_N), against the {MAX_REGS} a thread can address (the compiler needs more for \
addresses, m_i, l_i and operands); ~~struck~~: more than that, pruned by the sweep:

{markdown_table(["D", "BLOCK_M x BLOCK_N", "4 warps", "8 warps"], reg_rows, "llrr")}"""


def table_autotune(gpu_dir):
    """What @triton.autotune cost: first calls (cold and warm cache) against the steady state."""
    rows = read_csv(gpu_dir / "part2_autotune.csv")
    body = [[r["scenario"], f"{r['seconds']:.3g}", r["configs"] or "—", r["chosen"] or "—"] for r in rows]
    header = ["what", "seconds", "configurations tried", "chosen"]
    return table_block(rows, "python -m lab.coldstart --autotune --part 2 && make report", "", header, body, "lrrl")


TABLES = {
    "part2-budget": table_budget,
    "part2-smem-check": functools.partial(sweep_report.table_smem_check, name="part2", module=SWEEP),
    "part2-sweep-corners": functools.partial(sweep_report.table_sweep_corners, name="part2", module=SWEEP),
    "part2-sweep": functools.partial(sweep_report.table_sweep, name="part2", module=SWEEP),
    "part2-stages": functools.partial(sweep_report.table_sweep_stages, name="part2", module=SWEEP),
    "part2-autotune": table_autotune,
    "part2-fp32-sweep": functools.partial(
        sweep_report.table_sweep, name="part3_fp32", module="part3_inner_loop.tools.sweep --dtype fp32 --configs ..."
    ),
}
