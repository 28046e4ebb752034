"""The cold-start benchmark (lab/coldstart.py): a real cold run of part 1 in fresh processes, a
process killed at its timeout or failing, the tables from a synthetic file of two commits, and the
command line."""

import time

import pytest

from common.runtime import COMPILED
from lab import coldstart, report, results

META = dict(torch="2.x", triton="3.x", command="python -m lab.coldstart", parallel=1, timeout=600)


@pytest.mark.only_parts(1)
def test_a_cold_run_of_part1_writes_its_steps(part, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    argv = ["--part", "1", "--dtype", "fp32", "--causal", "0", "--shape", "small", "--parallel", "2"]
    assert coldstart.main(argv) == 0
    rows = results.read_csv(tmp_path / coldstart.FILENAME)
    assert set(coldstart.KEY) <= set(coldstart.FIELDS) <= set(rows[0])
    steps = [(r["scenario"], r["step"], r["causal"]) for r in rows]
    one = ["import torch", "import part", "first forward", "first backward", "second call", "process"]
    four = [("first forward", 0), ("first backward", 0), ("first forward", 1), ("first backward", 1)]
    four += [("import torch", None), ("import part", None), ("four calls", None), ("process", None)]
    assert steps == [(coldstart.ONE, s, 0) for s in one] + [(coldstart.FOUR, s, c) for s, c in four]
    for r in rows:
        assert (r["part"], r["dtype"], r["shape"], r["B"], r["H"], r["N"], r["D"]) == (
            1,
            "fp32",
            "small",
            4,
            None,
            128,
            64,
        )
        assert r["seconds"] > 0 and r["status"] == "ok" and r["parallel"] == 2 and r["commit"] == results.commit()
        assert r["device"] == ("cuda" if COMPILED else "cpu, interpreter")
    seconds = {(r["scenario"], r["step"]): r["seconds"] for r in rows if r["causal"] in (0, None)}
    calls = sum(r["seconds"] for r in rows if r["scenario"] == coldstart.FOUR and r["step"].startswith("first"))
    assert calls <= seconds[coldstart.FOUR, "four calls"] < seconds[coldstart.FOUR, "process"]
    binaries = next(r["binaries"] for r in rows if r["step"] == "process")
    if COMPILED:  # the first forward compiles part 1's kernel; the second call finds it compiled
        assert binaries > 0 and seconds[coldstart.ONE, "first forward"] > seconds[coldstart.ONE, "second call"]
    else:  # the interpreter compiles nothing
        assert binaries == 0


def test_each_process_gets_a_new_empty_cache_and_the_repository_root():
    code = (
        "import json, os; d = os.environ['TRITON_CACHE_DIR']; open(os.path.join(d, 'mine'), 'w').close(); "
        f"print({coldstart.MARK!r} + json.dumps(dict(cache=d, files=os.listdir(d), cwd=os.getcwd())))"
    )
    (a, ok_a, *_), (b, ok_b, *_) = (coldstart.run_process(code, timeout=60) for _ in range(2))
    assert ok_a == ok_b == "ok" and a[0]["files"] == b[0]["files"] == ["mine"] and a[0]["cache"] != b[0]["cache"]
    assert a[0]["cwd"] == str(coldstart.ROOT)


def test_a_process_past_its_timeout_is_killed_and_recorded(tmp_path):
    # Two steps printed, then a grandchild that would hold the pipe open for a minute: the whole
    # process group must go at the timeout, and the steps printed before it must stay.
    code = (
        "import json, subprocess, sys, time\n"
        f"print({coldstart.MARK!r} + json.dumps(dict(step='import torch', seconds=0.5)), flush=True)\n"
        f"print({coldstart.MARK!r} + json.dumps(dict(step='import part', seconds=0.25)), flush=True)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    start = time.perf_counter()
    ran = coldstart.run_process(code, timeout=2)
    assert time.perf_counter() - start < 20 and 2 <= ran[2] < 20
    assert ran[1].startswith("timeout: killed after") and "limit 2 s" in ran[1]
    rows = coldstart.job_rows(dict(part=3, scenario=coldstart.ONE, dtype="fp32", shape="small", causal=1), ran)
    assert [(r["step"], r["status"]) for r in rows] == [
        ("import torch", "ok"),
        ("import part", "ok"),
        ("process", ran[1]),
    ]
    # The log names the run in one line (no README shows the matrix): its commit and how many rows.
    meta = dict(META, gpu="NVIDIA H200", commit="aaa1111", date="2026-01-01T00:00:00Z", device="cuda", timeout=2)
    results.write_csv(tmp_path / coldstart.FILENAME, [{**meta, **r} for r in rows], coldstart.FIELDS)
    line = coldstart.table(tmp_path)
    assert "commit aaa1111" in line and "`cold_start.csv` holds its 3 rows" in line and "|" not in line


def test_an_error_in_the_process_is_recorded_with_its_last_line():
    lines, status, *_ = coldstart.run_process("raise SystemExit('part 9 has no kernel')", timeout=60)
    assert status == "error: part 9 has no kernel" and lines == []


def test_the_defaults_and_the_jobs_they_make():
    args = coldstart.arguments([], compiled=False)
    triton_parts = [n for n in coldstart.parts.available() if coldstart.parts.uses_triton(n)]
    assert args.part == triton_parts and (args.dtype, args.shape, args.causal) == (
        ("fp32", "fp16"),
        ("small",),
        (False, True),
    )
    jobs = coldstart.jobs(args)  # every part x dtype x causal, then the four calls per part
    assert len(jobs) == len(triton_parts) * 5 and jobs[-1]["scenario"] == coldstart.FOUR
    gpu = coldstart.arguments([], compiled=True)
    assert (gpu.dtype, gpu.shape) == (("fp32", "fp16", "bf16"), ("small", "bench"))
    args = coldstart.arguments(["--part", "2", "--dtype", "fp16", "--causal", "1", "--parallel", "4"], compiled=False)
    assert [j["scenario"] for j in coldstart.jobs(args)] == [coldstart.ONE]  # no fp32: no four calls


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "bf16"], "need a GPU"),
        (["--part", "9"], "part 9 does not exist"),
        (["--parallel", "0"], "--parallel must be 1 or more"),
        (["--autotune"], "--autotune needs --part N"),
    ],
)
def test_bad_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        coldstart.arguments(argv, compiled=False)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_autotune_without_a_gpu_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    if COMPILED:
        pytest.skip("on a GPU --autotune measures (minutes)")
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    assert coldstart.main(["--autotune", "--part", "2"]) == 0
    assert "on a GPU" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_the_tables_are_registered_for_the_readmes():
    assert report.all_tables(report.part_reports())["cold-start"] is coldstart.table


