"""Candidate changes to part 4's forward, each checked and timed on its own against the original.

    python -m part5_profiling.candidates   # GPU: results/<gpu>/part5_candidates.csv

A candidate is part 4's kernel file with a few lines replaced (CANDIDATES below). Unlike the stage
variants, every candidate must compute the same attention: each is checked against the float64
reference on the inputs it is timed on before it is timed. Part 5's kernel takes a candidate only
where this run shows it pays. Shapes: B=4, H=8, D 64 and 128, causal and not, N = 4096 and 16384,
bf16; CUDA-graph replay, median; each candidate autotuned for itself.
"""

import argparse
import sys

from common import results, runtime, variants
from part3_inner_loop.launch_order import ORDERS

PART = 4
B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (4096, 16384)
DOC = '    """The online softmax over the key tiles starting at lo, lo + BLOCK_N, ... below hi."""\n'
LOOP = DOC + "    for k_start in range(lo, hi, BLOCK_N):\n"  # the forward's loop (the dQ kernel has one like it)
CAUSAL_ORDER = (
    "        tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid // N_SEQS\n        bh = (pid % N_SEQS).to(tl.int64)\n"
)
GROUPED = ORDERS["tile-major in groups of 4 sequences, last tile first"]
CANDIDATES = {
    "part 4": [],
    # Triton splits the loop's warps into a producer (the loads) and consumers (products, softmax).
    "warp-specialized key loop": [
        (LOOP, DOC + "    for k_start in tl.range(lo, hi, BLOCK_N, warp_specialize=True):\n")
    ],
    # The causal launch order of part 3's launch-order study, in groups of 4 sequences (L2 reuse).
    "grouped causal order": [(CAUSAL_ORDER, "".join("    " + line + "\n" for line in GROUPED))],
}
FIELDS = ["candidate", "B", "H", "N", "D", "dtype", "causal", "graph_ms", "graph_tflops", "speedup", "config",
          "check", *results.PROVENANCE]  # fmt: skip


def load(name):
    return variants.load(PART, CANDIDATES[name], f"part5_candidate{list(CANDIDATES).index(name)}")


def run(seq_lens, save=None):
    modules = {name: load(name) for name in CANDIDATES}
    rows = variants.time_forwards(modules, lambda name, causal: dict(candidate=name), seq_lens, HEAD_DIMS, B, H,
                                  do_bench=False, save=save)  # fmt: skip
    base = {(r["D"], r["causal"], r["N"]): float(r["graph_ms"]) for r in rows
            if r["candidate"] == "part 4" and r.get("graph_ms")}  # fmt: skip
    for r in rows:
        if r.get("graph_ms") and (r["D"], r["causal"], r["N"]) in base:
            r["speedup"] = f"{base[(r['D'], r['causal'], r['N'])] / float(r['graph_ms']):.3f}"
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, action="append", help=f"sequence length (repeatable); default {SEQ_LENS}")
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The candidates are timed on a CUDA GPU; on a CPU the tests check that each computes attention.")
        return 0
    return results.write_as_measured("part5_candidates.csv", FIELDS, lambda save: run(args.n or SEQ_LENS, save))


if __name__ == "__main__":
    sys.exit(main())
