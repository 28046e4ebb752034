"""O, L, dQ, dK, dV of every part against the float64 reference (the rule: common/check.py)."""

import zlib

import pytest
import torch

from common import parts
from common.check import check_part, run_part
from common.inputs import STRESS_SCALE, Shape, make_inputs
from tests.helpers import (
    CORE_SHAPES,
    DEVICE,
    DTYPE_IDS,
    DTYPES,
    FULL_SHAPES,
    HAS_GPU,
    assert_report_ok,
    assert_same,
    dq_reordered,
    needs_gpu,
    random_shapes,
    skip_unsupported,
)

CAUSAL = [False, True]
CAUSAL_IDS = ["full", "causal"]


@pytest.mark.parametrize("is_causal", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", CORE_SHAPES, ids=str)
def test_core_shapes(part, shape, dtype, is_causal):
    skip_unsupported(part, dtype)
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=zlib.crc32(f"{shape}{is_causal}".encode()))
    assert_report_ok(check_part(parts.load(part), q, k, v, do, is_causal), f"part {part} {shape}")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", FULL_SHAPES, ids=str)
def test_full_size(part, shape, dtype, is_causal):
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=7)
    assert_report_ok(check_part(parts.load(part), q, k, v, do, is_causal), f"part {part} {shape}")


STRESS_SHAPES = (
    [Shape((2, 4), 1024, 1000, 64), Shape((1, 4), 777, 1500, 128)]
    if HAS_GPU
    else [Shape((2, 2), 96, 80, 64), Shape((1, 2), 50, 70, 128)]
)


# The backward takes exp2(S - L) over whole tiles and zeroes what the causal mask hides afterwards:
# hidden scores of order 100 overflow there, on purpose and harmlessly. The interpreter (numpy)
# warns about it; a GPU does not.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
@pytest.mark.parametrize("is_causal", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", STRESS_SHAPES, ids=str)
def test_large_scores(part, shape, dtype, is_causal):
    """|S| up to ~100: exp(S) overflows float32, so only a max-subtracting softmax survives."""
    skip_unsupported(part, dtype)
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=3, scale=STRESS_SCALE)
    s = (q[0, 0].double() @ k[0, 0].double().T) * shape.d**-0.5
    assert s.abs().max() > 60, "stress inputs should produce scores large enough to overflow exp"
    assert_report_ok(check_part(parts.load(part), q, k, v, do, is_causal), f"part {part} large scores")


@pytest.mark.parametrize("index", range(24 if HAS_GPU else 6))
def test_random_shapes(part, index):
    """A seeded sweep of shapes nobody picked by hand (full-size on a GPU, small on a CPU)."""
    shape = random_shapes(24 if HAS_GPU else 6, seed=2024, max_n=2000 if HAS_GPU else 150)[index]
    dtype = DTYPES[index % 3]
    is_causal = index % 2 == 1
    skip_unsupported(part, dtype)
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=100 + index)
    assert_report_ok(check_part(parts.load(part), q, k, v, do, is_causal), f"part {part} {shape} {dtype}")


def _same_as_contiguous(part, q, k, v, do):
    module = parts.load(part)
    want = run_part(module, *(t.clone(memory_format=torch.contiguous_format) for t in (q, k, v, do)), True)
    got = run_part(module, q, k, v, do, True)
    for name in want:  # dQ: see assert_same
        assert_same(name, got[name], want[name], "strided and contiguous", dq_reordered(module) and name == "dQ")


def test_strided_inputs(part):
    """Non-contiguous views (the (B, N, H, D) layout transposed to (B, H, N, D)), and a strided
    dO, give the same answer as contiguous copies."""
    q, k, v, do = make_inputs(Shape((2, 3), 40, 56, 32), torch.float32, DEVICE, seed=5)
    q, k, v, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do))
    assert not q.is_contiguous() and not do.is_contiguous()
    _same_as_contiguous(part, q, k, v, do)


def test_misaligned_inputs(part):
    """Tensors that start 4 bytes past a 16-byte boundary (tensor descriptors need 16)."""
    shape = Shape((2,), 24, 40, 16)

    def shifted(s, seed):
        flat = torch.randn(1 + torch.Size(s).numel(), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        return flat[1:].view(s)

    q, k, v, do = (
        shifted(shape.q_shape, 1),
        shifted(shape.kv_shape, 2),
        shifted(shape.kv_shape, 3),
        shifted(shape.q_shape, 4),
    )
    assert q.data_ptr() % 16 != 0
    _same_as_contiguous(part, q, k, v, do)
    assert_report_ok(check_part(parts.load(part), q, k, v, do, False), "misaligned inputs")


def test_saves_q_k_v_o_l(part):
    """The forward saves exactly (Q, K, V, O, L) for the backward, L being the only saved tensor of
    shape Q.shape[:-1] (float32) and equal to what flash_forward returns."""
    q, k, v, _ = make_inputs(Shape((2,), 20, 24, 16), torch.float32, DEVICE)
    q.requires_grad_(True)
    o = parts.load(part).FlashAttention.apply(q, k, v, False)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5
    assert torch.equal(saved[0], q) and torch.equal(saved[1], k) and torch.equal(saved[2], v)
    assert torch.equal(saved[3], o)
    assert [i for i, t in enumerate(saved) if t.shape == q.shape[:-1]] == [4]
    assert saved[4].dtype == torch.float32
    torch.testing.assert_close(saved[4], parts.load(part).flash_forward(q.detach(), k, v, False)[1], rtol=0, atol=0)
    assert o.dtype == q.dtype and o.shape == q.shape
