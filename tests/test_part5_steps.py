"""Part 5's ladders (part5_profiling/steps/): the forward's and the backward's steps, then the model
ladder's, rebuild the shipped files exactly; each lesson step is one idea of a readable size; every
step compiles for Hopper on any machine and its binary holds what the step adds; on a Hopper GPU
every step passes the correctness cases, each in a process of its own under a timeout."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from common import ROOT, parts, steps
from tests.helpers import needs_hopper

pytestmark = pytest.mark.only_parts(5)

# What a reader takes in at once: a forward step's patch (removed and added lines), a backward step's
# (its products, barriers and buffers change together), a ladder's first step (a whole file).
MAX_CHANGED_LINES = {"fwd": 150, "bwd": 250}
MAX_FIRST_LINES = 250
TEXT = dict(capture_output=True, text=True)


def changed(path):
    return sum(1 for line in path.read_text().splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))


@pytest.mark.parametrize("ladder", ["fwd", "bwd"])
def test_lesson_steps_are_one_idea_each(part, ladder):
    texts = steps.sources(part, ladder)
    assert texts[0] == "" and texts[1].startswith('"""'), "the first step is a whole file"
    assert len(set(texts)) == len(texts), "every step changes something"
    first, *rest = steps.steps_of(part, ladder)
    assert len(texts[1].splitlines()) <= MAX_FIRST_LINES, f"{first.name}: {len(texts[1].splitlines())} lines"
    for step, before, after in zip(rest, texts[1:], texts[2:]):
        assert 0 < changed(step.path) <= MAX_CHANGED_LINES[ladder], f"{step.name}: {changed(step.path)} changed lines"
        assert f"- {step.name}: " in after and f"- {step.name}: " not in before, f"{step.name}: its docstring line"


def test_the_ladders_rebuild_the_shipped_files(part):
    """The lesson's files, taken by the model ladder's steps, are the shipped files byte for byte; each
    model step adds its line to the docstring of a file it patches; its headers name the files."""
    texts = steps.states(part)
    for name, path in steps.shipped(part, steps.MODEL).items():
        assert texts[-1][name] == path.read_text(), "python -m common.steps --part 5 --refresh"
    assert texts[0]["flash_attention.py"] == parts.path(part - 1).read_text()
    for step, before, after in zip(steps.steps_of(part, steps.MODEL), texts, texts[1:]):
        touched = steps.split_patch(step.path.read_text())
        assert touched and all(before[f] != after[f] for f in touched), step.name
        assert any(f"- {step.name}: " in after[f] and f"- {step.name}: " not in before[f] for f in touched), step.name


def test_make_diff_shows_the_routing_and_lists_the_ladders(part):
    out = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5"], cwd=ROOT, **TEXT)
    assert "builds gluon_attention.py in 9 steps" in out.stdout and "builds gluon_backward.py in 8 steps" in out.stdout
    assert "then takes what a model needs in 7 steps" in out.stdout
    body = out.stdout.split("\nPart 5 also adds")[0]
    assert body.startswith("--- part4_backward/flash_attention.py\n+++ part5_profiling/flash_attention.py")
    lines = [x for x in body.splitlines() if x[:1] in "+-" and x[:3] not in ("+++", "---")]
    assert 0 < len(lines) <= 100 and any(x.startswith("+    if GLUON and gluon_attention.supported(Q):") for x in lines)
    first = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5", "--step", "fwd1"], cwd=ROOT, **TEXT)
    assert first.stdout.startswith("--- /dev/null") and "+def programs(" in first.stdout
    step = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5", "--step", "fwd7"], cwd=ROOT, **TEXT)
    ladder, at = steps.find(part, "fwd7")
    assert step.stdout == ladder[at].path.read_text() and "+class Turns:" in step.stdout
    assert step.stdout.startswith("--- part5_profiling/gluon_attention.py (step fwd6: l2 order)")
    wrong = subprocess.run([sys.executable, "-m", "common.diff", "--part", "5", "--step", "fwd11"], cwd=ROOT, **TEXT)
    assert wrong.returncode == 2 and "its steps: fwd1" in wrong.stdout


def test_no_positional_state_in_the_gluon_files(part):
    """Kernel state lives in @aggregate classes: no tuple of buffers or barriers indexed by position,
    no barrier parity worked out by hand outside the Ring's and the Turns' methods."""
    for name in ("gluon_attention.py", "gluon_backward.py", "hopper.py"):
        text = (parts.folder(part) / name).read_text()
        assert not re.search(r"\b(loads|buffers|sizes|exchange|work)\[\d\]", text), name
        assert "// STAGES) & 1" not in text and "(it // " not in text, name
        assert "// 8 * 8" not in text, f"{name}: divisibility is said with multiple_of"


