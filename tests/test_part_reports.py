"""Parts 3 and 4's own tables and figures, from small synthetic CSVs: each number lands in its
row and column, every table is well formed, and the figures draw what the rows say."""

import pytest

from common import results
from common.results import write_csv
from tests.helpers import META, study_row


def _columns(table):
    """Cells per line of every markdown table in the text: one number per table if well formed."""
    rows = [line for line in table.splitlines() if line.startswith("|")]
    return {line.count("|") for line in rows}


@pytest.mark.only_parts(3)
def test_part3_tables_and_figures(part, tmp_path):
    from part3_inner_loop import ablation, p_cast, report, variants

    rows = []
    for step in range(len(ablation.LABELS)):
        for d, c in ((64, 0), (64, 1), (128, 0), (128, 1)):
            for n in (2048, 4096, 16384):
                tf = 100 + 10 * step + d / 64 + c + n / 4096  # distinct everywhere
                rows.append(
                    study_row(
                        step=step,
                        label=ablation.LABELS[step],
                        N=n,
                        D=d,
                        causal=c,
                        ms=1.0,
                        tflops=tf,
                        graph_tflops=tf + 1,
                        check="ok",
                    )
                )
    write_csv(tmp_path / "part3_ablation.csv", rows, ablation.FIELDS)
    table = report.table_ablation(tmp_path)
    assert len(_columns(table)) == 1
    # D=128 causal N=4096: step 0 = 100 + 2 + 1 + 1, step 5 = 150 + 2 + 1 + 1
    assert "| 128 | yes | 4096 | 104 | 114 | 124 | 134 | 144 | 154 |" in table
    gains = report.table_step_gains(tmp_path)
    # + causal skip at D=64, non-causal: 112/102 .. 115/105 over N = 2048, 4096, 16384
    assert f"| + causal skip | {min(x / (x - 10) for x in (111.5, 112, 115)):.2f}x - {111.5 / 101.5:.2f}x |" in gains
    fig = report.ablation_figure(results.read_csv(tmp_path / "part3_ablation.csv"))
    first = fig.axes[0].get_lines()[0]  # D=64 non-causal, step 0
    assert list(first.get_xdata()) == [2048, 4096, 16384] and list(first.get_ydata()) == [101.5, 102.0, 105.0]

    acc = []
    for v_i, variant in enumerate(["PyTorch attention in the input dtype", *variants.P_PRODUCTS]):
        for dt in ("bf16", "fp16"):
            for n in (512, 2048):
                acc.append(
                    dict(
                        variant=variant,
                        what="accuracy",
                        dtype=dt,
                        B=1,
                        H=4,
                        N=n,
                        D=64,
                        score_std=1.0,
                        err=(v_i + 1) * 1e-3 * n / 512,
                        **META,
                    )
                )
    acc += [
        dict(variant=v, what="speed", dtype="bf16", B=4, H=8, N=4096, D=64, ms=1.0, tflops=300 + i, **META)
        for i, v in enumerate(variants.P_PRODUCTS)
    ]
    write_csv(tmp_path / "part3_p_cast.csv", acc, p_cast.FIELDS)
    table = report.table_p_cast(tmp_path)
    assert "| bf16 | 1 | 2048 | 4.0e-03 | 8.0e-03 | 1.2e-02 | 1.6e-02 |" in table
    assert "| P float32, IEEE product | 64 | 302 |" in table
    assert report.p_cast_figure(results.read_csv(tmp_path / "part3_p_cast.csv")).axes

    from part3_inner_loop import launch_order

    orders = list(variants.ORDERS)
    rows = [
        study_row(
            order=o,
            shipped=int(i == 2),
            N=n,
            D=d,
            causal=c,
            ms=1.0,
            tflops=200 + i,
            graph_tflops=300 + 10 * i + d / 64 + c,
            check="ok",
        )
        for i, o in enumerate(orders)
        for d, c in ((64, 0), (128, 1))
        for n in (1024, 4096)
    ]
    write_csv(tmp_path / "part3_launch_order.csv", rows, launch_order.FIELDS)
    table = report.table_launch_order(tmp_path)
    assert len(_columns(table)) == 1
    assert "| 128 | yes | 4096 | 303 | 313 | **323** |" in table  # graph TFLOP/s, the shipped one in bold


@pytest.mark.only_parts(4)
def test_part4_tables_and_figures(part, tmp_path):
    from part4_backward import dq_atomics, memory, report

    rows = []
    for variant, tf, same in (("second pass (default)", 300.0, 1), ("atomics", 330.0, 0)):
        rows.append(
            study_row(
                variant=variant,
                N=4096,
                D=64,
                causal=1,
                ms=1.0,
                tflops=tf,
                bitwise_repeatable=same,
                max_run_to_run=0.0 if same else 2.4e-4,
                check="ok",
            )
        )
    write_csv(tmp_path / "part4_dq_atomics.csv", rows, dq_atomics.FIELDS)
    table = report.table_dq(tmp_path)
    assert len(_columns(table)) == 1
    assert "| 64 | yes | 4096 | 300 | 330 | 1.10x | yes | no | 2.4e-04 |" in table

    rows = [
        study_row(
            impl=impl,
            N=n,
            D=64,
            peak_mib=n * scale if ok else None,
            status="ok" if ok else "out of memory",
        )
        for impl, scale in (("part4", 0.5), ("sdpa_math", 0.01))
        for n in (1024, 4096)
        for ok in [impl == "part4" or n < 4096]
    ]
    write_csv(tmp_path / "part4_memory.csv", rows, memory.FIELDS)
    table = report.table_memory(tmp_path)
    assert "| 4096 | 2,048 | out of memory |" in table and len(_columns(table)) == 1
    fig = report.memory_figure(results.read_csv(tmp_path / "part4_memory.csv"))
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines == {"part 4": [512.0, 2048.0], "SDPA math": [10.24]}


@pytest.mark.only_parts(4)
def test_part4_mode_table_adds_flex_when_measured(part, tmp_path):
    from common import bench, impls
    from part4_backward import report

    rows = [
        dict(
            impl=impl, part=p, B=4, H=8, N=4096, D=64, dtype="bf16", causal=0, mode="fwd+bwd", ms=ms, check="ok", **META
        )
        for impl, p, ms in (("part4", 4, 1.0), ("sdpa_flash", "", 2.0), ("sdpa_cudnn", "", 0.5))
    ]
    write_csv(tmp_path / "bench.csv", rows, bench.FIELDS)
    assert "Flex" not in report.table_mode(tmp_path, "fwd+bwd")
    rows.append(dict(rows[1], impl=impls.FLEX, ms=1.25))
    write_csv(tmp_path / "bench.csv", rows, bench.FIELDS)
    table = report.table_mode(tmp_path, "fwd+bwd")
    assert "| part 4 / Flex |" in table and table.splitlines()[-1].endswith("| 125% |") and len(_columns(table)) == 1
