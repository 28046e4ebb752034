"""Part 0's ideas, one test each: what grades its exercises (make exercise PART=0). In the suite they
test the shipped kernel; `make check PART=0 NAME=x` runs them on the learner's file instead."""

import pytest
import torch

from common import parts
from common.check import check_part
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE
from tests.helpers import assert_report_ok

pytestmark = pytest.mark.only_parts(0)

# Several key tiles (part 0's are 64 keys), so the running maximum moves from tile to tile.
MOVING_MAX = [Shape((1, 2), 130, 200, 64), Shape((2,), 70, 300, 32)]
CASES = [(shape, causal) for shape in MOVING_MAX for causal in (False, True)]
IDS = [f"{s.n_q}x{s.n_k}x{s.d}{'-causal' if c else ''}" for s, c in CASES]


def outputs_checked(part, shape, causal, grads):
    q, k, v, do = make_inputs(shape, torch.float32, DEVICE, seed=shape.n_k)
    return check_part(parts.load(part), q, k, v, do, causal, grads=grads)


@pytest.mark.parametrize(("shape", "causal"), CASES, ids=IDS)
def test_rescale_keeps_o_and_l_right_as_the_max_moves(part, shape, causal):
    """The online softmax: O and L against float64 where the maximum moves between key tiles."""
    assert_report_ok(outputs_checked(part, shape, causal, grads=False), f"{shape}, causal={causal}")


@pytest.mark.parametrize(("shape", "causal"), CASES, ids=IDS)
def test_logsumexp_is_what_the_backward_needs(part, shape, causal):
    """L = m + log(l), the row's logsumexp: checked, and through it the gradients (the backward
    rebuilds P = exp(S - L) from it)."""
    report = outputs_checked(part, shape, causal, grads=True)
    assert_report_ok(report, f"{shape}, causal={causal}")