@pytest.fixture(scope="module")
def compiled():
    """{(step, kernel, D): what its binary holds} for every step's Gluon kernels (a model step's: those
    it patches) at D = 64 without a mask and D = 128 causal, compiled for sm_90 in a fresh process
    with Triton's compiler on (tools/ladder.py --compile)."""
    pytest.importorskip("triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="0")
    cmd = [sys.executable, "-m", "part5_profiling.tools.ladder", "--compile"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["step"], r["kernel"], r["D"]): r for r in rows}


def same(a, b, skip=("step",)):
    """Two compiled kernels alike in everything counted and in their PTX instructions (their step's
    name apart): the same code."""
    return {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def alike(a, b):
    """Two compiled kernels alike in everything counted (products, waits, copies, registers, ...),
    whatever their instructions."""
    return same(a, b, skip=("step", "ptx"))


@pytest.mark.timeout(900)  # its fixture compiles every step's kernels: minutes where other tests share the CPUs
def test_every_step_compiles_and_holds_its_idea(part, compiled):
    c = {(step, d): r for (step, kind, d), r in compiled.items() if step[:3] == kind}  # the lesson's
    m = {key: r for key, r in compiled.items() if key[0].startswith("model")}
    assert len(c) == 2 * (9 + 8) and {k[0] for k in m} == {"model2", "model3", "model4", "model5", "model6"}
    for r in compiled.values():
        assert r["wgmma"] > 0 and r["smem"] <= 227 * 1024, r
        assert r["partitions"] == (r["step"] not in ("fwd1", "bwd1")), r  # a loader warp from step 2 on
    for d in (64, 128):
        # fwd1, bwd1: one warpgroup, every product waited for; step 2: the loader's partition and rings
        for first in ("fwd1", "bwd1"):
            assert c[first, d]["warps"] == 4 and list(c[first, d]["wgmma_waits"]) == ["0"], first
        assert c["fwd2", d]["warps"] == 8 and c["fwd2", d]["barrier_waits"] > c["fwd1", d]["barrier_waits"]
        assert c["bwd2", d]["warps"] == 8 and list(c["bwd2", d]["wgmma_waits"]) == ["0"]
        # bwd1 reads the row statistics from global memory; from bwd2 they come by TMA with the tiles
        assert c["bwd1", d]["global_loads"] > 0 and c["bwd2", d]["global_loads"] == 0
        assert c["bwd2", d]["tma_loads"]["1"] > 0
        # step 3: a product waited for while another is still in flight
        for name in ("fwd3", "bwd3"):
            assert set(c[name, d]["wgmma_waits"]) - {"0"}, name
        # step 4: two softmax warpgroups at D = 128, three at D = 64, and the loader; the backward's two
        assert c["fwd4", d]["warps"] == 4 * (1 + {128: 2, 64: 3}[d]) and c["bwd4", d]["warps"] == 12
        # bwd4: dQ added by TMA, 64 x 64 blocks of a 3-D tensor; bwd5: 16 x 256 blocks in fragment order
        assert c["bwd3", d]["tma_adds"]["3"] == 0 and c["bwd4", d]["tma_adds"]["3"] > 0
        assert c["bwd5", d]["tma_adds"]["3"] == 0 and c["bwd5", d]["tma_adds"]["2"] == c["bwd4", d]["tma_adds"]["3"]
        # fwd6 and bwd8: GROUP, the order's sequences side by side, one more argument
        assert c["fwd6", d]["params"] == c["fwd5", d]["params"] + 1
        assert c["bwd8", d]["params"] == c["bwd7", d]["params"] + 1
        # model3: grouped heads, one more argument to each kernel (Q_PER_KV), the same products
        for kind, before in (("fwd", c["fwd9", d]), ("bwd", m["model2", "bwd", d])):
            assert m["model3", kind, d]["params"] == before["params"] + 1
            assert m["model3", kind, d]["wgmma"] == before["wgmma"]
        # model4: heads where they lie, every 3-D tile copy now 4-D, the same products
        for kind in ("fwd", "bwd"):
            new, old = m["model4", kind, d], m["model3", kind, d]
            assert new["tma_loads"]["3"] == 0 and new["tma_loads"]["4"] == old["tma_loads"]["3"]
            assert new["wgmma"] == old["wgmma"] and new["params"] > old["params"]
        # model2 (the host path) and model6 (the group's sum, a launch of its own) leave the kernel as it was
        assert same(m["model2", "bwd", d], c["bwd8", d]) and same(m["model6", "bwd", d], m["model4", "bwd", d])
        # model5: the configuration of short and causal calls; compiled here with CONFIGS[d]'s, as model4's
        assert same(m["model5", "fwd", d], m["model4", "fwd", d])
    # fwd7: at D = 64 each of three warpgroups waits for its turn at four places more, the same products
    assert c["fwd7", 64]["barrier_waits"] == c["fwd6", 64]["barrier_waits"] + 4 * 3
    # at D = 128 (no turns) the same counts, though not always the same instructions
    assert c["fwd7", 64]["wgmma"] == c["fwd6", 64]["wgmma"] and alike(c["fwd7", 128], c["fwd6", 128])
    # fwd8: at D = 64 O leaves by TMA stores (3-D: sequence, row, column), one a warpgroup; D = 128 unchanged
    assert c["fwd7", 64]["tma_stores"] == 0 and c["fwd8", 64]["tma_stores"] == 3 and c["fwd8", 128]["tma_stores"] == 0
    assert same(c["fwd8", 128], c["fwd7", 128])
    # fwd9: at D = 64 P is packed where its product reads it (Triton 3.6: 32 byte permutes fewer a key step)
    assert c["fwd9", 64]["wgmma"] == c["fwd8", 64]["wgmma"] and alike(c["fwd9", 128], c["fwd8", 128])
    # bwd6: the operand addresses worked out in the loop spill less at D = 128
    assert c["bwd6", 128]["stack"] < c["bwd5", 128]["stack"]
    # bwd7: at D = 64 the warpgroup whose turn it is multiplies both halves of dS; D = 128 unchanged
    assert c["bwd7", 64]["wgmma"] > c["bwd6", 64]["wgmma"] and same(c["bwd7", 128], c["bwd6", 128])


def test_persistent_step_launches_one_program_per_sm(part, monkeypatch):
    """fwd4 launches a program per query tile, fwd5 (persistent) no more than the GPU has SMs."""
    from part5_profiling.tools import ladder

    sms = 132
    for name, expected in (("fwd4", 32 * 16384 // 128), ("fwd5", sms)):
        module = ladder.load(name, "fwd")
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
    """Every step of the three ladders has, in part 5's README, a heading of its own, its `make diff`
    line, its generated measurement under that heading (a lesson step's with its counters: the
    tensor pipe, the top stall, where the ladder's run had the counters). Before the ladder's first
    GPU run (no results/<gpu>/part5_ladder.csv) each line must say that it is missing."""
    text = (parts.folder(part) / "README.md").read_text()
    found = sorted((ROOT / "results").glob("*/part5_ladder.csv"))
    counted = bool(found) and any(r["tensor_pipe_pct"] for r in csv.DictReader(found[0].open()))
    headings = list(re.finditer(r"^#### (\w+): .+$", text, re.M))
    for ladder in ("fwd", "bwd", steps.MODEL):
        for step in steps.steps_of(part, ladder):
            at = [i for i, h in enumerate(headings) if h[1] == step.name]
            assert len(at) == 1, f"{step.name}: no heading of its own"
            end = (
                headings[at[0] + 1].start() if at[0] + 1 < len(headings) else text.index("\n## ", headings[at[0]].end())
            )
            section = text[headings[at[0]].end() : end]
            assert f"`make diff PART=5 STEP={step.name}`" in section, step.name
            measured = re.search(rf"<!-- results:part5-step-{step.name} -->\n(.*)\n<!-- /results", section)
            assert measured, step.name
            if not found:  # no ladder run since the ladders were rebuilt: the line says so, nothing else
                assert measured[1].startswith("_No results yet (part5_ladder.csv missing)"), step.name
                continue
            assert "not measured" not in measured[1], step.name
            if ladder != steps.MODEL and counted and "compiles to" not in measured[1]:
                assert "tensor pipe" in measured[1] and "top stall" in measured[1], step.name


def test_the_side_by_side_table_quotes_both_kernels(part):
    """fwd1's table in the README sets part 4's inner loop beside fwd1's, line for line: every code span
    of its left column is in part 4's flash_attention.py, of its right column in fwd1's file (a `...`
    stands for text left out), so the table cannot drift from the code."""
    text = (parts.folder(part) / "README.md").read_text()
    table = re.search(r"^\| part 4, `_attn_fwd_inner` .*?\n\n", text, re.S | re.M)
    assert table, "fwd1's side-by-side table"
    sources = [
        (parts.folder(4) / "flash_attention.py").read_text(),
        (parts.folder(5) / "steps" / "fwd1_first_forward.py").read_text(),
    ]
    rows = [line for line in table[0].splitlines()[2:] if line.startswith("|")]
    assert len(rows) >= 5
    for line in rows:
        cells = line.strip("|").split(" | ")
        assert len(cells) == 2, line
        for cell, source in zip(cells, sources):
            spans = re.findall(r"`([^`]+)`", cell)
            assert spans, line
            for span in spans:
                for piece in (p.strip() for p in span.split("...")):
                    assert piece in source, f"{piece!r} ({line})"
