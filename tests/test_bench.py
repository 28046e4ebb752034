"""The benchmark's own logic, on the CPU: FLOP count, check-before-time in every mode, what each mode
times, the results CSV, and the command line's answer to a bad flag."""

import dataclasses

import pytest
import torch

from common import parts
from common.inputs import Shape, make_inputs
from lab import bench, impls, results, study, timing
from tests.helpers import DEVICE, needs_gpu


def test_flop_count():
    # Two matmuls of 2*N_q*N_k*D each per (batch, head): 4 * 4*8 * 4096*4096 * 64 = 137438953472.
    assert timing.attention_flops(4, 8, 4096, 4096, 64, False) == 137438953472
    assert timing.attention_flops(4, 8, 4096, 4096, 64, True) == 137438953472 // 2
    # 1*1*10*10*16*4 = 6400 for the forward; the backward counts 2.5 times that, fwd+bwd 3.5 times.
    assert timing.attention_flops(1, 1, 10, 10, 16, False, "bwd") == 16000
    assert timing.attention_flops(1, 1, 10, 10, 16, False, "fwd+bwd") == 22400


def _inputs():
    return make_inputs(Shape((2, 3), 40, 40, 32), torch.float32, DEVICE, seed=4)


def _row():
    return dict(impl="x", part="", B=2, H=3, N=40, D=32, dtype="fp32", causal=1, mode="fwd")


def _counting(impl):
    """impl, with a count of how often its differentiable forward (the timed call) runs."""
    calls = []

    def attention(*args):
        calls.append(1)
        return impl.attention(*args)

    return dataclasses.replace(impl, attention=attention), calls


@pytest.mark.parametrize("mode", bench.MODES)
def test_a_part_is_checked_then_timed_in_each_mode(part, mode):
    q, k, v, do = _inputs()
    impl, calls = _counting(impls.part_impl(part))
    timed = []

    def timer(fn):  # runs the timed call twice, as a real timer would, and counts forwards per call
        before = len(calls)
        out = [fn(), fn()]
        timed.append((len(calls) - before, out))
        return 2.0

    row = bench.measure(_row(), impl, mode, q, k, v, do, True, timer, lambda fn: 1.0)
    checked = ["O", "L"] if mode == "fwd" else ["O", "dQ", "dK", "dV"]
    assert row["check"].startswith("ok") and [w.split("=")[0] for w in row["check"].split()[1:]] == checked
    assert float(row["ms"]) == 2.0
    assert row["tflops"] == f"{timing.attention_flops(2, 3, 40, 40, 32, True, mode) / 2.0 * 1e-9:.1f}"
    # PyTorch loops (part 0's forward, the backward of parts 0-3) are never graph-timed
    pytorch = not parts.uses_triton(part) or (mode != "fwd" and impl.backward_max_n is not None)
    assert row["graph_ms"] == ("" if pytorch else "1.0000")
    forwards, out = timed[0]
    # fwd and fwd+bwd run the forward on every call; bwd only re-runs the backward of one forward.
    assert forwards == {"fwd": 2, "fwd+bwd": 2, "bwd": 0}[mode]
    if mode != "fwd":
        assert len(out[1]) == 3 and torch.equal(out[0][0], out[1][0])  # dQ, dK, dV, the same each call


def test_a_wrong_forward_is_not_timed():
    q, k, v, do = _inputs()
    timed = []
    # Non-causal attention passed off as causal.
    wrong = impls.Impl(name="x", forward=lambda q, k, v, c: {"O": impls.sdpa(q, k, v, False)}, attention=impls.sdpa)
    row = bench.measure(_row(), wrong, "fwd", q, k, v, do, True, lambda fn: timed.append(fn) or 1.0)
    assert row["check"].startswith("FAIL") and row["ms"] == "" and not timed


