"""What every study shares: its command line, the GPU guard, check then time, and the results file.

A study (launch orders, the ablation, the candidates, the Gluon study, ...) measures variants of a
kernel on the benchmark's inputs. Each one's main() reads:

    args = study.arguments(__doc__, argv, n=SEQ_LENS)          # --n (and --d, --causal if asked)
    if not study.on_gpu("The launch-order study times compiled kernels"):
        return 0                                                # says so, and exits cleanly
    return results.write_as_measured("part3_launch_order.csv", FIELDS, lambda save: run(args.n, save))

and in between it checks each variant against the float64 reference on the inputs it is timed on
before it times it (forward_row, backward_row), so a wrong variant is never timed.
"""

import argparse

import torch

from common import runtime
from common.check import check_slices
from lab import bench, results
from lab.bench import each_shape
from lab.impls import Impl
from lab.timing import graph_time_ms, tflops, time_ms


def arguments(doc, argv=None, n=None, d=None, causal=False, extra=()):
    """Parse a study's command line: --n (repeatable, default the tuple n) when n is given, --d
    (choices d) when d is given, --causal 0/1 when causal; extra: (flags, add_argument keywords)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if n is not None:
        ap.add_argument("--n", type=int, action="append", help=f"sequence length (repeatable); default {n}")
    if d is not None:
        ap.add_argument("--d", type=int, action="append", choices=d, help="head dimension (repeatable); default all")
    if causal:
        ap.add_argument("--causal", type=int, action="append", choices=(0, 1), help="0 or 1 (repeatable); default both")
    for flags, kwargs in extra:
        ap.add_argument(*flags, **kwargs)
    args = ap.parse_args(argv)
    if n is not None:
        args.n = tuple(args.n or n)
    if d is not None:
        args.d = tuple(args.d or d)
    if causal:
        args.causal = tuple(bool(c) for c in args.causal or (0, 1))
    return args


def on_gpu(what):
    """True on a CUDA GPU with compiled kernels; otherwise print that `what` needs one and return False."""
    if not runtime.COMPILED:
        print(f"{what}: it needs a CUDA GPU (Triton's interpreter on a CPU times nothing).")
    return runtime.COMPILED


def checked(report):
    """A check for a study's CSV cell: "ok " or "FAIL " and every tensor's error against its bound."""
    return ("ok " if report.ok else "FAIL ") + str(report)


def forward_row(forward, q, k, v, causal, do_bench=True):
    """Check a forward (q, k, v, causal) -> (O, L) against the float64 reference on (q, k, v); if it
    passed, time it as the benchmark does (bench.measure): do_bench median (skipped with
    do_bench=False) and CUDA-graph replay. Returns row fields: check, ms, tflops, graph_ms, graph_tflops."""
    impl = Impl(name="", forward=lambda *a: dict(zip("OL", forward(*a))), attention=forward)
    timer = time_ms if do_bench else None
    return bench.measure({}, impl, "fwd", q, k, v, None, causal, timer, graph_time_ms, verdict=checked)


def time_forwards(
    forwards, row_for, seq_lens, head_dims=bench.HEAD_DIMS, b=bench.B, h=bench.H, do_bench=True, save=None, config=None
):
    """Check and time each forward ({label: (q, k, v, causal) -> (O, L)}) on the same bf16 inputs,
    for every D in head_dims, causal and not, and N in seq_lens (B=b, H=h; the benchmark's by
    default). row_for(label, causal) gives a row's own columns; each row also gets the shape, what
    forward_row returns, config(label) (if given) and the provenance. A forward that fails to compile
    or run gets an "error: ..." check instead. save(rows so far), if given, runs after every shape."""
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, _) in each_shape(seq_lens, head_dims, b=b, h=h):
        for label, forward in forwards.items():
            row = dict(row_for(label, causal), B=b, H=h, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                row.update(forward_row(forward, q, k, v, causal, do_bench=do_bench))
                row["config"] = config(label) if config is not None else ""
            except Exception as e:  # a variant the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            rows.append(row)
            print(f"{label:<34} D={d:<3} causal={causal:d} N={n:>5}  {row.get('tflops') or '-':>7} TFLOP/s "
                  f"(graph {row.get('graph_tflops') or '-':>7})  {row.get('config', '')}  {row['check'][:30]}", flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows


def backward_row(backward, o, lse, q, k, v, do, causal, flops, check=True):
    """Row fields for one backward (a call -> dQ, dK, dV, from the forward's O and L): checked against
    the float64 reference on dQ, dK and dV, with `repeatable` saying whether two calls give dQ bit
    for bit, then timed by CUDA-graph replay if the check passed. check=False: a variant that
    computes something else on purpose, timed as it is."""
    dq, dk, dv = backward()
    fields = dict(check="not checked: computes something else on purpose")
    if check:
        report = check_slices({"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}, q, k, v, causal, do)
        fields = dict(check=checked(report), repeatable=int(torch.equal(backward()[0], dq)))
        if not report.ok:
            return fields
    ms = graph_time_ms(backward)
    return dict(fields, graph_ms=f"{ms:.4f}", graph_tflops=tflops(flops, ms))
