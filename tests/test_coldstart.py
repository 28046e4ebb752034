"""The cold-start benchmark (common/coldstart.py): a real cold run of part 1 through its own fresh
processes, the table from a synthetic file holding two commits, a process killed at its timeout,
and the command line."""

import time

import pytest

from common import coldstart, report, results
from common.runtime import COMPILED

META = dict(torch="2.x", triton="3.x", command="python -m common.coldstart", parallel=1, timeout=600)


def _read(tmp_path):
    return results.read_csv(tmp_path / coldstart.FILENAME)


def _step(rows, scenario, step, causal=0):
    (row,) = [r for r in rows if r["scenario"] == scenario and r["step"] == step and r["causal"] == causal]
    return row


@pytest.mark.only_parts(1)
def test_a_cold_run_of_part1_writes_its_steps(part, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    argv = ["--part", "1", "--dtype", "fp32", "--causal", "0", "--shape", "small", "--parallel", "2"]
    assert coldstart.main(argv) == 0
    rows = _read(tmp_path)
    one = [r for r in rows if r["scenario"] == coldstart.ONE]
    assert [r["step"] for r in one] == [
        "import torch",
        "import part",
        "first forward",
        "first backward",
        "second call",
        "process",
    ]
    four = [r for r in rows if r["scenario"] == coldstart.FOUR]
    assert [(r["step"], r["causal"]) for r in four] == [
        ("first forward", 0),
        ("first backward", 0),
        ("first forward", 1),
        ("first backward", 1),
        ("import torch", None),
        ("import part", None),
        ("four calls", None),
        ("process", None),
    ]
    for r in rows:
        assert r["part"] == 1 and r["dtype"] == "fp32" and r["shape"] == "small"
        assert (r["B"], r["H"], r["N"], r["D"]) == (4, None, 128, 64)
        assert r["seconds"] > 0 and r["status"] == "ok" and r["parallel"] == 2
        assert r["commit"] == results.commit() and r["gpu"] == results.provenance()["gpu"]
        assert r["device"] == ("cuda" if COMPILED else "cpu, interpreter")
    four_calls = [r["seconds"] for r in four if r["step"] in ("first forward", "first backward")]
    assert sum(four_calls) <= _step(rows, coldstart.FOUR, "four calls", None)["seconds"]
    assert _step(rows, coldstart.ONE, "import part")["seconds"] < _step(rows, coldstart.ONE, "process")["seconds"]
    first, second = (_step(rows, coldstart.ONE, s)["seconds"] for s in ("first forward", "second call"))
    binaries = _step(rows, coldstart.ONE, "process")["binaries"]
    if COMPILED:  # the first forward compiles part 1's kernel; the second call finds it compiled
        assert binaries > 0 and first > second
    else:  # the interpreter compiles nothing
        assert binaries == 0


def test_a_fresh_process_gets_a_new_empty_cache():
    code = (
        "import json, os; d = os.environ['TRITON_CACHE_DIR']; "
        "open(os.path.join(d, 'mine'), 'w').close(); "
        f"print({coldstart.MARK!r} + json.dumps(dict(cache=d, files=sorted(os.listdir(d)), cwd=os.getcwd())))"
    )
    a, b = (coldstart.run_process(code, timeout=60) for _ in range(2))
    assert a.status == b.status == "ok"
    assert a.lines[0]["files"] == b.lines[0]["files"] == ["mine"]  # empty before it wrote
    assert a.lines[0]["cache"] != b.lines[0]["cache"]
    assert a.lines[0]["cwd"] == str(coldstart.ROOT)


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
    assert time.perf_counter() - start < 20
    assert ran.status.startswith("timeout: killed after") and "limit 2 s" in ran.status
    assert 2 <= ran.seconds < 20
    job = dict(part=3, scenario=coldstart.ONE, dtype="fp32", shape="small", causal=1)
    rows = coldstart.job_rows(job, ran)
    assert [(r["step"], r["status"]) for r in rows] == [
        ("import torch", "ok"),
        ("import part", "ok"),
        ("process", ran.status),
    ]
    assert float(rows[-1]["seconds"]) == pytest.approx(ran.seconds, rel=1e-5)
    # In the table, the steps it never reached say so, with the limit the run was given.
    meta = dict(META, gpu="NVIDIA H200", commit="aaa1111", date="2026-01-01T00:00:00Z", device="cuda", timeout=2)
    results.write_csv(tmp_path / coldstart.FILENAME, [{**meta, **r} for r in rows], coldstart.FIELDS)
    killed = "> 2 (killed)"
    assert f"| 3 | fp32 | yes | (4, 128, 64) | {killed} | {killed} | {killed} |" in coldstart.table(tmp_path)
    results.write_csv(tmp_path / coldstart.FILENAME, [{**meta, **r, "timeout": ""} for r in rows], coldstart.FIELDS)
    assert "| 3 | fp32 | yes | (4, 128, 64) | timed out | timed out | timed out |" in coldstart.table(tmp_path)


def test_an_error_in_the_process_is_recorded_with_its_last_line():
    ran = coldstart.run_process("raise SystemExit('part 9 has no kernel')", timeout=60)
    assert ran.status == "error: part 9 has no kernel" and ran.lines == []


def _synthetic(tmp_path, gpu="NVIDIA H200"):
    """Two commits of cold_start.csv: before (slow float32 first calls), after (fast)."""
    rows = []
    for commit, date, scale in (("bef0001", "2026-01-01T00:00:00Z", 10), ("aft0002", "2026-01-02T00:00:00Z", 1)):
        meta = dict(META, gpu=gpu, commit=commit, date=date, device="cuda")
        for part in (1, 2):
            for dtype in ("fp32", "fp16"):
                for causal in (0, 1):
                    group = dict(part=part, scenario=coldstart.ONE, dtype=dtype, shape="small", causal=causal)
                    big = scale if dtype == "fp32" else 1
                    seconds = {
                        "import part": 0.5,
                        "first forward": big * (4 + part + causal / 2),
                        "first backward": 0.25 * part,
                        "second call": 0.001,
                        "process": big * 8,
                    }
                    rows += [dict(meta, **group, step=s, seconds=x, status="ok") for s, x in seconds.items()]
            four = dict(part=part, scenario=coldstart.FOUR, dtype="fp32", shape="small", causal="")
            rows += [
                dict(meta, **four, step="four calls", seconds=scale * 20 * part, status="ok"),
                dict(meta, **four, step="process", seconds=scale * 25 * part, status="ok"),
            ]
            # the four-call process's own per-call rows (causal 0 and 1), which the summary must not take
            rows += [
                dict(meta, **four | dict(causal=causal), step=step, seconds=0.01, status="ok")
                for causal in (0, 1)
                for step in ("first forward", "first backward")
            ]
    path = results.write_csv(tmp_path / coldstart.FILENAME, rows[::-1], coldstart.FIELDS, sort=coldstart.order)
    return path


def test_the_table_shows_two_commits_side_by_side(tmp_path):
    _synthetic(tmp_path)
    table = coldstart.table(tmp_path)
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in lines[:10]}) == 1  # well formed
    assert lines[0] == (
        "| part | dtype | causal | shape | first forward, bef0001 | first forward, aft0002 | first backward, bef0001 "
        "| first backward, aft0002 | second call, bef0001 | second call, aft0002 |"
    )
    # part 2, fp32, causal: first forward 10 * 6.5 before, 6.5 after; backward 0.5 both times.
    assert "| 2 | fp32 | yes | (4, 128, 64) | 65 | 6.5 | 0.5 | 0.5 | 0.001 | 0.001 |" in lines
    assert "| 1 | fp16 | no | (4, 128, 64) | 5 | 5 | 0.25 | 0.25 | 0.001 | 0.001 |" in lines
    assert (
        len([line for line in lines if line.startswith(("| 1 |", "| 2 |"))]) == 8 + 2
    )  # 8 processes + 2 four-call lines
    # The four calls: import (absent here: a dash), the calls, the process, before and after.
    assert "| 2 | — | — | 400 | 40 | 500 | 50 |" in lines
    assert "empty" in table and "TRITON_CACHE_DIR" in table
    assert "Before and after: commit bef0001, then aft0002." in table
    assert "interpreter" not in table  # on a GPU
    assert "commit aft0002, bef0001" in table.splitlines()[0]  # the provenance line names both