@pytest.mark.only_parts(1)
def test_l_is_checked_through_flash_forward_and_the_last_slice_counts(part):
    """O right and L off by 1e-3 is a failure; so is a wrong last (batch, head) slice alone."""
    q, k, v, do = _inputs()
    good = impls.part_impl(part)
    forward = lambda *a: dict(good.forward(*a), L=good.forward(*a)["L"] + 1e-3)  # noqa: E731
    report = bench.check(dataclasses.replace(good, forward=forward), "fwd", q, k, v, do, True)
    assert [c.ok for c in report] == [True, False]

    def last_wrong(q, k, v, c):
        o = impls.sdpa(q, k, v, c).clone()
        o[-1, -1] += 1e-2
        return {"O": o}

    report = bench.check(impls.Impl(name="x", forward=last_wrong, attention=impls.sdpa), "fwd", q, k, v, do, True)
    assert not report.ok and [c.name for c in report] == ["O"]


def test_default_backend_is_named():
    q, k, v, _ = make_inputs(Shape((1, 2), 16, 16, 16), torch.float32, DEVICE)
    assert impls.dispatched_backend(impls.sdpa_fn("default", q, k, v, False)) in {"flash", "cudnn", "efficient", "math"}
    with impls.sdpa_context("math"):
        assert impls.dispatched_backend(impls.sdpa_fn("math", q, k, v, False)) == "math"


def test_rows_replace_same_key_in_bench_order(tmp_path):
    path = tmp_path / "bench.csv"

    def row(impl, n, mode="fwd", ms="1"):
        part = impl[4:] if impl.startswith("part") else ""
        return dict(impl=impl, part=part, B=4, H=8, N=n, D=64, dtype="bf16", causal=0, mode=mode, ms=ms)

    def write(rows):
        results.write_csv(path, rows, bench.FIELDS, key=bench.KEY, sort=bench.row_order)

    write([row("sdpa_flash", 512), row("part10", 512), row("part1", 512, ms="2"), row("part1", 512, "bwd")])
    write([row("part1", 512, ms="3"), row("part1", 1024, ms="4"), row("sdpa_cudnn", 512, "fwd+bwd")])
    got = [(r["mode"], r["impl"], r["N"], r["ms"]) for r in results.read_csv(path)]
    # Modes in the benchmark's order, parts by number (10 after 1), then SDPA's backends; N last.
    assert got == [
        ("fwd", "part1", 512, 3),
        ("fwd", "part1", 1024, 4),
        ("fwd", "part10", 512, 1),
        ("fwd", "sdpa_flash", 512, 1),
        ("fwd+bwd", "sdpa_cudnn", 512, 1),
        ("bwd", "part1", 512, 1),
    ]


def test_repeated_runs_keep_every_run_and_bench_csv_the_last(tmp_path):
    path = tmp_path / "bench.csv"

    def row(impl, ms):
        return dict(impl=impl, part="", B=4, H=8, N=4096, D=64, dtype="bf16", causal=0, mode="fwd", ms=ms)

    for run, ms in ((1, "1"), (2, "2"), (3, "3")):
        bench.save_run(path, [row("sdpa_cudnn", ms), row("part5", ms)], run, repeat=3)
    bench.save_run(path, [row("part5", "5")], 2, repeat=3)  # a later repeat's run 2 replaces run 2's row of its key
    runs = results.read_csv(tmp_path / "bench_runs.csv")
    got = [(r["run"], r["impl"], r["ms"]) for r in runs]
    assert got == [
        (1, "part5", 1),
        (1, "sdpa_cudnn", 1),
        (2, "part5", 5),
        (2, "sdpa_cudnn", 2),
        (3, "part5", 3),
        (3, "sdpa_cudnn", 3),
    ]
    assert {(r["impl"], r["ms"]) for r in results.read_csv(path)} == {("part5", 5), ("sdpa_cudnn", 3)}
    # A repeat of two runs: the keys it measures lose the third run an earlier repeat left; others keep it.
    bench.save_run(path, [row("part5", "7")], 1, repeat=2)
    runs = results.read_csv(tmp_path / "bench_runs.csv")
    assert [(r["run"], r["impl"], r["ms"]) for r in runs if r["run"] == 3] == [(3, "sdpa_cudnn", 3)]
    bench.save_run(tmp_path / "once" / "bench.csv", [row("part5", "1")])  # no --repeat: no runs file
    assert not (tmp_path / "once" / "bench_runs.csv").exists()


