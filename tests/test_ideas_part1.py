"""Part 1's ideas, one test each: what grades its exercises (make exercise PART=1). In the suite they
test the shipped kernel; `make check PART=1 NAME=x` runs them on the learner's file instead."""

import math

import pytest
import torch

from common import parts
from common.check import check_part
from common.counting import counting
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE, INTERPRET

pytestmark = pytest.mark.only_parts(1)


def checked(part, shape, causal, dtype=torch.float32):
    """The part's O and L against float64; a forward that does not run fails the test with one line
    saying why (the interpreter's InterpreterError, a GPU's CompilationError), not a traceback."""
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=shape.n_k)
    try:
        return check_part(parts.load(part), q, k, v, do, causal, grads=False)
    except Exception as e:  # noqa: BLE001
        lines = str(e).strip().splitlines() or [""]
        said = f"{type(e).__name__}: {next((line for line in lines if 'dtype' in line), lines[-1]).strip()}"
    pytest.fail(f"{shape}, {dtype}, causal={causal}: the forward does not run: {said}")


# ------------------------------------------------------------------------------ key_mask
# Key lengths that are not a multiple of 16: the last key tile is partly past the sequence. Causal
# with N_q > N_k: queries past N_k would see the zero keys too (key j visible to query i when j <= i).
RAGGED_KEYS = [(Shape((2, 3), 100, 100, 32), False), (Shape((2,), 80, 33, 64), True)]


@pytest.mark.parametrize(("shape", "causal"), RAGGED_KEYS, ids=[f"{s}{'-causal' if c else ''}" for s, c in RAGGED_KEYS])
def test_key_mask_keeps_zero_keys_out_of_the_softmax(part, shape, causal):
    """The ragged edge: a key tile past N_k loads zeros, which score exactly 0 against every query
    and would join the softmax; O and L against float64 say whether they did."""
    report = checked(part, shape, causal)
    tile = parts.load(part).BLOCK_N
    padding = -shape.n_k % tile
    assert report.ok, (
        f"{shape}, causal={causal}: {shape.n_k} keys, so the last key tile of {tile} has {padding} zero "
        f"rows past N_k; against float64: {report}"
    )


# ------------------------------------------------------------------------------ p_cast
CAST_SHAPE = Shape((2, 2), 48, 40, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_p_cast_lets_16_bit_inputs_through_p_v(part, dtype):
    """P_ij V_j: tl.dot takes two operands of one dtype. Float32 inputs cannot see a missing cast
    (P is float32 already); float16 ones can: the kernel must run, and be right."""
    report = checked(part, CAST_SHAPE, False, dtype)
    assert report.ok, f"{CAST_SHAPE}, {dtype}: against float64: {report}"


@pytest.mark.skipif(not INTERPRET, reason="reads the operands' dtypes under Triton's interpreter (a CPU)")
def test_p_cast_multiplies_16_bit_operands(part, monkeypatch):
    """Both products of a float16 forward, Q K^T and P V, on float16 operands (what tensor cores
    take), accumulating in float32: not P and V both widened to float32."""
    from triton.runtime.interpreter import InterpreterBuilder

    seen, original = [], InterpreterBuilder.create_dot

    def spy(self, a, b, *rest):
        seen.append((str(a.dtype), str(b.dtype)))
        return original(self, a, b, *rest)

    monkeypatch.setattr(InterpreterBuilder, "create_dot", spy)
    checked(part, CAST_SHAPE, False, torch.float16)
    wide = sorted({pair for pair in seen if pair != ("fp16", "fp16")})
    assert seen and not wide, (
        f"{CAST_SHAPE}, float16: {sum(p != ('fp16', 'fp16') for p in seen)} of {len(seen)} products "
        f"multiply {' and '.join(' x '.join(p) for p in wide)} operands; tensor cores take 16-bit ones"
    )


# ------------------------------------------------------------------------------ grid
GRID_SHAPES = [Shape((2, 3), 100, 100, 32), Shape((3,), 37, 53, 16)]


@pytest.mark.parametrize("shape", GRID_SHAPES, ids=str)
def test_grid_covers_every_query_tile_of_every_sequence(part, shape):
    """One program per (query tile, sequence): every row of O and L written, and right."""
    report = checked(part, shape, False)
    fa = parts.load(part)
    tiles, sequences = -(-shape.n_q // fa.BLOCK_M), math.prod(shape.lead)
    assert report.ok, (
        f"{shape}: {tiles} query tiles of {fa.BLOCK_M} rows in each of {sequences} sequences; against float64: {report}"
    )


@pytest.mark.skipif(not INTERPRET, reason="counts the programs' work under Triton's interpreter (a CPU)")
def test_grid_launches_no_program_for_nothing(part):
    """Exactly one program per (query tile, sequence): with N_q a multiple of BLOCK_M, a program
    more is a program whose rows are all past N_q, loading and multiplying for nothing."""
    fa = parts.load(part)
    shape = Shape((2,), 64, 48, 16)
    q, k, v, _ = make_inputs(shape, torch.float32, DEVICE)
    with counting("dot") as counts:
        fa.flash_forward(q, k, v, False)
    key_tiles, tiles = -(-shape.n_k // fa.BLOCK_N), -(-shape.n_q // fa.BLOCK_M)
    programs = counts["dot"] / (2 * key_tiles)  # each program: Q K^T and P V per key tile
    assert programs == tiles * 2, (
        f"{shape}: {programs:g} programs ran (counted by their products); {tiles} query tiles of "
        f"{fa.BLOCK_M} rows in each of 2 sequences need {tiles * 2}"
    )
