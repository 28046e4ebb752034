"""The benchmark's own logic, on the CPU: FLOP count, check-before-time, the results CSV."""

import csv

import torch

from common import bench
from common.inputs import Shape, make_inputs
from tests.helpers import DEVICE


def test_flop_count():
    assert bench.attention_flops(4, 8, 4096, 4096, 64, False) == 4 * 4 * 8 * 4096 * 4096 * 64
    assert bench.attention_flops(4, 8, 4096, 4096, 64, True) == 2 * 4 * 8 * 4096 * 4096 * 64
    assert bench.attention_flops(1, 1, 10, 10, 16, False, "fwd+bwd") == 3.5 * 4 * 10 * 10 * 16


def _row(impl, n, **extra):
    return dict(impl=impl, part="", B=4, H=8, N=n, D=64, dtype="bf16", causal=0, mode="fwd", **extra)


def test_measure_checks_before_timing(part):
    q, k, v, _ = make_inputs(Shape((2, 3), 40, 40, 32), torch.float32, DEVICE, seed=4)
    timed = []
    row = bench.measure(
        _row(f"part{part}", 40), lambda: None, q, k, v, True, lambda fn: timed.append(fn) or 2.0, lambda fn: 1.0
    )
    assert row["check"].startswith("ok"), row["check"]
    assert timed and float(row["ms"]) == 2.0 and float(row["graph_ms"]) == 1.0
    assert row["tflops"] == f"{bench.attention_flops(2, 3, 40, 40, 32, True) / 2.0 * 1e-9:.1f}"


def test_wrong_output_is_not_timed():
    q, k, v, _ = make_inputs(Shape((2, 3), 40, 40, 32), torch.float32, DEVICE, seed=4)
    timed = []
    wrong = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)  # noqa: E731
    row = bench.measure(_row("sdpa_math", 40), wrong, q, k, v, True, lambda fn: timed.append(fn) or 1.0)
    assert row["check"].startswith("FAIL") and row["ms"] == "" and not timed


def test_default_backend_is_named():
    q, k, v, _ = make_inputs(Shape((1, 2), 16, 16, 16), torch.float32, DEVICE)
    assert bench.dispatched_backend(bench.sdpa_fn("default", q, k, v, False)) in {"flash", "cudnn", "efficient", "math"}
    with bench.sdpa_context("math"):
        assert bench.dispatched_backend(bench.sdpa_fn("math", q, k, v, False)) == "math"


def test_rows_replace_same_key(tmp_path):
    path = tmp_path / "bench.csv"
    bench.write_rows([_row("sdpa_flash", 512, ms="1"), _row("part1", 512, ms="2")], path)
    bench.write_rows([_row("part1", 512, ms="3"), _row("part1", 1024, ms="4")], path)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [(r["impl"], r["N"], r["ms"]) for r in rows] == [
        ("part1", "512", "3"),
        ("part1", "1024", "4"),
        ("sdpa_flash", "512", "1"),
    ]
