"""Part 3's ablation steps (part3_inner_loop/steps/*.diff): applied in order to part 2's kernel they
give part 3's kernel exactly, and every intermediate kernel is itself correct."""

import pytest
import torch

from common import parts
from common.check import check_outputs, check_part
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, assert_report_ok


@pytest.mark.only_parts(3)
def test_steps_rebuild_part3(part):
    from part3_inner_loop import ablation

    sources = ablation.step_sources()
    assert len(sources) == len(ablation.LABELS)
    assert sources[0] == parts.path(2).read_text()
    assert sources[-1] == parts.path(3).read_text(), "regenerate steps/ after editing part 3's kernel"
    assert len(set(sources)) == len(sources), "every step changes something"


@pytest.mark.only_parts(3)
@pytest.mark.parametrize("step", range(1, 5))
def test_every_step_is_correct(part, step):
    from part3_inner_loop import ablation

    module = ablation.load_step(step, ablation.step_sources()[step])
    for is_causal in (False, True):
        q, k, v, do = make_inputs(Shape((1, 2), 70, 101, 32), torch.float16, DEVICE, seed=step)
        assert_report_ok(check_part(module, q, k, v, do, is_causal, grads=False), f"step {step}")


@pytest.mark.only_parts(3)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tile_picture_matches_brute_force(part, causal):
    """tiles.key_tiles (the kernel's loop bounds, drawn in tile_skipping.png) against the definition:
    a key tile is visited iff some query of the program sees some key in it (j <= i, j < N_k); it is
    left unmasked only if every query of the program sees every key in it."""
    from part3_inner_loop.tiles import key_tiles

    for bm, bn in ((128, 64), (64, 128), (64, 64), (32, 16)):
        for n_q, n_k in ((256, 256), (300, 451), (517, 260), (1, 1), (64, 1)):
            for q_start in range(0, n_q, bm):
                unmasked, masked = key_tiles(q_start, bm, bn, n_k, causal)
                queries = range(q_start, q_start + bm)  # padded rows past N_q count too: they are computed
                for k_start in range(0, n_k, bn):
                    keys = range(k_start, k_start + bn)
                    seen = [[j < n_k and (not causal or j <= i) for j in keys] for i in queries]
                    visited = k_start in unmasked or k_start in masked
                    assert visited == any(map(any, seen)), (bm, bn, n_q, n_k, q_start, k_start)
                    if k_start in unmasked:
                        assert all(map(all, seen)), (bm, bn, n_q, n_k, q_start, k_start)


@pytest.mark.only_parts(3)
def test_the_orders_part3_ships_are_part3_bit_for_bit(part):
    """The launch-order study's patches whose order is the one part 3 ships for a causal flag
    (tools/variants/tile_major_last_first.diff causal, sequence_major.diff not) give part 3's O and
    L bit for bit there, ragged; the study marks exactly those as shipped."""
    from part3_inner_loop import launch_order

    module = parts.load(part)
    q, k, v, _ = make_inputs(Shape((2, 3), 100, 77, 32), torch.float32, DEVICE, seed=11)
    for causal in (False, True):
        order = launch_order.SHIPPED_ORDER[causal]
        variant = parts.load_variant(part, launch_order.ORDERS[order])
        got, want = variant.flash_forward(q, k, v, causal), module.flash_forward(q, k, v, causal)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{order}, causal={causal}"
    assert launch_order.SHIPPED_ORDER == {False: "sequence-major", True: "tile-major, last tile first"}


@pytest.mark.only_parts(3)
@pytest.mark.parametrize(
    "order",
    [
        "sequence-major",
        "sequence-major, last tile first",
        "tile-major, last tile first",
        "tile-major in groups of 4 sequences, last tile first",
    ],
)
def test_every_launch_order_is_correct(part, order):
    """Each order the launch-order study times computes the same attention (ragged N, N_q != N_k,
    causal; more query tiles than sequences and the reverse; a last group of fewer than 4)."""
    from part3_inner_loop import launch_order

    assert len(launch_order.ORDERS) == 4, "a new order: extend the parametrisation above"
    forward = parts.load_variant(part, launch_order.ORDERS[order]).flash_forward
    for causal in (False, True):
        for shape in (Shape((2, 3), 200, 136, 32), Shape((3, 5), 16, 40, 16)):
            q, k, v, do = make_inputs(shape, torch.float32, DEVICE, seed=7)
            o, lse = forward(q, k, v, causal)
            assert_report_ok(check_outputs({"O": o, "L": lse}, q, k, v, do, causal), f"{order} {shape}")


@pytest.mark.only_parts(3)
@pytest.mark.parametrize("product", ["P float32, TF32 product", "P float32, IEEE product"])
def test_p_kept_in_float32_still_computes_attention(part, product):
    """The P-cast study's patches: P kept in float32 (V widened), product TF32 or IEEE, are attention too;
    its first variant is part 3's kernel as it ships."""
    from part3_inner_loop import p_cast

    assert p_cast.P_PRODUCTS["P cast to the input dtype (part 3)"] is None
    forward = p_cast.variant_forward(p_cast.P_PRODUCTS[product])
    q, k, v, do = make_inputs(Shape((2, 3), 100, 77, 32), torch.float16, DEVICE, seed=13)
    for causal in (False, True):
        o, lse = forward(q, k, v, causal)
        assert_report_ok(check_outputs({"O": o, "L": lse}, q, k, v, do, causal), f"{product} causal={causal}")


STUDY_PATCHES = sorted((n, p.stem) for n in (3, 4) for p in (parts.folder(n) / "tools" / "variants").glob("*.diff"))


@pytest.mark.parametrize("n, name", STUDY_PATCHES, ids=[f"part{n}-{name}" for n, name in STUDY_PATCHES])
def test_every_study_patch_applies_and_runs(n, name):
    """Each study's patch on part 3's or part 4's kernel (tools/variants/*.diff) applies to the kernel
    as it is now, the patched file imports (under the interpreter here), and it computes a tiny
    case correctly: the forward, and from part 4 on the backward too."""
    from common import steps

    assert steps.variant(n, name) != parts.path(n).read_text(), "a patch that changes nothing"
    module = parts.load_variant(n, name)
    q, k, v, do = make_inputs(Shape((1, 2), 40, 33, 16), torch.float32, DEVICE, seed=3)
    for causal in (False, True):
        assert_report_ok(check_part(module, q, k, v, do, causal, grads=n >= 4), f"{name} causal={causal}")


def test_every_part_with_study_patches_has_some():
    """The studies that patch parts 3 and 4 keep their patches where common.steps.variant looks."""
    assert {n for n, _ in STUDY_PATCHES} == {3, 4} and (4, "atomic_dq") in STUDY_PATCHES
