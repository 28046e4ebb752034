"""The Triton backward, from part 4 on: repeatable bits, the atomics variant, every tile ratio, a
non-causal backward that really is non-causal, and gradients that train a small model like SDPA's."""

import pytest
import torch

from common import parts, steps
from common.check import check_outputs, check_part
from common.inputs import Shape, make_inputs
from tests.helpers import (
    DEVICE,
    DTYPE_IDS,
    DTYPES,
    HAS_GPU,
    INTERPRET,
    assert_report_ok,
    assert_same,
    deterministic_algorithms,
    dq_reordered,
    mutant,
    skip_unsupported,
)

SHAPE = Shape((2, 3), 300, 451, 64) if HAS_GPU else Shape((1, 2), 70, 101, 32)
DKDV_LINE = """BWD_DKDV_CONFIGS = (
    [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    if INTERPRET
    else BWD_DKDV + list(BWD_DKDV_FLOAT32.values())
)"""
DQ_LINE = """BWD_DQ_CONFIGS = (
    [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    if INTERPRET
    else BWD_DQ + list(BWD_DQ_FLOAT32.values())
)"""
TILES = [(32, 128), (64, 64), (128, 32)] if HAS_GPU else [(16, 32), (16, 16), (32, 16)]


def _grads(module, q, k, v, do, is_causal, **kw):
    o, lse = module.flash_forward(q, k, v, is_causal)
    return (o, lse, *module.flash_backward(q, k, v, o, lse, do, is_causal, **kw))


@pytest.mark.since_part(4)
@pytest.mark.parametrize("mode", ["default", "deterministic"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_deterministic(part, dtype, is_causal, mode):
    """Two backward calls on the same inputs give the same bits: no atomics, a fixed summation
    order. Part 5's Gluon backward (16-bit inputs on a Hopper GPU) sums dQ in the order its programs
    arrive: its dQ agrees up to that order, and under torch.use_deterministic_algorithms(True) part 5
    runs part 4's kernels, whose bits repeat."""
    skip_unsupported(part, dtype)
    module = parts.load(part)
    q, k, v, do = make_inputs(SHAPE, dtype, DEVICE, seed=1)
    with deterministic_algorithms(mode == "deterministic"):
        first = _grads(module, q, k, v, do, is_causal)
        second = _grads(module, q, k, v, do, is_causal)
    reordered = dq_reordered(module)
    assert not (reordered and mode == "deterministic"), "deterministic algorithms asked for, dQ summed in any order"
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), first, second):
        assert_same(name, a, b, "two calls", reordered and name == "dQ")


@pytest.mark.only_parts(4)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_atomic_dq(part, dtype, is_causal):
    """FlashAttention-2's variant (dQ added with atomics by the dK/dV kernel), the patch
    tools/variants/atomic_dq.diff that part4_backward/tools/dq_atomics.py times, is correct too; and with
    atomic_dq=False the patched file is part 4's backward, bit for bit."""
    skip_unsupported(part, dtype)
    module = steps.load_variant(part, "atomic_dq")
    for i, shape in enumerate((SHAPE, Shape((2,), 40, 1, 16), Shape((1, 2), 1, 50, 32))):
        q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=2 + i, scale=5.0 if i == 0 else 1.0)
        out = dict(zip(("O", "L", "dQ", "dK", "dV"), _grads(module, q, k, v, do, is_causal, atomic_dq=True)))
        assert_report_ok(check_outputs(out, q, k, v, do, is_causal), f"atomic dQ {shape}")
        shipped = _grads(parts.load(part), q, k, v, do, is_causal)
        for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), shipped, _grads(module, q, k, v, do, is_causal)):
            assert_same(name, a, b, f"the patch with atomic_dq=False and part 4 {shape}")


@pytest.mark.since_part(4)
@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_every_tile_ratio(part, tiles, tmp_path):
    """Both backward kernels with BLOCK_M <, = and > BLOCK_N, causal (diagonal tiles) and not."""
    stages = 1 if INTERPRET else 2
    config = f'[triton.Config({{"BLOCK_M": {tiles[0]}, "BLOCK_N": {tiles[1]}}}, num_warps=4, num_stages={stages})]'
    module = mutant(
        part,
        tmp_path,
        f"bwd_tiles_{tiles[0]}x{tiles[1]}",
        [(DKDV_LINE, f"BWD_DKDV_CONFIGS = {config}"), (DQ_LINE, f"BWD_DQ_CONFIGS = {config}")],
    )
    for is_causal in (False, True):
        q, k, v, do = make_inputs(SHAPE, torch.float16, DEVICE, seed=4)
        assert_report_ok(check_part(module, q, k, v, do, is_causal), f"{tiles} causal={is_causal}")


@pytest.mark.since_part(4)
def test_non_causal_backward_is_not_causal(part, tmp_path):
    """A public tutorial once shipped a non-causal backward that did causal work. The same mistake
    here (the dK/dV kernel's loop bounds always causal) must fail the non-causal check, and only it."""
    broken = mutant(
        part,
        tmp_path,
        "always_causal_dkdv",
        [("    if IS_CAUSAL:\n        lo = ", "    if True:\n        lo = ")],
    )
    q, k, v, do = make_inputs(SHAPE, torch.float32, DEVICE, seed=5)
    assert check_part(broken, q, k, v, do, True).ok
    assert not check_part(broken, q, k, v, do, False).ok


class TwoLayers(torch.nn.Module):
    """x -> attention over heads -> linear: enough for gradients to flow through flash_attention."""

    def __init__(self, attention, d_model=64, heads=2):
        super().__init__()
        self.attention, self.heads = attention, heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        return self.out(self.attention(q, k, v).transpose(1, 2).reshape(b, n, -1))


@pytest.mark.since_part(4)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_trains_like_sdpa(part, is_causal):
    """One optimizer step of a small model: with flash_attention and with SDPA, from the same weights,
    on float32 (IEEE products in both), the loss, every parameter's gradient and the updated weights agree."""
    module = parts.load(part)
    models = []
    for attention in (
        lambda q, k, v: module.flash_attention(q, k, v, is_causal),
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
    ):
        torch.manual_seed(0)
        models.append(TwoLayers(attention).to(DEVICE))
    x = torch.randn(2, 77, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    losses = []
    for model in models:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for (name, ours), (_, theirs) in zip(models[0].named_parameters(), models[1].named_parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5, msg=f"gradient of {name}")
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=f"{name} after one step")