@pytest.mark.parametrize("argv, message", [(["--repeat", "0"], "--repeat"), (["--part", "99"], "part 99")])
def test_a_bad_flag_is_one_line_and_exit_2(argv, message, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_pytorch_backwards_are_timed_only_where_they_finish():
    """Parts 0-3 run the tiled PyTorch backward (part 4 writes it in Triton): the benchmark times
    their backward modes up to PYTORCH_BACKWARD_MAX_N and without a CUDA graph; a Triton backward
    runs everywhere."""
    n = impls.PYTORCH_BACKWARD_MAX_N
    for part in parts.available():
        impl = impls.part_impl(part)
        pytorch_backward = part <= 3
        assert parts.pytorch_backward(parts.load(part)) == pytorch_backward
        assert impl.runs("bwd", 2 * n) == impl.runs("fwd+bwd", 2 * n) == (not pytorch_backward)
        assert impl.runs("bwd", n) == (impl.max_n is None or n <= impl.max_n)
        assert impl.backward_graph == (parts.uses_triton(part) and not pytorch_backward)


@pytest.mark.only_parts(3)
def test_forward_row_checks_before_it_times(part, monkeypatch):
    """The studies' shared step (ablation, launch orders, candidates): a right forward is checked,
    then timed both ways; a wrong one is not timed at all."""
    timed = []
    monkeypatch.setattr(study, "time_ms", lambda fn: timed.append("do_bench") or 2.0)
    monkeypatch.setattr(study, "graph_time_ms", lambda fn: timed.append("graph") or 1.0)
    q, k, v, _ = _inputs()
    forward = parts.load(part).flash_forward
    row = study.forward_row(forward, q, k, v, True)
    assert row["check"].startswith("ok") and timed == ["do_bench", "graph"]
    assert (row["ms"], row["graph_ms"]) == ("2.0000", "1.0000")
    assert row["graph_tflops"] == f"{timing.attention_flops(2, 3, 40, 40, 32, True) / 1.0 * 1e-9:.1f}"
    timed.clear()
    assert study.forward_row(forward, q, k, v, True, do_bench=False)["ms"] == "" and timed == ["graph"]
    timed.clear()
    row = study.forward_row(lambda q, k, v, c: forward(q, k, v, not c), q, k, v, True)
    assert row["check"].startswith("FAIL O ") and not timed and row["graph_ms"] == ""  # "O <err><=<bound> FAIL"


# Run eagerly on purpose (the benchmark compiles it): flex_attention warns, once, that it is.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_flex_attention_is_checked_like_sdpa(monkeypatch):
    """FlexAttention's causal mask is top-left aligned like everything else: its O and gradients pass
    the same checks (run eagerly here; the benchmark compiles it)."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(impls, "_flex", lambda: flex_attention)
    impls._block_mask.cache_clear()
    q, k, v, do = make_inputs(Shape((1, 2), 48, 48, 16), torch.float32, "cpu", seed=9)
    impl = impls.flex_impl()
    modes = ("fwd", "fwd+bwd") if torch.cuda.is_available() else ("fwd",)  # no Flex backward on a CPU
    q, k, v, do = (t.to(DEVICE) for t in (q, k, v, do))
    for causal in (False, True):
        for mode in modes:
            report = bench.check(impl, mode, q, k, v, do, causal)
            assert report.ok, f"causal={causal} {mode}: {report}"
    assert impls.impl_label(impls.FLEX) == "FlexAttention"


def test_fa4_is_an_optional_baseline(monkeypatch):
    """--fa4's FlashAttention-4: no impl (so no rows) where flash-attn-4 does not import; where it does,
    its flash_attn_func gets (B, N, H, D) views of the (B, H, N, D) tensors and O comes back as
    (B, H, N, D); its rows sort after FlexAttention's."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import fails, as where it is not installed
    assert impls.fa4_impl() is None

    def flash_attn_func(q, k, v, causal=False):  # a stand-in with FA4's layout and return value
        assert q.shape[2] == 3 and q.stride(-1) == 1  # (B, N, H, D), heads third, no copy
        o = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
        return o.transpose(1, 2), None

    monkeypatch.setitem(sys.modules, "flash_attn.cute", types.SimpleNamespace(flash_attn_func=flash_attn_func))
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))
    impl = impls.fa4_impl()
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(impl.forward(q, k, v, causal)["O"], want)
    rows = [
        dict(mode="fwd", D=64, causal=0, N=512, impl=name) for name in (impls.FA4, impls.FLEX, "sdpa_math", "part2")
    ]
    assert [r["impl"] for r in sorted(rows, key=bench.row_order)] == ["part2", "sdpa_math", impls.FLEX, impls.FA4]
    assert impls.impl_label(impls.FA4) == "FlashAttention-4"


