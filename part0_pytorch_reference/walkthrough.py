# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Part 0 walkthrough: FlashAttention-2 in PyTorch
#
# Runs top to bottom on a CPU in a few seconds: `python -m part0_pytorch_reference.walkthrough`
# from the repository root, or `make notebook PART=0` for a notebook. Read it next to `README.md`
# in this folder.

# %%
import math

import torch

from common import parts
from common.check import check_part
from common.inputs import Shape, make_inputs
from common.reference import attention_reference

part0 = parts.load(0)

# %% [markdown]
# ## 1. Online softmax on eight numbers
#
# One query row, eight scores, eight (one-dimensional) values, seen four at a time. After each
# block we keep only the running max `m`, the running sum `l` of `exp(s - m)`, and the
# unnormalised output `acc`. When a block raises the max, everything kept so far is rescaled by
# `alpha = exp(m_old - m_new)`. `python -m part0_pytorch_reference.figures` draws the same
# recurrence over four tiles of eight keys (online_softmax.png in this folder).

# %%
scores = torch.tensor([0.5, 2.0, -1.0, 3.0, 1.0, 4.5, 2.5, 0.0], dtype=torch.float64)
values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], dtype=torch.float64)

m, l, acc = -math.inf, 0.0, 0.0
for start in (0, 4):
    s, v = scores[start : start + 4], values[start : start + 4]
    m_new = max(m, s.max().item())
    alpha = math.exp(m - m_new)  # exp(-inf) = 0 on the first block: nothing to rescale yet
    p = torch.exp(s - m_new)
    tile_sum, tile_acc = p.sum().item(), (p * v).sum().item()
    l = alpha * l + tile_sum
    acc = alpha * acc + tile_acc
    print(f"tile at {start}: m = {m_new}, alpha = {alpha:.4f}, exp(s - m) = {[round(x, 4) for x in p.tolist()]}")
    print(f"    tile sums: exp(s - m) {tile_sum:.4f}, exp(s - m) * v {tile_acc:.4f};  l = {l:.4f}, acc = {acc:.4f}")
    m = m_new

online = acc / l  # the one division, at the end
direct = (torch.softmax(scores, 0) * values).sum().item()
print(f"online: {online:.4f}   softmax over all eight at once: {direct:.4f}")
assert abs(online - direct) < 1e-12

# %% [markdown]
# ## 2. The same loop over tiles of Q, K and V
#
# `part0_pytorch_reference/flash_attention.py` runs exactly that recurrence for a whole tile of
# query rows at once, against tiles of keys. Check it against the materialised float64 reference
# on a ragged shape (lengths that are not multiples of the 64-row tile), causal, in float32:

# %%
shape = Shape((2, 3), 100, 150, 64)
q, k, v, do = make_inputs(shape, torch.float32, "cpu", seed=0)
report = check_part(part0, q, k, v, do, is_causal=True)
print(report)
assert report.ok

# %% [markdown]
# ## 3. What is kept: L instead of P
#
# The forward saves `(Q, K, V, O, L)`. `L` is one number per query row, the logsumexp of that
# row's scores; from it the backward recovers any tile of probabilities as `exp(S_ij - L_i)`
# without a second pass over the row. Compare its size with the probability matrix it replaces:

# %%
qg = q.clone().requires_grad_(True)
o = part0.FlashAttention.apply(qg, k, v, True)
saved = o.grad_fn.saved_tensors
for name, t in zip(("Q", "K", "V", "O", "L"), saved):
    print(f"{name}: {tuple(t.shape)} {t.dtype}")
_, lse_ref = attention_reference(q, k, v, is_causal=True)
print(f"max |L - L_ref| = {(saved[4].double() - lse_ref).abs().max().item():.2e}")
for n in (4096, 32768):
    print(
        f"N = {n}: L holds {n} floats per head ({n * 4 / 1024:.0f} KiB); P would hold {n * n} ({n * n * 2 / 2**20:.0f} MiB in bf16)"
    )

# %% [markdown]
# ## 4. The tiled backward
#
# `common/backward.py` walks key tiles (outer) and query tiles (inner), recomputes
# `P_ij = exp(S_ij - L_i)`, and uses `D_i = rowsum(dO_i * O_i)` for the softmax gradient.
# Its gradients against autograd through the materialised float64 attention:

# %%
for c in report:
    if c.name.startswith("d"):
        print(
            f"{c.name}: max |error| {c.err:.1e}, allowed {c.allowed:.1e} (twice PyTorch's own error, plus a floor: common/check.py)"
        )
