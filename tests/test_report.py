"""The report pipeline on synthetic CSVs: plots get drawn, README blocks get filled from data."""

import csv
import json

from common import bench, report
from part2_tile_tuning import sweep


def _write(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _ms(n, d, c, tflops):
    """The time that makes this shape run at `tflops`."""
    return bench.attention_flops(4, 8, n, n, d, c) / (tflops * 1e9)


META = dict(gpu="Test GPU", torch="2.x", triton="3.x", commit="abc1234", date="2026-01-01T00:00:00Z", run_id="1")


def test_bench_plots_and_tables(tmp_path):
    rows = []
    for impl, tf in (("part1", 40.0), ("part2", 300.0), ("sdpa_flash", 280.0), ("sdpa_cudnn", 450.0)):
        for d in (64, 128):
            for c in (0, 1):
                for n in (1024, 4096):
                    rows.append(dict(impl=impl, part=impl[4:] if impl.startswith("part") else "", B=4, H=8, N=n, D=d,
                                     dtype="bf16", causal=c, mode="fwd", ms=str(_ms(n, d, c, tf + d + c + n / 1024)),
                                     graph_ms=str(_ms(n, d, c, 2 * tf)),
                                     backend="", check="ok", **META))  # fmt: skip
    _write(tmp_path / "bench.csv", bench.FIELDS, rows)
    report.plot_bench(report.read_csv(tmp_path / "bench.csv"), tmp_path)
    assert (tmp_path / "bench_tflops.png").stat().st_size > 0 and (tmp_path / "bench_vs_sdpa.png").stat().st_size > 0
    overview = report.table_overview(tmp_path)
    assert "| part 2 | 368 | 369 | 432 | 433 |" in overview and "Test GPU" in overview and "abc1234" in overview
    part2 = report.table_part(tmp_path, 2)
    # D=64, non-causal, N=4096: part 2 = 368, part 1 = 108, flash = 348, cuDNN = 518.
    assert "| 64 | no | 4096 | 108 | **368** | 348 | 518 | 106% | 71% |" in part2
    graph = report.table_graph(tmp_path, 2)
    assert "| 64 | no | 4096 | 368 | 600 | 348 | 560 | 107% |" in graph


def test_sweep_heatmap_and_tables(tmp_path):
    rows = []
    for d in (64, 128):
        for r in sweep.plan(d, False, 227 * 1024):
            if r["status"] == "todo":
                tf = r["BLOCK_M"] * r["BLOCK_N"] / 100
                r.update(status="ok", ms="1", tflops=str(tf), smem_compiled=r["smem_est"], regs="100", B=4, H=8, N=4096)
            rows.append({**r, **META})
    _write(tmp_path / "part2_sweep.csv", sweep.FIELDS, rows)
    device = dict(multi_processor_count=132, regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                  max_threads_per_multi_processor=2048)  # fmt: skip
    (tmp_path / "part2_device.json").write_text(json.dumps(device))
    report.draw_sweep_heatmaps(tmp_path / "part2_sweep.csv", tmp_path / "heat.png")

    assert (tmp_path / "heat.png").stat().st_size > 0
    table = report.table_sweep(tmp_path)
    winners = [line for line in table.splitlines() if line.startswith(("| 64 | no | 1 |", "| 128 | no | 1 |"))]
    assert len(winners) == 2  # one winner per group
    assert "| 64 | no | 1 | 256 x 256 |" not in table  # pruned configurations never rank
    assert "triton.Config" in report.sweep_winners(tmp_path / "part2_sweep.csv")


def test_readme_blocks_are_replaced(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:demo -->\nold\n<!-- /results:demo -->\noutro\n")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setitem(report.TABLES, "demo", lambda gpu_dir: "new table")
    report.update_readmes(tmp_path)
    assert readme.read_text() == "intro\n<!-- results:demo -->\nnew table\n<!-- /results:demo -->\noutro\n"
