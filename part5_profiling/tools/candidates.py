"""Candidate changes to part 4's forward and backward, each checked and timed on its own against part 4.

    python -m part5_profiling.tools.candidates              # GPU: results/<gpu>/part5_candidates.csv
    python -m part5_profiling.tools.candidates --backward   # GPU: results/<gpu>/part5_bwd_candidates.csv

A candidate is part 4's kernel with one switch of the study's own copy turned (forward_variants.py's
CANDIDATE, backward_variants.py's DQ_BY_TMA). Unlike the stage variants, every candidate must
compute the same attention: each is checked against the float64 reference on the inputs it is
timed on before it is timed. Part 5's kernel takes a candidate only where this run shows it pays.
Shapes: B=4, H=8, D 64 and 128, causal and not, N = 4096 and 16384, bf16; CUDA-graph replay, median;
each candidate autotuned for itself. The backward's candidates are timed the same way on
flash_backward alone, from the forward's O and L.
"""

import functools
import sys

from common import results, study, triton_tools
from common.bench import each_shape
from common.timing import attention_flops
from part5_profiling.tools import backward_variants as bv
from part5_profiling.tools import forward_variants as fv

B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (4096, 16384)
BWD_CANDIDATES = {"part 4": False, "dQ by TMA reduce-add": True}  # name -> backward_variants' dq_by_tma
FIELDS = [
    "candidate",
    *results.SHAPE_FIELDS,
    "graph_ms",
    "graph_tflops",
    "speedup",
    "config",
    "check",
    *results.PROVENANCE,
]
KEY = ("candidate", "N", "D", "causal")  # a run of some candidates keeps the others' rows


def run(seq_lens, names=None, save=None):
    """Check and time part 4 and the named candidates (default: every one) at each N."""
    names = ["part 4", *(n for n in names or fv.CANDIDATES if n in fv.CANDIDATES and n != "part 4")]
    forwards = {name: fv.forward(candidate=fv.CANDIDATES[name]) for name in names}
    rows = study.time_forwards(
        forwards,
        lambda name, causal: dict(candidate=name),
        seq_lens,
        do_bench=False,
        save=save,
        config=lambda _: fv.chosen(),
    )
    base = {
        (r["D"], r["causal"], r["N"]): float(r["graph_ms"])
        for r in rows
        if r["candidate"] == "part 4" and r.get("graph_ms")
    }
    for r in rows:
        if r.get("graph_ms") and (r["D"], r["causal"], r["N"]) in base:
            r["speedup"] = f"{base[(r['D'], r['causal'], r['N'])] / float(r['graph_ms']):.3f}"
    return rows


BWD_FIELDS = [
    "candidate",
    *results.SHAPE_FIELDS,
    "graph_ms",
    "graph_tflops",
    "speedup",
    "config",
    "repeatable",
    "check",
    *results.PROVENANCE,
]


def run_backward(seq_lens, names=None, save=None):
    """Check and time part 4's backward and the named backward candidates: flash_backward alone from
    the forward's O and L (study.backward_row)."""
    names = ["part 4", *(n for n in names or BWD_CANDIDATES if n in BWD_CANDIDATES and n != "part 4")]
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in each_shape(seq_lens, HEAD_DIMS, b=B, h=H):
        base = None
        flops = attention_flops(B, H, n, n, d, causal, "bwd")
        o, lse = fv.flash_forward(q, k, v, causal)
        for name in names:
            row = dict(candidate=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                backward = functools.partial(bv.flash_backward, q, k, v, o, lse, do, causal, BWD_CANDIDATES[name])
                row.update(study.backward_row(backward, o, lse, q, k, v, do, causal, flops))
                if row.get("graph_ms"):
                    ms = float(row["graph_ms"])
                    base = ms if name == "part 4" else base
                    config = triton_tools.chosen_label(bv._attn_bwd_dkdv)
                    row.update(speedup=f"{base / ms:.3f}" if base else "", config=config)
            except Exception as e:  # a variant the compiler refuses: say why, go on
                row["check"] = f"error: {results.why(e)}"
            rows.append(row)
            print(
                f"{name:<24} D={d:<3} causal={causal:d} N={n:>5}  {row.get('graph_tflops') or '-':>7} TFLOP/s  "
                f"{row.get('config', '')}  repeatable={row.get('repeatable', '-')}  {row['check'][:40]}",
                flush=True,
            )
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    choices = [*fv.CANDIDATES, *BWD_CANDIDATES]
    extra = [
        (
            ("--candidate",),
            dict(
                action="append",
                choices=choices,
                help="time this candidate (repeatable; part 4 always runs); default: all",
            ),
        ),
        (("--backward",), dict(action="store_true", help="the backward's candidates: part5_bwd_candidates.csv")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, extra=extra)
    if not study.on_gpu("The candidates are timed (on a CPU the tests check that each computes attention)"):
        return 0
    if args.backward:
        run_them = lambda save: run_backward(args.n, args.candidate, save)  # noqa: E731
        return results.write_as_measured("part5_bwd_candidates.csv", BWD_FIELDS, run_them, key=KEY)
    return results.write_as_measured(
        "part5_candidates.csv", FIELDS, lambda save: run(args.n, args.candidate, save), key=KEY
    )


if __name__ == "__main__":
    sys.exit(main())
