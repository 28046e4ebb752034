# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Part 5 walkthrough: reading a roofline
#
# `python -m part5_profiling.walkthrough` from the repository root. Nothing here needs a GPU: it
# works out where attention sits on a roofline from first principles, then reads whatever the
# committed results (results/h200/) hold: the ceilings measured on the GPU, the profile of every
# part, and the roofline drawn from them.

# %%
from common import results
from common.timing import attention_flops
from part5_profiling import roofline

GPU_DIR = results.results_dir("h200")

# %% [markdown]
# ## 1. How many FLOPs per byte attention does
#
# The forward at B=4, H=8, N=4096 does 4 * B * H * N^2 * D FLOPs (two matrix products) and must at
# least read Q, K, V and write O and L. Their ratio is the arithmetic intensity: it grows with N,
# because the work is N^2 and the data is N.

# %%
for d in (64, 128):
    for pass_ in ("fwd", "bwd"):
        flops = attention_flops(4, 8, 4096, 4096, d, False, pass_)
        nbytes = roofline.compulsory_bytes(pass_, d)
        print(
            f"D={d:<3} {pass_}: {flops / 1e9:8.1f} GFLOP over {nbytes / 1e6:6.1f} MB: {flops / nbytes:6.0f} FLOPs per byte"
        )

# %% [markdown]
# ## 2. The ridge point
#
# A GPU that multiplies at P FLOP/s and moves B bytes/s is compute-bound above P / B FLOPs per
# byte. With the H200's datasheet figures (989 TFLOP/s of dense bf16, 4.8 TB/s) that is about 206:
# attention at N = 4096 is far to the right of it. Nothing about attention at this size is limited
# by DRAM bandwidth; what separates a kernel from the roof is how well it keeps the tensor cores
# busy, which is what the profile looks at.

# %%
print(f"ridge point, datasheet: {989e12 / 4.8e12:.0f} FLOPs per byte")
path = GPU_DIR / "part5_ceilings.csv"
if path.exists():
    peak, bw = roofline.ceilings(results.read_csv(path))
    print(f"measured on the GPU: {peak:.0f} TFLOP/s, {bw:.2f} TB/s, ridge at {peak / bw:.0f} FLOPs per byte")
else:
    print(f"({results.shown(path)} is not there yet: `python -m part5_profiling.ceilings` on a GPU writes it)")

# %% [markdown]
# ## 3. The committed profile and roofline

# %%
path = GPU_DIR / "part5_profile.csv"
if path.exists():
    for p in roofline.points(results.read_csv(path)):
        how = "measured" if p["measured"] else "modelled"
        print(
            f"{p['target']:>12} {p['pass_']} D={p['D']:<3} causal={p['causal']}: {p['tflops']:6.1f} TFLOP/s at "
            f"{p['intensity']:6.0f} FLOPs per byte ({how} bytes)"
        )
else:
    print(f"({results.shown(path)} is not there yet: `make profile PART=N` on a GPU writes it)")
