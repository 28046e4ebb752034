"""Shared pieces of the test suite."""

import pytest
import torch

from common import parts
from common.runtime import DEVICE, HAS_GPU, INTERPRET

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]

needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (full-size shapes are too slow elsewhere)")


def skip_unsupported(part, dtype):
    """bf16 through tl.dot is wrong in Triton's interpreter (triton-lang/triton#11584, not supported
    upstream), so the Triton parts refuse it there (tests/test_bad_inputs.py checks the refusal).
    Part 0 is plain PyTorch and runs bf16 anywhere."""
    if dtype == torch.bfloat16 and INTERPRET and parts.uses_triton(part):
        pytest.skip("bf16 tl.dot is not supported by the Triton interpreter (triton-lang/triton#11584); runs on GPU")


def assert_report_ok(report, context):
    assert report.ok, f"{context}: {report}"


def mutant(part, tmp_path, name, replacements):
    """Part's flash_attention.py with each `old` replaced by `new` (each must occur once), imported."""
    source = parts.path(part).read_text()
    for old, new in replacements:
        assert source.count(old) == 1, f"part {part}: expected exactly one '{old}' to mutate"
        source = source.replace(old, new)
    module = parts.load_source(f"mutant_part{part}_{name}", source)
    if hasattr(module, "GLUON"):  # part 5 sends some calls to its Gluon kernel: run the rewritten tl one
        module.GLUON = False
    return module


__all__ = [
    "DEVICE",
    "DTYPES",
    "DTYPE_IDS",
    "HAS_GPU",
    "INTERPRET",
    "needs_gpu",
    "skip_unsupported",
    "assert_report_ok",
    "mutant",
]
