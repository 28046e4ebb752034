# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Part 1 walkthrough: the first Triton kernel
#
# `python -m part1_triton_baseline.walkthrough` from the repository root (or `make notebook PART=1`).
# Without a GPU the kernel runs in Triton's interpreter, on the CPU, in a few seconds; with one it
# is compiled.

# %%
import torch

from common import parts, runtime  # runtime picks the interpreter when there is no GPU
from common.check import check_part
from common.inputs import Shape, make_inputs

part1 = parts.load(1)
print(runtime.describe())

# %% [markdown]
# ## 1. The grid: one program per (query tile, sequence)
#
# Part 0's outer loop over query tiles disappears into the launch grid. Each program owns
# `BLOCK_M` query rows of one (batch, head) sequence and loops over all key tiles itself.

# %%
shape = Shape((2, 4), 100, 100, 64)
grid = (-(-shape.n_q // part1.BLOCK_M), 2 * 4)
print(
    f"q {shape.q_shape}: grid = {grid} -> {grid[0] * grid[1]} programs, each looping over "
    f"{-(-shape.n_k // part1.BLOCK_N)} key tiles of {part1.BLOCK_N} rows"
)

# %% [markdown]
# ## 2. It matches the float64 reference, ragged lengths and all

# %%
dtype = torch.float16  # bf16 needs a GPU: the interpreter's bf16 tl.dot is wrong (triton-lang/triton#11584)
for is_causal in (False, True):
    q, k, v, do = make_inputs(shape, dtype, runtime.DEVICE, seed=1)
    report = check_part(part1, q, k, v, do, is_causal)
    print(f"causal={is_causal}: {report}")
    assert report.ok

# %% [markdown]
# ## 3. Why every tile needs the key mask
#
# A descriptor (like the seed's block pointer) fills rows past the end with zeros. A zero key
# scores exactly 0 against every query, an ordinary score, so without the mask the padding joins
# the softmax. Here is that effect in plain PyTorch: 100 keys, padded to 112 (7 tiles of 16).

# %%
q1, k1, v1 = (torch.randn(n, 64, dtype=torch.float64) for n in (1, 100, 100))
exact = torch.softmax(q1 @ k1.T / 8, -1) @ v1
k_pad, v_pad = (
    torch.cat([k1, torch.zeros(12, 64, dtype=torch.float64)]),
    torch.cat([v1, torch.zeros(12, 64, dtype=torch.float64)]),
)
phantom = torch.softmax(q1 @ k_pad.T / 8, -1) @ v_pad
print(f"max |error| with 12 phantom keys: {(phantom - exact).abs().max().item():.3f}  (masked: 0)")

# %% [markdown]
# ## 4. `.to()` returns a new tensor
#
# The seed's scaffold wrote `P.to(V.dtype)` on a line of its own. Nothing changed: `.to()` in
# Triton, as in PyTorch, returns a converted copy. The float16 tests caught it because `tl.dot`
# refuses a float32 operand next to a float16 one (tests/test_seed_bugs.py re-creates the bug).

# %%
p = torch.rand(4, dtype=torch.float32)
p.to(torch.float16)
print("after p.to(float16):", p.dtype)
p = p.to(torch.float16)
print("after p = p.to(float16):", p.dtype)

# %% [markdown]
# ## 5. On a GPU: a first timing against SDPA
#
# The full protocol is `make bench PART=1`; this is one shape, to show the size of the gap.

# %%
if runtime.HAS_GPU:
    from common.bench import attention_flops, sdpa_fn, time_ms

    q, k, v, _ = make_inputs(Shape((4, 8), 4096, 4096, 64), torch.bfloat16, runtime.DEVICE)
    for name, fn in (
        ("part 1", lambda: part1.flash_attention(q, k, v)),
        ("SDPA flash", sdpa_fn("flash", q, k, v, False)),
    ):
        ms = time_ms(fn)
        print(f"{name:>10}: {ms:.3f} ms, {attention_flops(4, 8, 4096, 4096, 64, False) / ms * 1e-9:.0f} TFLOP/s")
else:
    print("No GPU: timings need one (the interpreter runs the kernel in numpy, one program at a time).")
