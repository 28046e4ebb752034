"""Part 2's ideas, one test each: what grades its exercises (make exercise PART=2). In the suite they
test the shipped kernel; `make check PART=2 NAME=x` runs them on the learner's file instead. None
needs a GPU: the budget is arithmetic, the prune is asked with the compiler's answer stood in for
(on Hopper it is smem_bytes to within 1 KB), and the grid is read off the launch."""

import pytest
import torch

from common import launch, parts
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE

pytestmark = pytest.mark.only_parts(2)

KB = 1024
H200_SMEM, ADA_SMEM = 227 * KB, 99 * KB  # shared memory one program may use


def label(config):
    return f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']} w{config.num_warps} s{config.num_stages}"


def labels(configs):
    return "[" + ", ".join(map(label, configs)) + "]"


# ------------------------------------------------------------------------------ budget
# (BLOCK_M, BLOCK_N, D, bytes an element, stages): Q's tile once, `stages` tiles each of K and V.
TILES = [(128, 64, 64, 2, 2), (128, 128, 128, 2, 3), (32, 64, 64, 4, 2), (16, 32, 64, 2, 5)]


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: "{}x{}-d{}-{}B-s{}".format(*t))
def test_budget_counts_every_tile_in_shared_memory(part, tiles):
    """smem_bytes: what one program keeps in shared memory on Hopper, in bytes."""
    block_m, block_n, d, elem, stages = tiles
    need = block_m * d * elem + stages * 2 * block_n * d * elem
    got = parts.load(part).smem_bytes(block_m, block_n, d, elem, stages)
    assert got == need, (
        f"smem_bytes(BLOCK_M={block_m}, BLOCK_N={block_n}, D={d}, {elem} bytes an element, {stages} stages) "
        f"= {got} bytes; the tiles in shared memory take {need} ({need / KB:g} KB)"
    )


# (shared memory a program may use, D, BLOCK_M, BLOCK_N, warps, stages, the plan's verdict), bf16.
VERDICTS = [
    (H200_SMEM, 128, 128, 128, 8, 3, "todo"),  # 224 KB: the H200's D = 128 winner, just under 227
    (H200_SMEM, 128, 128, 128, 8, 4, "pruned: shared memory"),  # 288 KB
    (H200_SMEM, 64, 256, 128, 8, 2, "todo"),  # 96 KB
    (ADA_SMEM, 128, 128, 64, 4, 2, "todo"),  # 96 KB: the tile sized for Ada at D = 128
    (ADA_SMEM, 128, 128, 64, 4, 3, "pruned: shared memory"),  # 128 KB
    (ADA_SMEM, 64, 128, 128, 8, 3, "pruned: shared memory"),  # 112 KB
]


