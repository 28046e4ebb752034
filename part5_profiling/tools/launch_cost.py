"""What one call costs on the host, against what its kernels cost on the GPU.

    python -m part5_profiling.tools.launch_cost     # GPU: results/<gpu>/part5_launch_cost.csv
    python -m part5_profiling.tools.launch_cost --part 5 --paired-only   # the paired measure alone

Below N = 2048 the benchmark's do_bench times (Python, the launch and the GPU together) fall far
under its CUDA-graph times (the GPU alone): the GPU finishes before Python has issued the next
call. For each part with a Triton forward, at D = 128, non-causal, bf16, B=4, H=8, and for each
mode: fwd (the forward, FlashAttention.apply without gradients), and for a part whose backward is
Triton too, bwd (its flash_backward called directly, on the calling thread), "bwd, autograd" (the
same backward through torch.autograd.grad on a retained graph, as the benchmark's bwd mode runs it:
on autograd's own thread) and fwd+bwd (the forward and torch.autograd.grad). The same for SDPA's
flash and cuDNN backends (fwd, "bwd, autograd", fwd+bwd), whose launch path is C++: the yardstick.
And "floor": an autograd.Function whose forward allocates O and whose backward hands dO back as each
gradient, launching nothing (fwd+bwd only): what any Python Function's forward + backward costs before
it does any work, autograd's engine and its hand-off between threads included.

- gpu_us: the call replayed from a CUDA graph (no Python at all), median.
- host_us: the host's time per call, issuing CALLS calls back to back without waiting for the GPU
  (while the GPU keeps up, this is the time Python and the launch path take).
- call_us: do_bench's median, what a user's loop sees.

Then "host, paired" (results/<gpu>/part5_launch_paired.csv), when SDPA cuDNN is among the targets:
every target's forward + backward through autograd (autograd's device thread, as training runs it)
timed in turn, PAIRED_ROUNDS rounds of PAIRED_CALLS calls at N = 512 to 2048, the order of the
targets turning from round to round. Few calls per round, so the GPU's queue of launches never
fills and holds the host back. Per target: the median over the rounds, and its time over SDPA
cuDNN's of the same round (median, lowest, highest). The host's pace drifts by up to 2x between
runs and within one on a shared machine, and the rows above are minutes apart from target to
target: a ratio taken within one round compares like with like, so a host-time comparison with
SDPA is judged on this one.
"""

import argparse
import functools
import statistics
import sys
import time
from contextlib import nullcontext

import torch

from common import parts
from common.inputs import Shape, make_inputs
from common.runtime import DEVICE
from lab import impls, results, study
from lab.bench import timed_call
from lab.timing import graph_time_ms, time_ms

B, H, D = 4, 8, 128
SEQ_LENS = (512, 1024, 2048, 4096)
CALLS = 200
FIELDS = ["part", "mode", "N", "D", "what", "group", "us", *results.PROVENANCE]
# A run replaces every row of the parts (and SDPA backends, floor) it measures, and keeps the others'.
KEY = ("part",)


