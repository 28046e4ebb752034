"""The Gluon forward's two choices, each measured: how many softmax warpgroups share one K/V tile
(2: 128 query rows per program; 3: 192), and the persistent grid (one program per SM, each taking
query tiles in turn) against one program per query tile. With --backward, the Gluon backward
(gluon_backward.py) against part 4's two kernels, in each order its programs can take.

    python -m part5_profiling.tools.gluon_study              # a Hopper GPU: results/<gpu>/part5_gluon.csv
    python -m part5_profiling.tools.gluon_study --backward   # results/<gpu>/part5_gluon_bwd.csv
    python -m part5_profiling.tools.gluon_study --order      # results/<gpu>/part5_gluon_order.csv
    python -m part5_profiling.tools.gluon_study --pingpong   # ping-pong rows of part5_gluon.csv

Every variant is checked in bf16 against the float64 reference on the inputs it is timed on (as
the benchmark checks), then timed by CUDA-graph replay (median), beside part 4's forward (the tl
kernel, which part 5 keeps for the calls Gluon does not take) and SDPA's cuDNN backend on the same
inputs. B=4, H=8, N = 4096-16384. The warpgroups run free here (PINGPONG off; --pingpong below).
Three warpgroups at D = 128 are left out: the registers of one warpgroup (S and O, 64 x 128 float32
each) do not fit the 160 a thread gets when four warpgroups share the register file.

With --pingpong (no part 4 row), the persistent kernel with its softmax warpgroups running free
(each issues its products as soon as its operands are in shared memory) and taking turns (PINGPONG,
FlashAttention-3's ping-pong: a warpgroup issues its products once the one before it has issued
its own, so that one multiplies while the others compute exponentials): two warpgroups at both
head dims, and three at D = 64.

With --order, part 5's forward configuration with the mask, its programs taking the longest query
tiles first with GROUP sequences side by side (gluon_attention.group_size), for GROUP from one
sequence at a time (one sequence's query tiles side by side) to all 32 at once (the programs
running together take the same query tile of different sequences).

The backward's rows time flash_backward alone, from the forward's O and L, by CUDA-graph replay:
part 4's (dK/dV, then dQ), the Gluon kernel, the Gluon kernel with its programs in each order part 5
does not take for that call (gluon_backward.default_order: sequence-major without a mask; causal,
sequence-minor below N = 8192 and grouped from there, grouped meaning sequences side by side in
groups that fit in L2, key block by key block), and SDPA cuDNN's backward (autograd's, from a
retained graph, as the benchmark's bwd mode runs it). The backward counts 2.5 times the forward's
FLOPs. Rows of two earlier studies stay in the CSV, from commits that had the switches: the kernel
with dQ made but not added, or with no dQ at all (ablations: they computed something else on
purpose), and a staggered order without a mask (within 2% of sequence-major, so the switch went).
"""

import functools
import sys

import torch

from common import impls, results, runtime, study
from common.bench import each_shape, timed_call
from common.check import check_slices
from common.timing import attention_flops, graph_time_ms, tflops

B, H = 4, 8
SEQ_LENS = (4096, 8192, 16384)
HEAD_DIMS = (64, 128)
REGISTERS = {2: 232, 3: 160}  # per thread of each extra warpgroup: the register file is 64K x 32 bit
FIELDS = [
    "variant",
    *results.SHAPE_FIELDS,
    "graph_ms",
    "graph_tflops",
    "vs_cudnn",
    "check",
    *results.PROVENANCE,
]
KEY = ("variant", "N", "D", "causal")
BWD_FIELDS = [
    "candidate",
    *results.SHAPE_FIELDS,
    "graph_ms",
    "graph_tflops",
    "speedup",
    "vs_cudnn",
    "repeatable",
    "check",
    *results.PROVENANCE,
]
BWD_KEY = ("candidate", "N", "D", "causal")
# What --backward times, in the order its tables show them. A row of the CSV under another name was
# measured by an earlier version of this study: with a switch the kernel no longer has, or by an
# earlier kernel ("Gluon, row-order dQ", "Gluon, two dQ adds at D = 64": see report.py's caption).
BWD_ORDERS = {
    "Gluon, sequence-minor": "SEQUENCE_MINOR",
    "Gluon, sequence-major": "SEQUENCE_MAJOR",
    "Gluon, grouped": "GROUPED",
}
BWD_CANDIDATES = ("part 4", "Gluon, one pass", "Gluon, addresses hoisted", *BWD_ORDERS, "SDPA cuDNN")


