"""Part 5's Launch: after a shape class's first call, the kernels are launched straight through the
compiled kernel's launcher, skipping Triton's per-call Python. These tests hold it to the same bits
as Triton's own path, including a second length of the same class (the grid is per call, the
compiled kernel per class). GPU only: under the interpreter every call takes Triton's path."""

import pytest
import torch

from common import parts
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, assert_same, dq_reordered, needs_gpu

pytestmark = needs_gpu


def _backward_launchers(module, gluon):
    """The backward's three launchers: the Gluon kernel's, or part 4's kernels'."""
    if gluon:
        return [module._launch_bwd_prepare, module._launch_bwd_gluon, module._launch_dq_convert]
    return [module._launch_preprocess, module._launch_dkdv, module._launch_dq]


def _launchers(module):
    gluon = module._launch_fwd_gluon is not None, module._launch_bwd_gluon is not None
    forward = [module._launch_fwd] + ([module._launch_fwd_gluon] if gluon[0] else [])
    backward = _backward_launchers(module, True) + [module._launch_group_sum] if gluon[1] else []  # 4th: grouped
    return forward + _backward_launchers(module, False) + backward


def _forward_launcher(module, q):
    """The forward's launcher for q's call: the Gluon kernel's where it takes the call."""
    return module._launch_fwd_gluon if module.gluon_attention.supported(q) else module._launch_fwd


class _Unreachable:
    """Stands in for a kernel whose Triton launch path must not be taken."""

    def __init__(self, kernel):
        self.best_config = getattr(kernel, "best_config", None)

    def __getitem__(self, grid):
        raise AssertionError("a known shape class went through Triton's own launch path")


def _forget(module):
    for launch in _launchers(module):
        launch.known.clear()


def _run(module, q, k, v, do, causal):
    o, lse = module.flash_forward(q, k, v, causal)
    return (o, lse, *module.flash_backward(q, k, v, o, lse, do, causal))


@pytest.fixture(scope="module")
def part5():
    if 5 not in parts.available():
        pytest.skip("part 5 has no kernel")
    return parts.load(5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fast_launch_gives_tritons_bits(part5, dtype, causal):
    # 300 and 400 queries share the autotuner's bucket (512): one compiled kernel, two grids.
    small = make_inputs(Shape((2, 3), 300, 260, 64), dtype, DEVICE, seed=1)
    large = make_inputs(Shape((2, 3), 400, 450, 64), dtype, DEVICE, seed=2)
    _forget(part5)
    expected = _run(part5, *large, causal)  # Triton's own path: the first call of the class
    _forget(part5)
    _run(part5, *small, causal)  # learns the class on the small shape
    used = [_forward_launcher(part5, small[0]), *_backward_launchers(part5, part5.backward_label() == "gluon")]
    assert all(launch.known for launch in used), "every kernel the call ran should now know the class"
    kernels = [launch.kernel for launch in _launchers(part5)]
    try:  # Triton's own path is now out of reach: the next call must not need it
        for launch in _launchers(part5):
            launch.kernel = _Unreachable(launch.kernel)
        got = _run(part5, *large, causal)  # the fast path, on the large shape's grid
    finally:
        for launch, kernel in zip(_launchers(part5), kernels):
            launch.kernel = kernel
    names = ["O", "L", "dQ", "dK", "dV"]
    for name, e, g in zip(names, expected, got):  # dQ: see assert_same
        assert_same(name, e, g, "the fast launch and Triton's own", dq_reordered(part5) and name == "dQ")


def test_fast_launch_of_grouped_heads_gives_tritons_bits(part5):
    """Grouped heads (4 query heads on 2 key/value heads): the second call, on the fast path
    (the Gluon backward's group sum among its launches, on a Hopper GPU), gives the first's bits."""
    q, k, v, do = make_inputs(Shape((2, 4), 300, 260, 64), torch.bfloat16, DEVICE, seed=6)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    _forget(part5)
    expected = _run(part5, q, k, v, do, True)  # Triton's own path: the first call of the class
    got = _run(part5, q, k, v, do, True)
    if part5.backward_label() == "gluon":
        assert part5._launch_group_sum.known, "the group sum should now know the class"
    for name, e, g in zip(["O", "L", "dQ", "dK", "dV"], expected, got):
        assert_same(name, e, g, "the fast launch and Triton's own", dq_reordered(part5) and name == "dQ")


def test_fast_launch_keeps_the_chosen_config(part5):
    # forward_config() reads the autotuner's best_config; the fast path must leave the right one.
    # float32: the tl forward's (on a Hopper GPU bf16 goes to the Gluon kernel, which is not autotuned).
    q64 = make_inputs(Shape((1, 2), 256, 256, 64), torch.float32, DEVICE, seed=3)[:3]
    q128 = make_inputs(Shape((1, 2), 256, 256, 128), torch.float32, DEVICE, seed=4)[:3]
    part5.flash_forward(*q64, False)
    config64 = part5._attn_fwd.best_config
    part5.flash_forward(*q128, False)
    part5.flash_forward(*q64, False)  # a known class: the fast path
    assert part5._attn_fwd.best_config is config64


def test_a_triton_without_the_direct_launch_keeps_its_own_path(part5, monkeypatch):
    """Where the compiled kernel lacks what the direct launch reads (another Triton's internals),
    every call goes through Triton's public path, and computes the same."""
    from common import triton_tools

    def missing(compiled, tail):
        raise AttributeError("'CompiledKernel' object has no attribute 'packed_metadata'")

    q, k, v, do = make_inputs(Shape((1, 2), 256, 256, 64), torch.bfloat16, DEVICE, seed=5)
    expected = _run(part5, q, k, v, do, True)
    _forget(part5)
    monkeypatch.setattr(triton_tools, "direct_launcher", missing)
    try:
        first, second = _run(part5, q, k, v, do, True), _run(part5, q, k, v, do, True)
        used = [_forward_launcher(part5, q), *_backward_launchers(part5, part5.backward_label() == "gluon")]
        assert all(known[0] is None for launch in used for known in launch.known.values())
    finally:
        _forget(part5)  # the later tests' classes learn the direct launch again
    for name, e, a, b in zip(["O", "L", "dQ", "dK", "dV"], expected, first, second):
        assert_same(name, e, a, "Triton's public path and the fast launch", dq_reordered(part5) and name == "dQ")
        assert_same(name, a, b, "two calls on Triton's public path", dq_reordered(part5) and name == "dQ")
