# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Part 4 walkthrough: the backward in Triton
#
# `python -m part4_backward.walkthrough` from the repository root (or `make notebook PART=4`).
# Without a GPU the kernels run in Triton's interpreter, in a few seconds.

# %%
import torch

from common import parts, runtime, steps
from common.check import check_part
from common.inputs import Shape, make_inputs
from part4_backward import figures

part4 = parts.load(4)
print(runtime.describe())

# %% [markdown]
# ## 1. Why D = rowsum(dO * O) makes the softmax gradient tile-local
#
# dS_ij = P_ij (dP_ij - D_i) needs D_i = sum_j P_ij dP_ij, a sum over the whole row of keys. But
# dP = dO V^T and O = P V, so sum_j P_ij dP_ij = sum_j P_ij (dO_i . V_j) = dO_i . O_i: one dot
# product per row, from N x D tensors the backward already has.

# %%
q, k, v, do = make_inputs(Shape((1,), 6, 9, 16), torch.float64, "cpu", seed=0)
p = torch.softmax(q @ k.transpose(-2, -1) * 16**-0.5, dim=-1)  # (1, 6, 9), the full P
o, dp = p @ v, do @ v.transpose(-2, -1)
for i, (from_p, from_o) in enumerate(zip((p * dp).sum(-1)[0].tolist(), (do * o).sum(-1)[0].tolist())):
    print(f"row {i}: sum_j P_ij dP_ij = {from_p:+.6f}   rowsum(dO_i * O_i) = {from_o:+.6f}")

# %% [markdown]
# ## 2. Two loop orders
#
# A key tile's gradient (dK_j, dV_j) sums over queries, a query tile's (dQ_i) over keys, so each
# kernel walks the other side: the dK/dV kernel one program per key tile, down the query tiles
# that see it; the dQ kernel one program per query tile, across the key tiles it sees (the
# forward's walk). `figures.py` writes both kernels' loop bounds in Python (the tests check them
# against brute force) and draws them (backward_loops.png); causal, N = 320, the tiles of the
# tuned D = 64 configurations:

# %%
bm, bn = figures.DKDV_TILES
print(f"dK/dV kernel, {bm} query rows x {bn} keys:")
for k_start in range(0, figures.N, bn):
    masked, unmasked = figures.dkdv_query_tiles(k_start, bm, bn, figures.N, True)
    print(f"  key tile at {k_start:>3}: query tiles {masked} with a mask, then {unmasked} without")
bm, bn = figures.DQ_TILES
print(f"dQ kernel, {bm} query rows x {bn} keys:")
for q_start in range(0, figures.N, bm):
    unmasked, masked = figures.dq_key_tiles(q_start, bm, bn, figures.N, True)
    print(f"  query tile at {q_start:>3}: key tiles {unmasked} without a mask, then {masked} with one")

# %% [markdown]
# ## 3. The three launches, checked
#
# `flash_backward` runs the preprocess (D), the dK/dV kernel (one program per key tile) and the
# dQ kernel (one program per query tile). Causal, ragged, N_q != N_k, N = 1:

# %%
for shape, causal in (
    (Shape((2, 2), 100, 77, 64), True),
    (Shape((1, 2), 65, 200, 32), False),
    (Shape((2,), 40, 1, 16), False),
):
    q, k, v, do = make_inputs(shape, torch.float16, runtime.DEVICE, seed=1)
    report = check_part(part4, q, k, v, do, causal)
    print(f"{shape} causal={causal}: {report}")
    assert report.ok

# %% [markdown]
# ## 4. Deterministic by default, atomics as the alternative
#
# Each dQ tile is written by one program, summing the key tiles in a fixed order: two calls give
# the same bits. FlashAttention-2's choice, kept as a study's patch (tools/variants/atomic_dq.diff:
# `atomic_dq=True`), has the dK/dV kernel add each contribution to dQ with float32 atomics instead, in
# whatever order programs finish: on a GPU the last bits change from run to run (the interpreter runs
# programs one at a time, so it cannot show it).

# %%
q, k, v, do = make_inputs(Shape((2, 2), 100, 77, 64), torch.float16, runtime.DEVICE, seed=2)
o, lse = part4.flash_forward(q, k, v, True)
first = part4.flash_backward(q, k, v, o, lse, do, True)
second = part4.flash_backward(q, k, v, o, lse, do, True)
print("second pass, two calls bitwise equal:", all(torch.equal(a, b) for a, b in zip(first, second)))
atomics = steps.load_variant(4, "atomic_dq")
atomic = [atomics.flash_backward(q, k, v, o, lse, do, True, atomic_dq=True)[0] for _ in range(3)]
print("atomics, max |dQ - dQ (second pass)|:", max((a.float() - first[0].float()).abs().max().item() for a in atomic))

# %% [markdown]
# ## 5. Memory: nothing N x N
#
# What the backward keeps beyond its inputs: D (N floats per row), dQ, dK, dV (N x D each). The
# materialised backward needs P and dP, N x N each.

# %%
for n in (1024, 4096, 16384):
    flash = (n * 4 + 3 * n * 64 * 2) * 32  # B*H = 32 sequences, D = 64, bf16 gradients, float32 D
    materialised = 2 * n * n * 2 * 32
    print(f"N={n:>5}: flash backward {flash / 2**20:7.1f} MiB, materialised P and dP {materialised / 2**20:9.1f} MiB")
