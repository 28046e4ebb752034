"""Every part works the way a reader first uses it: imported directly, in a fresh Python process,
on this machine's device (on a CPU, Triton's interpreter must switch itself on)."""

import pytest

from common import parts
from common.runtime import HAS_GPU
from tests.helpers import fresh_python

DIRECT_USE = """
import torch
from {folder}.flash_attention import FlashAttention, flash_attention, flash_forward
from common.reference import attention_reference

device = "cuda" if torch.cuda.is_available() else "cpu"
q, k, v = (torch.randn(2, 3, n, 32, device=device) for n in (40, 56, 56))
o = FlashAttention.apply(q, k, v, True)
ref, _ = attention_reference(q, k, v, is_causal=True)
err = (o.double() - ref).abs().max().item()
assert err < 1e-4, err
assert torch.equal(flash_attention(q, k, v, True), o)
print("ok", err)
"""


def test_direct_import(part):
    result = fresh_python(DIRECT_USE.format(folder=parts.folder(part).name))
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-3000:]


@pytest.mark.triton_parts
@pytest.mark.skipif(HAS_GPU, reason="only without a GPU must the interpreter be switched on before triton loads")
def test_triton_imported_first_is_a_clear_error(part):
    code = f"import triton\nimport {parts.folder(part).name}.flash_attention"
    result = fresh_python(code)
    assert result.returncode != 0
    assert "ImportError: triton was imported before this project could switch on Triton's interpreter" in result.stderr


INTERPRETER_SCALARS = """
import operator
import numpy as np
import common.runtime  # switches the interpreter on (and patches it where it needs it)
from triton.runtime import interpreter

class Tensor:  # the interpreter's view of a kernel's scalar argument: a one-element array
    def __init__(self, data):
        self.handle = type("Handle", (), {"data": data})()

scope = interpreter._LangPatchScope()
interpreter._patch_lang_tensor(Tensor, scope)
assert operator.index(Tensor(np.array([7], dtype=np.int32))) == 7  # what range(0, N, BLOCK) asks
scope.restore()
print("ok")
"""


def test_the_interpreter_takes_a_run_time_length_as_an_index():
    """A kernel's `range(0, N_KEYS, BLOCK_N)` over a run-time length works under the interpreter with
    this NumPy: Triton 3.6's int() of a one-element array, which NumPy 2.4 refuses, is patched."""
    result = fresh_python(INTERPRETER_SCALARS, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-3000:]
