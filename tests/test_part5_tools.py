"""Part 5's profiling tools, on any machine: the parsing, the arithmetic and the variants they time.
What needs a GPU (the timings, the counters) says so and exits cleanly without one."""

import contextlib
import os
import re
import subprocess
import sys
import types

import pytest
import torch

from common import ROOT, parts, runtime
from common.check import check_outputs
from common.inputs import Shape, make_inputs
from common.reference import attention_reference
from lab import results, study
from lab.results import write_csv
from tests.helpers import DEVICE, META, assert_report_ok, study_row

NCU_CSV = """==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","gpu__time_duration.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","","","","","Mbyte","usecond","",""
"0","123","python3","host","_attn_fwd","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","100.5","250.25","0.75","1.50"
==PROF== Disconnected from process 123
"""


def test_ncu_csv_is_parsed_with_its_units():
    from part5_profiling.tools import profile

    launches, units = profile.parse_ncu_csv(NCU_CSV)
    assert len(launches) == 1
    assert launches[0]["Kernel Name"] == "_attn_fwd" and launches[0]["gpu__time_duration.sum"] == "250.25"
    assert units["dram__bytes_read.sum"] == "Mbyte"
    assert profile.parse_ncu_csv("==ERROR== no table here\n") == ([], {})


def test_occupancy_names_its_limit():
    from part5_profiling.tools import profile

    props = {"max_num_regs": 65536, "max_shared_mem": 232448}
    # 8 warps = 256 threads: threads allow 8 programs, 128 registers allow 2, 64 KiB of shared memory allow 3
    assert profile.occupancy({"num_warps": 8, "regs": 128, "shared": 65536}, props) == (2, ["registers"])
    assert profile.occupancy({"num_warps": 4, "regs": 32, "shared": 200000}, props) == (1, ["shared memory"])


def test_roofline_points_measured_and_modelled(tmp_path):
    from lab.timing import attention_flops
    from part5_profiling.tools import roofline

    base = dict(D=128, causal=0, note="", **META)
    fields = ("target", "kernel", "pass", "method", "metric", "value", "unit")
    rows = [
        dict(base, **dict(zip(fields, row)))
        for row in (
            ("part4", "(all kernels)", "fwd", "cupti", "time per call", 1000.0, "us"),
            ("part4", "_attn_fwd", "fwd", "ncu", "DRAM bytes read", 100.0, "Mbyte"),
            ("part4", "_attn_fwd", "fwd", "ncu", "DRAM bytes written", 50.0, "Mbyte"),
            ("sdpa_cudnn", "(all kernels)", "bwd", "cupti", "time per call", 2000.0, "us"),
        )
    ]
    pts = {p["target"]: p for p in roofline.points(results.read_csv(_write(tmp_path, rows)))}
    flops = attention_flops(4, 8, 4096, 4096, 128, False)
    assert pts["part4"]["measured"] and pts["part4"]["intensity"] == pytest.approx(flops / 150e6)
    assert pts["part4"]["tflops"] == pytest.approx(flops / 1e-3 * 1e-12)
    assert not pts["sdpa_cudnn"]["measured"]  # no counters: the compulsory bytes, read Q K V O dO L, write dQ dK dV D
    t, v = 4 * 8 * 4096 * 128 * 2, 4 * 8 * 4096 * 4
    assert pts["sdpa_cudnn"]["intensity"] == pytest.approx(flops * 2.5 / (8 * t + 3 * v))
    ceilings = [
        dict(ceiling="bf16 matmul", shape="square", value=800.0, unit="TFLOP/s", method="measured", **META),
        dict(ceiling="memory bandwidth", shape="copy", value=4.0, unit="TB/s", method="measured", **META),
        dict(ceiling="bf16 matmul", shape="datasheet", value=989.0, unit="TFLOP/s", method="datasheet", **META),
    ]
    assert roofline.ceilings(ceilings) == (800.0, 4.0)
    assert roofline.figure(ceilings, results.read_csv(tmp_path / "part5_profile.csv")).axes


def _write(tmp_path, rows):
    from part5_profiling.tools import profile

    write_csv(tmp_path / "part5_profile.csv", rows, profile.FIELDS)
    return tmp_path / "part5_profile.csv"


def test_one_thread_runs_the_call_with_autograd_on_the_calling_thread():
    """launch_cost's one-thread mode: the call runs with autograd's multithreading off (its backward
    on the calling thread, where cProfile sees it), gives the call's result, and leaves it on after."""
    import torch

    from part5_profiling.tools.launch_cost import one_thread

    seen = []
    call = one_thread(lambda: seen.append(torch._C._is_multithreading_enabled()) or "result")
    assert call() == "result" and seen == [False] and torch._C._is_multithreading_enabled()


def test_launch_cost_run_replaces_what_it_measures(tmp_path):
    """launch_cost's CSV merges by part: a run takes out every earlier row of what it measures (an old
    error, a cProfile group it no longer shows) and keeps the other parts' rows."""
    from lab.results import read_csv
    from part5_profiling.tools import launch_cost

    path = tmp_path / "part5_launch_cost.csv"
    old = [dict(part=p, mode="fwd", N=512, D=128, what=w, group="", us=1.0, **META) for p, w in ((4, "host_us"),)]
    old += [dict(part=5, mode="fwd", N=512, D=128, what=w, group="", us=1.0, **META) for w in ("host_us", "error: x")]
    write_csv(path, old, launch_cost.FIELDS)
    new = [dict(part=5, mode="fwd", N=512, D=128, what="host_us", group="", us=2.0, **META)]
    write_csv(path, new, launch_cost.FIELDS, key=launch_cost.KEY)
    assert sorted((r["part"], r["what"], r["us"]) for r in read_csv(path)) == [(4, "host_us", 1.0), (5, "host_us", 2.0)]


