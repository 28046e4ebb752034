"""The Gluon kernels' remaining choices, each measured (the ideas themselves are the ladder's steps,
timed by tools/ladder.py):

    python -m part5_profiling.tools.gluon_study              # a Hopper GPU: results/<gpu>/part5_gluon.csv
    python -m part5_profiling.tools.gluon_study --order      # results/<gpu>/part5_gluon_order.csv
    python -m part5_profiling.tools.gluon_study --backward   # results/<gpu>/part5_gluon_bwd.csv

Default: the shipped forward with two softmax warpgroups (both head dims) or three (D = 64; at
D = 128 one warpgroup's S and O do not fit the registers four warpgroups leave), each free (a
warpgroup issues its products when its operands are ready) and taking turns (PINGPONG): which
CONFIGS ships. --order: the forward with the mask, GROUP sequences side by side in the causal
order (gluon_attention.group_size), from one sequence at a time to all 32. --backward: the Gluon
backward in each program order (gluon_backward.ORDER), beside part 4's two kernels and SDPA
cuDNN's backward. B=4, H=8, N = 4096-16384, bf16; every variant is checked against the float64
reference on the inputs it is timed on, then timed by CUDA-graph replay (median), with its speed as
a fraction of cuDNN's in the same run. Rows of earlier versions of this study stay in the CSVs.
"""

import functools
import sys

import torch

from common import runtime
from lab import impls, results, study
from lab.bench import each_shape, timed_call
from lab.timing import attention_flops, graph_time_ms, tflops

