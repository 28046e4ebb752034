"""part5_profiling/tools/step_profile.py without a GPU: how it reads a profile (which kernels are
attention's, whose host time counts), its table from a small CSV, and its refusal on a CPU."""

from types import SimpleNamespace

import pytest
import torch

from common import runtime
from lab.results import write_csv
from part5_profiling.tools import report, step_profile
from tests.helpers import META

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def event(name, device=CUDA, us=0.0, parent=None, annotation=False):
    return SimpleNamespace(name=name, device_type=device, device_time=us, cpu_time_total=us, cpu_parent=parent,
                           is_user_annotation=annotation)  # fmt: skip


def test_breakdown_counts_kernels_once_and_the_outermost_attention_call():
    """One step: the attention range's copy on the GPU and Inductor's fused kernels named after the op
    are not attention kernels; a backward node inside the forward's range is not counted twice."""
    forward = event("attention", CPU, us=300.0)
    events = [
        forward,
        event("FlashAttentionBackward", CPU, us=500.0),
        event("FlashAttention", CPU, us=250.0, parent=forward),  # inside the range: counted with it
        event("aten::mm", CPU, us=900.0),
        event("attention", us=1000.0, annotation=True),  # the range, on the GPU's timeline
        event("_attn_fwd_gluon", us=100.0),
        event("_attn_bwd_gluon", us=300.0),
        event("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", us=50.0),
        event("triton_poi_fused_flash_attention_0", us=20.0),
        event("ampere_bf16_s16816gemm", us=530.0),
    ]
    got = step_profile.breakdown(events, steps=1)
    assert got["kernels"] == 5 and got["attn_kernels"] == 3
    assert got["gpu_ms"] == pytest.approx(1.0) and got["attn_gpu_ms"] == pytest.approx(0.45)
    assert got["other_gpu_ms"] == pytest.approx(0.55) and got["attn_host_ms"] == pytest.approx(0.8)  # 300 + 500 us
    assert step_profile.breakdown(events, steps=2)["attn_gpu_ms"] == pytest.approx(0.225)  # per step
    assert step_profile.breakdown(events, steps=1, eager=False)["attn_host_ms"] is None
    assert "triton_poi" not in got["attn_kernel_names"] and "_attn_fwd_gluon" in got["attn_kernel_names"]


def test_step_profile_table(tmp_path):
    row = dict(N=1024, step_ms="20.0", host_ms="19.9", gpu_ms="6.5", kernels=641, attn_gpu_ms="0.63", attn_kernels=16,
               other_gpu_ms="5.87", attn_kernel_names="_attn_fwd_gluon", **META)  # fmt: skip
    rows = [
        dict(row, impl="part5", mode="eager", attn_host_ms="3.69"),
        dict(row, impl="sdpa_default", mode="eager", attn_host_ms="1.79", step_ms="21.4"),
        dict(row, impl="part5", mode="compiled", attn_host_ms=""),
    ]
    write_csv(tmp_path / "part5_step_profile.csv", rows, step_profile.FIELDS)
    table = report.table_step_profile(tmp_path)
    lines = [line for line in table.splitlines() if line.startswith("| 1024")]
    assert lines == [
        "| 1024 | compiled | part 5 | 20.00 | 19.90 | 6.50 | 641 | 0.63 | 5.87 | — |",
        "| 1024 | eager | SDPA default | 21.40 | 19.90 | 6.50 | 641 | 0.63 | 5.87 | 1.79 |",
        "| 1024 | eager | part 5 | 20.00 | 19.90 | 6.50 | 641 | 0.63 | 5.87 | 3.69 |",
    ]


@pytest.mark.skipif(runtime.HAS_GPU, reason="checks the no-GPU path")
def test_step_profile_says_it_needs_a_gpu_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    assert step_profile.main([]) == 0
    assert "GPU" in capsys.readouterr().out and not list(tmp_path.iterdir())
