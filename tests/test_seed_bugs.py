"""The two bugs the seed kernel's own test file found, re-introduced on purpose.

Each test copies a part's kernel, breaks it the way the seed's first version was broken, and
shows that the suite's checks catch the broken copy (and, where it matters, that the friendly
shape the original assignment tested does not). If these tests pass, the correctness tests above
would have failed on those bugs.
"""

import pytest
import torch

from common import parts
from common.check import check_part
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, INTERPRET, mutant

FRIENDLY = Shape((2,), 256, 256, 64)  # lengths a multiple of every tile size (up to 256): no padding anywhere
RAGGED = Shape((2, 3), 100, 100, 32)  # 100 = 6*16 + 4 keys: the last key tile is mostly padding

# The lines each mutation rewrites, per part (parts 1 and 2 share the seed's inner loop).
KEY_MASK = "keep = k_pos[None, :] < N_KEYS"
P_CAST = "p = p.to(v.dtype)"
PER_SEQUENCE_K = "tl.make_tensor_descriptor(K + bh * N_KEYS * D, [N_KEYS, D]"
PER_SEQUENCE_V = "tl.make_tensor_descriptor(V + bh * N_KEYS * D, [N_KEYS, D]"
K_LOAD = "k = k_desc.load([k_start, 0])"
V_LOAD = "v = v_desc.load([k_start, 0])"

SEED_LOOP_PARTS = (1, 2)


def _check(module, shape, dtype=torch.float32, is_causal=False):
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=11)
    return check_part(module, q, k, v, do, is_causal, grads=False)


@pytest.mark.only_parts(*SEED_LOOP_PARTS)
def test_phantom_zero_keys_are_caught(part, tmp_path):
    """Bug 2 of the seed: without the key mask, zero-filled rows past N_KEYS score exactly 0 and
    enter the softmax as phantom keys. The friendly shape cannot see it; the ragged one must."""
    broken = mutant(part, tmp_path, "no_key_mask", [(KEY_MASK, "keep = k_pos[None, :] >= 0")])
    assert _check(broken, FRIENDLY).ok, "with N a tile multiple there is no padding, so no phantom keys"
    assert not _check(broken, RAGGED).ok, "ragged N must expose the phantom keys"
    assert _check(parts.load(part), RAGGED).ok


@pytest.mark.only_parts(*SEED_LOOP_PARTS)
def test_neighbour_sequence_keys_are_caught(part, tmp_path):
    """One descriptor over all sequences (B*H*N_k rows) instead of one per sequence: the ragged
    last tile of sequence b now reads the first keys of sequence b+1 instead of zeros. Without the
    key mask those keys enter the softmax, and the ragged, batch > 1 case must catch it."""
    flattened = [
        (PER_SEQUENCE_K, "tl.make_tensor_descriptor(K, [tl.num_programs(1) * N_KEYS, D]"),
        (PER_SEQUENCE_V, "tl.make_tensor_descriptor(V, [tl.num_programs(1) * N_KEYS, D]"),
        (K_LOAD, "k = k_desc.load([(bh * N_KEYS + k_start).to(tl.int32), 0])"),
        (V_LOAD, "v = v_desc.load([(bh * N_KEYS + k_start).to(tl.int32), 0])"),
    ]
    leaky = mutant(part, tmp_path, "flat_no_mask", flattened + [(KEY_MASK, "keep = k_pos[None, :] >= 0")])
    assert not _check(leaky, RAGGED).ok
    # With the mask in place the neighbour's rows are read but weigh exactly exp(-inf) = 0.
    masked = mutant(part, tmp_path, "flat_masked", flattened)
    assert _check(masked, RAGGED).ok


@pytest.mark.only_parts(*SEED_LOOP_PARTS)
def test_p_cast_that_does_nothing_is_caught(part, tmp_path):
    """Bug 1 of the seed: `p.to(v.dtype)` without assigning it is a no-op, so the second tl.dot
    gets a float32 P and a 16-bit V. Triton refuses mixed-dtype dots: the float16 test fails
    (float32 inputs cannot see it: the cast is float32 -> float32). Compiled, the refusal is a
    compile error; in the interpreter, the same assertion raised while the kernel runs."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import InterpreterError

    broken = mutant(part, tmp_path, "no_p_cast", [(P_CAST, "p.to(v.dtype)")])
    assert _check(broken, FRIENDLY, dtype=torch.float32).ok
    with pytest.raises(InterpreterError if INTERPRET else CompilationError, match="Both operands must be same dtype"):
        _check(broken, FRIENDLY, dtype=torch.float16)
