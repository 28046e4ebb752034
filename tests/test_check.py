"""The checker itself: it must fail on wrong answers, missing outputs and broken algorithms."""

import pytest
import torch

from common import parts
from common.check import Report, check_outputs, check_part, run_part
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, mutant

SHAPE = Shape((1, 2), 130, 200, 64)


def test_empty_report_is_not_ok():
    assert not Report().ok


def test_outputs_must_be_named():
    q, k, v, do = make_inputs(Shape((1,), 8, 8, 16), torch.float32, DEVICE)
    with pytest.raises(AssertionError, match="outputs to check"):
        check_outputs({}, q, k, v, do, False)
    with pytest.raises(AssertionError, match="outputs to check"):
        check_outputs({"O": q, "dQ": q}, q, k, v, do, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_small_errors_in_L_and_nans_in_O_fail(dtype):
    """L is float32 in every dtype: an error of 1e-3 in it must fail even for bf16 inputs."""
    q, k, v, do = make_inputs(SHAPE, dtype, DEVICE, seed=1)
    good = run_part(parts.load(0), q, k, v, do, True)
    assert check_outputs(good, q, k, v, do, True).ok
    shifted = dict(good, L=good["L"] + 1e-3)
    assert not check_outputs(shifted, q, k, v, do, True).ok
    poisoned = dict(good, O=good["O"].clone())
    poisoned["O"][0, 0, 0, 0] = float("nan")
    assert not check_outputs(poisoned, q, k, v, do, True).ok


def test_online_softmax_without_rescaling_is_caught(tmp_path):
    """Part 0 with the running output never rescaled by alpha: right on one key tile, wrong on several."""
    broken = mutant(0, tmp_path, "no_rescale", [("O_i = alpha[..., None] * O_i + ", "O_i = O_i + ")])
    one_tile = make_inputs(Shape((2,), 40, 60, 32), torch.float32, DEVICE, seed=2)
    assert check_part(broken, *one_tile, False).ok
    many_tiles = make_inputs(SHAPE, torch.float32, DEVICE, seed=2)
    assert not check_part(broken, *many_tiles, False).ok
