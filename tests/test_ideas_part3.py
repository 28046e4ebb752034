"""Part 3's ideas, one test each (or a pair: the count and the check that nothing was lost): what
grades its exercises (make exercise PART=3). In the suite they test the shipped kernel; `make check
PART=3 NAME=x` runs them on the learner's file instead.

Three of the ideas only cost time, so they are graded by counting what the kernel does under
Triton's interpreter (common/counting.py): the key tiles the programs visit (two tl.dot each), the
tiles that go through the masked stage (two tl.where each: the mask and the m_sub guard), and tl.exp
against tl.exp2. A compiled run on a GPU cannot be counted: those tests run on a CPU only."""

import functools
import warnings

import pytest
import torch

from common import exercises, parts
from common.check import check_part
from common.counting import counting
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE, INTERPRET
from tests.helpers import assert_report_ok

pytestmark = pytest.mark.only_parts(3)
interpreted = pytest.mark.skipif(not INTERPRET, reason="operations are counted under Triton's interpreter only")

# Square with whole tiles, N_q < N_k (keys past the last query tile's diagonal) and N_q > N_k
# (query tiles below the last key), both ragged.
SHAPES = [Shape((1,), 256, 256, 32), Shape((2,), 70, 101, 16), Shape((1,), 101, 45, 16)]
# The interpreter's tiles (INTERPRETED, BLOCK_M > BLOCK_N: a query tile's diagonal spans two key
# tiles) and the other way round (one key tile holds the diagonals of two query tiles).
TILES = [(32, 16), (16, 32)]
CONFIGS_LINE = "CONFIGS = [INTERPRETED] if INTERPRET else TUNED + list(FLOAT32.values())"
LOOP_HEAD = "    for k_start in range(lo, hi, BLOCK_N):\n"
LAST_FIRST = (  # the same key tiles, visited last first
    "    n_tiles = tl.cdiv(hi - lo, BLOCK_N)\n"
    "    for t in range(0, n_tiles):\n"
    "        k_start = lo + (n_tiles - 1 - t) * BLOCK_N\n"
)


def case(shape, tiles, causal):
    kind = "causal" if causal else "non-causal"
    return f"{kind} forward, N_q={shape.n_q}, N_k={shape.n_k}, {tiles[0]}x{tiles[1]} tiles"


@functools.cache
def kernel(part, tiles=TILES[0], last_first=False):
    """The part's file as graded (the learner's during `make check`) with `tiles` as the autotuner's
    only choice, and, with last_first, its key loop turned round."""
    source = exercises.learner_source(part, "flash_attention.py")
    stages = 1 if INTERPRET else 2
    meta = f'{{"BLOCK_M": {tiles[0]}, "BLOCK_N": {tiles[1]}}}'
    config = f"CONFIGS = [triton.Config({meta}, num_warps=4, num_stages={stages})]"
    changes = [(CONFIGS_LINE, config)] + ([(LOOP_HEAD, LAST_FIRST)] if last_first else [])
    for old, new in changes:
        assert source.count(old) == 1, f"the grader changes this line of flash_attention.py, keep it as it was: {old!r}"
        source = source.replace(old, new)
    name = f"part{part}_ideas_{tiles[0]}x{tiles[1]}{'_last_first' if last_first else ''}"
    return parts.load_source(name, source)


def tiles_needed(shape, tiles, causal):
    """(visited, masked): key tiles summed over every program, by definition. A tile must be visited
    iff some row of the query tile (the padded rows past N_q too: they are computed) sees some key of
    it (j < N_k, and j <= i causal); it needs a mask unless every row sees every key of it."""
    block_m, block_n = tiles
    visited = masked = 0
    for q_start in range(0, shape.n_q, block_m):
        for k_start in range(0, shape.n_k, block_n):
            seen = [
                j < shape.n_k and (not causal or j <= i)
                for i in range(q_start, q_start + block_m)
                for j in range(k_start, k_start + block_n)
            ]
            visited += any(seen)
            masked += any(seen) and not all(seen)
    n_seqs = shape.lead[0] if len(shape.lead) == 1 else shape.lead[0] * shape.lead[1]
    return visited * n_seqs, masked * n_seqs


def counted(module, shape, causal, *names):
    q, k, v, _ = make_inputs(shape, torch.float16, DEVICE, seed=shape.n_k)
    with counting(*names) as counts:
        module.flash_forward(q, k, v, causal)
    return counts


def assert_forward_right(module, shape, causal, context, seed=0):
    q, k, v, do = make_inputs(shape, torch.float16, DEVICE, seed=seed)
    assert_report_ok(check_part(module, q, k, v, do, causal, grads=False), context)


