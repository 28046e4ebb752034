# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Part 3 walkthrough: the inner loop
#
# `python -m part3_inner_loop.walkthrough` from the repository root (or `make notebook PART=3`).
# Without a GPU the kernel runs in Triton's interpreter, in a few seconds.

# %%
import math

import torch

from common import parts, runtime, steps
from common.check import check_part
from common.inputs import Shape, make_inputs
from part3_inner_loop import figures
from part3_inner_loop.tools import ablation

part3 = parts.load(3)
print(runtime.describe())

# %% [markdown]
# ## 1. Which key tiles a program visits
#
# `figures.key_tiles` is the kernel's loop bounds in Python: the tiles every row of the query tile
# sees whole (no mask), then the ones that need a mask (the diagonal, the ragged end). The rest
# are never loaded. `python -m part3_inner_loop.figures` draws the picture in the README.

# %%
n, block_m, block_n = 1024, 128, 64
visited = masked = 0
for q_start in range(0, n, block_m):
    unmasked, with_mask = figures.key_tiles(q_start, block_m, block_n, n, causal=True)
    visited, masked = visited + len(unmasked) + len(with_mask), masked + len(with_mask)
    print(f"query tile at {q_start:>4}: {len(unmasked):>2} tiles without a mask, {len(with_mask)} with one")
total = (n // block_m) * (n // block_n)
print(
    f"causal, N={n}, {block_m}x{block_n}: {visited} of {total} tiles visited ({masked} masked); part 2 visited all {total}"
)

# %% [markdown]
# ## 2. exp2 with the scale folded in
#
# exp(x) = 2^(x log2 e). The kernel computes `exp2(S * scale * log2(e) - m)`: the multiply and the
# subtraction are one fused multiply-add, and exp2 is the GPU's native instruction. The running
# max m_i is in the same base-2 units; at the end L = (m_i + log2 l_i) * ln 2 is a natural log again.

# %%
s, scale = torch.randn(8, dtype=torch.float64) * 3, 64**-0.5
m2 = (s * scale * math.log2(math.e)).max()
l2 = torch.exp2(s * scale * math.log2(math.e) - m2).sum()
print("L from base 2:", ((m2 + torch.log2(l2)) * math.log(2)).item())
print("L directly:   ", torch.logsumexp(s * scale, 0).item())

# %% [markdown]
# ## 3. The kernel, checked
#
# Causal, ragged, N_q != N_k: the cases where the split into unmasked and masked tiles can go wrong.

# %%
for shape, causal in (
    (Shape((2, 2), 100, 77, 64), True),
    (Shape((1, 2), 65, 200, 32), True),
    (Shape((2,), 90, 90, 16), False),
):
    q, k, v, do = make_inputs(shape, torch.float16, runtime.DEVICE, seed=1)
    report = check_part(part3, q, k, v, do, causal, grads=False)
    print(f"{shape} causal={causal}: {report}")
    assert report.ok

# %% [markdown]
# ## 4. The ablation, one change at a time
#
# `steps/` holds one patch per change; applied in order to part 2's kernel they give part 3's.
# `python -m part3_inner_loop.tools.ablation` times every step on a GPU; here, what each one changes:

# %%
sources = ablation.step_sources()
for i, label in enumerate(ablation.LABELS[1:], 1):
    before, after = sources[i - 1].splitlines(), sources[i].splitlines()
    print(f"step {i} {label:<26} {len(before):>4} -> {len(after):>4} lines")
assert sources[-1] == parts.path(3).read_text()
print(steps.steps_of(3)[0].path.read_text())
