"""Bad input gets a clear error naming the argument, before any kernel runs."""

import pytest
import torch

from common import parts
from tests.helpers import DEVICE, INTERPRET


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)


Q4, K4, K3 = _t(2, 3, 32, 64), _t(2, 3, 40, 64), _t(2, 8, 64)  # good inputs, for cases that break something else

CASES = [
    # (id, q, k, v, is_causal, exception, message pattern)
    ("2d-q", _t(32, 64), _t(2, 40, 64), _t(2, 40, 64), False, ValueError, "q must be at least 3-D"),
    ("k-head-dim", Q4, _t(2, 3, 40, 32), _t(2, 3, 40, 32), False, ValueError, "k has head dim 32 but q has 64"),
    ("v-head-dim", Q4, K4, _t(2, 3, 40, 32), False, ValueError, "v has head dim 32 but q has 64"),
    ("unsupported-d", _t(2, 32, 48), _t(2, 40, 48), _t(2, 40, 48), False, ValueError, "head dim D=48 is not supported"),
    ("d-256", _t(2, 8, 256), _t(2, 8, 256), _t(2, 8, 256), False, ValueError, "head dim D=256 is not supported"),
    ("kv-length", Q4, K4, _t(2, 3, 41, 64), False, ValueError, "k and v must have the same sequence length"),
    ("lead-dims", Q4, _t(2, 4, 40, 64), _t(2, 4, 40, 64), False, ValueError, r"k has (leading|4 heads)"),
    ("empty-seq", _t(2, 0, 64), _t(2, 40, 64), _t(2, 40, 64), False, ValueError, "sequence lengths must be at least 1"),
    ("float64", *[_t(2, 8, 64, dtype=torch.float64)] * 3, False, TypeError, "q has dtype torch.float64"),
    ("int-q", _t(2, 8, 64, dtype=torch.int32), K3, K3, False, TypeError, "q must be floating point"),
    ("mixed-dtype", _t(2, 8, 64), _t(2, 8, 64, dtype=torch.float16), _t(2, 8, 64), False, TypeError, "same dtype"),
    ("list-k", _t(2, 8, 64), [[1.0]], _t(2, 8, 64), False, TypeError, "k must be a torch.Tensor"),
    ("causal-not-bool", _t(2, 8, 64), _t(2, 8, 64), _t(2, 8, 64), "yes", TypeError, "is_causal must be a bool"),
    ("2d-k", _t(2, 8, 64), _t(8, 64), _t(8, 64), False, ValueError, "k must be at least 3-D"),
    ("3d-k-4d-q", _t(2, 3, 8, 64), _t(2, 8, 64), _t(2, 8, 64), False, ValueError, "k has leading"),
    ("empty-keys", _t(2, 8, 64), _t(2, 0, 64), _t(2, 0, 64), False, ValueError, "sequence lengths must be at least 1"),
    ("empty-batch", _t(0, 8, 64), _t(0, 8, 64), _t(0, 8, 64), False, ValueError, "empty batch/head dimension"),
    ("v-dtype", _t(2, 8, 64), _t(2, 8, 64), _t(2, 8, 64, dtype=torch.bfloat16), False, TypeError, "same dtype"),
    # 'meta' tensors have no data: a different device that exists on every machine.
    ("devices", _t(2, 8, 64), _t(2, 8, 64, device="meta"), _t(2, 8, 64), False, ValueError, "same device"),
    ("v-device", _t(2, 8, 64), _t(2, 8, 64), _t(2, 8, 64, device="meta"), False, ValueError, "same device"),
]


@pytest.mark.parametrize("q,k,v,is_causal,exc,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(part, q, k, v, is_causal, exc, pattern):
    with pytest.raises(exc, match=pattern):
        parts.load(part).FlashAttention.apply(q, k, v, is_causal)


@pytest.mark.triton_parts
@pytest.mark.skipif(
    INTERPRET, reason="the interpreter runs on CPU tensors; the error applies where Triton compiles for a GPU"
)
def test_cpu_tensors_on_gpu_build(part):
    q = _t(2, 8, 64, device="cpu")
    with pytest.raises(ValueError, match="need CUDA tensors"):
        parts.load(part).FlashAttention.apply(q, q, q, False)


@pytest.mark.triton_parts
@pytest.mark.skipif(not INTERPRET, reason="bf16 is refused only where Triton's interpreter runs the kernels")
def test_bf16_refused_by_interpreter(part):
    """The interpreter's tl.dot gets bf16 wrong by ~1e9 without an error: refuse it, name the way out."""
    q = _t(2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"triton-lang/triton#11584.*float32 or float16, or run on a CUDA GPU"):
        parts.load(part).FlashAttention.apply(q, q, q, False)


@pytest.mark.only_parts(1, 2)
def test_too_many_sequences(part):
    """Parts 1 and 2 put sequences on the launch grid's second axis, which stops at 65535 (part 3
    lifts the limit: tests/test_inner_loop.py)."""
    q = _t(65536, 1, 16)
    with pytest.raises(ValueError, match=r"65536 \(batch \* head\) sequences"):
        parts.load(part).FlashAttention.apply(q, q, q, False)