def test_the_summary_shows_the_newest_commit_per_part_and_dtype(tmp_path):
    _synthetic(tmp_path)
    summary = coldstart.summary(tmp_path)
    lines = [line for line in summary.splitlines() if line.startswith("|")]
    # bf16 never ran: no column
    assert lines[0] == "| part | fp32, first forward + backward | fp16, first forward + backward | fp32, four calls |"
    # part 2 after: the slower flag is causal, 4 + 2 + 0.5 forward and 0.5 backward; before: float32 ten times slower
    assert lines[2:] == ["| 1 | 55.2 → 5.75 | 5.75 → 5.75 | 200 → 20 |", "| 2 | 65.5 → 7 | 7 → 7 | 400 → 40 |"]
    assert "as before → after (fp32, fp16 and the four calls: commit bef0001 → aft0002)" in summary
    assert "ran at once" not in summary  # one process at a time
    assert report.all_tables(report.part_reports())["cold-start-summary"] is coldstart.summary


def test_a_dtype_measured_alone_later_keeps_the_other_columns(tmp_path):
    """A third commit that measured only fp16 (as a session adding that dtype does): the fp16 column
    compares it with the commit before, the fp32 and four-call columns keep their own two commits."""
    path = _synthetic(tmp_path)
    rows = results.read_csv(path)
    later = [
        dict(r, commit="new0003", date="2026-01-03T00:00:00Z", seconds=r["seconds"] / 2)
        for r in rows
        if r["commit"] == "aft0002" and r["dtype"] == "fp16"
    ]
    results.write_csv(path, rows + later, coldstart.FIELDS, sort=coldstart.order)
    summary = coldstart.summary(tmp_path)
    lines = [line for line in summary.splitlines() if line.startswith("|")]
    assert lines[2:] == ["| 1 | 55.2 → 5.75 | 5.75 → 2.88 | 200 → 20 |", "| 2 | 65.5 → 7 | 7 → 3.5 | 400 → 40 |"]
    assert "(fp32 and the four calls: commit bef0001 → aft0002; fp16: commit aft0002 → new0003)" in summary


