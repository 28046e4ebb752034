"""The Gluon kernels' remaining choices, each measured (the ideas themselves are the ladder's steps,
timed by tools/ladder.py):

    python -m part5_profiling.tools.gluon_study              # a Hopper GPU: results/<gpu>/part5_gluon.csv
    python -m part5_profiling.tools.gluon_study --order      # results/<gpu>/part5_gluon_order.csv
    python -m part5_profiling.tools.gluon_study --backward   # results/<gpu>/part5_gluon_bwd.csv
    python -m part5_profiling.tools.gluon_study --candidates # results/<gpu>/part5_gluon_candidates.csv

Default: the shipped forward with two softmax warpgroups (both head dims) or three (D = 64; at
D = 128 one warpgroup's S and O do not fit the registers four warpgroups leave), each free (a
warpgroup issues its products when its operands are ready) and taking turns (PINGPONG): which
CONFIGS ships. --order: the forward with the mask, GROUP sequences side by side in the causal
order (gluon_attention.group_size), from one sequence at a time to all 32. --backward: the Gluon
backward in each program order (gluon_backward.ORDER), beside part 4's two kernels and SDPA
cuDNN's backward, at D = 64 the backward with 128 queries a step (the variant patch
tools/variants/bwd_tile128.diff: both warpgroups make half of each dQ_i), and at both head dims
the backward with dS^T's exchange in two stages, as FlashAttention-3 keeps P and dS
(tools/variants/bwd_ds_stages.diff: a warpgroup stores dS_i^T while the other may still be reading
dS_{i-1}^T for its dQ, where one stage makes it wait). --candidates: changes to the forward tried
and not shipped, each against the shipped forward in three interleaved rounds at N = 4096 unless
--n says (the median of each one's speed over the shipped one's in the same round): exp2 partly by
a polynomial on the FMA units (tools/variants/exp2_poly.diff: half or a quarter of each
tile's exponentials), O rescaled only when a row's maximum rose by more than 8 in log2
(tools/variants/cond_rescale.diff), K_j and V_{j-1} in one ring stage, so each key step waits on one
barrier and releases one (tools/variants/kv_stage.diff: Triton puts a warpgroup bar.sync before every
mbarrier arrive; key_step_syncs counts them in the SASS), and at D = 128 what D = 64 ships: O by TMA
(O_BY_TMA), P packed at its product (PACK_LATE; exponentials_before_pv_wait and key_step_opcodes
read what it changes off the SASS), both, and ping-pong (with 232 or 240 registers). B=4, H=8,
N = 4096-16384, bf16; every variant is checked against the float64 reference on the inputs it is
timed on, then timed by CUDA-graph replay (median), with its speed as a fraction of cuDNN's in the
same run. A run replaces the CSV's rows of the variants and shapes it times; the rest stay (older
rounds: the CSV's git history).
"""

import collections
import functools
import re
import statistics
import sys

import torch

from common import runtime, steps
from lab import impls, results, study
from lab.bench import each_shape, timed_call
from lab.timing import attention_flops, graph_time_ms, tflops

