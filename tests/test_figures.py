"""The parts' figures (part<N>/figures.py): each draws, and the arithmetic each is drawn from is right:
part 0's online softmax reproduces torch.softmax and part 0's own forward, part 1's grid and key walk
and part 4's loop bounds match brute force, part 5's ring model keeps its invariants and its step
follows the kernel's source."""

import importlib
import random

import pytest
import torch

from common import parts


def test_every_part_keeps_one_shape():
    """Each part folder: the kernel, README, walkthrough and figures at the top, what measures under
    tools/, a ladder under steps/, exercises under exercises/; no other module at the top."""
    allowed = {"__init__.py", "flash_attention.py", "walkthrough.py", "figures.py"}
    allowed |= {"gluon_attention.py", "gluon_backward.py", "hopper.py", "fast_launch.py"}  # part 5's kernels
    for n in parts.available():
        extra = {p.name for p in parts.folder(n).glob("*.py")} - allowed
        assert not extra, f"part {n}: {sorted(extra)} at the top: a study goes under tools/"


@pytest.mark.only_parts(0, 1, 3, 4, 5)
def test_figures_draw(part, tmp_path):
    """draw(folder) writes its PNGs there and returns their paths, the same bytes every time (the
    pictures are deterministic); the committed copies exist."""
    figures = importlib.import_module(f"{parts.folder(part).name}.figures")
    home = parts.folder(part)
    (tmp_path / "first").mkdir(), (tmp_path / "second").mkdir()
    paths = figures.draw(tmp_path / "first")
    assert paths and all(p.parent == tmp_path / "first" for p in paths)
    again = figures.draw(tmp_path / "second")
    for path, other in zip(paths, again):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000, path.name
        assert path.read_bytes() == other.read_bytes(), path.name
        assert (home / path.name).exists(), f"run python -m {figures.__name__}"