def host_us(fn, rounds=5, calls=CALLS):
    """Host time per call, calls issued back to back without synchronising: the median of `rounds`
    rounds of `calls` calls (one round alone moves by 2x from run to run with the host's other work)."""
    per_round = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(per_round)[rounds // 2]


class Floor(torch.autograd.Function):
    """The least a forward + backward through a Python autograd.Function costs the host: the forward
    allocates O (as every part's does), the backward returns dO as each gradient; no kernel runs."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        return do, do, do, None


FLOOR = "floor"


PAIRED = "host, paired"
PAIRED_CSV = "part5_launch_paired.csv"  # its own file: a run without SDPA cuDNN leaves it as it is
PAIRED_ROUNDS = 15
PAIRED_CALLS = 40
PAIRED_LENS = (512, 1024, 2048)
YARDSTICK = "sdpa_cudnn"


def paired_times(fns, rounds, calls=None):
    """{target: [host us per call, one per round]} for fns ({target: (call, context)}): every target's
    calls timed in turn (`calls` back to back, PAIRED_CALLS by default, inside its context), round
    after round, who goes first turning from round to round, so each round's times compare like with
    like however the host's pace drifts between rounds."""
    order, calls = list(fns), calls or PAIRED_CALLS
    times = {target: [] for target in order}
    for r in range(rounds):
        for target in order[r % len(order) :] + order[: r % len(order)]:  # who goes first turns
            fn, context = fns[target]
            with context():
                times[target].append(host_us(fn, rounds=1, calls=calls))
    return times


def paired_rows(targets, meta, rounds=PAIRED_ROUNDS, lens=PAIRED_LENS):
    """Rows of what PAIRED for each target in `targets` (part numbers, "sdpa_flash", YARDSTICK, FLOOR)
    that has a forward + backward through autograd, at each N in lens: host_us of every target in
    turn (the order turning each round), `rounds` times; "us" the median of its rounds, "over SDPA
    cuDNN" its time over YARDSTICK's of the same round, as median, lowest and highest over the
    rounds. A target whose call fails gets an error row and is left out of the rounds."""
    rows = []
    for n in lens:
        fns = {}
        for target in targets:
            base = dict(part=target, mode="fwd+bwd", N=n, D=D, group="", us="", **meta)
            try:
                fn = calls(target, n).get("fwd+bwd")
                if fn is None:  # a PyTorch backward: no fwd+bwd mode
                    continue
                pinned = isinstance(target, str) and target.startswith("sdpa_")
                context = functools.partial(impls.sdpa_context, target.removeprefix("sdpa_")) if pinned else nullcontext
                with context():
                    fn()  # compile, autotune, warm
                fns[target] = (fn, context)
            except Exception as e:  # this target's first call failed: say why, time the others
                rows.append(dict(base, what=f"error: {PAIRED}: {results.why(e)}"))
                print(f"part {target} N={n:>5}  {PAIRED}: error: {results.why(e)}", flush=True)
        if not fns:
            continue
        times = paired_times(fns, rounds)
        for target, us in times.items():
            base = dict(part=target, mode="fwd+bwd", N=n, D=D, what=PAIRED, **meta)
            rows.append(dict(base, group="us (median of rounds)", us=f"{statistics.median(us):.1f}"))
            line = f"part {target} fwd+bwd N={n:>5}  {PAIRED}: {statistics.median(us):8.1f} us"
            if YARDSTICK in times:
                ratios = [a / b for a, b in zip(us, times[YARDSTICK])]
                stats = (("median", statistics.median(ratios)), ("lowest", min(ratios)), ("highest", max(ratios)))
                rows += [dict(base, group=f"over SDPA cuDNN ({name})", us=f"{value:.2f}") for name, value in stats]
                line += f"  {stats[0][1]:.2f}x cuDNN ({stats[1][1]:.2f}-{stats[2][1]:.2f})"
            print(line, flush=True)
        torch.cuda.empty_cache()
    return rows


def one_thread(fn):
    """fn with autograd's backward on the calling thread (torch.autograd.set_multithreading_enabled(False))."""

    def call():
        with torch.autograd.set_multithreading_enabled(False):
            return fn()

    return call


def sdpa_calls(backend, n):
    """{mode: the call to time} for SDPA pinned to one backend, as the benchmark times it: the
    yardstick for host time (its launch path is C++)."""
    impl = impls.sdpa_impl(backend)
    q, k, v, do = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, DEVICE, seed=n)
    with impls.sdpa_context(backend):  # the bwd mode runs its forward here: on this backend
        # SDPA's backward has no direct call: bench's bwd mode runs it through autograd
        modes = {"fwd": "fwd", "bwd, autograd": "bwd", "fwd+bwd": "fwd+bwd"}
        out = {mode: timed_call(impl, bench_mode, q, k, v, do, False) for mode, bench_mode in modes.items()}
    return out


def calls(n_part, n):
    """{mode: the call to time} for part n_part at sequence length n."""
    if n_part == FLOOR:
        q, k, v, do = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, DEVICE, seed=n)
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        return {"fwd+bwd": lambda: torch.autograd.grad(Floor.apply(*leaves, False), leaves, do)}
    if isinstance(n_part, str):  # "sdpa_flash", "sdpa_cudnn"
        return sdpa_calls(n_part.removeprefix("sdpa_"), n)
    module = parts.load(n_part)
    q, k, v, do = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, DEVICE, seed=n)

    def fwd():
        with torch.no_grad():
            return module.FlashAttention.apply(q, k, v, False)

    out = {"fwd": fwd}
    if not parts.pytorch_backward(module):  # a Triton backward of its own
        o, lse = module.flash_forward(q, k, v, False)
        out["bwd"] = lambda: module.flash_backward(q, k, v, o, lse, do, False)
        impl = impls.part_impl(n_part)
        out["bwd, autograd"] = timed_call(impl, "bwd", q, k, v, do, False)  # the same backward, as training runs it
        out["fwd+bwd"] = timed_call(impl, "fwd+bwd", q, k, v, do, False)
    return out