B, H = 4, 8
SEQ_LENS = (4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FIELDS = ["variant", *results.SHAPE_FIELDS, "graph_ms", "graph_tflops", "vs_cudnn", "check", *results.PROVENANCE]
KEY = ("variant", "N", "D", "causal")
# --candidates: each row the median over its rounds, with its speed over the shipped forward's
CANDIDATE_FIELDS = [*FIELDS[: -len(results.PROVENANCE)], "vs_shipped", "rounds", *results.PROVENANCE]
BWD_FIELDS = ["candidate", *results.SHAPE_FIELDS, "graph_ms", "graph_tflops", "speedup", "vs_cudnn", "repeatable"]
BWD_FIELDS += ["check", *results.PROVENANCE]
BWD_KEY = ("candidate", "N", "D", "causal")
BWD_ORDERS = {"Gluon, sequence-minor": "SEQUENCE_MINOR", "Gluon, sequence-major": "SEQUENCE_MAJOR"}
BWD_ORDERS["Gluon, grouped"] = "GROUPED"
TILE128 = "Gluon, 128 queries a step"  # tools/variants/bwd_tile128.diff, at D = 64
DS_STAGES = "Gluon, dS in two stages"  # tools/variants/bwd_ds_stages.diff
BWD_CANDIDATES = ("part 4", "Gluon, one pass", *BWD_ORDERS, TILE128, DS_STAGES, "SDPA cuDNN")
ORDERS = {"one sequence at a time" if g == 1 else f"{g} sequences side by side": g for g in (1, 2, 4, 8, 16, B * H)}


def gluon_forward(warpgroups=None, pingpong=None, group=None, module=None, **changes):
    """(Q, K, V, causal) -> (O, L) through the shipped Gluon forward (or `module`, a variant of its
    file), its configuration changed where given (None: part 5's for the head dim; changes: other
    compile-time arguments)."""
    from part5_profiling import gluon_attention

    ga = module or gluon_attention

    def forward(Q, K, V, causal):
        q, k, v = (t.reshape(-1, *t.shape[-2:]).contiguous() for t in (Q, K, V))
        o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        config = dict(ga.CONFIGS[q.shape[-1]])
        registers = {c["WARPGROUPS"]: c["REGISTERS"] for c in ga.CONFIGS.values()}  # per extra warpgroup
        if warpgroups is not None:
            config.update(WARPGROUPS=warpgroups, REGISTERS=registers[warpgroups])
        if pingpong is not None:
            config.update(PINGPONG=pingpong)
        config.update(changes)
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


def candidate_calls(d):
    """{name: forward}: the shipped forward, then the candidate changes at head dim d."""
    poly = steps.load_variant(5, "exp2_poly")
    calls = {"shipped": gluon_forward()}
    calls["exp2 by polynomial, half"] = gluon_forward(module=poly, EMULATED=2)
    calls["exp2 by polynomial, a quarter"] = gluon_forward(module=poly, EMULATED=4)
    calls["conditional rescaling"] = gluon_forward(module=steps.load_variant(5, "cond_rescale"))
    calls["K and V in one stage"] = gluon_forward(module=steps.load_variant(5, "kv_stage"))
    if d == 128:  # D = 64's choices, and ping-pong
        calls["O by a TMA store"] = gluon_forward(O_BY_TMA=True)
        calls["P packed at its product"] = gluon_forward(PACK_LATE=True)
        calls["O by TMA, P packed at its product"] = gluon_forward(O_BY_TMA=True, PACK_LATE=True)
        calls["ping-pong"] = gluon_forward(pingpong=True)
        calls["ping-pong, 240 registers"] = gluon_forward(pingpong=True, REGISTERS=240)
    return calls


PV_WGMMA = re.compile(r"HGMMA\.\S+ R\d+, R\d+, gdesc")  # in the SASS, P V: its A operand, P, from registers


@functools.cache
def forward_sass(module, d, causal=False, **changes):
    """The SASS of the forward of `module` (gluon_attention or a variant of it) compiled for sm_90 at
    head dim d, its compile-time arguments changed where given, as lines. Needs no GPU."""
    from lab import compiler
    from part5_profiling.tools.ladder import compile_gluon

    return compiler.sass(compile_gluon(module, "fwd", d, causal, **changes).asm["cubin"]).splitlines()


def exponentials_before_pv_wait(module, d, causal=False, **changes):
    """The most MUFU exponentials the forward of `module`, compiled for sm_90 at head dim d, runs
    between issuing a P V product and waiting for it (WARPGROUP.DEPBAR to 0 in the SASS): how much
    of a warpgroup's softmax overlaps its own P V. Needs no GPU."""
    most, count = 0, None
    for line in forward_sass(module, d, causal, **changes):
        if PV_WGMMA.search(line):
            count = 0
        elif count is not None and "MUFU.EX2" in line:
            count += 1
        elif count is not None and "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line:
            most, count = max(most, count), None
    return most


def key_step(module, d, causal=False, **changes):
    """The SASS lines of one key step of the forward of `module` compiled for sm_90 at head dim d: the
    innermost loop that issues both products (S_j, whose first wgmma starts from zero, and P V, whose
    A operand is in registers). Needs no GPU."""
    lines = forward_sass(module, d, causal, **changes)
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\.L_x_\d+):", line.strip()))}
    loops = []  # each loop body: from a label to a branch back to it
    for i, line in enumerate(lines):
        if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] : i + 1]
            if any(PV_WGMMA.search(x) for x in body) and any("HGMMA" in x and "RZ, !UPT" in x for x in body):
                loops.append(body)
    return min(loops, key=len)  # the innermost


def key_step_opcodes(module, d, causal=False, **changes):
    """{opcode: count} of one key step's SASS instructions (key_step), e.g. PRMT: byte permutes."""
    ops = (
        re.match(r"\s*/\*[0-9a-f]+\*/\s*(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", x)
        for x in key_step(module, d, causal, **changes)
    )
    return collections.Counter(m.group(1) for m in ops if m)


def key_step_syncs(module, d, causal=False, **changes):
    """(bar.syncs, mbarrier waits, mbarrier arrives) in one key step of the forward of `module`
    compiled for sm_90 at head dim d (key_step). A bar.sync here is a warpgroup's own (BAR.SYNC with a
    thread count): its four warps wait for one another. Needs no GPU."""
    body = key_step(module, d, causal, **changes)
    return (
        sum(bool(re.search(r"BAR\.SYNC\S* 0x\w+, 0x\w+", x)) for x in body),
        sum("SYNCS.PHASECHK" in x for x in body),
        sum("SYNCS.ARRIVE" in x for x in body),
    )