@pytest.mark.parametrize(
    "limit, d, block_m, block_n, warps, stages, verdict",
    VERDICTS,
    ids=[f"{v[0] // KB}KB-d{v[1]}-{v[2]}x{v[3]}-w{v[4]}-s{v[5]}" for v in VERDICTS],
)
def test_budget_prunes_a_configuration_that_cannot_fit(part, limit, d, block_m, block_n, warps, stages, verdict):
    """The sweep's plan builds nothing over the budget: a configuration whose tiles pass the GPU's
    shared memory per program is pruned, one just under it is compiled and measured."""
    from lab.sweep import plan
    from part2_tile_tuning.tools.sweep import Forward

    rows = {(r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"]): r for r in plan(Forward(), d, False, limit)}
    row = rows[(block_m, block_n, warps, stages)]
    assert row["status"] == verdict, (
        f"D={d} bf16, {block_m}x{block_n} w{warps} s{stages}, {limit // KB} KB a program: the plan says "
        f"{row['status']!r} from smem_bytes = {row['smem_est']} bytes; it should say {verdict!r}"
    )


# ------------------------------------------------------------------------------ prune
@pytest.fixture
def compiler_on_hopper(part, monkeypatch):
    """launch.fitting as a Hopper GPU of launch.smem_limit() bytes a program would answer: the
    compiler's figure is smem_bytes; those within the limit, or the smallest if none is."""
    fa = parts.load(part)

    def size(config, named_args, constexprs):
        block_m, block_n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
        return fa.smem_bytes(block_m, block_n, constexprs["D"], named_args["Q"].element_size(), config.num_stages)

    def fitting(kernel, configs, named_args, constexprs):
        sizes = {c: size(c, named_args, constexprs) for c in configs}
        return [c for c in configs if sizes[c] <= launch.smem_limit()] or [min(configs, key=sizes.get)]

    monkeypatch.setattr(launch, "fitting", fitting)
    return size


def every_config(fa):
    return fa.TUNED + list(fa.FLOAT32.values())


@pytest.mark.parametrize("d", [16, 64, 128])
def test_prune_gives_float32_its_own_tile_alone(part, d, compiler_on_hopper):
    """A float32 call (IEEE products, no tensor cores) gets the FLOAT32 tile of its head dim, alone:
    nothing to time, one compile."""
    fa = parts.load(part)
    tile = fa.FLOAT32[128 if d > 64 else 64]
    kept = fa.fits_in_smem(every_config(fa), {"Q": torch.empty(1, dtype=torch.float32)}, D=d)
    assert kept == [tile], f"float32 call, D={d}: the prune keeps {labels(kept)}; it should keep {label(tile)} alone"


# (shared memory a program may use, D, dtype): what a 16-bit call keeps of TUNED.
SIXTEEN_BIT = [
    (H200_SMEM, 128, torch.bfloat16),  # all three fit
    (ADA_SMEM, 128, torch.bfloat16),  # only 128x64 s2 (96 KB)
    (ADA_SMEM, 64, torch.float16),  # 128x128 s3 (112 KB) does not
    (64 * KB, 128, torch.bfloat16),  # none fits: the smallest, whose launch then says why
]


@pytest.mark.parametrize(
    "limit, d, dtype", SIXTEEN_BIT, ids=[f"{s[0] // KB}KB-d{s[1]}-{str(s[2])[6:]}" for s in SIXTEEN_BIT]
)
def test_prune_keeps_the_16_bit_tiles_that_fit(part, limit, d, dtype, compiler_on_hopper, monkeypatch):
    """A 16-bit call never gets a float32 tile, and of the others those whose binary fits this GPU's
    shared memory (the smallest if none does): the autotuner compiles and times nothing that cannot run."""
    fa = parts.load(part)
    monkeypatch.setattr(launch, "smem_limit", lambda: limit)
    named_args = {"Q": torch.empty(1, dtype=dtype)}
    need = {label(c): compiler_on_hopper(c, named_args, {"D": d}) for c in every_config(fa)}
    tuned, float32 = [label(c) for c in fa.TUNED], [label(c) for c in fa.FLOAT32.values()]
    fits = [c for c in tuned if need[c] <= limit] or [min(tuned, key=need.get)]
    kept = [label(c) for c in fa.fits_in_smem(every_config(fa), named_args, D=d)]
    wrong = [f"keeps the float32 tile {c}" for c in kept if c in float32]
    wrong += [f"keeps {c}, which needs {need[c] / KB:g} KB" for c in kept if c not in fits and c not in float32]
    for c in (c for c in fits if c not in kept):
        fit = need[c] <= limit
        wrong.append(
            f"drops {c}, " + (f"which fits in {need[c] / KB:g} KB" if fit else "the smallest, kept when none fits")
        )
    assert kept == fits, (
        f"{str(dtype)[6:]} call, D={d}, {limit // KB} KB a program: the prune keeps [{', '.join(kept)}]"
        + "".join(f"; it {w}" for w in wrong)
        + f"; it should keep [{', '.join(fits)}]"
    )


# ------------------------------------------------------------------------------ grid
GRID_SHAPE = Shape((2, 3), 100, 100, 32)


def test_grid_follows_the_tile_the_autotuner_picks(part, monkeypatch):
    """The autotuner chooses BLOCK_M after flash_forward has built the launch: one program per
    (query tile, sequence) needs a grid that Triton evaluates with the configuration it picked."""
    fa = parts.load(part)
    grids, run = [], launch.run
    monkeypatch.setattr(launch, "run", lambda kernel, grid, *a, **kw: grids.append(grid) or run(kernel, grid, *a, **kw))
    q, k, v, _ = make_inputs(GRID_SHAPE, torch.float32, DEVICE)
    fa.flash_forward(q, k, v, False)
    assert len(grids) == 1, f"flash_forward made {len(grids)} launches through launch.run, not one"
    sequences = 6
    for config in [*fa.CONFIGS, *fa.TUNED, *fa.FLOAT32.values(), fa.INTERPRETED]:
        meta = dict(config.all_kwargs(), D=GRID_SHAPE.d, IS_CAUSAL=False, DOT_PRECISION="ieee")
        got = grids[0](meta) if callable(grids[0]) else grids[0]
        tiles = -(-GRID_SHAPE.n_q // config.kwargs["BLOCK_M"])
        assert tuple(got) == (tiles, sequences), (
            f"{GRID_SHAPE}: with {label(config)} the grid is {tuple(got)}; {GRID_SHAPE.n_q} queries in "
            f"{sequences} sequences, {config.kwargs['BLOCK_M']} a tile, need ({tiles}, {sequences})"
        )