@pytest.mark.parametrize(
    "first_two, path",
    [((1.0, 1.0), "do_bench"), ((900.0, 2.0), "do_bench"), ((900.0, 800.0), "slow")],
    ids=["fast", "slow only while compiling", "slow"],
)
def test_time_ms_picks_the_timer_by_call_length(monkeypatch, first_two, path):
    """do_bench for calls under SLOW_MS (the second try decides, as the first may compile);
    for longer calls, the median of SLOW_SAMPLES single calls each after an L2 flush."""
    import triton

    script = iter([*first_two, 700.0, 300.0, 500.0])
    flushed = []
    monkeypatch.setattr(timing, "one_call_ms", lambda fn, flush=None: flushed.append(flush is not None) or next(script))
    monkeypatch.setattr(timing.torch, "empty", lambda *a, **k: torch.zeros(1))  # the flush buffer, not on a GPU here
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: 1.5)
    ms = timing.time_ms(lambda: None)
    if path == "do_bench":
        assert ms == 1.5 and not any(flushed)
    else:
        assert ms == 500.0 and flushed == [False, False, True, True, True]


@needs_gpu
@pytest.mark.gpu
def test_slow_calls_are_timed_three_times_after_two():
    """On a GPU: a call of about 60 ms is made 2 + SLOW_SAMPLES times in all, not do_bench's 8."""
    calls = []

    def slow():
        calls.append(1)
        torch.cuda._sleep(120_000_000)  # GPU cycles: 60 ms at 2 GHz, longer at lower clocks

    assert timing.time_ms(slow) > 0 and len(calls) == 2 + timing.SLOW_SAMPLES


def test_run_gpu_visits_only_the_shapes_asked_for_and_saves_the_columns_the_report_reads(monkeypatch, tmp_path):
    """--d and --causal pick part of the grid (to fill a gap without re-running all of it); each shape's
    rows are saved as they come, with every column the report reads."""
    seen = []

    def fake_measure(row, impl, mode, q, k, v, do, causal):
        seen.append((q.shape[-1], causal, q.shape[-2], mode))
        return dict(row, check="ok", ms="1.0", tflops="2.0", graph_ms="", graph_tflops="", backend="")

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "B", 1)
    monkeypatch.setattr(bench, "H", 1)
    impl = impls.Impl(name="part1", forward=None, attention=None, part=1)
    path = tmp_path / "bench.csv"
    rows = bench.run_gpu([impl], ["fwd", "bwd"], [16, 32], lambda rows: bench.save_run(path, rows), (128,), (True,))
    assert seen == [(128, True, n, m) for n in (16, 32) for m in ("fwd", "bwd")] and len(rows) == 4
    written = results.read_csv(path)
    read_by_report = set("impl part N D causal mode ms tflops graph_tflops check backend run_id".split())
    assert len(written) == 4 and read_by_report | set(results.PROVENANCE) <= set(written[0])


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["part", "sdpa_flash"])
def test_lone_backward_replays_from_a_cuda_graph(name):
    """The bwd mode's call (a backward re-run on a retained graph) can be captured and replayed: its
    forward ran on a stream of its own, not on the legacy default stream."""
    triton_parts = [n for n in parts.available() if not parts.pytorch_backward(parts.load(n))]
    if name == "part" and not triton_parts:
        pytest.skip("no part with a Triton backward yet")
    impl = impls.part_impl(triton_parts[-1]) if name == "part" else impls.sdpa_impl("flash")
    q, k, v, do = make_inputs(Shape((2, 4), 512, 512, 64), torch.bfloat16, "cuda", seed=1)
    with impl.context():
        assert timing.graph_time_ms(bench.timed_call(impl, "bwd", q, k, v, do, True)) > 0