def variants(d):
    """{name: (warpgroups, persistent)} for head dim d."""
    found = {}
    for warpgroups in (2, 3):
        if d == 128 and warpgroups == 3:
            continue
        found[f"{warpgroups} warpgroups, persistent"] = (warpgroups, True)
        found[f"{warpgroups} warpgroups, a program per tile"] = (warpgroups, False)
    return found


# --order: {name: the sequences side by side in the causal order}, the same at every D
ORDERS = {"one sequence at a time" if g == 1 else f"{g} sequences side by side": g for g in (1, 2, 4, 8, 16, B * H)}


def gluon_forward(warpgroups=None, persistent=True, group=None, pingpong=None):
    """flash_forward(Q, K, V, causal) -> (O, L) through the Gluon kernel in this configuration
    (warpgroups None: part 5's for the head dim; group None: part 5's causal order; pingpong None:
    part 5's PINGPONG for the head dim)."""
    from part5_profiling import flash_attention, gluon_attention

    def forward(Q, K, V, causal):
        q, k, v = (flash_attention._as_sequences(t) for t in (Q, K, V))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        d = q.shape[-1]
        config = None
        if warpgroups is not None or pingpong is not None:
            config = dict(gluon_attention.CONFIGS[d])
            if warpgroups is not None:
                config.update(WARPGROUPS=warpgroups, REGISTERS=REGISTERS[warpgroups])
            if pingpong is not None:
                config.update(PINGPONG=pingpong)
        gluon_attention.launch(q, k, v, o, lse, causal, config, persistent, group)
        return o.view(Q.shape), lse.view(Q.shape[:-1])

    return forward


def forward_calls(d):
    """{name: forward} of the warpgroups study at head dim d: part 4's tl forward, which part 5 keeps
    for other calls, and the Gluon kernel in each choice of warpgroups and grid."""
    from part5_profiling.tools import forward_variants

    calls = {"part 4": forward_variants.forward()}  # the Gluon variants with their warpgroups free (no PINGPONG)
    calls.update({name: gluon_forward(*choice, pingpong=False) for name, choice in variants(d).items()})
    return calls


def pingpong_calls(d):
    """{name: forward} of --pingpong at head dim d: the persistent kernel with its warpgroups free
    (each issues its products when its operands are ready) and taking turns (PINGPONG), for each
    choice of warpgroups that fits the head dim."""
    calls = {}
    for warpgroups in (2, 3) if d == 64 else (2,):
        for pingpong, how in ((False, ""), (True, ", ping-pong")):
            calls[f"{warpgroups} warpgroups, persistent{how}"] = gluon_forward(warpgroups, True, None, pingpong)
    return calls


def order_calls(d):
    """{name: forward} of --order: part 5's configuration in each causal order (any head dim d)."""
    return {name: gluon_forward(group=group) for name, group in ORDERS.items()}


