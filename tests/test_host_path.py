"""Part 5's cheaper host path: flash_forward keeps what it launches per call signature (dtype,
shapes, device, causal), and its kernels launch through fast_launch.Launch. None of it may change an
answer or an error: a call after another signature must not reuse that one's launch, a strided or
misaligned input is still copied, and bad input still raises the check's error."""

import pytest
import torch

from common import launch, parts
from common.check import check_outputs
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, HAS_GPU, INTERPRET, assert_report_ok, needs_hopper
from tests.test_bad_inputs import CASES

pytestmark = pytest.mark.only_parts(5)

DTYPES = [torch.float32, torch.float16] if INTERPRET else [torch.float32, torch.float16, torch.bfloat16]
SHAPE = Shape((2, 3), 300, 260, 64) if HAS_GPU else Shape((1, 2), 40, 33, 32)
# Each differs from SHAPE in one thing the launch depends on: N_q (and so the grid), N_k, D,
# the batch/head layout (same B*H x N x D, 3-D), the number of sequences.
OTHERS = (
    [
        Shape((2, 3), 520, 260, 64),
        Shape((2, 3), 300, 700, 64),
        Shape((2, 3), 300, 260, 128),
        Shape((6,), 300, 260, 64),
        Shape((3, 3), 300, 260, 64),
    ]
    if HAS_GPU
    else [
        Shape((1, 2), 70, 33, 32),
        Shape((1, 2), 40, 50, 32),
        Shape((1, 2), 40, 33, 16),
        Shape((2,), 40, 33, 32),
        Shape((2, 2), 40, 33, 32),
    ]
)


def _transposed(t):
    """t's values with (N, D) strided: a (..., D, N) tensor transposed, as a layout change leaves it."""
    return t.transpose(-2, -1).contiguous().transpose(-2, -1)


def _misaligned(t):
    """t's values, contiguous, starting 2 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    out = flat[1 : 1 + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


def _launched(module, q, k, v, causal):
    """flash_forward(q, k, v, causal), with what it handed its launcher: the key, the run-time
    arguments after the five tensors, the constexprs, and the programs the grid gives."""
    seen = []
    launchers = {"_launch_fwd": module._launch_fwd, "_launch_fwd_gluon": module._launch_fwd_gluon}

    def spy(launch):
        def call(key, grid, *args, **constexprs):
            seen.append((key, args[5:], constexprs, grid(dict(BLOCK_M=16))))
            return launch(key, grid, *args, **constexprs)

        return call

    try:
        for name, launch in launchers.items():
            setattr(module, name, spy(launch))
        out = module.flash_forward(q, k, v, causal)
    finally:
        for name, launch in launchers.items():
            setattr(module, name, launch)
    assert len(seen) == 1
    return out, seen[0]


def _check_forward(module, q, k, v, do, causal, context):
    with torch.no_grad():
        (o, lse), (key, scalars, constexprs, programs) = _launched(module, q, k, v, causal)
        o_apply = module.FlashAttention.apply(q, k, v, causal)
    # The launch for this call, not a cached one of another signature:
    n_q, n_k, d, n_seqs = q.shape[-2], k.shape[-2], q.shape[-1], q[..., 0, 0].numel()
    assert key[:4] == (q.device, q.dtype, d, causal), f"{context}: launch key {key}"
    assert scalars[:3] == (n_q, n_k, n_seqs) and scalars[-1] == d**-0.5, f"{context}: arguments {scalars}"
    assert constexprs["D"] == d and constexprs["IS_CAUSAL"] == causal, f"{context}: constexprs {constexprs}"
    if "WARPGROUPS" in constexprs:  # the Gluon kernel: the causal order's group before the scale
        assert scalars[3] == module.gluon_attention.group_size(n_seqs, n_q, d, causal), context
    if "DOT_PRECISION" in constexprs:  # the tl kernel: a program per 16 query rows of each sequence here
        assert constexprs["DOT_PRECISION"] == ("ieee" if q.dtype == torch.float32 else "tf32"), context
        assert key[4] == launch.n_bucket(n_q, n_k) and programs == -(-n_q // 16) * n_seqs, context
    assert o.shape == q.shape and o.is_contiguous() and lse.shape == q.shape[:-1], context
    assert torch.equal(o, o_apply), f"{context}: FlashAttention.apply and flash_forward disagree"
    assert_report_ok(check_outputs({"O": o, "L": lse}, q, k, v, do, causal), context)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_a_call_after_another_signature_gets_its_own_launch(part, dtype):
    module = parts.load(part)
    base = make_inputs(SHAPE, dtype, DEVICE, seed=1)
    _check_forward(module, *base, False, "first call")
    for i, shape in enumerate(OTHERS):
        _check_forward(module, *make_inputs(shape, dtype, DEVICE, seed=2 + i), False, f"{shape}")
        _check_forward(module, *base, False, f"the first shape again, after {shape}")
    _check_forward(module, *base, True, "causal, same shapes")
    _check_forward(module, *base, False, "not causal again")
    other_dtype = torch.float16 if dtype == torch.float32 else torch.float32
    _check_forward(module, *make_inputs(SHAPE, other_dtype, DEVICE, seed=9), False, f"{other_dtype}, same shapes")
    _check_forward(module, *base, False, "the first dtype again")


@pytest.mark.parametrize("layout", ["transposed", "misaligned"])
def test_strided_and_misaligned_inputs_after_a_contiguous_call(part, layout):
    """Strides are not part of the signature: the same shapes strided or off a 16-byte boundary are
    still copied before the launch (the kernels read contiguous, aligned rows)."""
    module = parts.load(part)
    q, k, v, do = make_inputs(SHAPE, torch.float16, DEVICE, seed=3)
    change = _transposed if layout == "transposed" else _misaligned
    _check_forward(module, q, k, v, do, False, "contiguous")
    for name in ("q", "k", "v"):
        changed = [change(t) if n == name else t for n, t in zip("qkv", (q, k, v))]
        _check_forward(module, *changed, do, False, f"{layout} {name}")
    _check_forward(module, change(q), change(k), change(v), do, True, f"{layout} q, k and v, causal")
    _check_forward(module, q, k, v, do, False, "contiguous again")


@pytest.mark.parametrize("q,k,v,is_causal,exc,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_after_a_good_call(part, q, k, v, is_causal, exc, pattern):
    module = parts.load(part)
    good = make_inputs(Shape((2,), 8, 8, 64), torch.float32, DEVICE, seed=4)[:3]
    with torch.no_grad():
        module.FlashAttention.apply(*good, False)
        module.FlashAttention.apply(*good, False)
    with pytest.raises(exc, match=pattern):
        module.FlashAttention.apply(q, k, v, is_causal)
    with torch.no_grad(), pytest.raises(exc, match=pattern):
        module.FlashAttention.apply(q, k, v, is_causal)


def test_one_bad_argument_in_a_known_good_call(part):
    """The good call's exact shapes with one thing wrong: the quick check must not let it through."""
    module = parts.load(part)
    q, k, v = make_inputs(Shape((2,), 8, 8, 64), torch.float32, DEVICE, seed=5)[:3]
    with torch.no_grad():
        module.FlashAttention.apply(q, k, v, False)
        for args, exc, pattern in [
            ((q, k.half(), v, False), TypeError, "same dtype"),
            ((q, k, v.half(), False), TypeError, "same dtype"),
            ((q, k, v, 1), TypeError, "is_causal must be a bool"),
            ((q, k, v, None), TypeError, "is_causal must be a bool"),
            ((q, k.tolist(), v, False), TypeError, "k must be a torch.Tensor"),
            ((q, k, v[..., :32], False), ValueError, "v has head dim 32"),
            ((q, k, v[:, :7], False), ValueError, "k and v must have the same sequence length"),
            ((q, k, v.to("meta"), False), ValueError, "same device"),
        ]:
            with pytest.raises(exc, match=pattern):
                module.FlashAttention.apply(*args)


