"""The checker itself: it must fail on wrong answers, missing outputs and broken algorithms."""

import importlib.util
import sys

import pytest
import torch

from common import parts
from common.check import Report, check_outputs, check_part
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE

SHAPE = Shape((1, 2), 130, 200, 64)


def _outputs(module, q, k, v, do):
    from common.check import run_part

    return run_part(module, q, k, v, do, True)


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
    good = _outputs(parts.load(0), q, k, v, do)
    assert check_outputs(good, q, k, v, do, True).ok
    shifted = dict(good, L=good["L"] + 1e-3)
    assert not check_outputs(shifted, q, k, v, do, True).ok
    poisoned = dict(good, O=good["O"].clone())
    poisoned["O"][0, 0, 0, 0] = float("nan")
    assert not check_outputs(poisoned, q, k, v, do, True).ok


def test_online_softmax_without_rescaling_is_caught(tmp_path):
    """Part 0 with the running output never rescaled by alpha: right on one key tile, wrong on several."""
    source = parts.path(0).read_text()
    old = "O_i = alpha[..., None] * O_i + "
    assert source.count(old) == 1
    file = tmp_path / "part0_no_rescale.py"
    file.write_text(source.replace(old, "O_i = O_i + "))
    spec = importlib.util.spec_from_file_location("part0_no_rescale", file)
    broken = importlib.util.module_from_spec(spec)
    sys.modules["part0_no_rescale"] = broken
    spec.loader.exec_module(broken)
    one_tile = make_inputs(Shape((2,), 40, 60, 32), torch.float32, DEVICE, seed=2)
    assert check_part(broken, *one_tile, False).ok
    many_tiles = make_inputs(SHAPE, torch.float32, DEVICE, seed=2)
    assert not check_part(broken, *many_tiles, False).ok