def test_floor_launches_nothing_and_hands_do_back():
    """launch_cost's floor: a Python autograd.Function whose forward only allocates O (q's shape) and
    whose backward returns dO as every gradient, so its host time is autograd's alone; the run's
    floor call is a forward + backward."""
    from part5_profiling.tools.launch_cost import FLOOR, Floor, calls

    q, k, v, do = (torch.randn(1, 2, 8, 4) for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = Floor.apply(*leaves, False)
    assert o.shape == q.shape and o.grad_fn is not None
    grads = torch.autograd.grad(o, leaves, do)
    assert all(torch.equal(g, do) for g in grads)
    modes = calls(FLOOR, 16)
    assert list(modes) == ["fwd+bwd"]
    for call in modes.values():
        assert [g.shape for g in call()] == [(4, 8, 16, 128)] * 3


def test_stage_variants_do_what_they_say():
    """The stages study's patches (tools/variants/), on ragged causal inputs: the original is part 4's
    forward bit for bit; "P V twice" doubles O; "Q K^T twice" is attention with doubled scores;
    "exp2 twice" adds 2^-64 of each exponential (O as before); "no exp2" changes O."""
    from part5_profiling.tools.candidates import load
    from part5_profiling.tools.stages import STAGES

    q, k, v, do = make_inputs(Shape((1, 2), 70, 90, 32), torch.float32, DEVICE, seed=3)
    o, lse = parts.load(4).flash_forward(q, k, v, True)
    out = {name: load(patch).flash_forward(q, k, v, True) for name, patch in STAGES.items() if name != "no exp2"}
    assert torch.equal(out["original"][0], o) and torch.equal(out["original"][1], lse)
    torch.testing.assert_close(out["P V twice"][0], 2 * o)
    doubled, _ = attention_reference(q * 2, k, v, True, dtype=torch.float64)
    torch.testing.assert_close(out["Q K^T twice"][0].double(), doubled, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["exp2 twice"][0], o)
    # L = m + log2(l) of a negative l: "no exp2" is timed only (the interpreter's NumPy says so; a GPU gives NaN)
    with pytest.warns(RuntimeWarning, match="log2") if runtime.INTERPRET else contextlib.nullcontext():
        o_none, _ = load(STAGES["no exp2"]).flash_forward(q, k, v, True)
    assert not torch.allclose(o_none, o)


CANDIDATE_PATCHES = """
import re
from common import steps
from part5_profiling import gluon_attention
from part5_profiling.tools.gluon_study import exponentials_before_pv_wait, key_step_opcodes, key_step_syncs
from part5_profiling.tools.ladder import compile_gluon
for name, changes in (("exp2_poly", dict(EMULATED=2)), ("exp2_poly", dict(EMULATED=4)), ("cond_rescale", {})):
    ptx = compile_gluon(steps.load_variant(5, name), "fwd", 64, False, **changes).asm["ptx"]
    print(name + str(changes.get("EMULATED", "")), ptx.count("ex2.approx"))
for d in (64, 128):
    ptx = compile_gluon(gluon_attention, "fwd", d, False).asm["ptx"]
    print(f"shipped{d}", ptx.count("ex2.approx"), len(re.findall(r"cp.async.bulk.tensor.4d.global.shared", ptx)))
for name, changes in (("shipped", {}), ("pack_late", dict(PACK_LATE=True))):
    print(name, exponentials_before_pv_wait(gluon_attention, 128, **changes))
    print(name + "_permutes", key_step_opcodes(gluon_attention, 128, **changes)["PRMT"])
for name, module in (("shipped", gluon_attention), ("kv_stage", steps.load_variant(5, "kv_stage"))):
    print(name + "_syncs", *key_step_syncs(module, 128))
module = steps.load_variant(5, "bwd_tile128")
ptx = compile_gluon(module, "bwd", 64, False).asm["ptx"]
print("bwd_tile128", module.constexprs(64, False)["BLOCK_M"], len(re.findall(r"cp.reduce.async.bulk.tensor.2d", ptx)))
from part5_profiling import gluon_backward
for name, module in (("bwd_shipped", gluon_backward), ("bwd_ds_stages", steps.load_variant(5, "bwd_ds_stages"))):
    print(name, compile_gluon(module, "bwd", 128, True).metadata.shared)
"""


def test_candidate_patches_compute_and_compile():
    """Part 5's Gluon candidate patches (tools/variants/, timed by gluon_study). exp2_poly makes
    some exponentials on the FMA units: its arithmetic, done here in float32 as the kernel does it, is
    2^x within 1e-4 relative over the range it sees (x <= 0, and 2^-125 where a score is masked), and
    the kernel compiles for sm_90 with half and a quarter of the exponentials by the polynomial: every
    split and join of the score tile stays in the registers that hold it (assert_trivial), and fewer
    MUFU exponentials are left (the PTX's ex2.approx). The shipped forward writes O by TMA stores at
    D = 64 (O_BY_TMA) and from registers at D = 128; cond_rescale (O rescaled only where a row's
    maximum rose by more than a factor 2^8) compiles with as many exponentials as the shipped kernel.
    At D = 128 (PACK_LATE off) the shipped forward waits for P_{j-1} V_{j-1} before nearly all of P_j's
    66 exponentials (in the SASS: ptxas packs P_j into the registers the product still reads, so it
    moves the wait up); with PACK_LATE, P_j is packed only when its own product is issued and most of
    them run ahead of the wait, nor are P's bytes permuted more (Triton 3.6 permutes them 32 times a
    key step without it, none with it; Triton 3.9 in neither). kv_stage puts K_j and V_{j-1} in one
    ring stage: a key step waits on one mbarrier and arrives on one, and so holds one warpgroup
    bar.sync fewer (Triton puts one before every arrive). The backward candidate bwd_tile128
    compiles at D = 64 with 128 queries a step, each warpgroup adding its half of dQ_i by TMA;
    bwd_ds_stages compiles at D = 128 with a second 16 KB stage of dS^T, still within the 227 KB of
    shared memory a Hopper program may have."""
    from common import steps

    patch = steps.variant(5, "exp2_poly")
    coeffs = [
        float(c) for c in re.search(r"p = \(\((\S+) \* f \+ (\S+)\) \* f \+ (\S+)\) \* f \+ (\S+)\n", patch).groups()
    ]
    x = torch.cat([torch.linspace(-125, 0, 200001), torch.tensor([float("-inf")])])
    xc = torch.clamp(x, min=-125.0)
    t = xc + 12582912.0
    f = xc - (t - 12582912.0)
    poly = ((coeffs[0] * f + coeffs[1]) * f + coeffs[2]) * f + coeffs[3]
    y = (poly.view(torch.int32) + (t.view(torch.int32) << 23)).view(torch.float32)
    exact = torch.exp2(xc.double())
    assert ((y.double() - exact).abs() / exact).max() < 1e-4
    assert 0 < y[-1] < 2.0**-124  # a masked score: next to nothing, and a normal float
    pytest.importorskip("triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run(
        [sys.executable, "-c", CANDIDATE_PATCHES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    counts = {name: tuple(map(int, rest)) for name, *rest in (x.split() for x in out.stdout.splitlines())}
    assert counts["exp2_poly2"][0] < counts["exp2_poly4"][0], counts  # half by polynomial leaves fewer
    # O by TMA stores at D = 64 (O_BY_TMA), from registers at D = 128
    assert counts["shipped64"][1] > 0 and counts["shipped128"][1] == 0, counts
    # cond_rescale: as many exponentials as the shipped forward
    assert counts["cond_rescale"] == (counts["shipped64"][0],), counts
    # the softmax beside its own P V at D = 128: a few of the 66 exponentials in the shipped forward, most in pack_late
    assert counts["shipped"] <= (8,) and counts["pack_late"] >= (48,), counts
    assert counts["pack_late_permutes"] <= counts["shipped_permutes"], counts
    # a key step's (bar.syncs, waits, arrives): K and V apart, two of each; in one stage, one fewer of each
    shipped, kv_stage = counts["shipped_syncs"], counts["kv_stage_syncs"]
    assert shipped[1:] == (2, 2) and kv_stage == tuple(n - 1 for n in shipped), counts
    # bwd_tile128: 128 queries a step; one TMA add of dQ in each of its two steps (masked and not)
    assert counts["bwd_tile128"] == (128, 2), counts
    # bwd_ds_stages: one more stage of two 64 x 64 bf16 dS^T tiles, and it fits (sm_90: 232,448 bytes a program)
    assert counts["bwd_ds_stages"][0] - counts["bwd_shipped"][0] == 2 * 64 * 64 * 2, counts
    assert counts["bwd_ds_stages"][0] <= 232448, counts


@pytest.mark.skipif(runtime.HAS_GPU, reason="checks the no-GPU path")
@pytest.mark.parametrize("name", ["profile", "ceilings", "launch_cost", "stages", "candidates", "gluon_study"])
def test_gpu_tools_say_what_they_need_and_write_nothing(name, capsys, tmp_path, monkeypatch):
    """Without a GPU a study says in one line what it needs, exits cleanly, and leaves the results alone."""
    import importlib

    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    module = importlib.import_module(f"part5_profiling.tools.{name}")
    argv = ["--part", "4"] if name == "profile" else []
    assert module.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "GPU" in out and "Traceback" not in out
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(runtime.HAS_GPU, reason="checks the interpreter's refusal")
def test_compiled_needs_the_compiler(capsys):
    """Under the interpreter (this process on a CPU) nothing is compiled: the tool says how to run it."""
    from part5_profiling.tools import candidates

    assert candidates.main(["--compile"]) == 2
    assert "TRITON_INTERPRET=0" in capsys.readouterr().out


def test_backward_row(monkeypatch):
    """The backward studies' shared step: right gradients are checked, tested for repeatable bits and
    timed; wrong ones are not timed; a variant that computes something else on purpose is timed unchecked."""
    monkeypatch.setattr(study, "graph_time_ms", lambda fn: 2.0)
    part = parts.load(4)
    q, k, v, do = make_inputs(Shape((1, 2), 40, 56, 32), torch.float32, DEVICE, seed=8)
    o, lse = part.flash_forward(q, k, v, True)
    right = lambda: part.flash_backward(q, k, v, o, lse, do, True)  # noqa: E731
    wrong = lambda: tuple(t * 2 for t in right())  # noqa: E731
    row = study.backward_row(right, o, lse, q, k, v, do, True, flops=4e9)
    assert row["check"].startswith("ok") and row["repeatable"] == 1 and row["graph_tflops"] == "2.0"
    row = study.backward_row(wrong, o, lse, q, k, v, do, True, flops=4e9)
    assert row["check"].startswith("FAIL") and "graph_ms" not in row
    row = study.backward_row(wrong, o, lse, q, k, v, do, True, flops=4e9, check=False)
    assert row["check"].startswith("not checked") and row["graph_ms"] == "2.0000"


def test_compiled_reads_a_binary_off_the_compiler():
    """One configuration of part 4's forward compiled for sm_90 in a fresh process with the compiler
    on (any machine: Triton's compiler and ptxas run on the CPU): it compiles, launches the warps it
    was given, and its registers come off the binary."""
    import json
    import os
    import subprocess
    import sys

    from common import ROOT

    code = (
        "import json; from part5_profiling.tools import candidates; m = candidates.load(None); "
        "print(json.dumps(candidates.compile_forward(m, 64, True, m.TUNED[1])))"
    )
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["status"] == "ok" and row["arch"] == "sm_90"
    assert row["warps_launched"] == 4 and row["warp_specialized"] == 0  # TUNED[1]: 128 x 64, 4 warps
    assert 32 < row["registers"] <= 255 and row["stack_bytes"] >= 0 and row["smem_bytes"] > 0


def test_profile_refuses_a_missing_part(capsys):
    from part5_profiling.tools import profile

    assert profile.main(["--part", "9"]) == 2
    assert "part 9 does not exist" in capsys.readouterr().err


def test_walkthrough_runs_in_a_fresh_process():
    """`python -m part5_profiling.walkthrough`, as a reader runs it, from the committed results."""
    import subprocess
    import sys

    from common import ROOT

    cmd = [sys.executable, "-m", "part5_profiling.walkthrough"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "FLOPs per byte" in out.stdout


CANDIDATE_NAMES = [
    "part 4",
    "warp-specialized key loop",
    "grouped causal order",
    "one warp-specialized loop",
    "warp-specialized whole tiles",
    "Q K^T issued one tile ahead",
]


@pytest.mark.parametrize("name", CANDIDATE_NAMES)
def test_every_candidate_computes_attention(name):
    """A candidate change must keep the answer: each is checked here (interpreter on a CPU) on ragged,
    causal shapes with more sequences than a launch-order group holds, and on whole key tiles (N_k a
    multiple of 128, which one candidate runs without masks). Float32 here, on a GPU too, so the
    compiled products are IEEE ones, not the bf16 tensor-core path that Triton warp-specializes:
    the candidates study checks every candidate in bf16 before it times it (and drops what fails)."""
    from part5_profiling.tools import candidates

    assert list(candidates.CANDIDATES) == CANDIDATE_NAMES, "a new candidate: add it to CANDIDATE_NAMES"
    forward = candidates.load(candidates.CANDIDATES[name]).flash_forward
    for causal in (False, True):
        for shape in (Shape((2, 3), 200, 136, 32), Shape((3, 5), 16, 40, 16), Shape((1, 2), 72, 256, 16)):
            q, k, v, do = make_inputs(shape, torch.float32, DEVICE, seed=5)
            o, lse = forward(q, k, v, causal)
            assert_report_ok(check_outputs({"O": o, "L": lse}, q, k, v, do, causal), f"candidate {name} {shape}")


@pytest.mark.parametrize("dq_by_tma", [False, True], ids=["part 4", "dQ by TMA reduce-add"])
def test_every_backward_candidate_computes_the_gradients(dq_by_tma):
    """The backward's candidates keep dQ, dK, dV: ragged (both sides, N_q != N_k) and causal."""
    from part5_profiling.tools import candidates

    module = candidates.load("dq_by_tma" if dq_by_tma else None)
    part = types.SimpleNamespace(
        flash_forward=parts.load(4).flash_forward,
        flash_backward=module.flash_backward,  # dq_by_tma.diff turns atomic_dq on by default
        FlashAttention=None,
    )
    for causal in (False, True):
        for shape in (Shape((2, 3), 70, 90, 32), Shape((1, 2), 100, 37, 16)):
            q, k, v, do = make_inputs(shape, torch.float32, DEVICE, seed=7)
            o, lse = part.flash_forward(q, k, v, causal)
            grads = part.flash_backward(q, k, v, o, lse, do, causal)
            out = {"O": o, "L": lse, **dict(zip(("dQ", "dK", "dV"), grads))}
            assert_report_ok(check_outputs(out, q, k, v, do, causal), f"dq_by_tma={dq_by_tma} {shape} causal={causal}")


def test_part5_tables(tmp_path):
    """Each of part 5's tables from a small synthetic CSV: well formed, the numbers where they belong."""
    from part5_profiling.tools import candidates, ceilings, gluon_study, launch_cost, profile, report, stages

    write_csv(
        tmp_path / "part5_ceilings.csv",
        [
            dict(ceiling="bf16 matmul", shape="square", value=790.5, unit="TFLOP/s", method="measured", **META),
            dict(ceiling="memory bandwidth", shape="copy", value=4.3, unit="TB/s", method="measured", **META),
        ],
        ceilings.FIELDS,
    )
    assert "| bf16 matmul | square | 790.5 | TFLOP/s | measured |" in report.table_ceilings(tmp_path)

    base = dict(target="part4", D=64, causal=1, note="", **{"pass": "fwd"}, **META)
    write_csv(
        tmp_path / "part5_profile.csv",
        [
            dict(base, kernel="(all kernels)", method="cupti", metric="time per call", value=250.0, unit="us"),
            dict(base, kernel="(all kernels)", method="cupti", metric="achieved", value=300.0, unit="TFLOP/s"),
            dict(base, kernel="_attn_fwd", method="compiler", metric="registers per thread", value=168, unit=""),
            dict(base, kernel="_attn_fwd", method="compiler", metric="spilled registers", value=0, unit=""),
            dict(base, kernel="(all kernels)", method="ncu", metric="unavailable", value="", unit=""),
        ],
        profile.FIELDS,
    )
    table = report.table_profile(tmp_path)
    assert "| part4 | fwd | 64 | yes | 250.0 | 300.0 | _attn_fwd 168 | 0 | — | — | no |" in table

    write_csv(
        tmp_path / "part5_launch_cost.csv",
        [
            dict(part=p, mode=m, N=512, D=128, what=w, group="", us=us, **META)
            for p, m, scale in ((4, "fwd", 1), (4, "bwd", 3), ("sdpa_cudnn", "fwd", 0.5))
            for w, us in (("gpu_us", 20.0 * scale), ("host_us", 45.0 * scale), ("call_us", 47.0 * scale))
        ]
        + [dict(part=4, mode="bwd", N=512, D=128, what="host, by group (cProfile)", group="autotuner", us=9.5, **META)]
        + [dict(part=3, mode="fwd", N=512, D=128, what="host_us", group="", us=90.0, **dict(META, commit="0ld0ld0"))]
        + [
            dict(part=4, mode="fwd+bwd", N=512, D=128, what="host split", group=f"{name} ({stat})", us=us, **META)
            for name, median in (("forward", 80), ("backward body", 120), ("engine and hand-off", 70), ("total", 280))
            for stat, us in (("median", median), ("mean", median * 1.5))
        ],
        launch_cost.FIELDS,
    )
    table = report.table_launch_cost(tmp_path)
    assert "| 4 | fwd | 512 | 20.0 | 45.0 | 47.0 |" in table
    assert "| 4 | bwd | 512 | 60.0 | 135.0 | 141.0 |" in table
    assert "| 3 | fwd | 512 | — | 90.0 | — |" in table
    assert "paired" not in table  # no part5_launch_paired.csv: no paired table
    write_csv(
        tmp_path / "part5_launch_paired.csv",
        [
            dict(part=p, mode="fwd+bwd", N=n, D=128, what="host, paired", group=g, us=us, **META)
            for p, us_of in ((5, 200.0), ("sdpa_cudnn", 100.0))
            for n in (512, 1024)
            for g, us in (
                ("us (median of rounds)", us_of * n / 512),
                *(
                    (f"over SDPA cuDNN ({s})", r)
                    for s, r in (("median", us_of / 100), ("lowest", us_of / 110), ("highest", us_of / 90))
                ),
            )
        ],
        launch_cost.FIELDS,
    )
    table = report.table_launch_cost(tmp_path)
    assert "| part | N = 512 | N = 1024 |" in table
    assert "| 5 | 200 (2.00x, 1.82-2.22) | 400 (2.00x, 1.82-2.22) |" in table
    assert "| sdpa_cudnn | 100 (1.00x, 0.91-1.11) | 200 (1.00x, 0.91-1.11) |" in table

    write_csv(
        tmp_path / "part5_stages.csv",
        [
            study_row(
                variant=v,
                N=4096,
                D=128,
                causal=0,
                graph_ms=ms,
                graph_tflops=1.0,
                delta_us=delta,
                config="",
                check="",
            )
            for v, ms, delta in (("original", 0.5, 0.0), ("P V twice", 0.6, 100.0))
        ],
        stages.FIELDS,
    )
    assert "| 128 | no | 500 (+0) | 600 (+100) |" in report.table_stages(tmp_path)

    write_csv(
        tmp_path / "part5_candidates.csv",
        [
            study_row(
                candidate="one warp-specialized loop",
                N=4096,
                D=64,
                causal=0,
                check="FAIL O inf<=1.9e-02 FAIL  L 1.0e-06<=3.7e-05 ok  dQ 2.0<=0.1 FAIL",
            ),
            study_row(
                candidate="part 4",
                N=4096,
                D=64,
                causal=0,
                graph_tflops=400.0,
                speedup=1.0,
                check="ok",
            ),
            study_row(
                candidate="warp-specialized key loop",
                N=4096,
                D=64,
                causal=0,
                check="error: X",
            ),
        ],
        candidates.FIELDS,
    )
    write_csv(
        tmp_path / "part5_compiled.csv",
        [
            dict(
                candidate=name,
                D=128,
                causal=c,
                BLOCK_M=128,
                BLOCK_N=64,
                num_warps=4,
                num_stages=2,
                arch="sm_90",
                **(
                    dict(status="ok", warp_specialized=ws, warps_launched=w, registers=r, stack_bytes=st, smem_bytes=1)
                    if ok
                    else dict(status="error: PassManager::run failed")
                ),
                **META,
            )
            for name, c, ok, ws, w, r, st in (
                ("one loop", 0, True, 1, 12, 168, 0),
                ("one loop", 1, True, 0, 4, 255, 32),
                ("part 4", 0, True, 0, 4, 255, 8),
                ("two loops", 0, False, 0, 0, 0, 0),
            )
        ],
        candidates.COMPILED_FIELDS,
    )
    line = report.TABLES["part5-compiled"](tmp_path)  # no README shows it: one line of the log, no table
    assert "`part5_compiled.csv` holds its 4 rows" in line and "|" not in line and "sm_90" not in line
    assert (
        "Regenerate: `TRITON_INTERPRET=0 python -m part5_profiling.tools.candidates --compile && make report`" in line
    )

    write_csv(
        tmp_path / "part5_bwd_candidates.csv",
        [
            study_row(
                candidate=name,
                N=4096,
                D=128,
                causal=1,
                graph_tflops=t,
                speedup=x,
                repeatable=r,
                check="ok",
            )
            for name, t, x, r in (("dQ by TMA reduce-add", 300.0, 0.75, 0), ("part 4", 400.0, 1.0, 1))
        ],
        candidates.FIELDS,
    )
    assert "`part5_bwd_candidates.csv` holds its 2 rows" in report.TABLES["part5-bwd-candidates"](tmp_path)

    table = report.table_candidates(tmp_path)  # part 4 first; a wrong answer names its outputs
    assert "| part 4 | one warp-specialized loop | warp-specialized key loop |" in table
    assert "| 64 | no | 4096 | 400 (1.00x) | wrong O, dQ | error |" in table

    write_csv(
        tmp_path / "part5_gluon.csv",
        [
            study_row(
                variant=name,
                N=8192,
                D=64,
                causal=1,
                graph_tflops=t,
                vs_cudnn=x,
                check="ok",
            )
            for name, t, x in (
                ("part 4", 400.0, 0.9),
                ("3 warpgroups, persistent", 430.0, 0.97),
                ("SDPA cuDNN", 444.0, 1.0),
            )
        ],
        gluon_study.FIELDS,
    )
    table = report.table_gluon(tmp_path)  # part 4 first, SDPA cuDNN last, each with its fraction of cuDNN
    assert "| D | causal | N | part 4 | 3 warpgroups, persistent | SDPA cuDNN |" in table
    assert "| 64 | yes | 8192 | 400 (0.90x) | 430 (0.97x) | 444 (1.00x) |" in table

    write_csv(
        tmp_path / "part5_gluon_bwd.csv",
        [
            study_row(candidate=name, N=4096, D=128, causal=0, graph_tflops=t, vs_cudnn=x, check=c)
            for name, t, x, c in (
                ("SDPA cuDNN", 500.0, 1.0, "checked by the benchmark"),
                ("part 4", 400.0, 0.8, "ok"),
                ("Gluon, one pass", 420.0, 0.84, "ok"),
                ("Gluon, no dQ (ablation)", 560.0, 1.12, "not checked: computes something else on purpose"),
                ("Gluon, sequence-minor", 380.0, 0.76, "ok"),
            )
        ],
        gluon_study.BWD_FIELDS,
    )
    assert "`part5_gluon_bwd.csv` holds its 5 rows" in report.TABLES["part5-gluon-bwd"](tmp_path)


def test_gluon_order_rows_and_line(tmp_path):
    from part5_profiling.tools import gluon_study, report

    names = list(gluon_study.ORDERS)
    assert names[0] == "one sequence at a time" and names[-1] == "32 sequences side by side"
    write_csv(
        tmp_path / "part5_gluon_order.csv",
        [
            study_row(
                variant=name, N=8192, D=128, causal=1, graph_ms=1.0, graph_tflops=tf, vs_cudnn=tf / 500, check="ok"
            )
            for name, tf in zip(["SDPA cuDNN", *reversed(names)], (500.0, 490.0, 480.0, 470.0, 460.0, 450.0, 520.0))
        ],
        gluon_study.FIELDS,
    )
    assert "`part5_gluon_order.csv` holds its 7 rows" in report.TABLES["part5-gluon-order"](tmp_path)


def test_ncu_rows_from_a_run(monkeypatch):
    """ncu_rows on ncu's output (a stand-in process returns NCU_CSV): counters become rows with
    their units, stalls are ranked, and a failed run becomes one 'unavailable' row saying why."""
    import subprocess

    from part5_profiling.tools import profile

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=NCU_CSV, stderr="")

    monkeypatch.setattr(profile.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    stalls = [
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    ]
    rows = profile.ncu_rows("part4", "fwd", 128, False, ["dram__bytes_read.sum", "gpu__time_duration.sum"], stalls)
    assert "--clock-control" in calls[0] and calls[0][calls[0].index("--clock-control") + 1] == "none"
    got = {r["metric"]: (r["value"], r["unit"]) for r in rows}
    assert got["DRAM bytes read"] == ("100.5", "Mbyte") and got["duration"] == ("250.25", "usecond")
    assert got["stall #1: wait"][0] == "1.50" and got["stall #2: long_scoreboard"][0] == "0.75"
    assert "not offered by this ncu" in got  # the metrics not asked for are named

    monkeypatch.setattr(
        profile.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(
            cmd, 1, stdout="==ERROR== ERR_NVGPUCTRPERM - no permission\n", stderr=""
        ),
    )
    rows = profile.ncu_rows("part4", "fwd", 128, False, ["gpu__time_duration.sum"], [])
    assert [r["metric"] for r in rows] == ["unavailable"] and "ERR_NVGPUCTRPERM" in rows[0]["note"]


def test_profile_refuses_the_pytorch_part(capsys):
    from part5_profiling.tools import profile

    assert profile.main(["--part", "0"]) == 2
    assert "part0" in capsys.readouterr().err


def test_time_forwards_rows_errors_and_saves(monkeypatch):
    """The studies' shared loop: one row per forward and shape, with the row's own columns; a forward
    that raises gets an error check and the loop goes on; save() runs after every shape."""

    def forward_row(forward, q, k, v, causal, do_bench=True):
        return forward(q)

    def fine(q):
        return {"check": "ok", "graph_ms": f"{q.shape[-2] / 1000:.4f}"}

    def broken(q):
        raise RuntimeError("out of resources: shared memory\nmore detail")

    monkeypatch.setattr(study, "forward_row", forward_row)
    saved = []
    rows = study.time_forwards(
        {"fine": fine, "broken": broken},
        lambda label, causal: dict(name=label, c=causal),
        (16, 32),
        head_dims=(16,),
        b=1,
        h=1,
        save=lambda rows: saved.append(len(rows)),
    )
    assert len(rows) == 2 * 2 * 2 and saved == [2, 4, 6, 8]
    fine_rows = [r for r in rows if r["name"] == "fine"]
    assert [(r["causal"], r["N"], r["graph_ms"]) for r in fine_rows] == [
        (0, 16, "0.0160"),
        (0, 32, "0.0320"),
        (1, 16, "0.0160"),
        (1, 32, "0.0320"),
    ]
    assert all(r["c"] == bool(r["causal"]) for r in rows)
    assert {r["check"] for r in rows if r["name"] == "broken"} == {
        "error: RuntimeError: out of resources: shared memory"
    }


def test_launch_cost_paired_rounds(monkeypatch):
    """launch_cost's paired measure: every target timed in turn, round after round, and each round's
    time over SDPA cuDNN's of the same round. The fake targets' calls all slow down by the same
    factor from round to round (1, 4, 9: a host whose pace drifts), a target taking twice the
    yardstick's time stays at 2x in every round (a ratio of the wrong rounds would not), the
    yardstick at exactly 1x; a part without a fwd+bwd mode gives no rows, one whose first call
    fails an error row, and the others are still timed."""
    import contextlib
    import types

    from part5_profiling.tools import launch_cost

    monkeypatch.setattr(launch_cost, "PAIRED_CALLS", 3)
    naps = {launch_cost.YARDSTICK: 0.001, 5: 0.002, launch_cost.FLOOR: 0.0005}
    made = {t: 0 for t in naps}
    clock = [0.0]  # a clock the fake calls move (sleeping would time this machine's scheduler instead)
    monkeypatch.setattr(launch_cost, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def fake(target, seconds):
        def call():
            made[target] += 1
            drift = (1 + (made[target] - 2) // launch_cost.PAIRED_CALLS) ** 2  # the first call warms up
            clock[0] += seconds * max(drift, 1)

        return call

    def failing():
        raise RuntimeError("no kernel")

    modes = {t: {"fwd+bwd": fake(t, s)} for t, s in naps.items()} | {3: {"fwd": lambda: None}, 4: {"fwd+bwd": failing}}
    entered = []
    monkeypatch.setattr(launch_cost, "calls", lambda target, n: modes[target])
    monkeypatch.setattr(
        launch_cost.impls, "sdpa_context", lambda backend: entered.append(backend) or contextlib.nullcontext()
    )
    monkeypatch.setattr(launch_cost.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(launch_cost.torch.cuda, "empty_cache", lambda: None)
    targets = [3, 4, 5, launch_cost.YARDSTICK, launch_cost.FLOOR]
    rows = launch_cost.paired_rows(targets, META, rounds=3, lens=(512,))
    cell = {(r["part"], r["group"]): float(r["us"]) for r in rows if r["what"] == launch_cost.PAIRED}
    errors = [r for r in rows if r["what"].startswith("error")]
    assert [r["part"] for r in errors] == [4] and "no kernel" in errors[0]["what"]
    assert {p for p, _ in cell} == {5, launch_cost.YARDSTICK, launch_cost.FLOOR}
    assert set(entered) == {"cudnn"}  # the yardstick's calls run under its backend, the others' not
    assert all(r["mode"] == "fwd+bwd" and r["N"] == 512 for r in rows)
    assert cell[(launch_cost.YARDSTICK, "over SDPA cuDNN (median)")] == 1.0
    for stat in ("median", "lowest", "highest"):  # the clock moves by the naps exactly: the ratios are exact
        assert cell[(5, f"over SDPA cuDNN ({stat})")] == 2.0
        assert cell[(launch_cost.FLOOR, f"over SDPA cuDNN ({stat})")] == 0.5
    assert cell[(5, "us (median of rounds)")] == 8000.0  # round 2's 2 ms x 4


def test_profile_run_replaces_its_shapes_rows(tmp_path):
    """The profile's CSV merges by target, shape, pass and method: a run takes out every earlier row
    of what it measures (a stall reason no longer among the top) and keeps the other shapes' and
    methods' rows."""
    from lab.results import read_csv
    from part5_profiling.tools import profile

    path = tmp_path / "part5_profile.csv"
    row = lambda D, method, metric, value: dict(  # noqa: E731
        target="part5", kernel="k", D=D, causal=0, method=method, metric=metric, value=value, unit="", note="", **META
    )
    row_of = lambda *a: dict(row(*a), **{"pass": "bwd"})  # noqa: E731
    old = [row_of(128, "ncu", "stall #1: long_scoreboard", 5), row_of(64, "ncu", "stall #1: barrier", 2)]
    old += [row_of(128, "cupti", "time per call", 700)]
    write_csv(path, old, profile.FIELDS)
    write_csv(path, [row_of(128, "ncu", "stall #1: barrier", 4)], profile.FIELDS, key=profile.KEY)
    kept = sorted((r["D"], r["method"], r["metric"], r["value"]) for r in read_csv(path))
    assert kept == [
        (64, "ncu", "stall #1: barrier", 2),
        (128, "cupti", "time per call", 700),
        (128, "ncu", "stall #1: barrier", 4),
    ]

    # a machine whose ncu cannot read the counters: its row replaces nothing, and is written only
    # for a shape with no counters yet
    blind = [dict(row_of(D, "ncu", "unavailable", ""), note="ERR_NVGPUCTRPERM") for D in (128, 96)]
    blind += [row_of(128, "cupti", "time per call", 710)]
    write_csv(path, blind, profile.FIELDS, key=profile.KEY, replaces=profile.replaces)
    kept = sorted((r["D"], r["method"], r["metric"], r["value"]) for r in read_csv(path))
    assert kept == [
        (64, "ncu", "stall #1: barrier", 2),
        (96, "ncu", "unavailable", None),
        (128, "cupti", "time per call", 710),
        (128, "ncu", "stall #1: barrier", 4),
    ]


def test_launch_cost_paired_only_needs_the_yardstick(capsys):
    """--paired-only divides by SDPA cuDNN's time: without it the command refuses, naming the way out."""
    from part5_profiling.tools import launch_cost

    assert launch_cost.main(["--part", "5", "--paired-only", "--no-sdpa"]) == 2
    assert "--paired-only needs SDPA cuDNN" in capsys.readouterr().err


def test_host_parts_table_orders_the_ladder(tmp_path):
    """The ladder's rungs in the order they add part 5's work, whatever order the CSV holds them in, each
    with its ratio to SDPA cuDNN of the same rounds; rows of an earlier commit's target after the rungs,
    SDPA cuDNN last; the pieces of the latest run first."""
    from part5_profiling.tools import host_parts, report

    thread = host_parts.DEVICE_THREAD
    ladder = [
        dict(section="ladder", target=t, threads=thread, N=512, what=w, us=v, **META)
        for t, us, x in (
            ("SDPA cuDNN", 200.0, 1.0),
            ("part 5", 330.0, 1.65),
            ("part 5, LEAN on", 320.0, 1.6),
            ("tensors", 170.0, 0.85),
            ("floor", 100.0, 0.5),
        )
        for w, v in (("us (median of rounds)", us), ("over SDPA cuDNN (median of rounds)", x))
    ]
    pieces = [
        dict(section="piece", target=t, threads="calling", N=512, what="us per call", us=us, **dict(META, date=d))
        for t, us, d in (("old piece", 1.0, "2026-01-01T00:00:00Z"), ("new piece", 2.0, "2026-01-02T00:00:00Z"))
    ]
    write_csv(tmp_path / "part5_host_parts.csv", ladder + pieces, host_parts.FIELDS)
    table = report.table_host_parts(tmp_path)
    order = [f"| {t} | {thread} |" for t in ("floor", "tensors", "part 5", "part 5, LEAN on", "SDPA cuDNN")]
    assert [table.index(line) for line in order] == sorted(table.index(line) for line in order)
    assert f"| part 5 | {thread} | 330 (1.65x) |" in table
    assert table.index("| new piece | 2.0 |") < table.index("| old piece | 1.0 |")


def test_pingpong_study_pairs_free_and_turns():
    from part5_profiling.tools import gluon_study

    assert list(gluon_study.forward_calls(128)) == ["2 warpgroups, persistent", "2 warpgroups, persistent, ping-pong"]
    names = list(gluon_study.forward_calls(64))
    assert names == [f"{w} warpgroups, persistent{how}" for w in (2, 3) for how in ("", ", ping-pong")]


def test_profile_of_fa4_where_it_does_not_import_says_so(monkeypatch, capsys):
    from lab import impls
    from part5_profiling.tools import profile

    monkeypatch.setattr(impls, "fa4_impl", lambda: None)
    assert profile.main(["--fa4"]) == 2 and "flash-attn-4 does not import" in capsys.readouterr().err
    assert profile.target_impl("sdpa_cudnn").name == "sdpa_cudnn"


def test_profile_table_shows_each_gpu_folder(tmp_path, monkeypatch):
    from part5_profiling.tools import profile, report

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    for folder, gpu in (("h200", "NVIDIA H200"), ("h100", "NVIDIA H100 80GB HBM3")):
        (tmp_path / folder).mkdir()
        base = dict(target="part5", D=128, causal=0, note="", **{"pass": "fwd"}, **dict(META, gpu=gpu))
        time = dict(base, kernel="(all kernels)", method="cupti", metric="time per call", value=400.0, unit="us")
        write_csv(tmp_path / folder / "part5_profile.csv", [time], profile.FIELDS)
    table = report.table_profile(tmp_path / "h200")  # its own first, then the other GPU's
    assert table.index("_NVIDIA H200;") < table.index("_NVIDIA H100 80GB HBM3;")
    assert table.count("| part5 | fwd | 128 | no | 400.0 |") == 2


def test_fa4_table_takes_the_median_of_a_repeated_invocation(tmp_path):
    """FA4's table: each shape's three rows from one invocation; where it repeated, the median of its runs
    (from bench_runs.csv, whatever later rows bench.csv holds) and part 5 over FA4 as the median of each
    run's ratio with its range, and the same ratio by CUDA-graph replay (no host time in it: where FA4's
    do_bench waited on its host, here in run 2, only that column shows it); no FA4 rows, no table."""
    from lab import bench
    from part5_profiling.tools import report

    shape = dict(B=4, H=8, N=4096, D=128, dtype="bf16", causal=1, mode="fwd", backend="", check="ok", **META)
    speeds = {"fa4": (600, 620, 610), "sdpa_cudnn": (500, 510, 520), "part5": (540, 570, 560)}
    graphs = {"fa4": (600, 700, 600), "sdpa_cudnn": (500, 500, 500), "part5": (540, 560, 552)}
    runs = [
        dict(shape, impl=impl, part="", run=run, ms=1.0, tflops=t[run - 1], graph_tflops=graphs[impl][run - 1])
        | dict(run_id=f"r{run}")  # a run_id per run
        for impl, t in speeds.items()
        for run in (1, 2, 3)
    ]
    write_csv(tmp_path / "bench_runs.csv", runs, bench.RUNS_FIELDS)
    write_csv(tmp_path / "bench.csv", [r for r in runs if r["run"] == 3], bench.FIELDS)
    table = report.table_fa4(tmp_path)
    # medians 610, 510, 560; ratios part5/fa4 0.90, 0.92, 0.92 -> 0.92 (0.90-0.92); fa4/cudnn 1.20, 1.22, 1.17;
    # by graph replay 0.90, 0.80, 0.92 -> 0.90
    assert "| fwd | 128 | yes | 4096 | 610 | 510 | 560 | 1.20x | 0.92x (0.90-0.92) | 0.90x |" in table
    assert "the median of 3 runs" in table
    later = [dict(r, run_id="r9") if r["impl"] == "part5" else r for r in runs if r["run"] == 3]
    write_csv(tmp_path / "bench.csv", later, bench.FIELDS)  # a later invocation timed part 5 alone there
    assert report.table_fa4(tmp_path) == table  # the repeated invocation's runs still make the row
    write_csv(tmp_path / "bench.csv", [r for r in runs if r["run"] == 3 and r["impl"] != "fa4"], bench.FIELDS)
    assert report.table_fa4(tmp_path).startswith("No FlashAttention-4 rows")


def test_a_fingerprint_sees_instructions_not_lines():
    """The ladder's compiled fingerprint: the same PTX instructions from another file, at other lines,
    hash alike; one instruction more does not."""
    from part5_profiling.tools import ladder

    body = "\tmov.u32 \t%r1, %ctaid.x;\n\tadd.s32 \t%r2, %r1, 127;\n"
    here = f'.file 1 "steps/fwd4.py"\n.loc 1 10 0\n{body}// a comment\n.section .debug_abbrev\n{{\n.b8 1\n}}\n'
    there = f'.file 1 "gluon_attention.py"\n.loc 1 99 4\n{body}'
    assert ladder.fingerprint(here) == ladder.fingerprint(there)
    assert ladder.fingerprint(there + "\tret;\n") != ladder.fingerprint(there)
    assert ladder.fingerprint(here).startswith("sha256:")  # text in the CSV, never read as a number


def test_forward_candidates_are_medians_of_each_rounds_own_ratio(monkeypatch):
    """gluon_study --candidates: a row's time is the median over the rounds, its speed over the
    shipped forward the median of each round's own ratio (not a ratio of medians), and a candidate
    that failed in any round is left untimed; rows are saved after every round."""
    from part5_profiling.tools import gluon_study

    def found(shipped, poly, cudnn, check="ok"):
        base = dict(N=4096, D=64, causal=0)
        return [
            dict(base, variant="shipped", graph_ms=str(shipped), vs_cudnn=f"{cudnn / shipped:.3f}", check="ok"),
            dict(
                base,
                variant="poly",
                graph_ms=str(poly or ""),
                vs_cudnn=f"{cudnn / poly:.3f}" if poly else "",
                check=check,
            ),
            dict(base, variant="SDPA cuDNN", graph_ms=str(cudnn), vs_cudnn="1.000", check="ok"),
        ]

    rounds = iter([found(1.0, 0.5, 1.0), found(2.0, 2.0, 1.0), found(1.0, 0.8, 1.0)])
    monkeypatch.setattr(gluon_study, "run", lambda *a: next(rounds))
    saved = []
    rows = gluon_study.run_candidates((4096,), (64,), rounds=3, save=saved.append)
    assert [len(s) for s in saved] == [3, 3, 3] and [s[0]["rounds"] for s in saved] == [1, 2, 3]
    poly = next(r for r in rows if r["variant"] == "poly")
    assert poly["graph_ms"] == "0.8000" and poly["vs_shipped"] == "1.250"  # ratios 2.0, 1.0, 1.25
    rounds = iter([found(1.0, 0.5, 1.0), found(1.0, None, 1.0, check="wrong O")])
    rows = gluon_study.run_candidates((4096,), (64,), rounds=2)
    assert next(r for r in rows if r["variant"] == "poly")["graph_ms"] == ""


def test_backward_with_128_queries_a_step_keeps_the_sums_layout():
    """The backward candidate with 128 queries a step at D = 64 (tools/variants/bwd_tile128.diff,
    timed by gluon_study --backward): its dQ sum keeps the shipped layout, 64 x 64 blocks in
    fragment order one after another, each warpgroup adding the block of its own 64 rows; here its
    _dq_convert (a `tl` kernel, run as this machine runs them) reads a sum with 128-row tiles back
    into row order as from_fragment_order does, ragged last tile included. Its Gluon kernel compiles
    for sm_90 (test_candidate_patches_compute_and_compile, which checks its TMA adds)."""
    from common import steps

    module = steps.load_variant(5, "bwd_tile128")
    assert module.BLOCK_MS == {64: 128, 128: 64} and module.constexprs(64, False)["BLOCK_M"] == 128
    n_seqs, n_q, heads, scale = 3, 200, 3, 0.5
    plan = module.Plan((n_seqs, n_q, 64), (n_seqs, n_q, 64), DEVICE, torch.float32, False)
    assert plan.dq32_shape == (n_seqs, 256, 64) and plan.stats_shape == (2, n_seqs, 256)
    dq32 = torch.randn(plan.dq32_shape, device=DEVICE)
    dq = torch.empty(n_seqs, n_q, 64, device=DEVICE)
    grid = (2 * n_seqs,)  # two tiles of 128 queries per sequence
    module._dq_convert[grid](dq32, dq, n_q, n_seqs, heads, 0, n_q * 64, 64, scale, D=64, BLOCK_M=128)
    torch.testing.assert_close(dq, module.from_fragment_order(dq32, n_q) * scale)


def test_gluon_candidates_table_shows_each_gpu_folder(tmp_path, monkeypatch):
    """The forward candidates' table: every GPU folder that ran them, each naming its GPU (the H200's log
    shows the H100's rounds); none yet: the report's missing-CSV line."""
    from lab import report as lab_report
    from part5_profiling.tools import gluon_study, report

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    (tmp_path / "h200").mkdir()
    (tmp_path / "h100").mkdir()
    assert "part5_gluon_candidates.csv missing" in lab_report.render(report.table_gluon_candidates, tmp_path / "h200")
    fields = gluon_study.CANDIDATE_FIELDS
    rows = [
        study_row(variant=v, N=4096, D=64, causal=0, graph_ms=ms, graph_tflops=t, vs_cudnn="", check=c, vs_shipped=x)
        for v, ms, t, c, x in (("shipped", 0.33, 418.0, "ok", 1.0), ("O by a TMA store", 0.32, 432.0, "ok", 1.025))
    ]
    rows.append(study_row(variant="exp2 by polynomial, half", N=4096, D=64, causal=0, graph_ms="", graph_tflops="",
                          vs_cudnn="", check="FAIL O 1e-3<=1e-2 ok  L 5e-5<=3e-5 FAIL", vs_shipped=""))  # fmt: skip
    rows = [dict(r, gpu="NVIDIA H100", rounds=3) for r in rows]
    write_csv(tmp_path / "h100" / "part5_gluon_candidates.csv", rows, fields)
    table = report.table_gluon_candidates(tmp_path / "h200")
    assert "_NVIDIA H100;" in table and "| 64 | no | 4096 | 418 (1.00x) | 432 (1.02x) | wrong L |" in table
    assert "the median of 3 interleaved rounds" in table  # the CSV's rounds, not a number in the caption