def measure(fn):
    """({what: us}, notes) for one call. A failed CUDA-graph capture leaves gpu_us out (the benchmark's
    bwd mode, whose forward ran outside the capture, fails so)."""
    fn()  # compile and autotune
    measured, notes = {}, []
    try:
        measured["gpu_us"] = graph_time_ms(fn) * 1e3
    except Exception as e:
        notes.append(f"no graph timing: {results.why(e)}")
    measured["host_us"] = host_us(fn)
    measured["call_us"] = time_ms(fn) * 1e3
    return measured, notes


def run(part_numbers, save=None):
    meta = results.provenance()
    rows = []
    for n_part in part_numbers:
        pinned = isinstance(n_part, str) and n_part.startswith("sdpa_")  # an SDPA backend, pinned while measured
        context = functools.partial(impls.sdpa_context, n_part.removeprefix("sdpa_")) if pinned else nullcontext
        for n in SEQ_LENS:
            try:
                modes = calls(n_part, n)
            except Exception as e:  # the part's first forward failed: say why, go on
                rows.append(
                    dict(part=n_part, mode="", N=n, D=D, group="", what=f"error: {results.why(e)}", us="", **meta)
                )
                print(f"part {n_part} N={n:>5}  error: {results.why(e)}", flush=True)
                continue
            for mode, fn in modes.items():
                base = dict(part=n_part, mode=mode, N=n, D=D, group="", **meta)
                try:
                    with context():
                        measured, notes = measure(fn)
                except Exception as e:  # a mode that fails: say why, go on
                    rows.append(dict(base, what=f"error: {results.why(e)}", us=""))
                    print(f"part {n_part} {mode:<7} N={n:>5}  error: {results.why(e)}", flush=True)
                    continue
                rows += [dict(base, what=what, us=f"{us:.1f}") for what, us in measured.items()]
                rows += [dict(base, what=note, us="") for note in notes]
                print(
                    f"part {n_part} {mode:<7} N={n:>5}  "
                    + "  ".join(f"{w} {us:8.1f}" for w, us in measured.items())
                    + "".join(f"  ({note})" for note in notes),
                    flush=True,
                )
            torch.cuda.empty_cache()
            if save is not None:  # after every shape too: a run cut short keeps what it measured
                save(rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable); default: every Triton part")
    ap.add_argument(
        "--sdpa",
        action="append",
        choices=["flash", "cudnn"],
        help="SDPA backend to measure beside the parts (repeatable); default: flash and cudnn",
    )
    ap.add_argument("--no-sdpa", action="store_true", help="the parts alone (and no floor)")
    ap.add_argument(
        "--paired-only",
        action="store_true",
        help="only the paired measure (part5_launch_paired.csv)",
    )
    args = ap.parse_args(argv)
    try:
        numbers = parts.require(args.part) if args.part else [n for n in parts.available() if parts.uses_triton(n)]
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    numbers += [] if args.no_sdpa else [f"sdpa_{b}" for b in args.sdpa or ("flash", "cudnn")] + [FLOOR]
    if args.paired_only and YARDSTICK not in numbers:
        print(
            "--paired-only needs SDPA cuDNN, the yardstick: leave out --no-sdpa, keep cudnn in --sdpa", file=sys.stderr
        )
        return 2
    if not study.on_gpu("Launch cost is measured against a GPU's kernels"):
        return 0
    failed = lambda r: r["what"].startswith("error")  # noqa: E731
    paired = lambda save: paired_rows(numbers, results.provenance())  # noqa: E731
    if args.paired_only:
        return results.write_as_measured(PAIRED_CSV, FIELDS, paired, failed=failed, key=KEY)
    measure = lambda save: run(numbers, save)  # noqa: E731
    status = results.write_as_measured("part5_launch_cost.csv", FIELDS, measure, failed=failed, key=KEY)
    if YARDSTICK in numbers:
        status = max(status, results.write_as_measured(PAIRED_CSV, FIELDS, paired, failed=failed, key=KEY))
    return status


if __name__ == "__main__":
    sys.exit(main())