def run(seq_lens, save=None, head_dims=HEAD_DIMS, calls_of=forward_calls, masks=(False, True)):
    cudnn = impls.sdpa_impl("cudnn")
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, _) in each_shape(seq_lens, head_dims, masks, b=B, h=H):
        flops = attention_flops(B, H, n, n, d, causal)
        calls = calls_of(d)
        shape_rows = []
        for name, forward in calls.items():
            row = dict(variant=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                with torch.no_grad():
                    o, lse = forward(q, k, v, causal)
                    report = check_slices({"O": o, "L": lse}, q, k, v, causal)
                    row["check"] = study.checked(report)
                    if report.ok:
                        ms = graph_time_ms(functools.partial(forward, q, k, v, causal))
                        row.update(graph_ms=f"{ms:.4f}", graph_tflops=tflops(flops, ms))
            except Exception as e:  # a configuration the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            shape_rows.append(row)
        row = dict(variant="SDPA cuDNN", B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
        with impls.sdpa_context("cudnn"), torch.no_grad():
            report = check_slices({"O": cudnn.attention(q, k, v, causal)}, q, k, v, causal)
            row["check"] = study.checked(report)
            ms = graph_time_ms(functools.partial(cudnn.attention, q, k, v, causal))
        row.update(graph_ms=f"{ms:.4f}", graph_tflops=tflops(flops, ms))
        shape_rows.append(row)
        for r in shape_rows:
            if r.get("graph_ms"):
                r["vs_cudnn"] = f"{ms / float(r['graph_ms']):.3f}"
            print(
                f"D={d:<3} causal={causal:d} N={n:>5}  {r['variant']:<38} {r.get('graph_tflops') or '-':>7} TFLOP/s "
                f"({r.get('vs_cudnn') or '-'} of cuDNN)  {r['check'][:30]}",
                flush=True,
            )
        rows += shape_rows
        if save is not None:
            save(rows)
    return rows


def gluon_backward(order=None, addresses_in_loop=True):
    """flash_backward(Q, K, V, O, L, dO, causal) -> (dQ, dK, dV) through the Gluon backward (its
    programs in `order`, part 5's default_order by default; addresses_in_loop=False: its operand
    addresses hoisted out of the loop, as the compiler left them)."""
    from part5_profiling import flash_attention, gluon_backward

    def backward(Q, K, V, O, L, dO, causal):
        q, k, v, o, do = (flash_attention._as_sequences(t) for t in (Q, K, V, O, dO))
        lse = L.reshape(q.shape[:-1]).contiguous()
        dq, dk, dv = gluon_backward.launch(q, k, v, o, do, lse, causal, order, addresses_in_loop=addresses_in_loop)
        return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)

    return backward


def run_backward(seq_lens, save=None, head_dims=HEAD_DIMS):
    from part5_profiling import gluon_backward as gb
    from part5_profiling.tools import backward_variants, forward_variants

    cudnn = impls.sdpa_impl("cudnn")
    calls = {"part 4": backward_variants.flash_backward, "Gluon, one pass": gluon_backward()}
    calls["Gluon, addresses hoisted"] = gluon_backward(addresses_in_loop=False)
    orders = {name: getattr(gb, order) for name, order in BWD_ORDERS.items()}
    calls.update({name: gluon_backward(order) for name, order in orders.items()})
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, head_dims, b=B, h=H):
        flops = attention_flops(B, H, n, n, d, causal, "bwd")
        o, lse = forward_variants.flash_forward(q, k, v, causal)
        shape_rows = []
        for name, backward in calls.items():
            if orders.get(name) == gb.default_order(causal, n):  # "Gluon, one pass" already runs in this order
                continue
            row = dict(candidate=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                call = functools.partial(backward, q, k, v, o, lse, do, causal)
                row.update(study.backward_row(call, o, lse, q, k, v, do, causal, flops))
            except Exception as e:  # a configuration the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            shape_rows.append(row)
        row = dict(candidate="SDPA cuDNN", B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
        try:
            with impls.sdpa_context("cudnn"):
                ms = graph_time_ms(timed_call(cudnn, "bwd", q, k, v, do, causal))
            row.update(graph_ms=f"{ms:.4f}", graph_tflops=tflops(flops, ms), check="checked by the benchmark")
        except Exception as e:
            row["check"] = f"error: {results.why(e)}"
        shape_rows.append(row)
        times = {r["candidate"]: float(r["graph_ms"]) for r in shape_rows if r.get("graph_ms")}
        for r in shape_rows:
            if r.get("graph_ms"):
                r["speedup"] = f"{times['part 4'] / float(r['graph_ms']):.3f}" if "part 4" in times else ""
                r["vs_cudnn"] = f"{times['SDPA cuDNN'] / float(r['graph_ms']):.3f}" if "SDPA cuDNN" in times else ""
            print(
                f"D={d:<3} causal={causal:d} N={n:>5}  {r['candidate']:<32} {r.get('graph_tflops') or '-':>7} TFLOP/s "
                f"(x{r.get('speedup') or '-'} of part 4, {r.get('vs_cudnn') or '-'} of cuDNN)  {r['check'][:30]}",
                flush=True,
            )
        rows += shape_rows
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    extra = [
        (("--backward",), dict(action="store_true", help="the Gluon backward: part5_gluon_bwd.csv")),
        (("--order",), dict(action="store_true", help="the forward's causal order: part5_gluon_order.csv")),
        (("--pingpong",), dict(action="store_true", help="warpgroups free or taking turns: part5_gluon.csv")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, d=HEAD_DIMS, extra=extra)
    from part5_profiling import gluon_attention

    if not gluon_attention.supported(torch.empty(1, 1, 64, dtype=torch.bfloat16, device=runtime.DEVICE)):
        which = "backward" if args.backward else "forward"
        print(f"The Gluon {which} runs on a Hopper GPU (sm_90) with Triton's compiler: nothing to time here.")
        return 0
    if args.backward:
        return results.write_as_measured(
            "part5_gluon_bwd.csv", BWD_FIELDS, lambda save: run_backward(args.n, save, args.d), key=BWD_KEY
        )
    if args.order:
        measure = lambda save: run(args.n, save, args.d, order_calls, masks=(True,))  # noqa: E731
        return results.write_as_measured("part5_gluon_order.csv", FIELDS, measure, key=KEY)
    calls_of = pingpong_calls if args.pingpong else forward_calls
    measure = lambda save: run(args.n, save, args.d, calls_of)  # noqa: E731
    return results.write_as_measured("part5_gluon.csv", FIELDS, measure, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