def test_the_summary_says_when_a_process_was_killed(tmp_path):
    path = _synthetic(tmp_path)
    rows = [r for r in results.read_csv(path) if r["commit"] == "aft0002"]
    for r in rows:
        if (r["part"], r["dtype"], r["causal"]) == (2, "fp32", 1):
            r.update(timeout=45, status="timeout: killed after 45 s (limit 45 s)" if r["step"] == "process" else "ok")
    rows = [r for r in rows if not ((r["part"], r["dtype"], r["causal"]) == (2, "fp32", 1) and "first" in r["step"])]
    results.write_csv(path, rows, coldstart.FIELDS)
    assert "| 2 | > 45 | 7 | 40 |" in coldstart.summary(tmp_path)  # the newest commit alone: no arrows


def test_one_commit_has_one_column_per_step_and_a_cpu_says_interpreter(tmp_path):
    rows = [r for r in results.read_csv(_synthetic(tmp_path, gpu="cpu")) if r["commit"] == "aft0002"]
    results.write_csv(tmp_path / coldstart.FILENAME, rows, coldstart.FIELDS)
    table = coldstart.table(tmp_path)
    assert "| part | dtype | causal | shape | first forward | first backward | second call |" in table
    assert "| 2 | fp32 | yes | (4, 128, 64) | 6.5 | 0.5 | 0.001 |" in table
    assert "interpreter" in table and "compiles nothing" in table and "Before and after" not in table


def test_rows_merge_by_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    group = dict(part=1, scenario=coldstart.ONE, dtype="fp32", shape="small", causal=0, step="first forward")

    def row(commit, seconds):
        return dict(META, gpu="cpu", commit=commit, date="2026-01-01T00:00:00Z", **group, seconds=seconds)

    coldstart.write([row("aaa1111", 1.0)])
    coldstart.write([row("bbb2222", 2.0)])  # another commit: side by side
    coldstart.write([row("aaa1111", 3.0)])  # the same commit again: replaced
    assert sorted((r["commit"], r["seconds"]) for r in _read(tmp_path)) == [("aaa1111", 3.0), ("bbb2222", 2.0)]


def test_commits_are_compared_only_with_runs_alike():
    """A process sharing the CPU compiles slower: the tables set the newest commit beside the latest
    earlier one measured with as many processes at once, or beside none."""

    def rows(commit, parallel, day):
        return [dict(commit=commit, parallel=parallel, date=f"2026-01-0{day}T00:00:00Z")]

    found = [*rows("aaa1111", 2, 1), *rows("bbb2222", 1, 2), *rows("ccc3333", 2, 3), *rows("ddd4444", 1, 4)]
    assert coldstart._compared(found) == ["bbb2222", "ddd4444"]
    assert coldstart._compared(found[:3]) == ["aaa1111", "ccc3333"]
    assert coldstart._compared(found[:2]) == ["bbb2222"]
    assert coldstart._compared([]) == []


