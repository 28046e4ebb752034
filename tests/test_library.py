"""flash_attention goes through torch.library (common/library.py): it gives FlashAttention.apply's
answer, its ops pass torch's own checks, and torch.compile(fullgraph=True) traces a function that
calls it, forward and backward."""

import pytest
import torch

from common import library, parts
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, DTYPE_IDS, DTYPES, HAS_GPU, assert_same, dq_reordered, mutant, skip_unsupported

RAGGED = Shape((2, 3), 37, 21, 32)  # not a multiple of any tile; N_q != N_k
SQUARE = Shape((2, 3), 37, 37, 32)


def ops(module):
    """The namespace holding a part module's flash_forward and flash_backward ops."""
    return getattr(torch.ops, library.namespace(module.__name__))


def _leaves(shape, dtype, seed):
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=seed)
    return [t.detach().clone().requires_grad_(True) for t in (q, k, v)], do


def _run(fn, leaves, do, is_causal):
    """O and (dQ, dK, dV) of fn(q, k, v, is_causal), with dO given."""
    for t in leaves:
        t.grad = None
    o = fn(*leaves, is_causal)
    o.backward(do)
    return [o.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_op_matches_apply(part, dtype, is_causal):
    """The op calls the same flash_forward and flash_backward on the same tensors: bitwise equal
    (dQ up to its summation order where the part's backward reorders it: assert_same)."""
    skip_unsupported(part, dtype)
    module = parts.load(part)
    leaves, do = _leaves(SQUARE if is_causal else RAGGED, dtype, seed=3)
    op = _run(module.flash_attention, leaves, do, is_causal)
    apply = _run(module.FlashAttention.apply, leaves, do, is_causal)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), op, apply):  # dQ: see assert_same
        assert_same(name, a, b, "flash_attention and FlashAttention.apply", dq_reordered(module) and name == "dQ")
    assert not torch.equal(op[0], torch.zeros_like(op[0])) and not torch.equal(op[1], torch.zeros_like(op[1]))


def test_opcheck(part):
    """torch.library.opcheck: schema, fake implementation (shapes, dtypes, strides), autograd
    registration, and tracing with dynamic shapes, for both ops. The transposed q checks that the
    ops return the layouts their fake implementations promise, whatever the input strides: contiguous,
    or q's, k's and v's own for a part that reads strided heads (part 5's STRIDED_HEADS)."""
    namespace = ops(parts.load(part))
    q, k, v, do = make_inputs(RAGGED, torch.float32, DEVICE, seed=4)
    q = q.transpose(-2, -3).contiguous().transpose(-2, -3)  # (B, N, H, D) memory, seen as (B, H, N, D)
    o, lse = namespace.flash_forward(q, k, v, False)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    for result in (
        torch.library.opcheck(namespace.flash_forward, (*leaves, False)),
        torch.library.opcheck(namespace.flash_backward, (q, k, v, o, lse, do, False)),
    ):
        assert set(result.values()) == {"SUCCESS"}, result


def test_checks_inputs_first(part):
    """The same clear errors as FlashAttention.apply, before anything reaches the op."""
    module = parts.load(part)
    q = torch.randn(1, 8, 32, device=DEVICE)
    with pytest.raises(ValueError, match="head dim"):
        module.flash_attention(q, torch.randn(1, 8, 64, device=DEVICE), torch.randn(1, 8, 64, device=DEVICE))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        module.flash_attention(q, q, q, 1)


def test_compile_fullgraph_aot_eager(part):
    """torch.compile(fullgraph=True) traces a function calling flash_attention without a graph
    break, on any device. The aot_eager backend runs the traced graph with eager kernels (no code
    generation, so it is quick on a CPU and the Triton parts run in the interpreter as usual); it
    exercises what Inductor would see: Dynamo, the fake implementations and the autograd split."""
    module = parts.load(part)
    torch._dynamo.reset()
    leaves, do = _leaves(SQUARE, torch.float32, seed=5)
    eager = _run(module.flash_attention, leaves, do, True)
    compiled = _run(torch.compile(module.flash_attention, fullgraph=True, backend="aot_eager"), leaves, do, True)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), eager, compiled):
        assert_same(name, a, b, "compiled and eager", dq_reordered(module) and name == "dQ")


def test_each_module_gets_its_own_ops(tmp_path):
    """A copy of a part loaded under another module name (as the tests' mutants are) registers ops
    of its own, and loading a module name again replaces its ops' implementation instead of failing."""
    rescale = ("O_i = alpha[..., None] * O_i + ", "O_i = O_i + ")  # part 0 without the online rescaling
    original = parts.load(0)
    copy = mutant(0, tmp_path, "library_copy", [])
    broken = mutant(0, tmp_path, "library_copy", [rescale])  # same module name, now broken
    assert library.namespace(copy.__name__) == library.namespace(broken.__name__) != "part0_pytorch_reference"
    leaves, _ = _leaves(Shape((2,), 150, 150, 32), torch.float32, seed=6)  # three tiles of 64 rows
    expected = original.flash_attention(*leaves)
    assert torch.equal(broken.FlashAttention.apply(*leaves, False), broken.flash_attention(*leaves))
    assert not torch.allclose(broken.flash_attention(*leaves), expected, atol=1e-3)
    assert torch.equal(original.flash_attention(*leaves), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU: Inductor compiles for it")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_compile_inductor_matches_eager(part, dtype, is_causal):
    """A Triton part under torch.compile(fullgraph=True) with the default backend, Inductor.

    Inductor compiles the code around the op and calls the op itself as an opaque kernel, so the
    part's own Triton kernel runs on the same inputs as in eager mode: O, dQ, dK and dV must agree
    bitwise (dQ up to its summation order where the part's backward reorders it: assert_same).
    The only arithmetic Inductor generates here is the multiplication by 2, exact in floating
    point, on the way in (dO = 2 * grad) and out."""
    if not parts.uses_triton(part):
        pytest.skip("not a Triton part: part 0 runs plain PyTorch (its compiled path is tested with aot_eager)")
    module = parts.load(part)
    torch._dynamo.reset()

    def attend(q, k, v, is_causal):
        return module.flash_attention(q, k, v, is_causal=is_causal) * 2  # something for Inductor to fuse around

    leaves, do = _leaves(Shape((2, 4), 250, 250 if is_causal else 300, 64), dtype, seed=7)
    eager = _run(attend, leaves, do, is_causal)
    compiled = _run(torch.compile(attend, fullgraph=True), leaves, do, is_causal)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), eager, compiled):
        assert_same(name, a, b, "Inductor and eager", dq_reordered(module) and name == "dQ")
