"""Shared pieces of the test suite."""

import contextlib
import os
import random
import subprocess
import sys

import pytest
import torch

from common import ROOT, parts
from common.inputs import Shape
from common.runtime import DEVICE, HAS_GPU, INTERPRET

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]

needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (full-size shapes are too slow elsewhere)")
HOPPER = HAS_GPU and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernels run on a Hopper GPU (sm_90) only")


# The shape matrix of tests/test_correctness.py, chosen to break the kernels' weak spots: lengths
# that are not a multiple of any tile size, N_q != N_k, N = 1, the smallest D, 3-D and 4-D. These
# are small enough for the Triton interpreter on a CPU (each case well under a second or two).
CORE_SHAPES = [
    Shape((2,), 64, 64, 64),  # every length a multiple of 16, 32 and 64: the friendly case
    Shape((2, 2), 48, 48, 16),  # smallest D, 4-D
    Shape((2, 3), 100, 100, 32),  # ragged: 100 = 6*16 + 4, batch*heads > 1
    Shape((3,), 37, 53, 128),  # ragged on both axes, N_q < N_k, largest D
    Shape((2,), 80, 33, 64),  # N_q > N_k, ragged keys: the last key tile is mostly padding
    Shape((1, 2), 1, 50, 32),  # a single query
    Shape((2,), 40, 1, 16),  # a single key
    Shape((3,), 1, 1, 32),  # a single query and a single key
    Shape((1, 2), 130, 200, 64),  # several key tiles of every tile size used, so the running max
    # really moves between tiles (with 64-row tiles, most shapes above fit in one key tile)
]

# Full-size shapes: GPU only (the interpreter would take minutes each).
FULL_SHAPES = [
    Shape((2, 8), 1024, 1024, 64),
    Shape((1, 4), 2048, 2048, 128),
    Shape((2, 4), 1000, 1531, 64),  # ragged, N_q != N_k
    Shape((4, 2), 777, 777, 16),
    Shape((1, 2), 4096, 4096, 128),
]


def random_shapes(count, seed, max_n, ds=(16, 32, 64, 128)):
    """A seeded sweep of random shapes (3-D and 4-D, any N in [1, max_n], any supported D)."""
    rng = random.Random(seed)

    def lead():
        return (rng.randint(1, 3),) if rng.random() < 0.5 else (rng.randint(1, 2), rng.randint(1, 3))

    return [Shape(lead(), rng.randint(1, max_n), rng.randint(1, max_n), rng.choice(ds)) for _ in range(count)]


def fresh_python(code, timeout=300, **env):
    """`python -c code` in a new interpreter at the repository root, with a reader's environment:
    TRITON_INTERPRET is not inherited from this test process (common.runtime set it here when there
    is no GPU); env adds variables."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"} | env
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def skip_unsupported(part, dtype):
    """bf16 through tl.dot is wrong in Triton's interpreter (triton-lang/triton#11584, not supported
    upstream), so the Triton parts refuse it there (tests/test_bad_inputs.py checks the refusal).
    Part 0 is plain PyTorch and runs bf16 anywhere."""
    if dtype == torch.bfloat16 and INTERPRET and parts.uses_triton(part):
        pytest.skip("bf16 tl.dot is not supported by the Triton interpreter (triton-lang/triton#11584); runs on GPU")


# The provenance columns of a synthetic results row; tables print them in their provenance line.
META = dict(gpu="Test GPU", torch="2.x", triton="3.x", commit="abc1234", date="2026-01-01T00:00:00Z", command="x")


def study_row(**fields):
    """A synthetic row of a study's CSV: the benchmark's B=4, H=8 and bf16 with META, then `fields`."""
    return dict(B=4, H=8, dtype="bf16", **META) | fields


# A Llama small enough for the CPU: two layers, hidden 64 = 4 query heads of D = 16 sharing 2
# key/value heads (grouped-query attention).
TINY_LLAMA = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def assert_report_ok(report, context):
    assert report.ok, f"{context}: {report}"


@contextlib.contextmanager
def deterministic_algorithms(on=True):
    """torch.use_deterministic_algorithms(on) inside the block (warn_only: a PyTorch op without a
    deterministic version warns instead of raising), as it was after."""
    before, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn)


def dq_reordered(module):
    """Whether the module's last backward summed dQ in an order that can change from call to call:
    part 5's Gluon backward adds each key block's float32 dQ share by TMA in whatever order the
    programs arrive (part 4's kernels, and part 5's under torch.use_deterministic_algorithms, do not)."""
    return getattr(module, "backward_label", lambda: None)() == "gluon"


def assert_same(name, a, b, context, reordered=False):
    """a and b bitwise equal; or, for a dQ whose float32 sum was reordered, equal up to that order.
    The shares are the same numbers added in another order: the float32 sums differ by a few of
    float32's ulps of the largest share (2^-14 of max |dQ| covers hundreds of key blocks), and
    rounding to the 16-bit dtype can then move a value by one of its ulps (eps * |value|)."""
    assert a.dtype == b.dtype and a.shape == b.shape, f"{context}: {name} dtype or shape differs"
    if not reordered:
        assert torch.equal(a, b), f"{context}: {name} differs"
        return
    x, y = a.float(), b.float()
    bound = torch.finfo(a.dtype).eps * torch.maximum(x.abs(), y.abs()) + 2**-14 * x.abs().max()
    excess = ((x - y).abs() - bound).max().item()
    assert excess <= 0, f"{context}: {name} differs by more than a reordered float32 sum (by {excess:.1e})"


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
    "dq_reordered",
    "assert_same",
    "deterministic_algorithms",
]
