"""Part 5's ladder (part5_profiling/steps/): the forward's and the backward's steps rebuild the
shipped Gluon kernels exactly, each step is one idea of a readable size, every step compiles for
Hopper on any machine and its binary holds what the step adds; on a Hopper GPU every step passes
the correctness cases, each in a process of its own under a timeout."""

import json
import os
import re
import subprocess
import sys

import pytest

from common import ROOT, parts, steps
from tests.helpers import needs_hopper

pytestmark = pytest.mark.only_parts(5)

# a step's diff (removed and added lines) past the first, a whole new file; bwd7 (174) gives three
# kernels their tensors' strides, a parameter a line
MAX_CHANGED_LINES = 180


@pytest.mark.parametrize("ladder, target", [("fwd", "gluon_attention.py"), ("bwd", "gluon_backward.py")])
def test_ladder_rebuilds_the_shipped_kernel(part, ladder, target):
    texts = steps.sources(part, ladder)
    assert texts[-1] == (parts.folder(part) / target).read_text(), "python -m common.steps --part 5 --refresh " + ladder
    assert texts[0] == "" and texts[1].startswith('"""'), "the first step is a whole file"
    assert len(set(texts)) == len(texts), "every step changes something"
    for step, before, after in zip(steps.steps_of(part, ladder)[1:], texts[1:], texts[2:]):
        changed = sum(1 for line in step.path.read_text().splitlines() if line[:1] in "+-" and line[:3] not in "+++---")
        assert 0 < changed <= MAX_CHANGED_LINES, f"{step.name}: {changed} changed lines"
        assert f"- {step.name}: " in after and f"- {step.name}: " not in before, (
            f"{step.name}: its line in the docstring"
        )


def test_make_diff_shows_each_step_and_lists_them(part):
    out = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5"], cwd=ROOT, capture_output=True, text=True)
    assert "builds gluon_attention.py in 10 steps" in out.stdout and "builds gluon_backward.py in 9 steps" in out.stdout
    first = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5", "--step", "fwd1"], cwd=ROOT, **TEXT)
    assert first.stdout.startswith("--- /dev/null") and "+def programs(" in first.stdout
    step = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5", "--step", "fwd7"], cwd=ROOT, **TEXT)
    ladder, at = steps.find(part, "fwd7")
    assert step.stdout == ladder[at].path.read_text() and "+    def _my_turn(" in step.stdout
    wrong = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5", "--step", "fwd11"], cwd=ROOT, **TEXT)
    assert wrong.returncode == 2 and "its steps: fwd1" in wrong.stdout


TEXT = dict(capture_output=True, text=True)


@pytest.fixture(scope="module")
def compiled():
    """{(step, D): what its binary holds} for every step at D = 64 without a mask and D = 128 causal,
    compiled for sm_90 in a fresh process with Triton's compiler on (tools/ladder.py --compile)."""
    pytest.importorskip("triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="0")
    cmd = [sys.executable, "-m", "part5_profiling.tools.ladder", "--compile"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["step"], r["D"]): r for r in rows}