B, H = 4, 8
SEQ_LENS = (4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FIELDS = ["variant", *results.SHAPE_FIELDS, "graph_ms", "graph_tflops", "vs_cudnn", "check", *results.PROVENANCE]
KEY = ("variant", "N", "D", "causal")
BWD_FIELDS = ["candidate", *results.SHAPE_FIELDS, "graph_ms", "graph_tflops", "speedup", "vs_cudnn", "repeatable"]
BWD_FIELDS += ["check", *results.PROVENANCE]
BWD_KEY = ("candidate", "N", "D", "causal")
BWD_ORDERS = {"Gluon, sequence-minor": "SEQUENCE_MINOR", "Gluon, sequence-major": "SEQUENCE_MAJOR"}
BWD_ORDERS["Gluon, grouped"] = "GROUPED"
BWD_CANDIDATES = ("part 4", "Gluon, one pass", *BWD_ORDERS, "SDPA cuDNN")
ORDERS = {"one sequence at a time" if g == 1 else f"{g} sequences side by side": g for g in (1, 2, 4, 8, 16, B * H)}


def gluon_forward(warpgroups=None, pingpong=None, group=None):
    """(Q, K, V, causal) -> (O, L) through the shipped Gluon forward, its configuration changed where
    given (None: part 5's for the head dim)."""
    from part5_profiling import gluon_attention as ga

    def forward(Q, K, V, causal):
        q, k, v = (t.reshape(-1, *t.shape[-2:]).contiguous() for t in (Q, K, V))
        o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        config = dict(ga.CONFIGS[q.shape[-1]])
        registers = {c["WARPGROUPS"]: c["REGISTERS"] for c in ga.CONFIGS.values()}  # per extra warpgroup
        if warpgroups is not None:
            config.update(WARPGROUPS=warpgroups, REGISTERS=registers[warpgroups])
        if pingpong is not None:
            config.update(PINGPONG=pingpong)
        ga.launch(q, k, v, o, lse, causal, config, group)
        return o.view(Q.shape), lse.view(Q.shape[:-1])

    return forward


def forward_calls(d):
    """{name: forward}: the persistent kernel with 2 warpgroups (and 3 at D = 64), free or taking turns."""
    calls = {}
    for warpgroups in (2, 3) if d == 64 else (2,):
        for pingpong, how in ((False, ""), (True, ", ping-pong")):
            calls[f"{warpgroups} warpgroups, persistent{how}"] = gluon_forward(warpgroups, pingpong)
    return calls


def with_cudnn(rows, inputs, causal, mode, name_column):
    """Time SDPA cuDNN on the shape's inputs and give every row its speed as a fraction of cuDNN's."""
    q, k, v, do = inputs
    b, h, n, d = q.shape
    with impls.sdpa_context("cudnn"):
        ms = graph_time_ms(timed_call(impls.sdpa_impl("cudnn"), mode, q, k, v, do, causal))
    flops = attention_flops(b, h, n, n, d, causal, mode)
    cudnn = {name_column: "SDPA cuDNN", "graph_ms": f"{ms:.4f}", "graph_tflops": tflops(flops, ms)}
    rows.append(dict(rows[-1], **cudnn, check="checked by the benchmark", repeatable=""))
    for r in rows:
        if r.get("graph_ms"):
            r["vs_cudnn"] = f"{ms / float(r['graph_ms']):.3f}"
    return rows


def run(seq_lens, head_dims, calls_of, masks=(False, True), save=None):
    meta, rows = results.provenance(), []
    for d, causal, n, inputs in each_shape(seq_lens, head_dims, masks, b=B, h=H):
        found = []
        for name, forward in calls_of(d).items():
            row = dict(variant=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                row.update(study.forward_row(forward, *inputs[:3], causal, do_bench=False))
            except Exception as e:  # a configuration the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            found.append(row)
        rows += with_cudnn(found, inputs, causal, "fwd", "variant")
        for r in found:
            print(f"D={d:<3} causal={causal:d} N={n:>5}  {r['variant']:<38} {r.get('graph_tflops') or '-':>7} TFLOP/s "
                  f"({r.get('vs_cudnn') or '-'} of cuDNN)  {r['check'][:30]}", flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows


def gluon_backward(order=None):
    """(Q, K, V, O, L, dO, causal) -> (dQ, dK, dV) through the shipped Gluon backward in `order`."""
    from part5_profiling import gluon_backward as gb

    def backward(Q, K, V, O, L, dO, causal):
        seqs = [t.reshape(-1, *t.shape[-2:]).contiguous() for t in (Q, K, V, O, dO)]
        dq, dk, dv = gb.launch(*seqs, L.reshape(seqs[0].shape[:-1]).contiguous(), causal, order)
        return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)

    return backward


def run_backward(seq_lens, head_dims, save=None):
    from part5_profiling import gluon_backward as gb
    from part5_profiling.tools.candidates import load

    part4 = load(None)
    calls = {"part 4": part4.flash_backward, "Gluon, one pass": gluon_backward()}
    orders = {name: getattr(gb, order) for name, order in BWD_ORDERS.items()}
    calls.update({name: gluon_backward(order) for name, order in orders.items()})
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, head_dims, b=B, h=H):
        o, lse = part4.flash_forward(q, k, v, causal)
        found = []
        for name, backward in calls.items():
            if orders.get(name) == gb.default_order(causal, n):  # "Gluon, one pass" runs in this order already
                continue
            row = dict(candidate=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                call = functools.partial(backward, q, k, v, o, lse, do, causal)
                row.update(
                    study.backward_row(call, o, lse, q, k, v, do, causal, attention_flops(B, H, n, n, d, causal, "bwd"))
                )
            except Exception as e:  # a configuration the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            found.append(row)
        rows += with_cudnn(found, (q, k, v, do), causal, "bwd", "candidate")
        base = next((float(r["graph_ms"]) for r in found if r["candidate"] == "part 4" and r.get("graph_ms")), None)
        for r in found:
            r["speedup"] = f"{base / float(r['graph_ms']):.3f}" if base and r.get("graph_ms") else ""
            print(f"D={d:<3} causal={causal:d} N={n:>5}  {r['candidate']:<24} {r.get('graph_tflops') or '-':>7} TFLOP/s "
                  f"(x{r['speedup'] or '-'} of part 4, {r.get('vs_cudnn') or '-'} of cuDNN)  {r['check'][:30]}", flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    extra = [
        (("--backward",), dict(action="store_true", help="the Gluon backward's orders: part5_gluon_bwd.csv")),
        (("--order",), dict(action="store_true", help="the forward's causal order: part5_gluon_order.csv")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, d=HEAD_DIMS, extra=extra)
    from part5_profiling import gluon_attention

    if not gluon_attention.supported(torch.empty(1, 1, 64, dtype=torch.bfloat16, device=runtime.DEVICE)):
        print("The Gluon kernels run on a Hopper GPU (sm_90) with Triton's compiler: nothing to time here.")
        return 0
    if args.backward:
        measure = lambda save: run_backward(args.n, args.d, save)  # noqa: E731
        return results.write_as_measured("part5_gluon_bwd.csv", BWD_FIELDS, measure, key=BWD_KEY)
    if args.order:
        calls = lambda d: {name: gluon_forward(group=g) for name, g in ORDERS.items()}  # noqa: E731
        measure = lambda save: run(args.n, args.d, calls, (True,), save)  # noqa: E731
        return results.write_as_measured("part5_gluon_order.csv", FIELDS, measure, key=KEY)
    return results.write_as_measured(
        "part5_gluon.csv", FIELDS, lambda save: run(args.n, args.d, forward_calls, save=save), key=KEY
    )


if __name__ == "__main__":
    sys.exit(main())