@pytest.mark.only_parts(0)
def test_online_softmax_is_softmax(part):
    """The figure's numbers: O_i / l_i is softmax(s) . v, m_i + log l_i is logsumexp(s), the weights it
    plots are torch.softmax's; after every tile, the state is part 0's flash_forward over the keys so
    far (L = m + log l, O = O_i / l_i). The example shows a max that rises and one that stays."""
    from part0_pytorch_reference import figures
    from part0_pytorch_reference.flash_attention import flash_forward

    cases = [(*figures.example(), figures.TILE)]
    g = torch.Generator().manual_seed(1)
    cases += [(3 * torch.randn(30, generator=g, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64), 7)]
    for scores, values, tile in cases:
        steps = figures.online_softmax(scores, values, tile)
        last = steps[-1]
        torch.testing.assert_close(last["o"] / last["l"], torch.softmax(scores, 0) @ values, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(last["m"] + torch.log(last["l"]), torch.logsumexp(scores, 0))
        torch.testing.assert_close(figures.probabilities(steps), torch.softmax(scores, 0))

        # part 0's own loop on the keys seen so far: S = Q K^T / sqrt(d) = scores with K = I, Q = scores * sqrt(d)
        n, d = len(scores), len(scores)
        q, k = (scores * d**0.5)[None, :], torch.eye(n, dtype=torch.float64)
        v = torch.zeros(n, d, dtype=torch.float64)
        v[:, : values.reshape(n, -1).shape[1]] = values.reshape(n, -1)
        for st in steps:
            seen = st["start"] + tile
            o, lse = flash_forward(q, k[:seen], v[:seen], False)
            torch.testing.assert_close(lse[0].double(), st["m"] + torch.log(st["l"]), rtol=1e-5, atol=1e-5)
            o_i = (st["o"] / st["l"]).reshape(-1)
            torch.testing.assert_close(o[0, : len(o_i)].double(), o_i, rtol=1e-5, atol=1e-5)

    steps = figures.online_softmax(*figures.example())
    rises = [bool(st["m"] > st["m_old"]) for st in steps[1:]]
    assert any(rises) and not all(rises), "the example should show the max rising and staying"


@pytest.mark.only_parts(1)
def test_launch_grid_and_key_walk(part):
    """part 1's grid gives every query row of every sequence to exactly one program, and a program's
    walk loads every key exactly once, in order; the rows past N are the last tile's, as many as the
    tiles overrun N. The figure uses the kernel's BLOCK_M and BLOCK_N."""
    from part1_triton_baseline import figures
    from part1_triton_baseline import flash_attention as part1

    assert (figures.BLOCK_M, figures.BLOCK_N) == (part1.BLOCK_M, part1.BLOCK_N)
    for block in (16, 32, 64):
        for n in (1, 15, 16, 17, 40, 100):
            tiles, seqs = figures.launch_grid(n, 3, block)
            owner = {}
            for t in range(tiles):
                q_start, end, padded = figures.query_rows(t, n, block)
                assert q_start + block == end + padded
                for b in range(seqs):
                    for i in range(q_start, end):
                        assert (i, b) not in owner
                        owner[(i, b)] = (t, b)
            assert set(owner) == {(i, b) for i in range(n) for b in range(3)}

            walk = figures.key_walk(n, block)
            keys = [j for k_start, end, _ in walk for j in range(k_start, end)]
            assert keys == list(range(n))
            assert [pad for _, _, pad in walk[:-1]] == [0] * (len(walk) - 1)
            assert walk[-1][2] == len(walk) * block - n


@pytest.mark.only_parts(4)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_loop_bounds_match_brute_force(part, causal):
    """figures.dkdv_query_tiles and dq_key_tiles (the kernels' loop bounds, drawn in backward_loops.png)
    against the definition. dK/dV: a query tile is visited iff one of its rows (rows past N_q too:
    they are computed, with zero dO) sees one of the key tile's keys; it is left unmasked only if
    every row sees every key below N_k (keys past N_k need no mask there: their rows are dropped).
    dQ, as the forward: visited iff some row sees some key below N_k, unmasked only if every row sees
    every key of the tile and the tile is whole. No tile is visited twice; walks go in order."""
    from part4_backward import figures

    for bm, bn in ((32, 128), (128, 64), (64, 64), (16, 32), (32, 16)):
        for n_q, n_k in ((256, 256), (320, 320), (300, 451), (517, 260), (1, 1), (64, 1), (40, 64)):
            for k_start in range(0, n_k, bn):
                masked, unmasked = figures.dkdv_query_tiles(k_start, bm, bn, n_q, causal)
                assert masked + unmasked == sorted(set(masked + unmasked)), (bm, bn, n_q, n_k, k_start)
                keys = range(k_start, min(k_start + bn, n_k))
                for q_start in range(0, n_q, bm):
                    seen = [[not causal or j <= i for j in keys] for i in range(q_start, q_start + bm)]
                    assert (q_start in masked + unmasked) == any(map(any, seen)), (bm, bn, n_q, n_k, k_start, q_start)
                    if q_start in unmasked:
                        assert all(map(all, seen)), (bm, bn, n_q, n_k, k_start, q_start)
            for q_start in range(0, n_q, bm):
                unmasked, masked = figures.dq_key_tiles(q_start, bm, bn, n_k, causal)
                assert unmasked + masked == sorted(set(unmasked + masked)), (bm, bn, n_q, n_k, q_start)
                for k_start in range(0, n_k, bn):
                    keys = range(k_start, k_start + bn)
                    seen = [[j < n_k and (not causal or j <= i) for j in keys] for i in range(q_start, q_start + bm)]
                    assert (k_start in unmasked + masked) == any(map(any, seen)), (bm, bn, n_q, n_k, q_start, k_start)
                    if k_start in unmasked:
                        assert all(map(all, seen)), (bm, bn, n_q, n_k, q_start, k_start)


@pytest.mark.only_parts(5)
def test_ring_model_never_deadlocks_or_overwrites(part):
    """ring.run under many interleavings (the loader first, and random choices among whoever can go):
    every run finishes, the loader never copies into a slot some warpgroup has not released, no
    warpgroup reads a slot holding another tile, and every warpgroup reads every tile, in order."""
    from part5_profiling.tools import ring

    rng = random.Random(0)
    for stages in (1, 2, 3, 4):
        for consumers in (1, 2, 3):
            for n_tiles in (0, 1, 2, 5, 6, 9):
                for pick in [None] + [rng.choice] * 20:
                    events, errors = ring.run(n_tiles, stages, consumers, pick=pick)
                    assert errors == [], (stages, consumers, n_tiles, errors)
                    done = [e for e in events if not e["blocked"]]
                    assert [e["tile"] for e in done if e["who"] == "loader"] == list(range(n_tiles))
                    for w in range(consumers):
                        reads = [e["tile"] for e in done if e["who"] == f"warpgroup {w}"]
                        assert reads == list(range(n_tiles)), (stages, consumers, n_tiles, w)


@pytest.mark.only_parts(5)
def test_ring_model_catches_a_broken_rule(part):
    """The checks can fail: a loader that waits on free with parity `phase` (not phase ^ 1) deadlocks
    at its first wait, on a fresh barrier; a free barrier that completes on one arrival when two
    warpgroups read the slot lets the loader overwrite a tile one of them has not read."""
    from part5_profiling.tools import ring

    def wrong_parity(n_tiles, stages):
        for it in range(n_tiles):
            yield it, it % stages, "free", (it // stages) & 1

    _, errors = ring.run(6, 2, 2, load=wrong_parity)
    assert len(errors) == 1 and errors[0].startswith("deadlock")

    rng = random.Random(1)
    found = set()
    for _ in range(50):
        _, errors = ring.run(6, 2, 2, pick=rng.choice, free_count=1)
        found |= {e.split(":")[0] for e in errors}
    assert "overwrite" in found


@pytest.mark.only_parts(5)
def test_ring_model_rule_is_the_kernels(part):
    """The rule ring.py models is the one the kernels' rings use (hopper.Ring and Counter): the slot and
    phase bit of a key tile, the parities the loader and the warpgroups wait with, and the barriers'
    arrival counts (the forward's K and V rings freed by every warpgroup)."""
    from part5_profiling import gluon_attention, hopper

    source = " ".join(open(hopper.__file__).read().split())
    for line in (
        "return self.count % self.STAGES",
        "return (self.count // self.STAGES) & 1",
        "mbarrier.wait(self.free.index(c.index()), c.phase() ^ 1)",
        "mbarrier.wait(self.ready.index(c.index()), c.phase())",
        "mbarrier.arrive(self.free.index(c.index()), count=1)",
        "mbarrier.init(ready.index(i), count=producers)",
        "mbarrier.init(free.index(i), count=consumers)",
    ):
        assert line in source, f"hopper.py no longer has `{line}`: update ring.py and this test"
    forward = " ".join(open(gluon_attention.__file__).read().split())
    assert "Ring.alloc(K.dtype.element_ty, [BLOCK_N, D], swizzled(2), STAGES, WARPGROUPS)" in forward


@pytest.mark.only_parts(5)
def test_step_figure_follows_the_kernel(part, tmp_path):
    """step_order reads _softmax_step's statements in order (S_j issued, then P V, wait for S_j only,
    softmax, wait for P V, rescale); a statement it does not know is an error, not a stale picture.
    In the timeline drawn from it the softmax of S_j overlaps P_{j-1} V_{j-1} on the tensor cores and
    starts after S_j is done; in part 4's serial chain nothing overlaps, and it takes longer."""
    from part5_profiling import figures, gluon_attention

    order = figures.step_order()
    kinds = [kind for kind, _, _, _ in order]
    expected = "wait mma wait mma mma_wait arrive softmax mma_wait arrive rescale convert"
    assert kinds == expected.split()
    assert [n for kind, _, _, n in order if kind == "mma_wait"] == [1, 0]

    source = open(gluon_attention.__file__).read()
    changed = tmp_path / "gluon_attention.py"
    wait = "    s, acc = warpgroup_mma_wait(1"
    assert wait in source
    changed.write_text(source.replace(wait, "    s = s * 2\n" + wait))
    with pytest.raises(ValueError, match="does not know"):
        figures.step_order(changed)

    steps = 3
    bars, _ = figures.gluon_timeline(order, steps)
    span = {name: (start, end) for _, start, end, name in bars if name}
    for j in range(1, steps + 1):
        soft, pv, s = span[f"softmax(S_{j})"], span[f"P_{j - 1} V_{j - 1}"], span[f"S_{j}"]
        assert soft[0] >= s[1] and min(soft[1], pv[1]) > max(soft[0], pv[0]), j
    serial = figures.serial_timeline(steps)
    for lane, start, end, _ in serial:
        for other_lane, other_start, other_end, _ in serial:
            if lane != other_lane:
                assert min(end, other_end) <= max(start, other_start)
    assert max(end for _, _, end, _ in bars) < max(end for _, _, end, _ in serial)


@pytest.mark.only_parts(5)
def test_ring_occupancy_one_tile_per_slot(part):
    """The ring picture's bars: a slot holds one tile at a time, tile j in slot j % STAGES."""
    from part5_profiling import figures
    from part5_profiling.tools import ring

    events, _ = ring.run(figures.N_TILES, figures.STAGES, figures.WARPGROUPS)
    spans = figures.ring_occupancy(events)
    assert sorted(tile for _, _, _, tile in spans) == list(range(figures.N_TILES))
    for slot in range(figures.STAGES):
        mine = sorted((first, last, tile) for s, first, last, tile in spans if s == slot)
        assert all(tile % figures.STAGES == slot for _, _, tile in mine)
        assert all(a[1] < b[0] for a, b in zip(mine, mine[1:]))