def test_every_step_compiles_and_holds_its_idea(part, compiled):
    c = compiled
    assert len(c) == 2 * 19
    for (name, _), r in c.items():
        assert r["wgmma"] > 0 and r["smem"] <= 227 * 1024, r
        assert r["partitions"] == (name != "fwd1"), r  # a loader warp from fwd2 on
    for d in (64, 128):
        # fwd1: one warpgroup, every product waited for; fwd2: the loader's partition and its ring
        assert c["fwd1", d]["warps"] == 4 and list(c["fwd1", d]["wgmma_waits"]) == ["0"]
        assert c["fwd2", d]["warps"] == 8 and c["fwd2", d]["barrier_waits"] > c["fwd1", d]["barrier_waits"]
        # fwd3: S_j waited for while P_{j-1} V_{j-1} is still in flight
        assert "1" in c["fwd3", d]["wgmma_waits"] and "1" not in c["fwd2", d]["wgmma_waits"]
        # fwd4: two softmax warpgroups at D = 128, three at D = 64, and the loader
        assert c["fwd4", d]["warps"] == 4 * (1 + {128: 2, 64: 3}[d])
        # fwd5: the loader waits for Q's buffer to be free before the next query tile
        assert c["fwd5", d]["barrier_waits"] > c["fwd4", d]["barrier_waits"]
        # fwd6 and bwd6: GROUP, the order's sequences side by side, one more argument
        assert c["fwd6", d]["params"] == c["fwd5", d]["params"] + 1
        assert c["bwd6", d]["params"] == c["bwd5", d]["params"] + 1
        # fwd8: grouped heads, one more argument (Q_PER_KV), the same products
        assert c["fwd8", d]["params"] == c["fwd7", d]["params"] + 1 and c["fwd8", d]["wgmma"] == c["fwd7", d]["wgmma"]
        # fwd9 and bwd7: heads read where they lie, every tile through a 4-D descriptor, the same products
        for new, old in (("fwd9", "fwd8"), ("bwd7", "bwd6")):
            assert c[new, d]["tma_loads"]["3"] == 0 and c[new, d]["tma_loads"]["4"] == c[old, d]["tma_loads"]["3"]
            assert c[new, d]["wgmma"] == c[old, d]["wgmma"] and c[new, d]["params"] > c[old, d]["params"]
        # bwd8: grouped heads read in place, one more argument (Q_PER_KV), the same products
        assert c["bwd8", d]["params"] == c["bwd7", d]["params"] + 1 and c["bwd8", d]["wgmma"] == c["bwd7", d]["wgmma"]
        # bwd9: the group's sum is a launch of its own after the kernel, whose binary is bwd8's
        assert c["bwd9", d] | {"step": "bwd8"} == c["bwd8", d]
        # fwd10: the configuration a short or causal call takes (compiled here: CONFIGS[d]'s, as fwd9's)
        assert c["fwd10", d] | {"step": "fwd9"} == c["fwd9", d]
        # bwd1: dQ added by TMA, the statistics loaded from global memory; bwd2: they come by TMA
        assert c["bwd1", d]["tma_adds"]["3"] > 0 and c["bwd1", d]["global_loads"] > 0
        assert c["bwd2", d]["global_loads"] == 0 and c["bwd2", d]["tma_loads"]["1"] > 0
        # bwd3: the adds copy 16 x 256 blocks in fragment order, not rows of a 3-D tensor
        assert c["bwd3", d]["tma_adds"]["3"] == 0 and c["bwd3", d]["tma_adds"]["2"] == c["bwd2", d]["tma_adds"]["3"]
    # fwd7: at D = 64 each of three warpgroups waits for its turn at four places more, same products
    assert c["fwd7", 64]["barrier_waits"] == c["fwd6", 64]["barrier_waits"] + 4 * 3
    assert c["fwd7", 64]["wgmma"] == c["fwd6", 64]["wgmma"] and c["fwd7", 128] | {"step": "fwd6"} == c["fwd6", 128]
    # bwd4: the operand addresses worked out in the loop spill less at D = 128
    assert c["bwd4", 128]["stack"] < c["bwd3", 128]["stack"]
    # bwd5: at D = 64 the warpgroup whose turn it is multiplies both halves of dS; D = 128 unchanged
    assert c["bwd5", 64]["wgmma"] > c["bwd4", 64]["wgmma"] and c["bwd5", 128] | {"step": "bwd4"} == c["bwd4", 128]


def test_persistent_step_launches_one_program_per_sm(part, monkeypatch):
    """fwd4 launches a program per query tile, fwd5 (persistent) no more than the GPU has SMs."""
    from part5_profiling.tools import ladder

    sms = 132
    for name, expected in (("fwd4", 32 * 16384 // 128), ("fwd5", sms)):
        module = ladder.load(name)
        if hasattr(module, "properties"):
            monkeypatch.setattr(module, "properties", lambda device: type("P", (), {"multi_processor_count": sms}))
        assert module.programs(16384, 32, 128, "cuda") == expected, name


@needs_hopper
@pytest.mark.gpu
def test_every_step_is_correct_on_hopper(part):
    """Every step against the float64 reference on the ladder's cases (tools/ladder.py CASES: ragged,
    N_q != N_k, one query or key, persistent rounds, full size, large scores; bf16 and fp16, causal
    and not), each step in a process of its own under a timeout: a phase error hangs, not fails."""
    from part5_profiling.tools import ladder

    names = [s.name for _, s in ladder.every_step()]
    checks = ladder.check_all(names)
    failed = {n: c for n, c in checks.items() if not c.startswith("ok")}
    assert not failed, failed


def test_each_step_has_its_lesson_in_the_readme(part):
    """Every step of both ladders has, in part 5's README, a heading of its own, its `make diff`
    line, its generated measurement with its counter (the tensor pipe, the top stall) under that
    heading, and its row in the progression table with its counter."""
    text = (parts.folder(part) / "README.md").read_text()
    headings = list(re.finditer(r"^#### (\w+): .+$", text, re.M))
    for ladder in ("fwd", "bwd"):
        for step in steps.steps_of(part, ladder):
            at = [i for i, h in enumerate(headings) if h[1] == step.name]
            assert len(at) == 1, f"{step.name}: no heading of its own"
            end = (
                headings[at[0] + 1].start() if at[0] + 1 < len(headings) else text.index("\n## ", headings[at[0]].end())
            )
            section = text[headings[at[0]].end() : end]
            assert f"`make diff PART=5 STEP={step.name}`" in section, step.name
            measured = re.search(rf"<!-- results:part5-step-{step.name} -->\n(.*)\n<!-- /results", section)
            assert measured and "tensor pipe" in measured[1] and "top stall" in measured[1], step.name
            row = re.search(rf"^\| `{step.name}` \| .*$", text, re.M)
            assert row and row[0].count("%") == 2, f"{step.name}: its row in the progression table, with its counter"
