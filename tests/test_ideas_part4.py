"""Part 4's ideas, one test each: what grades its exercises (make exercise PART=4). In the suite they
test the shipped kernels; `make check PART=4 NAME=x` runs them on the learner's file instead. The
backward runs in Triton's interpreter on a CPU, one program at a time: the shapes stay small."""

import warnings

import pytest
import torch

from common import parts
from common.check import check_outputs, check_part, run_part
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE
from tests.helpers import assert_report_ok

pytestmark = pytest.mark.only_parts(4)

# Ragged on both axes, N_q > N_k and N_q < N_k, several tiles of both kernels (the interpreter's
# dK/dV tiles are 16x32, the dQ kernel's 32x16), one sequence and several.
SHAPES = [Shape((2,), 48, 37, 16), Shape((1, 2), 70, 101, 32)]
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])


def case(shape, causal):
    return f"{'causal' if causal else 'non-causal'} backward, {shape}"


def assert_gradients_right(part, causal, dtype=torch.float16):
    module = parts.load(part)
    for i, shape in enumerate(SHAPES):
        q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=10 + i)
        assert_report_ok(check_part(module, q, k, v, do, causal), case(shape, causal))


@CAUSAL
def test_delta_makes_the_gradients_right(part, causal):
    """D = rowsum(dO * O), computed once up front: dS = P * (dP - D) needs it in both kernels, so dQ
    and dK are right only with it (dV does not use it)."""
    assert_gradients_right(part, causal)


@CAUSAL
def test_dkdv_sums_over_the_query_tiles(part, causal):
    """dK and dV, one program per key tile walking the query tiles, against float64."""
    assert_gradients_right(part, causal)


def test_dq_mask_hides_the_keys_after_the_query(part):
    """Causal: the dQ kernel's diagonal tiles hold scores of keys after the query, P = 0 there."""
    assert_gradients_right(part, True)


def very_negative_rows(shape, dtype=torch.float32):
    """Inputs where every real score of half the rows is about -120: their L_i is about -120 too, so
    a zero-filled key past N_k (score 0) would get P = exp(0 - L_i) = exp(120), past float32's range."""
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=7)
    u = torch.zeros(shape.d, dtype=dtype, device=DEVICE)
    u[0] = 1.0
    k = k + 12 * u  # every key leans along u
    q = q.clone()
    q[..., ::2, :] -= 40 * u  # even rows point against it: q.k / sqrt(16) is about -40 * 12 / 4
    return q, k, v, do


def test_dq_mask_hides_the_keys_past_n_k(part):
    """Not causal, N_k ragged: the last key tile's rows past N_k are zero-filled. Where a row's real
    scores are all very negative, their P must be masked to 0, not computed: exp(0 - L_i) is inf,
    and inf times a zero-filled key is NaN in dQ."""
    shape = Shape((1,), 40, 20, 16)  # 20 keys: one whole tile of 16 and a ragged one (64 on a GPU)
    q, k, v, do = very_negative_rows(shape)
    context = f"{case(shape, False)}, half the rows' scores near -120"
    with warnings.catch_warnings():  # exp2 overflows before the mask drops it: numpy warns, a GPU does not
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        out = run_part(parts.load(part), q, k, v, do, False)
    bad = ~torch.isfinite(out["dQ"]).all(-1)
    assert not bad.any(), f"{context}: dQ is NaN or inf in {int(bad.sum())} of {bad.numel()} rows"
    assert_report_ok(check_outputs(out, q, k, v, do, False), context)