@pytest.mark.skipif(COMPILED, reason="the interpreter's case")
def test_compile_together_under_the_interpreter_compiles_nothing_and_starts_no_thread():
    """Nothing compiles under the interpreter: compile_together, ahead or not, neither asks for the
    launches nor starts the background thread, and remembers the class (a later call returns at once)."""
    import threading

    import torch

    from common import triton_tools

    asked, seen = [], {}
    triton_tools.compile_together(lambda: asked.append(1) or [], seen, "class", ahead=torch.device("cpu"))
    triton_tools.compile_together(lambda: asked.append(1) or [], seen, "class")
    assert seen == {"class": None} and asked == []
    assert not any(t.name.startswith("compile-ahead") for t in threading.enumerate())


def test_ahead_makes_a_blank_only_when_it_runs_the_function(monkeypatch):
    """launch.ahead runs fn once per signature, a Blank made into a tensor of its shape and dtype on
    the first tensor's device; the same call again runs nothing (and so allocates nothing)."""
    import torch

    from common import launch, runtime

    monkeypatch.setattr(runtime, "INTERPRET", False)  # the interpreter's ahead() returns at once
    seen, q = [], torch.zeros(2, 3, 5, 4)
    fn = lambda *args: seen.append(args)  # noqa: E731
    for _ in range(2):
        launch.ahead(fn, q, launch.Blank((2, 3, 5), torch.float32), True)
    assert len(seen) == 1
    _, blank, flag = seen[0]
    assert (blank.shape, blank.dtype, blank.device, flag) == ((2, 3, 5), torch.float32, q.device, True)


def test_descriptor_scratch_is_a_new_buffer_every_launch():
    """Triton's scratch allocator (common.runtime) gives each launch a buffer of its own: one kept
    across launches would, when first made inside a compiled model's CUDA-graph warm-up, live in the
    graph's memory pool untracked, and torch.compile(mode="reduce-overhead") fails (as one kept per
    stream did; tests/test_model.py's CUDA-graphs test runs the model on a GPU)."""
    import torch

    from common import runtime

    first = runtime._descriptor_scratch(384, 128, 7)
    assert first.numel() == 384 and first.dtype == torch.int8
    again = runtime._descriptor_scratch(384, 128, 7)
    assert again is not first and again.numel() == 384


