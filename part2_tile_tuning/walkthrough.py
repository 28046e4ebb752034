# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Part 2 walkthrough: tile sizes, warps, stages
#
# `python -m part2_tile_tuning.walkthrough` from the repository root (or `make notebook PART=2`).
# The sweep itself needs a GPU (`python -m part2_tile_tuning.tools.sweep`); this walkthrough runs anywhere.

# %%
import torch

from common import launch, parts, runtime
from common.check import check_part
from common.inputs import Shape, make_inputs
from lab.sweep import regs_estimate

part2 = parts.load(2)
print(runtime.describe())

# %% [markdown]
# ## 1. The shared-memory budget
#
# A program keeps its Q tile for the whole loop and, to hide memory latency, `num_stages`
# buffers each of K and V in flight. In bf16 (2 bytes):

# %%
limit = launch.smem_limit()
where = "read off this GPU" if runtime.HAS_GPU else "no GPU here: Hopper's limit, assumed"
print(f"shared memory one program may use: {limit // 1024} KB ({where})")
for d in (64, 128):
    for bm, bn in ((16, 16), (128, 64), (128, 128), (256, 128)):
        cells = []
        for stages in (1, 2, 3, 4):
            b = part2.smem_bytes(bm, bn, d, 2, stages)
            cells.append(f"{b // 1024:>4} KB{'' if b <= limit else ' (too big)':<11}")
        print(f"D={d:<3} {bm:>3}x{bn:<3} stages 1-4: " + " ".join(cells))

# %% [markdown]
# ## 2. The register budget
#
# The output accumulator O_i (BLOCK_M x D) and the score tile S_ij (BLOCK_M x BLOCK_N) live in
# registers, in float32, spread over 32 * num_warps threads. A thread can address 255:

# %%
for bm, bn, d in ((128, 64, 64), (128, 128, 128), (256, 128, 128)):
    print(
        f"{bm}x{bn}, D={d}: "
        + ", ".join(f"{w} warps -> {regs_estimate(bm, bn, d, w):.0f} per thread" for w in (2, 4, 8))
    )

# %% [markdown]
# ## 3. What the autotuner chooses from
#
# `TUNED` is the short list of sweep winners a GPU's autotuner times (under the interpreter, which
# cannot time anything, `CONFIGS` holds one configuration instead). The key is (D, causal, power of
# two of N), plus the dtype. For each: its tiles, warps and stages, the shared memory it needs
# (section 1) and the registers its accumulators take per thread (section 2):

# %%
print("at D = 64/128, bf16:")
for name, configs in (("TUNED", part2.TUNED), ("CONFIGS", [] if runtime.HAS_GPU else part2.CONFIGS)):
    for c in configs:
        bm, bn, w, s = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages
        smem = "/".join(f"{part2.smem_bytes(bm, bn, d, 2, s) // 1024}" for d in (64, 128))
        regs = "/".join(f"{regs_estimate(bm, bn, d, w):.0f}" for d in (64, 128))
        print(
            f"  {name:<8} {bm:>3} x {bn:<3} tiles, {w} warps, {s} stage(s): {smem:>7} KB of shared memory, "
            f"{regs:>7} registers a thread"
        )
shape = Shape((2, 2), 100, 80, 64)
q, k, v, do = make_inputs(shape, torch.float16, runtime.DEVICE, seed=2)
report = check_part(part2, q, k, v, do, is_causal=True)
print(report)
assert report.ok
if runtime.HAS_GPU:
    print("the autotuner picked:", parts.forward_config(part2))
