"""Where a training step's time goes: lab/train_step.py's Llama step with SDPA default and with a
part, under PyTorch's profiler.

    python -m part5_profiling.tools.step_profile            # results/<gpu>/part5_step_profile.csv
    python -m part5_profiling.tools.step_profile --n 1024 --mode eager

For each implementation, mode and N: WARMUP steps, then TIMED steps timed two ways, then PROFILED
steps under torch.profiler (CPU and CUDA activities). Per step:
- step_ms: CUDA events around the step (as the training benchmark times it), the median;
- host_ms: the host's time to issue the step (perf_counter around it, no synchronisation), the
  median: a step whose host_ms is near its step_ms is bound by the host, and the GPU waits;
- gpu_ms, kernels: the sum of the profiled kernels' GPU times and their number;
- attn_gpu_ms, attn_kernels: those of the attention's kernels (their names: ATTENTION below);
- attn_host_ms (eager): the host's time inside the attention's calls (the model's attention
  function, forward, and the autograd node of its backward), profiled (the profiler adds a few
  microseconds per operator to it); compiled, the attention's operators run inside the compiled
  graph's, and this is not counted (empty);
- other_gpu_ms: gpu_ms - attn_gpu_ms, the rest of the model, the loss and the optimizer.
"""

import re
import statistics
import sys
import time

import torch

from common import hf
from lab import results, study, train_step

WARMUP, TIMED, PROFILED = 5, 10, 3
SEQ_LENS = (1024, 4096)
MODES = ("eager", "compiled")
# Kernel names of attention: the parts' (tl and Gluon), cuDNN's and PyTorch's flash/efficient kernels.
ATTENTION = re.compile(r"_attn_|_bwd_prepare|_dq_convert|sdpa|fmha|flash|attention|cudnn", re.I)
# Host-side operators that are an attention call (forward or backward), outermost only.
ATTENTION_OPS = re.compile(r"^attention$|FlashAttention|ScaledDotProduct", re.I)
FIELDS = ["impl", "mode", "N", "step_ms", "host_ms", "gpu_ms", "kernels", "attn_gpu_ms", "attn_kernels",
          "attn_host_ms", "other_gpu_ms", "attn_kernel_names", *results.PROVENANCE]  # fmt: skip
KEY = ("impl", "mode", "N")


def marked(attention):
    """attention (a transformers attention function) inside a profiler range named "attention"."""

    def call(*args, **kwargs):
        with torch.profiler.record_function("attention"):
            return attention(*args, **kwargs)

    return call


def register(impl):
    """The implementation's attention under a name of its own, its forward marked for the profiler."""
    name = hf.register_sdpa() if impl == train_step.REFERENCE else hf.register(int(impl.removeprefix("part")))
    attention, _ = hf.registered(name)
    return hf.register_sdpa(f"profiled_{impl}", marked(attention))


def measure(impl, mode, n, config=train_step.CONFIG, device="cuda"):
    """One row: the step's times and its profile, as the module docstring says."""
    steps = WARMUP + TIMED + PROFILED
    model = hf.llama(attn_implementation=register(impl), seed=train_step.SEED, **config).to(device, torch.bfloat16)
    runner = torch.compile(model) if mode == "compiled" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_step.LR, fused=True)
    data = train_step.batches(n, steps=steps).to(device)
    run = lambda ids: train_step.step(runner, optimizer, ids)  # noqa: E731
    for ids in data[:WARMUP]:
        run(ids)
    torch.cuda.synchronize()
    events, host = [], []
    for ids in data[WARMUP : WARMUP + TIMED]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        run(ids)
        end.record()
        host.append((time.perf_counter() - t0) * 1e3)
        events.append((start, end))
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for ids in data[WARMUP + TIMED :]:
            run(ids)
        torch.cuda.synchronize()
    row = dict(impl=impl, mode=mode, N=n, step_ms=statistics.median(s.elapsed_time(e) for s, e in events))
    row.update(host_ms=statistics.median(host), **breakdown(prof.events(), PROFILED, mode == "eager"))
    return {k: f"{v:.3f}" if isinstance(v, float) else v for k, v in row.items()}


def breakdown(events, steps, eager=True):
    """gpu_ms, kernels, attn_* and other_gpu_ms per step from a profile's events."""
    cuda = torch.autograd.DeviceType.CUDA  # kernels, not the GPU's copy of a record_function range
    kernels = [
        e
        for e in events
        if e.device_type == cuda and e.name != "attention" and not getattr(e, "is_user_annotation", False)
    ]
    attn = [e for e in kernels if ATTENTION.search(e.name) and not e.name.startswith("triton_")]  # not Inductor's
    gpu = sum(e.device_time for e in kernels) / 1e3 / steps
    attn_gpu = sum(e.device_time for e in attn) / 1e3 / steps

    def outermost(e):
        p = e.cpu_parent
        while p is not None:
            if ATTENTION_OPS.search(p.name):
                return False
            p = p.cpu_parent
        return True

    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and ATTENTION_OPS.search(e.name)]
    attn_host = sum(e.cpu_time_total for e in cpu if outermost(e)) / 1e3 / steps if eager else None
    names = sorted({re.sub(r"\s+", " ", e.name)[:60] for e in attn})
    return dict(
        gpu_ms=gpu,
        kernels=round(len(kernels) / steps),
        attn_gpu_ms=attn_gpu,
        attn_kernels=round(len(attn) / steps),
        attn_host_ms=attn_host,
        other_gpu_ms=gpu - attn_gpu,
        attn_kernel_names="; ".join(names),
    )


def run(impls, seq_lens, modes, save):
    meta, rows = results.provenance(), []
    for n in seq_lens:
        for mode in modes:
            for impl in impls:
                try:
                    row = {**measure(impl, mode, n), **meta}
                except Exception as e:  # say why, go on
                    row = dict(impl=impl, mode=mode, N=n, attn_kernel_names=f"error: {results.why(e)}", **meta)
                finally:
                    torch._dynamo.reset()
                rows.append(row)
                print(" ".join(f"{k}={row.get(k, '')}" for k in FIELDS[:11]), flush=True)
                save(rows)
    return rows


def main(argv=None):
    extra = [(("--mode",), dict(action="append", choices=MODES, help="eager or compiled (repeatable)"))]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, extra=extra)
    if not study.on_gpu("The step profile times a model's steps"):
        return 0
    impls = (train_step.REFERENCE, "part5")
    return results.write_as_measured(
        "part5_step_profile.csv", FIELDS, lambda save: run(impls, args.n, tuple(args.mode or MODES), save), key=KEY
    )


if __name__ == "__main__":
    sys.exit(main())
