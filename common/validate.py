"""Input validation shared by every part: bad input gets a clear error naming the argument,
never a crash inside a kernel or a silently wrong answer."""

import torch

from common.runtime import INTERPRET

SUPPORTED_D = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_inputs(q, k, v, is_causal, triton=False, grouped=False):
    """Raise TypeError/ValueError, naming the argument, for anything the kernels do not support.

    triton: the part launches Triton kernels. Compiled, they need CUDA tensors; under Triton's
    interpreter (TRITON_INTERPRET=1, no GPU) they run on CPU tensors, but not in bfloat16 (below).
    grouped: the part takes k and v with fewer heads than q (grouped-query attention): 4-D or more,
    (..., H, N, D) against (..., H_kv, N, D), H a multiple of H_kv.
    A good call costs a microsecond or two here: every check reads what it needs once.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            if not t.is_floating_point():
                raise TypeError(f"{name} must be floating point (float32, float16 or bfloat16), got {t.dtype}")
            raise TypeError(f"{name} has dtype {t.dtype}; supported dtypes are float32, float16 and bfloat16")
        if t.dim() < 3:
            raise ValueError(
                f"{name} must be at least 3-D, (batch, seq, D) or (batch, heads, seq, D); got shape {tuple(t.shape)}"
            )
    if is_causal is not True and is_causal is not False:
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    dtype, device = q.dtype, q.device
    if k.dtype is not dtype or v.dtype is not dtype:
        raise TypeError(f"q, k and v must have the same dtype; got q {dtype}, k {k.dtype}, v {v.dtype}")
    if k.device != device or v.device != device:
        raise ValueError(f"q, k and v must be on the same device; got q on {device}, k on {k.device}, v on {v.device}")
    if triton and not INTERPRET and device.type != "cuda":
        raise ValueError(
            f"q is on {device}, but this part runs compiled Triton kernels, which need CUDA tensors "
            "(without a GPU, set TRITON_INTERPRET=1 before importing it to use the interpreter)"
        )
    if triton and INTERPRET and dtype is torch.bfloat16:
        # The interpreter's tl.dot multiplies the raw bit patterns of bfloat16 operands: the answer
        # comes back wrong (off by ~1e9) without any error. Refuse rather than return it.
        raise TypeError(
            "q is bfloat16, which Triton's interpreter computes wrongly in tl.dot (triton-lang/triton#11584, "
            "not supported upstream); on the CPU use float32 or float16, or run on a CUDA GPU"
        )
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    d = q_shape[-1]
    for name, shape in (("k", k_shape), ("v", v_shape)):
        if shape[-1] != d:
            raise ValueError(f"{name} has head dim {shape[-1]} but q has {d}; q, k and v must share D")
    if d not in SUPPORTED_D:
        raise ValueError(f"head dim D={d} is not supported; D must be one of {SUPPORTED_D}")
    lead = q_shape[:-2]
    for name, shape in (("k", k_shape), ("v", v_shape)):
        if shape[:-2] == lead:
            continue
        if grouped and len(shape) == len(q_shape) > 3 and shape[:-3] == q_shape[:-3]:
            if q_shape[-3] % shape[-3]:
                raise ValueError(
                    f"{name} has {shape[-3]} heads and q {q_shape[-3]}: grouped heads need q's a multiple of {name}'s"
                )
            continue
        also = "" if grouped else " (part 5 takes k and v with fewer heads than q: grouped-query attention)"
        raise ValueError(
            f"{name} has leading (batch/head) dims {tuple(shape[:-2])} but q has {tuple(lead)}; they must match" + also
        )
    if v_shape[:-2] != k_shape[:-2]:
        raise ValueError(f"v has leading (batch/head) dims {tuple(v_shape[:-2])} but k has {tuple(k_shape[:-2])}")
    if v_shape[-2] != k_shape[-2]:
        raise ValueError(f"k and v must have the same sequence length; got k {k_shape[-2]}, v {v_shape[-2]}")
    if q_shape[-2] == 0 or k_shape[-2] == 0:
        raise ValueError(f"sequence lengths must be at least 1; got N_q={q_shape[-2]}, N_k={k_shape[-2]}")
    if 0 in lead:
        raise ValueError(f"q has an empty batch/head dimension: shape {tuple(q_shape)}")
