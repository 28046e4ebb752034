"""Part 3's ablation steps (part3_inner_loop/steps/*.diff): applied in order to part 2's kernel they
give part 3's kernel exactly, and every intermediate kernel is itself correct."""

import pytest
import torch

from common import parts
from common.check import check_part
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE, assert_report_ok


@pytest.mark.only_parts(3)
def test_steps_rebuild_part3(part):
    from part3_inner_loop.tools import ablation

    sources = ablation.step_sources()
    assert len(sources) == len(ablation.LABELS)
    assert sources[0] == parts.path(2).read_text()
    assert sources[-1] == parts.path(3).read_text(), "regenerate steps/ after editing part 3's kernel"
    assert len(set(sources)) == len(sources), "every step changes something"


@pytest.mark.only_parts(3)
@pytest.mark.parametrize("step", range(1, 5))
def test_every_step_is_correct(part, step):
    from part3_inner_loop.tools import ablation

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
    from part3_inner_loop.figures import key_tiles

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


STUDY_PATCHES = sorted((4, p.stem) for p in (parts.folder(4) / "tools" / "variants").glob("*.diff"))


@pytest.mark.parametrize("n, name", STUDY_PATCHES, ids=[f"part{n}-{name}" for n, name in STUDY_PATCHES])
def test_every_study_patch_applies_and_runs(n, name):
    """Each study's patch on part 4's kernel (tools/variants/*.diff) applies to the kernel as it is
    now, the patched file imports (under the interpreter here), and it computes a tiny case
    correctly, forward and backward."""
    from common import steps

    assert steps.variant(n, name) != parts.path(n).read_text(), "a patch that changes nothing"
    module = steps.load_variant(n, name)
    q, k, v, do = make_inputs(Shape((1, 2), 40, 33, 16), torch.float32, DEVICE, seed=3)
    for causal in (False, True):
        assert_report_ok(check_part(module, q, k, v, do, causal), f"{name} causal={causal}")


def test_every_part_with_study_patches_has_some():
    """The study that patches part 4 keeps its patch where common.steps.variant looks."""
    assert (4, "atomic_dq") in STUDY_PATCHES
