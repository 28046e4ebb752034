"""The training-step benchmark (common/train_step.py) on any machine: its data, its
training loop on a tiny model, its verdict on the losses, its table and loss plot from a small
synthetic CSV; without a GPU it says so and writes nothing."""

import pytest
import torch

from common import hf, parts, runtime, train_step
from common.results import write_csv
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
def test_training_loop_matches_sdpa_on_cpu():
    """The benchmark's loop (fresh seeded model, AdamW, the profiled warm-up step) on a tiny float32
    Llama: part 0 and SDPA through hf.register_sdpa train the same, step for step, within float32
    rounding (about 5e-7 measured); and the loss falls, so the optimizer steps."""
    data = train_step.batches(32, steps=train_step.WARMUP + 1, b=2, vocab=TINY["vocab_size"])

    def train(attention, what_ran):
        return train_step.train(attention, "eager", data, what_ran, config=TINY, dtype=torch.float32, device="cpu")

    sdpa_losses, times, peak, ran = train(hf.register_sdpa(), train_step.sdpa_ran)
    assert times == [] and peak is None and ran in ("flash", "math", "efficient", "cudnn")
    losses, _, _, _ = train(hf.register(0), train_step.part_ran(parts.load(0)))
    assert len(losses) == len(sdpa_losses) == len(data)
    assert max(abs(a - b) for a, b in zip(losses, sdpa_losses)) < 1e-5
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.skipif(runtime.HAS_GPU, reason="checks the no-GPU path")
def test_train_step_says_it_needs_a_gpu_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    assert train_step.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "GPU" in out and "Traceback" not in out
    assert not list(tmp_path.iterdir())


def synthetic_rows():
    """Two N, both modes; SDPA default, flash, transformers' mask (compiled), part 5 (one error)."""
    shape = dict(B=8, layers=4, hidden=512, heads=8, kv_heads=2, D=64, vocab=8192, dtype="bf16", steps=30, warmup=5)
    losses = [9.0 - 0.1 * i for i in range(30)]
    rows = []
    for n, scale in ((1024, 1.0), (4096, 4.0)):
        for mode, speed in (("eager", 1.0), ("compiled", 0.8)):
            impls = [
                ("sdpa_default", 10.0, 0.0, "cudnn"),
                ("sdpa_flash", 11.0, 0.004, "flash"),
                ("part5", 9.0, 0.006, "gluon"),
            ]
            if mode == "compiled":
                impls.insert(2, ("sdpa_hf_mask", 14.0, 0.002, "efficient"))
            for impl, ms, diff, ran in impls:
                step_ms = ms * scale * speed
                rows.append(
                    dict(
                        impl=impl,
                        mode=mode,
                        N=n,
                        **shape,
                        step_ms=f"{step_ms:.3f}",
                        peak_mib=f"{1500 * scale:.0f}",
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


def test_train_step_table(tmp_path):
    """The table: rows by N, eager before compiled, SDPA first; times, ratio, memory and loss where they belong."""
    write_csv(tmp_path / "train_step.csv", synthetic_rows(), train_step.FIELDS)
    table = train_step.table(tmp_path)
    assert "Test GPU; torch 2.x; Triton 3.x; commit abc1234" in table
    assert (
        "4-layer Llama: hidden 512, 8 heads of D = 64 sharing 2 key/value heads, vocabulary 8,192, bf16, B=8" in table
    )
    assert "median of 25 steps after 5 of warm-up" in table
    assert "| 1024 | eager | SDPA default | cudnn | 10.0 | 1.00x | 1,500 | — | ok |" in table
    assert "| 1024 | eager | part 5 | gluon | 9.0 | 1.11x | 1,500 | 0.0060 | ok |" in table
    assert (
        "| 4096 | compiled | SDPA default, transformers' mask | efficient | 44.8 | 0.71x | 6,000 | 0.0020 | ok |"
        in table
    )
    assert "| 4096 | compiled | part 4 | — | — | — | — | — | error |" in table
    lines = [line for line in table.splitlines() if line.startswith("| 4096 | compiled")]
    assert [line.split(" | ")[2] for line in lines] == [
        "SDPA default",
        "SDPA flash (FA2)",
        "SDPA default, transformers' mask",
        "part 4",
        "part 5",
    ]
    first = table.index("| 1024 | eager |")
    assert first < table.index("| 1024 | compiled |") < table.index("| 4096 | eager |")
