"""Part 5's causal diagonal aligned bottom-right (FlashAttention.apply(q, k, v, True, True)): query i
sees the keys up to i + N_k - N_q, as queries continuing a key/value cache do (chunked prefill,
several tokens checked at once). is_causal alone keeps SDPA's top-left meaning. Part 4's kernels,
which part 5 keeps, take it (the Gluon kernels do not yet): checked against the float64 reference,
whose bottom-right mask is checked against SDPA's with an explicit mask."""

import pytest
import torch

from common import parts
from common.check import check_part
from common.inputs import Shape, make_inputs
from common.reference import attention_reference
from tests.helpers import DEVICE, DTYPE_IDS, DTYPES, HAS_GPU, assert_report_ok, skip_unsupported

# N_q < N_k, ragged against every tile; N_k - N_q below and above a tile; one query (a decoding step).
SHAPES = (
    [Shape((2, 4), 300, 451, 64), Shape((1, 8), 1000, 1100, 128), Shape((2, 2), 1, 333, 64)]
    if HAS_GPU
    else [Shape((1, 2), 37, 70, 32), Shape((1, 2), 5, 90, 16), Shape((1, 1), 1, 40, 32)]
)


def test_the_reference_matches_sdpa_with_the_mask():
    q, k, v, _ = make_inputs(Shape((1, 2), 7, 19, 16), torch.float64, "cpu", seed=0)
    visible = torch.ones(7, 19, dtype=torch.bool).tril(19 - 7)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    o, _ = attention_reference(q, k, v, is_causal=True, bottom_right=True)
    torch.testing.assert_close(o, expected)
    top_left, _ = attention_reference(q, k, v, is_causal=True)
    assert not torch.allclose(o, top_left)  # the two alignments differ when N_q != N_k


@pytest.mark.only_parts(5)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bottom_right_matches_the_reference(part, dtype):
    skip_unsupported(part, dtype)
    module = parts.load(part)
    for i, shape in enumerate(SHAPES):
        q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=i)
        report = check_part(module, q, k, v, do, True, bottom_right=True)
        assert_report_ok(report, f"part {part}, bottom-right, {shape}")
        kv = (k[:, :1].contiguous(), v[:, :1].contiguous()) if shape.lead[1] > 1 else (k, v)  # grouped heads
        report = check_part(module, q, *kv, do, True, bottom_right=True)
        assert_report_ok(report, f"part {part}, bottom-right, one key/value head, {shape}")


@pytest.mark.only_parts(5)
def test_bottom_right_is_refused_where_it_means_nothing(part):
    module = parts.load(part)
    q, k, v, _ = make_inputs(Shape((1, 2), 40, 20, 32), torch.float32, DEVICE, seed=0)
    with pytest.raises(ValueError, match="bottom_right=True with 40 queries and 20 keys"):
        module.FlashAttention.apply(q, k, v, True, True)
    with pytest.raises(ValueError, match="needs is_causal=True"):
        module.FlashAttention.apply(k, q, q, False, True)
    with pytest.raises(TypeError, match="bottom_right must be a bool"):
        module.FlashAttention.apply(k, q, q, True, 1)
    # N_q = N_k: the two alignments are one; the call is the usual causal one
    same = module.FlashAttention.apply(q, q, q, True, True)
    torch.testing.assert_close(same, module.FlashAttention.apply(q, q, q, True), rtol=0, atol=0)
