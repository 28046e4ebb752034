"""Input validation shared by every part: bad input gets a clear error naming the argument,
never a crash inside a kernel or a silently wrong answer."""

import torch

from common.runtime import INTERPRET

SUPPORTED_D = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# The dtypes a Triton part takes here (below: the interpreter refuses bfloat16) and the head dims.
_TRITON_DTYPES = (torch.float32, torch.float16) if INTERPRET else SUPPORTED_DTYPES
_FAST_D = frozenset(SUPPORTED_D)


def check_inputs(q, k, v, is_causal, triton=False):
    """Raise TypeError/ValueError for anything the kernels do not support.

    triton: the part launches Triton kernels. Compiled, they need CUDA tensors; under Triton's
    interpreter (TRITON_INTERPRET=1, no GPU) they run on CPU tensors, but not in bfloat16 (below).
    """
    # A good call passes every check below; this is those checks in the fewest Python operations
    # (each attribute read once), so that the common case costs little host time. Anything it does
    # not accept goes on to the checks themselves, which raise the error that names the argument.
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        dtype, shape, device = q.dtype, q.shape, q.device
        k_shape = k.shape
        lead = shape[:-2]
        if (
            (is_causal is True or is_causal is False)
            and dtype in (_TRITON_DTYPES if triton else SUPPORTED_DTYPES)
            and k.dtype is dtype
            and v.dtype is dtype
            and len(shape) >= 3
            and shape[-1] in _FAST_D
            and k_shape[:-2] == lead  # so k has q's number of dims, at least 3
            and k_shape[-1] == shape[-1]
            and v.shape == k_shape
            and shape[-2] > 0
            and k_shape[-2] > 0
            and all(lead)
            and k.device == device
            and v.device == device
            and (not triton or INTERPRET or device.type == "cuda")
        ):
            return
    _check_inputs(q, k, v, is_causal, triton)


def _check_inputs(q, k, v, is_causal, triton):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point (float32, float16 or bfloat16), got {t.dtype}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported dtypes are float32, float16 and bfloat16")
        if t.dim() < 3:
            raise ValueError(
                f"{name} must be at least 3-D, (batch, seq, D) or (batch, heads, seq, D); got shape {tuple(t.shape)}"
            )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must have the same dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(
            f"q, k and v must be on the same device; got q on {q.device}, k on {k.device}, v on {v.device}"
        )
    if triton and not INTERPRET and q.device.type != "cuda":
        raise ValueError(
            f"q is on {q.device}, but this part runs compiled Triton kernels, which need CUDA tensors "
            "(without a GPU, set TRITON_INTERPRET=1 before importing it to use the interpreter)"
        )
    if triton and INTERPRET and q.dtype == torch.bfloat16:
        # The interpreter's tl.dot multiplies the raw bit patterns of bfloat16 operands: the answer
        # comes back wrong (off by ~1e9) without any error. Refuse rather than return it.
        raise TypeError(
            "q is bfloat16, which Triton's interpreter computes wrongly in tl.dot (triton-lang/triton#11584, "
            "not supported upstream); on the CPU use float32 or float16, or run on a CUDA GPU"
        )
    d = q.shape[-1]
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != d:
            raise ValueError(f"{name} has head dim {t.shape[-1]} but q has {d}; q, k and v must share D")
    if d not in SUPPORTED_D:
        raise ValueError(f"head dim D={d} is not supported; D must be one of {SUPPORTED_D}")
    for name, t in (("k", k), ("v", v)):
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name} has leading (batch/head) dims {tuple(t.shape[:-2])} but q has {tuple(q.shape[:-2])}; they must match"
            )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same sequence length; got k {k.shape[-2]}, v {v.shape[-2]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"sequence lengths must be at least 1; got N_q={q.shape[-2]}, N_k={k.shape[-2]}")
    if any(s == 0 for s in q.shape[:-2]):
        raise ValueError(f"q has an empty batch/head dimension: shape {tuple(q.shape)}")
