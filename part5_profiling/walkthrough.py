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
# `python -m part5_profiling.walkthrough` from the repository root. Nothing here needs a GPU, and
# nothing here is measured on this machine: section 1 works out where attention sits on a roofline
# from first principles; sections 2 and 3 print a few numbers measured on an H200, read from the
# committed results in results/h200/ (each says which file); section 4 models the K/V ring of part
# 5's Gluon forward in plain Python. Section 0 first asks which kernels part 5 runs on this machine.

# %%
import inspect

import torch

from common import runtime
from lab import results
from lab.timing import attention_flops
from part5_profiling import gluon_attention
from part5_profiling.tools import ring, roofline

GPU_DIR = results.results_dir("h200")

# %% [markdown]
# ## 0. Which kernels run here
#
# Part 5's lesson, the Gluon forward and backward, is written for Hopper (sm_90: wgmma and TMA as
# it uses them). On every other GPU, Blackwell included, and without a GPU, part 5 runs part 4's
# Triton kernels, and the Gluon code is read rather than run. The routing's own test, asked here:

# %%
q = torch.empty(1, 128, 64, dtype=torch.bfloat16 if runtime.HAS_GPU else torch.float16, device=runtime.DEVICE)
where = (
    f"{torch.cuda.get_device_name()} (sm_{''.join(map(str, runtime.capability(q.device)))})"
    if runtime.HAS_GPU
    else "no GPU"
)
kernels = "the Gluon kernels" if gluon_attention.supported(q) else "part 4's Triton kernels"
print(f"{where}: a 16-bit call at D = 64 runs {kernels}")

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
    rows = results.read_csv(path)
    peak, bw = roofline.ceilings(rows)
    print(f"measured on an {rows[0]['gpu']}, read from the committed {results.shown(path)}:")
    print(f"  {peak:.0f} TFLOP/s of bf16 matmul, {bw:.2f} TB/s of copy: ridge at {peak / bw:.0f} FLOPs per byte")
else:
    print(f"({results.shown(path)} is not there yet: `python -m part5_profiling.tools.ceilings` on a GPU writes it)")

# %% [markdown]
# ## 3. Where parts 4 and 5 sit
#
# Again read from the committed results, not measured here: results/h200/part5_profile.csv, which
# `make profile PART=N` writes on the GPU. Each pass's FLOPs over its kernels' time, and over the
# bytes they moved to and from DRAM (ncu's counters). Every pass sits right of the ridge, part 5's
# causal backward only just: at this size attention is compute-bound. `python -m
# part5_profiling.tools.roofline` draws every point, the SDPA backends' too, in results/h200/part5_roofline.png.

# %%
path = GPU_DIR / "part5_profile.csv"
if path.exists():
    rows = results.read_csv(path)
    ridge = peak / bw if (GPU_DIR / "part5_ceilings.csv").exists() else 989e12 / 4.8e12
    found = {(p["target"], p["pass_"], p["causal"]): p for p in roofline.points(rows) if p["D"] == 128}
    runs = {r["target"]: f"an {r['gpu']} at commit {r['commit'][:7]}" for r in rows}
    print(
        f"read from the committed {results.shown(path)}: part 4 measured on {runs['part4']}, part 5 on {runs['part5']}"
    )
    print(f"D = 128, B = 4, H = 8, N = 4096; the ridge is at {ridge:.0f} FLOPs per byte")
    print(f"{'':<13}{'not causal':<46}causal")
    for target in ("part4", "part5"):
        for pass_ in ("fwd", "bwd"):
            cells = [found.get((target, pass_, c)) for c in (0, 1)]
            text = [
                f"{p['tflops']:3.0f} TFLOP/s, {p['intensity']:4.0f} FLOPs/byte = {p['intensity'] / ridge:3.1f}x ridge"
                if p
                else "-"
                for p in cells
            ]
            print(f"part {target[4:]} {pass_}:  {text[0]:<46}{text[1]}")
else:
    print(f"({results.shown(path)} is not there yet: `make profile PART=N` on a GPU writes it)")

# %% [markdown]
# ## 4. The Gluon forward's K/V ring, modelled
#
# `gluon_attention.py` gives each program one loader warp and softmax warpgroups of 64 query rows
# (two at D = 128, three at D = 64: its CONFIGS). The loader copies K_j and V_j into a ring of STAGES
# shared-memory buffers; mbarriers carry the hand-off: ready[slot] completes a phase when the copy
# lands, free[slot] when every warpgroup has arrived on it. Gluon has no interpreter, so `ring.py`
# models the K ring in plain Python with the kernel's rule: key tile `it` goes to slot
# `it % STAGES` with phase bit `(it // STAGES) & 1`; the loader waits on free[slot] with parity
# `phase ^ 1`, each warpgroup on ready[slot] with parity `phase`. A wait with parity p passes once
# the phase of parity p just before the current one has completed, and a fresh barrier counts as
# having completed phase -1: so the loader's first wait on each free barrier (parity 1) passes at
# once, and its next one (parity 0) waits for every warpgroup to release the slot.
#
# The model's two sides, then 6 key tiles with STAGES = 2 and two warpgroups, the loader taking its
# turn first whenever it can go (tests/test_figures.py runs many other interleavings and checks that
# none deadlocks or overwrites a slot not yet released). `python -m part5_profiling.figures` draws
# the roles, the ring, and one step of a warpgroup.

# %%
print(inspect.getsource(ring.loader))
print(inspect.getsource(ring.consumer))
events, errors = ring.run(6, 2, 2)
print("\n".join(ring.story(events, 2, 2)))
assert not errors, errors
blocked = [e["who"] for e in events if e["blocked"]]
print(
    f"the loader blocked {blocked.count('loader')} times on a free barrier; the warpgroups {len(blocked) - blocked.count('loader')} times on ready"
)