def test_commits_unknown_to_git_put_every_commit_in_date_order(monkeypatch):
    """Where git cannot place one commit (a copy without the newest commits, a label of one's own),
    history cannot order it against the others: every commit is then ordered by date."""
    rows = [dict(commit=c, date=f"2026-01-0{day}T00:00:00Z") for c, day in (("old", 1), ("mid", 2), ("new", 3))]
    known = {"old": 10, "mid": 11}  # "new" is unknown to this repository
    monkeypatch.setattr(coldstart, "_history_position", lambda c: known.get(c, -1))
    assert coldstart._commits_in_order(rows) == ["old", "mid", "new"]
    known["new"] = 5  # all known: history wins over the dates
    assert coldstart._commits_in_order(rows) == ["new", "old", "mid"]


def test_options():
    args = coldstart.arguments([], compiled=False)
    triton_parts = [n for n in coldstart.parts.available() if coldstart.parts.uses_triton(n)]
    assert args.part == triton_parts and 0 not in args.part
    assert (args.dtype, args.shape, args.causal) == (("fp32", "fp16"), ("small",), (False, True))
    assert (args.parallel, args.timeout, args.autotune) == (1, coldstart.DEFAULT_TIMEOUT, False)
    # jobs: every part x dtype x causal, then one four-call scenario per part
    jobs = coldstart.jobs(args)
    assert len(jobs) == len(triton_parts) * 2 * 2 + len(triton_parts)
    assert [j for j in jobs if j["scenario"] == coldstart.FOUR][0] == dict(
        part=triton_parts[0], scenario=coldstart.FOUR, dtype="fp32", shape="small", causal=""
    )

    gpu = coldstart.arguments([], compiled=True)
    assert (gpu.dtype, gpu.shape) == (("fp32", "fp16", "bf16"), ("small", "bench"))

    args = coldstart.arguments(
        ["--part", "2", "--part", "3", "--dtype", "fp16", "--causal", "1", "--parallel", "4", "--timeout", "30"],
        compiled=False,
    )
    assert (args.part, args.dtype, args.causal, args.parallel, args.timeout) == ([2, 3], ("fp16",), (True,), 4, 30)
    assert [j["scenario"] for j in coldstart.jobs(args)] == [coldstart.ONE] * 2  # no fp32: no four calls
    assert coldstart.arguments(["--autotune", "--part", "2"], compiled=True).part == [2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "bf16"], "bf16 needs a GPU"),
        (["--shape", "bench"], "--shape bench needs a GPU"),
        (["--part", "9"], "part 9 does not exist"),
        (["--parallel", "0"], "--parallel must be 1 or more"),
        (["--timeout", "0"], "--timeout positive"),
        (["--dtype", "fp64"], "invalid choice"),
        (["--autotune"], "--autotune needs --part N"),  # common/ names no part: the caller says which
    ],
)
def test_bad_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        coldstart.arguments(argv, compiled=False)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_autotune_without_a_gpu_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    if COMPILED:
        pytest.skip("on a GPU --autotune measures (minutes); here only its refusal elsewhere is tested")
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    assert coldstart.main(["--autotune", "--part", "2"]) == 0
    assert "on a GPU" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_the_table_is_registered_and_the_columns_match_results():
    assert report.all_tables(report.part_reports())["cold-start"] is coldstart.table
    assert set(coldstart.KEY) <= set(coldstart.FIELDS) and "commit" in coldstart.KEY


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
    on a background thread (compile_backward_ahead), in a fresh process with an empty Triton cache:
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
from common import parts, triton_tools  # first: common.runtime sets Triton up before triton loads
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
started = sum(f is not None for f in m._bwd_compiled.values())  # a Future: compiling on the background thread
dq, dk, dv = torch.autograd.grad(o, leaves, do)  # waits for the compile under way, launches
route = m.backward_label() if part == 5 else "tl"
report = check_outputs(dict(O=o.detach(), dQ=dq, dK=dk, dV=dv), q, k, v, do, causal)
print(json.dumps(dict(started=started, compiles=len(threads), elsewhere=[t for t in threads if not t.startswith("compile-together")],
                      check=verdict(report), route=route)))
"""
