"""The implementations the benchmark compares: every part (loaded through the registry), SDPA pinned
to each of its backends, and FlexAttention and FlashAttention-4 when asked for.

An Impl is what the benchmark checks and times: a forward that returns what the check compares, a
differentiable attention that is timed, and the limits of what it is run at. A part is read only
through its interface (common/parts.py): flash_forward, FlashAttention, whether its backward is the
PyTorch one of common/backward.py, and what parts.forward_config() reads of its last forward.
"""

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common import parts

PYTORCH_PART_MAX_N = 2048  # part 0 is Python loops over 64x64 tiles; the time per call grows as N^2
# The PyTorch backward of parts 0-3 launches over a dozen small kernels per pair of 64-row tiles,
# 4096 pairs at N = 4096 (over a second per call, B=4, H=8), four times as many at 8192.
PYTORCH_BACKWARD_MAX_N = 4096
MATH_MAX_N = 4096  # SDPA's math backend materialises B*H*N*N scores: 17 GB of bf16 at N = 16384
SDPA_BACKENDS = {"flash": "SDPA flash (FA2)", "cudnn": "SDPA cuDNN", "efficient": "SDPA efficient", "math": "SDPA math"}
SDPA_BACKENDS["default"] = "SDPA default"  # PyTorch chooses; the CSV's backend column says what it chose
FLEX = "flex"  # FlexAttention (torch.nn.attention.flex_attention, compiled): timed only with --flex
FA4 = "fa4"  # FlashAttention-4 (the flash-attn-4 package, CuTe DSL): timed only with --fa4, where installed


@dataclass
class Impl:
    """One implementation the benchmark checks and times."""

    name: str  # the CSV's impl column: "part1", "sdpa_flash"
    forward: Callable  # (q, k, v, causal) -> {"O": O} or {"O": O, "L": L}: what the forward check compares
    attention: Callable  # (q, k, v, causal) -> O, differentiable: what is timed, and the backward's source
    part: int | None = None  # the part number; None for SDPA
    context: Callable = contextlib.nullcontext  # entered once around the check and all timed calls
    max_n: int | None = None  # the longest N it is run at
    graph: bool = True  # also time its replay from a CUDA graph
    backward_max_n: int | None = None  # the longest N of the fwd+bwd and bwd modes, if shorter
    backward_graph: bool = True  # whether the backward modes are timed from a CUDA graph too
    backend: Callable | None = None  # (q, k, v, causal) -> what really ran, for the CSV's backend column

    def runs(self, mode, n):
        """Whether this implementation is timed in this mode at this N."""
        longest = [m for m in (self.max_n, None if mode == "fwd" else self.backward_max_n) if m is not None]
        return all(n <= m for m in longest)


def impl_label(name):
    """How tables and plots name an implementation: "part1" -> "part 1", "sdpa_flash" -> "SDPA flash (FA2)"."""
    labels = {FLEX: "FlexAttention", FA4: "FlashAttention-4"}
    return labels.get(name) or SDPA_BACKENDS.get(name.removeprefix("sdpa_"), name.replace("part", "part "))


def part_impl(n):
    """Part n, checked through flash_forward(Q, K, V, is_causal) -> (O, L), timed through FlashAttention.apply.
    A part written in PyTorch alone (part 0: thousands of small ops per call) runs only up to
    PYTORCH_PART_MAX_N and without a CUDA graph; so does, in the backward modes, a part whose backward
    is the tiled PyTorch one of common/backward.py, up to PYTORCH_BACKWARD_MAX_N."""
    module = parts.load(n)
    triton_part = parts.uses_triton(n)
    pytorch_backward = parts.pytorch_backward(module)
    return Impl(
        name=f"part{n}",
        forward=lambda *args: dict(zip("OL", module.flash_forward(*args))),
        attention=module.FlashAttention.apply,
        part=n,
        max_n=None if triton_part else PYTORCH_PART_MAX_N,
        graph=triton_part,
        backward_max_n=PYTORCH_BACKWARD_MAX_N if pytorch_backward else None,
        backward_graph=triton_part and not pytorch_backward,
        backend=lambda *_: parts.forward_config(module),
    )


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_impl(backend):
    """SDPA pinned to one backend ("default": PyTorch chooses, and the CSV records what it chose)."""
    chosen = (lambda q, k, v, c: dispatched_backend(lambda: sdpa(q, k, v, c))) if backend == "default" else None
    return Impl(
        name=f"sdpa_{backend}",
        forward=lambda q, k, v, c: {"O": sdpa(q, k, v, c)},
        attention=sdpa,
        context=functools.partial(sdpa_context, backend),
        max_n=MATH_MAX_N if backend == "math" else None,
        backend=chosen,
    )


def sdpa_context(name):
    """Pins SDPA to one backend ('default' lets PyTorch choose). Entered once around the check and
    all timed calls: entering it per call would add its Python cost to every timing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "default":
        return contextlib.nullcontext()
    pinned = dict(flash="FLASH_ATTENTION", cudnn="CUDNN_ATTENTION", efficient="EFFICIENT_ATTENTION", math="MATH")
    return sdpa_kernel([getattr(SDPBackend, pinned[name])])


def sdpa_fn(name, q, k, v, causal):
    """A closure running SDPA pinned to one backend ('default': PyTorch chooses), entering the pin on
    every call (which costs Python time: the benchmark enters sdpa_context(name) once instead)."""

    def run():
        with sdpa_context(name):
            return sdpa(q, k, v, causal)

    return run


def dispatched_backend(fn):
    """Which backend SDPA's default dispatch really ran, read off the profiler's operator names."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = " ".join(e.key for e in prof.key_averages())
    for label in ("cudnn", "flash", "efficient"):
        if f"_scaled_dot_product_{label}_attention" in names:
            return label
    return "math" if "_scaled_dot_product_attention_math" in names else "unknown"


@functools.cache
def _flex():
    """flex_attention compiled once (torch.compile generates its Triton kernels per shape on first use)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def _block_mask(n_q, n_k, device):
    """The causal block mask for one shape (top-left aligned, as every part's and SDPA's is_causal),
    built once: building it is work on the GPU of its own."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, i, j: i >= j, B=None, H=None, Q_LEN=n_q, KV_LEN=n_k, device=device)


def flex(q, k, v, causal):
    """FlexAttention, compiled: PyTorch's template for attention variants, generated as Triton kernels."""
    mask = _block_mask(q.shape[-2], k.shape[-2], str(q.device)) if causal else None
    return _flex()(q, k, v, block_mask=mask)


def flex_impl():
    """FlexAttention beside SDPA. Its first call at each shape compiles (tens of seconds), so the
    benchmark times it only when asked (--flex); the check runs first and compiles it."""
    return Impl(name=FLEX, forward=lambda q, k, v, c: {"O": flex(q, k, v, c)}, attention=flex)


def fa4_impl():
    """FlashAttention-4 beside SDPA, an optional baseline: None where flash-attn-4 (or what it needs)
    does not import. Its first call at each head dim and mask compiles its kernels (CuTe DSL), which
    the check's call pays. It takes (B, N, H, D): a transposed view of the benchmark's (B, H, N, D)
    tensors is that layout with the last dim still contiguous, accepted as it is (no copy)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # ImportError, or a dependency that fails to load: no FA4 rows
        return None

    def attention(q, k, v, causal):
        o, _ = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)  # (O, L)
        return o.transpose(1, 2)

    return Impl(name=FA4, forward=lambda q, k, v, c: {"O": attention(q, k, v, c)}, attention=attention)
