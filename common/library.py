"""Every part once more as a `torch.library` custom op, so a model that calls it can be compiled.

torch.compile cannot trace into a part's Triton launch: Dynamo steps into the Python launcher and
fails there (on the H200, Triton 3.6: "triton.set_allocator not supported", an AssertionError about
an AttrSource inside Triton's launch path, Inductor failing to recompile part 1's kernel). A custom
op is opaque to the compiler instead: it sees only the op's schema and a fake implementation
(output shapes and dtypes from input shapes), and at run time the op calls the part's own
`flash_forward` and `flash_backward` exactly as eager code does. So a compiled model can call the
op (`flash_attention` below), or `FlashAttention.apply`: each part's flash_forward (and its own
flash_backward) is marked `@library.traceable`, which hands Dynamo the op in its place.

Each part turns its `flash_attention` into such an op with one decorator, the same in every part:

    @library.custom_op
    def flash_attention(q, k, v, is_causal=False):
        '''...'''

The decorator reads `flash_forward` and `flash_backward` from the part's module and registers two
ops in a namespace named after that module (`torch.ops.part1_triton_baseline.flash_forward`, and
`.flash_backward`): the forward returns (O, L), the backward (dQ, dK, dV), and autograd joins them
with the same saved tensors as FlashAttention, (Q, K, V, O, L). The returned `flash_attention`
checks its inputs first (the check FlashAttention.forward makes) and returns O. The decorated
function's body never runs: only its name, signature and docstring are kept.
"""

import functools
import re

import torch
from torch import Tensor

from common.validate import check_inputs

# namespace -> the module's (flash_forward, flash_backward). Ops are registered once per namespace;
# loading a module again under the same name (a test's mutated copy, importlib.reload) points the
# existing ops at the new functions instead of defining the ops a second time.
_IMPLS = {}
_OPS = {}
# Inductor hands the ops contiguous inputs, copying in kernels of its own that it can fuse with the
# ones before (a model's rotary embedding), instead of the op copying them (torch 2.7 and later).
_CONTIGUOUS = tuple(t for t in (getattr(torch.Tag, "needs_contiguous_strides", None),) if t is not None)


def namespace(module_name):
    """'part1_triton_baseline.flash_attention' -> 'part1_triton_baseline'; any other module name
    (a mutated copy 'mutant_part1_x', '__main__') -> itself, made a valid identifier."""
    name = re.sub(r"\.flash_attention$", "", module_name)
    return re.sub(r"\W", "_", name).strip("_") or "flash_attention_part"


def _empty(like, strided):
    """What the fake implementations promise for an output shaped like `like`: like's layout
    (torch.empty_like: a dense tensor's strides, else contiguous) for a part that reads strided
    heads, contiguous for the others."""
    return torch.empty_like(like) if strided else like.new_empty(like.shape)


def _like(t, like, strided):
    """t in the layout _empty promises, exactly: a copy only where t is not already laid out so. t is
    a fresh (dense) output: with like's strides, like is dense too, and empty_like keeps them."""
    if not strided:
        return t.contiguous()
    if t.stride() == like.stride():
        return t
    out = torch.empty_like(like)
    return t if t.stride() == out.stride() else out.copy_(t)


def _register(ns, strided=False):
    """Define ns::flash_forward and ns::flash_backward, their fake implementations and autograd.

    A compiled graph relies on the fake implementations' output strides, so the real outputs are put
    in exactly those. strided=False: Inductor hands the ops contiguous inputs (needs_contiguous_strides)
    and the outputs are contiguous. strided=True (a part that reads a model's transposed heads where
    they lie): the inputs come as the model made them, and O, dQ, dK, dV come back laid out as Q, Q,
    K, V (empty_like's strides), as SDPA returns them."""
    tags = () if strided else _CONTIGUOUS

    @torch.library.custom_op(f"{ns}::flash_forward", mutates_args=(), tags=tags)
    def forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
        O, L = _IMPLS[ns][0](q, k, v, is_causal)
        return _like(O, q, strided), L.contiguous()

    @forward.register_fake
    def _(q, k, v, is_causal):
        return _empty(q, strided), q.new_empty(q.shape[:-1], dtype=torch.float32)  # O like q, L float32

    @torch.library.custom_op(f"{ns}::flash_backward", mutates_args=(), tags=tags)
    def backward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        O: Tensor,
        L: Tensor,
        dO: Tensor,
        is_causal: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        dQ, dK, dV = _IMPLS[ns][1](q, k, v, O, L, dO, is_causal)
        return _like(dQ, q, strided), _like(dK, k, strided), _like(dV, v, strided)

    @backward.register_fake
    def _(q, k, v, O, L, dO, is_causal):
        return _empty(q, strided), _empty(k, strided), _empty(v, strided)

    def setup_context(ctx, inputs, output):
        q, k, v, is_causal = inputs
        O, L = output
        ctx.save_for_backward(q, k, v, O, L)  # what FlashAttention saves
        ctx.is_causal = is_causal

    def grad(ctx, dO, dL):
        # L is internal (flash_attention returns O only), so nothing flows back through dL.
        q, k, v, O, L = ctx.saved_tensors
        dQ, dK, dV = backward(q, k, v, O, L, dO, ctx.is_causal)
        return dQ, dK, dV, None  # no gradient for is_causal

    forward.register_autograd(grad, setup_context=setup_context)
    return forward


def traceable(fn):
    """Mark a part's flash_forward or flash_backward: in eager code it is fn, unchanged; while
    torch.compile traces it (FlashAttention.apply in a compiled model) it calls the part's op of the
    same name instead (registered by custom_op below, which runs fn at run time), so Dynamo records
    one opaque call where it cannot follow a Triton launch. torch.compiler.is_compiling() is the
    public test for "Dynamo is tracing this"."""
    ns, name = namespace(fn.__module__), fn.__name__

    @functools.wraps(fn)
    def marked(*args, **kwargs):
        if torch.compiler.is_compiling():
            return getattr(getattr(torch.ops, ns), name)(*args, **kwargs)
        return fn(*args, **kwargs)

    return marked


def custom_op(flash_attention):
    """Decorator for a part's `flash_attention`: returns a function with its name and signature that
    checks the inputs, runs the part's forward as a torch.library op, and returns O.

    The op is built from `flash_forward` and `flash_backward` in the module that defines
    `flash_attention`. Inputs are checked as FlashAttention.forward checks them: a part whose
    module imports triton launches Triton kernels (check_inputs(..., triton=True)); one that sets
    GROUPED_HEADS takes k and v with fewer heads than q (check_inputs(..., grouped=True)).
    """
    module = flash_attention.__globals__
    ns = namespace(flash_attention.__module__)
    _IMPLS[ns] = (module["flash_forward"], module["flash_backward"])
    if ns not in _OPS:
        _OPS[ns] = _register(ns, strided=module.get("STRIDED_HEADS", False))
    op = getattr(torch.ops, ns).flash_forward.default
    launches_triton = "triton" in module
    grouped = module.get("GROUPED_HEADS", False)  # the part takes k and v with fewer heads than q

    @functools.wraps(flash_attention)
    def checked(q, k, v, is_causal=False):
        check_inputs(q, k, v, is_causal, triton=launches_triton, grouped=grouped)
        return op(q, k, v, is_causal)[0]

    return checked
