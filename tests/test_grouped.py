"""Grouped key/value heads (grouped-query attention), from part 5 on: K and V with H_kv heads, H a
multiple of H_kv. Query head h reads key/value head h // (H / H_kv); dK and dV sum over the group's
query heads. Checked against the float64 reference (which repeats each key/value head for its group),
on the Gluon kernels (16-bit on a Hopper GPU) and on part 4's Triton kernels (float32, other GPUs,
the interpreter, and every backward under deterministic algorithms). Earlier parts refuse such
inputs, naming k and the part that takes them."""

import pytest
import torch

from common import parts
from common.check import check_part
from common.inputs import Shape, make_inputs
from common.validate import check_inputs
from tests.helpers import (
    DEVICE,
    DTYPE_IDS,
    DTYPES,
    HAS_GPU,
    assert_report_ok,
    deterministic_algorithms,
    skip_unsupported,
)

SHAPE = Shape((2, 8), 300, 451, 64) if HAS_GPU else Shape((1, 4), 70, 101, 32)
HEAD_DIMS = (64, 128) if HAS_GPU else (32,)


def grouped(shape, dtype, kv_heads, seed=0, d=None):
    """(q, k, v, do) of `shape` (D replaced by d), k and v cut to their first kv_heads heads."""
    if d is not None:
        shape = Shape(shape.lead, shape.n_q, shape.n_k, d)
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=seed)
    return q, k[:, :kv_heads].contiguous(), v[:, :kv_heads].contiguous(), do


@pytest.mark.since_part(5)
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["one-kv-head", "two-kv-heads"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_grouped_heads_match_the_reference(part, dtype, is_causal, kv_heads):
    skip_unsupported(part, dtype)
    module = parts.load(part)
    for d in HEAD_DIMS:
        q, k, v, do = grouped(SHAPE, dtype, kv_heads, seed=d, d=d)
        report = check_part(module, q, k, v, do, is_causal)
        assert_report_ok(report, f"part {part}, {kv_heads} key/value heads for {q.shape[1]}, D={d}")


@pytest.mark.since_part(5)
@pytest.mark.skipif(not HAS_GPU, reason="on the CPU every call already runs the Triton kernels")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_grouped_heads_under_deterministic_algorithms(part, is_causal):
    """Deterministic algorithms send the backward to the Triton kernels: same answer, same bits twice."""
    module = parts.load(part)
    q, k, v, do = grouped(SHAPE, torch.bfloat16, 2)
    with deterministic_algorithms(True):
        first = check_part(module, q, k, v, do, is_causal)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grads = [torch.autograd.grad(module.FlashAttention.apply(*leaves, is_causal), leaves, do) for _ in range(2)]
    assert_report_ok(first, f"part {part}, deterministic")
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("part_number", [0, 1, 2, 3, 4])
def test_earlier_parts_refuse_grouped_heads_naming_k(part_number):
    module = parts.load(part_number)
    dtype = torch.float32
    q, k, v, do = grouped(Shape((1, 4), 16, 16, 32), dtype, 2)
    with pytest.raises(ValueError, match=r"^k has leading .*part 5 takes"):
        module.FlashAttention.apply(q, k, v, False)


def test_a_group_that_does_not_divide_is_refused():
    q = torch.zeros(1, 4, 8, 32)
    k = torch.zeros(1, 3, 8, 32)
    with pytest.raises(ValueError, match=r"^k has 3 heads and q 4"):
        check_inputs(q, k, k, False, grouped=True)
    with pytest.raises(ValueError, match=r"^v has leading .* but k has"):
        check_inputs(q, torch.zeros(1, 2, 8, 32), torch.zeros(1, 1, 8, 32), False, grouped=True)
    with pytest.raises(ValueError, match=r"^k has leading"):  # 3-D inputs have no head dim to group
        check_inputs(q[:, 0], k[:, :1].reshape(1, 8, 32).expand(2, 8, 32), k[:, 0], False, grouped=True)