@pytest.mark.skipif(not COMPILED, reason="compiles for a GPU")
def test_compile_together_compiles_every_configuration_before_the_launch(tmp_path):
    """common/triton_tools.compile_together on a toy autotuned kernel, in a fresh process (a first
    call's situation): both configurations compiled in the pool's threads, not the caller's, before
    any launch; the launch that follows compiles nothing more and gives the right answer; a second
    call of the same shape class compiles nothing."""
    import json
    import os
    import subprocess
    import sys

    from common import ROOT

    script = tmp_path / "compile_together.py"  # a file: Triton reads a jit function's source
    script.write_text(COMPILE_TOGETHER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == dict(ahead=2, on_caller=0, cached=2, after_launch=2, right=True, again=2), seen


COMPILE_TOGETHER = """
import json, threading
from common import triton_tools  # first: common.runtime sets Triton up before triton loads
import torch, triton, triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=4)], key=["n"])
@triton.jit
def _double(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, 2 * tl.load(X + offs, mask=offs < n), mask=offs < n)

x = torch.arange(1000, device="cuda", dtype=torch.float32)
y = torch.empty_like(x)
fn = triton_tools.jit_function(_double)
cache = fn.device_caches[x.device.index][0]  # 3.6 to 3.9: (kernel cache, ...) per device; made here
threads, compile_ = [], fn.compile
fn.compile = lambda *a, **k: threads.append(threading.get_ident()) or compile_(*a, **k)
seen, calls = {}, [(_double, (x, y, x.numel()), {})]
triton_tools.compile_together(calls, seen, "class")
ahead, cached = len(threads), len(cache)
_double[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
after_launch = len(threads)
triton_tools.compile_together(calls, seen, "class")
print(json.dumps(dict(ahead=ahead, on_caller=threads.count(threading.get_ident()), cached=cached,
                      after_launch=after_launch, right=bool(torch.equal(y, 2 * x)), again=len(threads))))
"""


@pytest.mark.skipif(not COMPILED, reason="compiles for a GPU")
@pytest.mark.only_parts(4, 5)
@pytest.mark.parametrize("dtype, causal", [("float32", 1), ("bfloat16", 0), ("bfloat16", 1)])
def test_the_backward_compiles_ahead_while_the_forward_runs(part, dtype, causal, tmp_path):
    """Parts 4 and 5: a forward whose inputs want gradients starts compiling the backward's kernels
    on a background thread (common.launch.ahead), in a fresh process with an empty Triton cache:
    the forward started one such compile (it may have finished by the time the forward returns,
    since it began before the forward's own); the backward that follows waits for it, and
    every backward kernel is compiled by compile_together's pool (none on the caller's thread or
    autograd's); the gradients pass the float64 check. Part 5's bf16 calls go to its Gluon
    backward, its float32 call to part 4's kernels."""
    import json
    import os
    import subprocess
    import sys

    from common import ROOT

    script = tmp_path / "ahead.py"
    script.write_text(AHEAD)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, str(script), str(part), dtype, str(causal)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["started"] == 1 and seen["compiles"] >= 3 and seen["elsewhere"] == [], seen
    assert seen["check"].startswith("ok"), seen
    assert seen["route"] == ("gluon" if (part, dtype) == (5, "bfloat16") else "tl"), seen


AHEAD = """
import json, sys, threading
from common import launch, parts, triton_tools  # first: common.runtime sets Triton up before triton loads
import torch
from common.check import check_outputs, verdict
from common.inputs import Shape, make_inputs

part, dtype, causal = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3] == "1"
m = parts.load(part)
kernels = [m._attn_bwd_preprocess, m._attn_bwd_dkdv, m._attn_bwd_dq]
if part == 5:
    from part5_profiling import gluon_backward as g
    kernels += [g._bwd_prepare, g._attn_bwd_gluon, g._dq_convert]
threads = []
for kernel in kernels:  # every compile of a backward kernel, by the name of its thread
    fn = triton_tools.jit_function(kernel)
    fn.device_caches[torch.cuda.current_device()]  # 3.6 to 3.9: makes the per-device cache and fn.compile
    fn.compile = lambda *a, _compile=fn.compile, **k: threads.append(threading.current_thread().name) or _compile(*a, **k)
q, k, v, do = make_inputs(Shape((2, 3), 256, 256, 64), dtype, "cuda")
leaves = [t.clone().requires_grad_() for t in (q, k, v)]
o = m.FlashAttention.apply(*leaves, causal)
started = launch.ahead_started()  # compiles started on the background thread
dq, dk, dv = torch.autograd.grad(o, leaves, do)  # waits for the compile under way, launches
route = m.backward_label() if part == 5 else "tl"
report = check_outputs(dict(O=o.detach(), dQ=dq, dK=dk, dV=dv), q, k, v, do, causal)
print(json.dumps(dict(started=started, compiles=len(threads), elsewhere=[t for t in threads if not t.startswith("compile-together")],
                      check=verdict(report), route=route)))
"""


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
    ],
)
def test_results_folder_names_the_gpu_alone(monkeypatch, name, slug):
    """results/<gpu>/ is the GPU's short name: an H100 80GB HBM3's results go to results/h100/."""
    from common import runtime

    monkeypatch.setattr(runtime, "gpu_name", lambda: name)
    assert runtime.gpu_slug() == slug