def _grads(module, q, k, v, do, causal):
    """O, L and the gradients of a forward + backward through autograd, and which backward ran."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = module.FlashAttention.apply(*leaves, causal)
    dq, dk, dv = torch.autograd.grad(o, leaves, do)
    lse = module.flash_forward(q, k, v, causal)[1]
    return {"O": o.detach(), "L": lse, "dQ": dq, "dK": dk, "dV": dv}, module.backward_label()


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d", [64, 128])
def test_a_backward_after_another_signature_gets_its_own_plan(part, d):
    """The Gluon backward keeps a plan per call signature (gluon_backward.Plan): every shape, causal
    and not, in turn and again, gets its own programs and arguments; gradients come back in the
    inputs' shapes and pass the check; a strided or misaligned input or upstream gradient of known
    shapes is still copied before the launches."""
    module = parts.load(part)
    shapes = [Shape(s.lead, s.n_q, s.n_k, d) for s in (SHAPE, *OTHERS) if s.d == SHAPE.d]
    for causal in (False, True):
        for i, shape in enumerate(shapes + shapes[:1]):  # the first again, after the others
            q, k, v, do = make_inputs(shape, torch.bfloat16, DEVICE, seed=30 + i)
            out, label = _grads(module, q, k, v, do, causal)
            assert label == "gluon", f"{shape} causal={causal}: ran {label}"
            assert [out[n].shape for n in ("dQ", "dK", "dV")] == [q.shape, k.shape, v.shape]
            assert_report_ok(check_outputs(out, q, k, v, do, causal), f"{shape} causal={causal}")
    q, k, v, do = make_inputs(shapes[0], torch.bfloat16, DEVICE, seed=30)
    for change in (_transposed, _misaligned):
        for name in ("q", "k", "do"):
            changed = [change(t) if n == name else t for n, t in zip(("q", "k", "v", "do"), (q, k, v, do))]
            out, label = _grads(module, *changed, True)
            assert label == "gluon"
            assert_report_ok(check_outputs(out, *changed, True), f"{change.__name__} {name}")
