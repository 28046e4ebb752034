"""Part 3's inner loop, from part 3 on: every tile shape the autotuner may pick, rows that see no key
in the first tile they visit, and more (batch * head) sequences than a second grid axis allows."""

import warnings

import pytest
import torch

from common.check import check_part
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, HAS_GPU, INTERPRET, assert_report_ok, mutant, needs_gpu

INTERPRETER_CONFIGS = "CONFIGS = [INTERPRETED] if INTERPRET else TUNED + list(FLOAT32.values())"
# BLOCK_M < BLOCK_N (one key tile spans several query tiles' diagonals), ==, and > (a query tile's
# diagonal spans several key tiles). Interpreter tiles stay small; GPU tiles are the sweep's sizes.
TILES = [(64, 128), (128, 128), (128, 64), (128, 32)] if HAS_GPU else [(16, 32), (16, 16), (32, 16), (64, 16)]
# Ragged everywhere, N_q < N_k and N_q > N_k, several tiles of every size above.
SHAPES = (
    [Shape((1, 2), 300, 451, 64), Shape((2, 1), 517, 260, 128), Shape((1, 1), 130, 130, 16)]
    if HAS_GPU
    else [Shape((1, 2), 70, 101, 32), Shape((2,), 101, 45, 16), Shape((1, 1), 67, 67, 64)]
)
LOOP_HEAD = """    for k_start in range(lo, hi, BLOCK_N):
        k = k_desc.load([k_start, 0])  # (BLOCK_N, D)
        v = v_desc.load([k_start, 0])  # (BLOCK_N, D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) Q_i K_j^T, float32"""
FORWARD_LOOP = (
    LOOP_HEAD,
    LOOP_HEAD.replace(
        "    for k_start in range(lo, hi, BLOCK_N):\n",
        "    n_tiles = tl.cdiv(hi - lo, BLOCK_N)\n"
        "    for t in range(0, n_tiles):  # the same tiles, last first\n"
        "        k_start = lo + (n_tiles - 1 - t) * BLOCK_N\n",
    ),
)
GUARD = 'm_sub = tl.where(m_new == float("-inf"), 0.0, m_new)'


def one_config(bm, bn):
    """The mutation that makes the autotuner's only choice BLOCK_M x BLOCK_N, on any machine."""
    stages = 1 if INTERPRET else 2
    config = f'CONFIGS = [triton.Config({{"BLOCK_M": {bm}, "BLOCK_N": {bn}}}, num_warps=4, num_stages={stages})]'
    return (INTERPRETER_CONFIGS, config)


@pytest.mark.since_part(3)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_every_tile_ratio(part, tiles, is_causal, tmp_path):
    """The split into unmasked and masked tiles holds for BLOCK_M <, = and > BLOCK_N."""
    module = mutant(part, tmp_path, f"tiles_{tiles[0]}x{tiles[1]}", [one_config(*tiles)])
    for i, shape in enumerate(SHAPES):
        q, k, v, do = make_inputs(shape, torch.float16, DEVICE, seed=i)
        assert_report_ok(check_part(module, q, k, v, do, is_causal, grads=False), f"{tiles} {shape}")


@pytest.mark.since_part(3)
def test_rows_with_no_visible_key_stay_finite(part, tmp_path):
    """Visit key tiles last first: a causal query tile then meets, first, a diagonal tile in which
    its upper rows see no key at all (BLOCK_M > BLOCK_N), so their running max is still -inf. The
    kernel's guard must keep O and L finite and right; without it, exp2(-inf - (-inf)) is NaN."""
    tiles = one_config(32, 16) if INTERPRET else one_config(128, 64)
    shape = SHAPES[0]
    q, k, v, do = make_inputs(shape, torch.float16, DEVICE, seed=3)
    backwards = mutant(part, tmp_path, "backwards", [tiles, FORWARD_LOOP])
    assert_report_ok(check_part(backwards, q, k, v, do, True, grads=False), "tiles visited last first")
    unguarded = mutant(part, tmp_path, "backwards_unguarded", [tiles, FORWARD_LOOP, (GUARD, "m_sub = m_new")])
    # -inf - (-inf) on purpose; the interpreter (numpy) warns about it, a GPU does not
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "invalid value encountered in subtract", RuntimeWarning)
        out = unguarded.flash_forward(q, k, v, True)
    assert not torch.isfinite(out[0]).all(), "without the guard the fully masked rows should turn NaN"


@needs_gpu
@pytest.mark.gpu
@pytest.mark.since_part(3)
def test_more_sequences_than_a_grid_axis(part):
    """70000 (batch * head) sequences: past the 65535 of a second grid axis, which parts 1-2 use."""
    q, k, v, do = make_inputs(Shape((70000,), 20, 24, 16), torch.float16, DEVICE, seed=1)
    from common import parts

    assert_report_ok(check_part(parts.load(part), q, k, v, do, True, grads=False), "70000 sequences")
