"""Part 2's tuning machinery on the CPU: the budget arithmetic, the pruning, the shape classes."""

import pytest
import torch

from common import parts


@pytest.mark.only_parts(2)
def test_budget_arithmetic(part):
    fa = parts.load(part)
    # Q tile 128x64 bf16 = 16 KB once; K and V tiles 64x64 bf16 = 8 KB each, two buffers of each.
    assert fa.smem_bytes(128, 64, 64, 2, 2) == 16 * 1024 + 2 * 2 * 8 * 1024


@pytest.mark.only_parts(2)
def test_sweep_plan_prunes_only_what_cannot_fit(part):
    from part2_tile_tuning.sweep import MAX_REGS, plan, regs_estimate

    limit = 227 * 1024
    rows = plan(128, False, limit)
    assert len(rows) == 5 * 5 * 3 * 5
    fa = parts.load(part)
    for r in rows:
        smem = fa.smem_bytes(r["BLOCK_M"], r["BLOCK_N"], 128, 2, r["num_stages"])
        regs = regs_estimate(r["BLOCK_M"], r["BLOCK_N"], 128, r["num_warps"])
        expected = "pruned: shared memory" if smem > limit else "pruned: registers" if regs > MAX_REGS else "todo"
        assert r["status"] == expected
    assert any(r["status"] == "todo" for r in rows) and any(r["status"].startswith("pruned") for r in rows)


@pytest.mark.only_parts(2)
def test_autotune_prune_follows_dtype(part, monkeypatch):
    fa = parts.load(part)
    import triton

    big = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3)
    small = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)
    monkeypatch.setattr(fa, "smem_limit", lambda: 227 * 1024)
    bf16, fp32 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.float32)
    # 128x128, D=128, 3 stages: 32 KB + 3 * 64 KB = 224 KB in bf16 fits; 448 KB in float32 does not.
    assert fa.fits_in_smem([big, small], {"Q": bf16}, D=128) == [big, small]
    assert fa.fits_in_smem([big, small], {"Q": fp32}, D=128) == [small]
    # If nothing fits, the smallest survives, so the autotuner always has a candidate.
    monkeypatch.setattr(fa, "smem_limit", lambda: 1024)
    assert fa.fits_in_smem([big, small], {"Q": fp32}, D=128) == [small]


@pytest.mark.only_parts(2)
def test_n_bucket(part):
    fa = parts.load(part)
    assert fa.n_bucket(1, 1) == 256
    assert fa.n_bucket(100, 3000) == 4096
    assert fa.n_bucket(4096, 4096) == 4096
    assert fa.n_bucket(4097, 16) == 8192