# ------------------------------------------------------------------------------ causal tile skipping
@interpreted
@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_causal_skip_visits_only_tiles_a_row_sees(part, tiles):
    """Causal, a query tile's loop ends at the last key any of its rows sees: the key tiles above
    the diagonal are never loaded. Not causal, every key tile is visited."""
    module = kernel(part, tiles)
    for shape in SHAPES:
        for causal in (True, False):
            visits = counted(module, shape, causal, "dot")["dot"] // 2  # Q K^T and P V per tile
            expected, _ = tiles_needed(shape, tiles, causal)
            assert visits == expected, (
                f"{case(shape, tiles, causal)}: the programs visit {visits} key tiles, "
                f"{'with skipping they should visit' if causal else 'there are'} {expected}"
            )


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_causal_skip_loses_no_key(part, tiles):
    """What the loop still visits is everything the rows see: O and L against float64."""
    module = kernel(part, tiles)
    for shape in SHAPES:
        assert_forward_right(module, shape, True, case(shape, tiles, True))


# ------------------------------------------------------------------------------ masks only where needed
@interpreted
@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_masks_only_on_tiles_that_need_one(part, tiles):
    """Only the diagonal tiles (causal) and the ragged last key tile go through the masked stage;
    the rest run the first stage, compiled without tl.where."""
    module = kernel(part, tiles)
    for shape in SHAPES:
        for causal in (True, False):
            masked_stage = counted(module, shape, causal, "select")["select"] / 2  # the mask and the m_sub guard
            _, expected = tiles_needed(shape, tiles, causal)
            assert masked_stage == expected, (
                f"{case(shape, tiles, causal)}: {masked_stage:g} key tiles go through the masked stage "
                f"(tl.where), only {expected} hold a score some row must not see"
            )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_masks_still_hide_every_key_they_must(part, tiles, causal):
    """The unmasked stage sees no key past N_k and, causal, none after its query: O and L against
    float64 on ragged shapes."""
    module = kernel(part, tiles)
    for shape in SHAPES[1:]:
        assert_forward_right(module, shape, causal, case(shape, tiles, causal))


# ------------------------------------------------------------------------------ exp2, the scale folded in
@interpreted
def test_exp2_instead_of_exp(part):
    """Every exponential of the forward is the GPU's native exp2."""
    module = kernel(part)
    for causal in (False, True):
        counts = counted(module, SHAPES[0], causal, "exp", "exp2")
        assert counts["exp"] == 0 and counts["exp2"] > 0, (
            f"{case(SHAPES[0], TILES[0], causal)}: tl.exp ran {counts['exp']} times and tl.exp2 "
            f"{counts['exp2']} times (each call on a whole tile or row counts once); every one should be exp2"
        )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_exp2_keeps_o_and_l_right(part, causal):
    """Base 2 inside, the same O and the natural-log L outside."""
    module = kernel(part)
    for shape in SHAPES:
        assert_forward_right(module, shape, causal, case(shape, TILES[0], causal))


# ------------------------------------------------------------------------------ rows with no visible key
def test_no_visible_key_rows_stay_finite(part):
    """Key tiles visited last first: a causal query tile then meets, first, a diagonal tile in which
    its upper rows see no key at all (BLOCK_M > BLOCK_N), so their running max is still -inf. O and
    L must come out finite and right."""
    module = kernel(part, TILES[0], last_first=True)
    shape = Shape((1, 2), 70, 101, 32)
    q, k, v, do = make_inputs(shape, torch.float16, DEVICE, seed=3)
    context = f"{case(shape, TILES[0], True)}, key tiles visited last first"
    with warnings.catch_warnings():  # -inf - (-inf): numpy (the interpreter) warns, a GPU does not
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        o, lse = module.flash_forward(q, k, v, True)
    bad = ~torch.isfinite(o).all(-1) | ~torch.isfinite(lse)
    assert not bad.any(), f"{context}: {int(bad.sum())} of {bad.numel()} rows of O or L are NaN or inf"
    assert_report_ok(check_part(module, q, k, v, do, True, grads=False), context)


@interpreted
def test_no_visible_key_guard_costs_the_unmasked_stage_nothing(part):
    """The guard sits in the masked stage only: with one masked tile per program (the ragged last
    key tile, not causal), more whole key tiles add no tl.where."""
    module = kernel(part)
    few, many = (Shape((1,), 32, n_k, 16) for n_k in (40, 136))  # 2 and 8 whole key tiles, then a ragged one
    selects = [counted(module, shape, False, "select")["select"] for shape in (few, many)]
    assert selects[0] == selects[1], (
        f"non-causal forward, N_q=32, {TILES[0][0]}x{TILES[0][1]} tiles: tl.where ran {selects[0]} times with "
        f"N_k=40 and {selects[1]} times with N_k=136, the same one masked tile: the unmasked tiles run it too"
    )
