"""How the project counts and times: the FLOPs of attention, and the timers every measurement uses.

- attention_flops: 4 * B * H * N_q * N_k * D for the forward's two matrix products, halved when
  causal; the backward counts 2.5 times the forward (five products instead of two).
- time_ms: triton.testing.do_bench's median (the benchmark protocol: each call launched from
  Python, L2 flushed between calls), or for calls of 50 ms and more the median of three calls
  timed alone.
- graph_time_ms: the median of the call replayed from a CUDA graph: the GPU's time without the
  Python and launch cost of each call.
"""

import torch


def attention_flops(b, h, n_q, n_k, d, causal, mode="fwd"):
    """4*B*H*N_q*N_k*D for the two matmuls of the forward, halved when causal; backward = 2.5x."""
    flops = 4 * b * h * n_q * n_k * d
    if causal:
        flops //= 2
    return {"fwd": flops, "bwd": flops * 2.5, "fwd+bwd": flops * 3.5}[mode]


SLOW_MS = 50.0  # a call this long is timed by slow_time_ms, not do_bench
SLOW_SAMPLES = 3
_FLUSH_BYTES = 256 * 2**20  # what do_bench writes to flush L2 (the H200's is 60 MB)


def time_ms(fn, warmup=25, rep=100):
    """Median milliseconds of fn over about `rep` ms of runs, after `warmup` ms (L2 flushed between
    runs): triton.testing.do_bench. A call that takes SLOW_MS or more twice in a row (the PyTorch
    backward of parts 0-3 at long N: seconds a call) gets slow_time_ms instead: do_bench would make
    eight such calls and time only one of them."""
    import triton

    if one_call_ms(fn) < SLOW_MS or one_call_ms(fn) < SLOW_MS:  # the first may include compiling
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return slow_time_ms(fn)


def one_call_ms(fn, flush=None):
    """Milliseconds of one call of fn between two CUDA events, after writing `flush` (if given)."""
    if flush is not None:
        flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def slow_time_ms(fn):
    """Median of SLOW_SAMPLES calls, each timed alone with L2 flushed before it (for calls so long
    that one more warm-up or a few samples are all the statistics they need)."""
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    times = sorted(one_call_ms(fn, flush) for _ in range(SLOW_SAMPLES))
    return times[len(times) // 2]


def graph_time_ms(fn):
    """Median milliseconds of fn replayed from a CUDA graph: the GPU's time alone, without the
    Python and launch cost of each call (which do_bench includes whenever it exceeds the GPU time)."""
    import triton

    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def tflops(flops, ms):
    """A rate for a CSV cell: FLOPs over milliseconds, in TFLOP/s, one decimal."""
    return f"{flops / ms * 1e-9:.1f}"
