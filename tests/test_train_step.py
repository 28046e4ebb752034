"""The training-step benchmark (lab/train_step.py) on any machine: its data, its
training loop on a tiny model, its verdict on the losses, its table and loss plot from a small
synthetic CSV; without a GPU it says so and writes nothing."""

import pytest
import torch

from common import hf, runtime
from lab import train_step
from lab.results import write_csv
from tests.helpers import META, TINY_LLAMA

TINY = TINY_LLAMA


def test_batches_are_seeded_repeated_segments():
    """The same data for every implementation; each row one segment repeated (what attention can copy)."""
    data = train_step.batches(1024, steps=3, b=2)
    assert data.shape == (3, 2, 1024) and data.dtype == torch.int64
    assert torch.equal(data, train_step.batches(1024, steps=3, b=2))
    assert not torch.equal(data[..., :512], train_step.batches(512, steps=3, b=2))  # another N: other data
    segment = data[..., : train_step.SEGMENT]
    assert torch.equal(data, segment.repeat(1, 1, 1024 // train_step.SEGMENT))
    assert not torch.equal(data[0, 0], data[0, 1]) and not torch.equal(data[0], data[1])
    assert 0 <= data.min() and data.max() < train_step.CONFIG["vocab_size"]
    counts = torch.bincount(data.flatten(), minlength=train_step.CONFIG["vocab_size"])
    # Zipf-like: the first token the most frequent, the first ten about 30% of all (2.93 / 9.6, p = 1 / rank)
    assert counts.argmax() == 0 and counts[:10].sum() > 0.2 * counts.sum()


def test_compare_judges_the_losses():
    reference = [9.0 - 0.1 * i for i in range(train_step.STEPS)]
    close = [x + 0.004 for x in reference]
    assert train_step.compare(close, reference) == dict(
        loss_diff="0.00400", check="ok: the first 15 losses within 0.005 of SDPA default's"
    )
    late = reference[: train_step.COMPARED] + [x + 1 for x in reference[train_step.COMPARED :]]
    assert train_step.compare(late, reference)["check"].startswith("ok")  # only the first 15 steps count
    far = [x + 0.006 for x in reference]
    assert train_step.compare(far, reference)["check"].startswith("FAIL: a loss 0.0060 from SDPA default's")
    assert train_step.compare(reference[:-1] + [float("nan")], reference)["check"] == "FAIL: a loss is not finite"
    assert train_step.compare(reference, None)["check"].startswith("ok: every loss finite")


@pytest.mark.skipif(not hf.available(), reason="needs transformers (pip install -e '.[model]')")
def test_paired_runs_train_alike_on_cpu():
    """The benchmark's loop (fresh seeded models, AdamW, warm-up then steps in turns) on a tiny float32
    Llama: SDPA with grouped heads, SDPA with K and V repeated, and part 0 train the same, step for
    step, within float32 rounding (about 5e-7 measured); and the loss falls, so the optimizer steps."""
    data = train_step.batches(32, steps=train_step.WARMUP + 2, b=2, vocab=TINY["vocab_size"])
    impls = {
        train_step.REFERENCE: hf.register_sdpa(),
        train_step.REPEATED: hf.register_sdpa("sdpa_repeated", train_step.sdpa_repeated),
        "part0": hf.register(0),
    }
    runs = train_step.paired(impls, "eager", data, config=TINY, dtype=torch.float32, device="cpu")
    rows = {r["impl"]: r for r in train_step.measured(runs)}
    assert list(rows) == list(impls)
    assert rows["sdpa_default"]["attention"] in ("flash", "math", "efficient", "cudnn")
    for impl, row in rows.items():
        losses = [float(x) for x in row["losses"].split()]
        assert len(losses) == len(data) and losses[-1] < losses[0] - 0.1
        assert row["check"].startswith("ok: the first 15 losses within"), (impl, row["check"])
        assert float(row["loss_diff"]) < 1e-5 and "step_ms" not in row  # nothing timed without a GPU
    # an implementation that fails says why in its row, and the others run on
    runs = train_step.paired({"broken": "no_such_attention"}, "eager", data, config=TINY, device="cpu")
    (row,) = train_step.measured(runs)
    assert row["impl"] == "broken" and row["check"].startswith("error: ") and "no_such_attention" in row["check"]


@pytest.mark.skipif(runtime.HAS_GPU, reason="checks the no-GPU path")
def test_train_step_says_it_needs_a_gpu_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    assert train_step.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "GPU" in out and "Traceback" not in out
    assert not list(tmp_path.iterdir())


def synthetic_rows():
    """Two N, three modes; SDPA default, SDPA with K/V repeated, part 5 (and part 4, one error)."""
    shape = dict(B=8, layers=4, hidden=512, heads=8, kv_heads=2, D=64, vocab=8192, dtype="bf16", steps=30, warmup=5)
    losses = [9.0 - 0.1 * i for i in range(30)]
    rows = []
    for n, scale in ((1024, 1.0), (4096, 4.0)):
        for mode, speed in (("eager", 1.0), ("compiled", 0.8), ("cudagraphs", 0.5)):
            for impl, ms, diff, ran in (
                ("sdpa_default", 10.0, 0.0, "cudnn"),
                ("sdpa_repeat", 11.0, 0.004, "cudnn"),
                ("part5", 9.0, 0.006, "gluon"),
            ):
                step_ms = ms * scale * speed
                rows.append(
                    dict(
                        impl=impl,
                        mode=mode,
                        N=n,
                        **shape,
                        step_ms=f"{step_ms:.3f}",
                        step_mib=f"{1500 * scale:.0f}",
                        vs_sdpa=f"{10.0 * scale * speed / step_ms:.3f}",
                        loss_diff="" if impl == "sdpa_default" else f"{diff:.5f}",
                        attention=ran,
                        check="ok: fine",
                        losses=" ".join(f"{x + diff:.5f}" for x in losses),
                        **META,
                    )
                )
    rows.append(dict(impl="part4", mode="compiled", N=4096, **shape, check="error: OutOfMemoryError: boom", **META))
    return rows


def test_train_step_tables_and_figure(tmp_path):
    """The log's tables (rows by N, then mode, SDPA first) and the README's summary,
    with times, ratios, memory and losses where they belong; the figure is drawn."""
    write_csv(tmp_path / "train_step.csv", synthetic_rows(), train_step.FIELDS)
    table = train_step.table(tmp_path)
    assert "Test GPU; torch 2.x; Triton 3.x; commit abc1234" in table
    assert (
        "4-layer Llama: hidden 512, 8 heads of D = 64 sharing 2 key/value heads, vocabulary 8,192, bf16, B=8" in table
    )
    assert "median of 25 steps after 5 of warm-up" in table
    assert "| 1024 | eager | SDPA default | cudnn | 10.0 | 1.00x | 1,500 | — | ok |" in table
    assert "| 1024 | eager | part 5 | gluon | 9.0 | 1.11x | 1,500 | 0.0060 | ok |" in table
    assert "| 4096 | cudagraphs | SDPA default, K/V repeated | cudnn | 22.0 | 0.91x | 6,000 | 0.0040 | ok |" in table
    assert "| 4096 | compiled | part 4 | — | — | — | — | — | error |" in table
    lines = [line for line in table.splitlines() if line.startswith("| 4096 | compiled")]
    assert [line.split(" | ")[2] for line in lines] == [
        "SDPA default",
        "SDPA default, K/V repeated",
        "part 4",
        "part 5",
    ]
    first = table.index("| 1024 | eager |")
    assert first < table.index("| 1024 | compiled |") < table.index("| 1024 | cudagraphs |") < table.index("| 4096 |")

    summary = train_step.summary(tmp_path)
    assert "| attention | mode | N = 1024 | N = 4096 |" in summary
    assert "| part 5 | cudagraphs | 1.11x | 1.11x |" in summary and "| part 4 | compiled | — | — |" in summary
    assert "SDPA default" not in summary.split("|", 1)[1]  # the parts only: the log's table has SDPA's other path
    (path,) = train_step.draw(tmp_path)
    assert path.name == "train_step.png" and path.stat().st_size > 10_000