def run_candidates(seq_lens, head_dims, rounds=3, save=None):
    """The candidates in `rounds` rounds (the order reversed every other round), each row the median
    over the rounds so far (saved after each) of its time and of its speed over the shipped
    forward's in the same round."""
    by_round, rows = [], []
    for r in range(rounds):
        flip = (lambda d: dict(reversed(candidate_calls(d).items()))) if r % 2 else candidate_calls
        by_round.append(run(seq_lens, head_dims, flip))
        rows = [_median_row(row, by_round) for row in by_round[0]]
        if save is not None:
            save(rows)
    for r in rows:
        print(f"D={r['D']:<3} causal={r['causal']:d} N={r['N']:>5}  {r['variant']:<32} {r['graph_tflops'] or '-':>7} "
              f"TFLOP/s  x{r['vs_shipped'] or '-'} of shipped  {r['check'][:40]}", flush=True)  # fmt: skip
    return rows


def _median_row(row, by_round):
    """Row's variant and shape over the rounds: median time, speed over cuDNN's and over the shipped
    forward's (each round's own ratio), and how many rounds timed it."""
    same = [next(x for x in found if all(x[k] == row[k] for k in KEY)) for found in by_round]
    if not all(x.get("graph_ms") for x in same):
        return dict(row, graph_ms="", graph_tflops="", vs_cudnn="", vs_shipped="", rounds=len(by_round))
    shipped = [next(x for x in found if x["variant"] == "shipped" and all(x[k] == row[k] for k in KEY[1:]))
               for found in by_round]  # fmt: skip
    ms = [float(x["graph_ms"]) for x in same]
    flops = attention_flops(B, H, row["N"], row["N"], row["D"], bool(row["causal"]))
    median = statistics.median(ms)
    return dict(
        row,
        graph_ms=f"{median:.4f}",
        graph_tflops=tflops(flops, median),
        vs_cudnn=f"{statistics.median(float(x['vs_cudnn']) for x in same):.3f}",
        vs_shipped=f"{statistics.median(float(s['graph_ms']) / m for s, m in zip(shipped, ms)):.3f}",
        check="; ".join(dict.fromkeys(x["check"] for x in same)),
        rounds=len(by_round),
    )


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


def gluon_backward(order=None, module=None):
    """(Q, K, V, O, L, dO, causal) -> (dQ, dK, dV) through the shipped Gluon backward (or `module`, a
    variant of its file) in `order`."""
    from part5_profiling import gluon_backward

    gb = module or gluon_backward

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
    calls[TILE128] = gluon_backward(module=steps.load_variant(5, "bwd_tile128"))  # D = 64 only
    calls[DS_STAGES] = gluon_backward(module=steps.load_variant(5, "bwd_ds_stages"))
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, head_dims, b=B, h=H):
        o, lse = part4.flash_forward(q, k, v, causal)
        found = []
        for name, backward in calls.items():
            if orders.get(name) == gb.default_order(causal, n):  # "Gluon, one pass" runs in this order already
                continue
            if name == TILE128 and d != 64:
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
        (("--candidates",), dict(action="store_true", help="forward changes tried: part5_gluon_candidates.csv")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, d=HEAD_DIMS, extra=extra)
    from part5_profiling import gluon_attention

    if not gluon_attention.supported(torch.empty(1, 1, 64, dtype=torch.bfloat16, device=runtime.DEVICE)):
        print("The Gluon kernels run on a Hopper GPU (sm_90) with Triton's compiler: nothing to time here.")
        return 0
    if args.backward:
        measure = lambda save: run_backward(args.n, args.d, save)  # noqa: E731
        return results.write_as_measured("part5_gluon_bwd.csv", BWD_FIELDS, measure, key=BWD_KEY)
    if args.candidates:
        measure = lambda save: run_candidates(args.n if args.n != SEQ_LENS else (4096,), args.d, save=save)  # noqa: E731
        return results.write_as_measured("part5_gluon_candidates.csv", CANDIDATE_FIELDS, measure, key=KEY)
    if args.order:
        calls = lambda d: {name: gluon_forward(group=g) for name, g in ORDERS.items()}  # noqa: E731
        measure = lambda save: run(args.n, args.d, calls, (True,), save)  # noqa: E731
        return results.write_as_measured("part5_gluon_order.csv", FIELDS, measure, key=KEY)
    return results.write_as_measured(
        "part5_gluon.csv", FIELDS, lambda save: run(args.n, args.d, forward_calls, save=save), key=KEY
    )


if __name__ == "__main__":
    sys.exit(main())
