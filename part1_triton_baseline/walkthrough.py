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
from part1_triton_baseline import figures

part1 = parts.load(1)
print(runtime.describe())

# %% [markdown]
# ## 1. The grid: one program per (query tile, sequence)
#
# Part 0's outer loop over query tiles disappears into the launch grid. Each program owns
# `BLOCK_M` query rows of one (batch, head) sequence and loops over all key tiles itself. With
# N = 100 and tiles of 16 rows, the last query tile and the last key tile run past the sequence:
# the tensor descriptor loads those rows as zeros. `python -m part1_triton_baseline.figures` draws
# the grid and one program's walk (launch_grid.png in this folder).

# %%
shape = Shape((2, 4), 100, 100, 64)
grid = figures.launch_grid(shape.n_q, 2 * 4)  # (cdiv(N_q, BLOCK_M), B * H), as flash_forward launches
print(
    f"q {shape.q_shape}: grid = {grid} -> {grid[0] * grid[1]} programs, each looping over "
    f"{-(-shape.n_k // part1.BLOCK_N)} key tiles of {part1.BLOCK_N} rows"
)
q_start, end, padded = figures.query_rows(grid[0] - 1, shape.n_q)
print(
    f"the last query tile: rows {q_start}-{q_start + part1.BLOCK_M - 1}, {end - q_start} of them in the "
    f"sequence, {padded} past N_q = {shape.n_q} (zeros, computed, never stored)"
)
walk = figures.key_walk(shape.n_k)
whole = [k_start for k_start, _, padded in walk if not padded]
print(f"its walk: steps 1-{len(whole)} load whole K and V tiles, rows {whole[0]}-{whole[-1] + part1.BLOCK_N - 1}")
for step, (k_start, end, padded) in enumerate(walk, 1):
    if padded:
        print(
            f"  step {step}: rows {k_start}-{k_start + part1.BLOCK_N - 1}, {padded} zero rows past N_k = {end}: masked to -inf"
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
    from lab.impls import sdpa_fn
    from lab.timing import attention_flops, tflops, time_ms

    q, k, v, _ = make_inputs(Shape((4, 8), 4096, 4096, 64), torch.bfloat16, runtime.DEVICE)
    for name, fn in (
        ("part 1", lambda: part1.flash_attention(q, k, v)),
        ("SDPA flash", sdpa_fn("flash", q, k, v, False)),
    ):
        ms = time_ms(fn)
        print(f"{name:>10}: {ms:.3f} ms, {tflops(attention_flops(4, 8, 4096, 4096, 64, False), ms)} TFLOP/s")
else:
    print("No GPU: timings need one (the interpreter runs the kernel in numpy, one program at a time).")
