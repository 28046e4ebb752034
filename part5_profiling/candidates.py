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
FIRST_CALL = """    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_desc, v_desc, q_pos, 0, unmasked_hi, N_KEYS, qk_scale,
        BLOCK_N, False, IS_CAUSAL, DOT_PRECISION,
    )  # fmt: skip
"""  # the forward's loop over whole key tiles (no masks)
FWD_META = """    grid = lambda META: (triton.cdiv(n_q, META["BLOCK_M"]) * q.shape[0],)  # noqa: E731
    meta = dict(D=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(Q))
"""  # the forward's launch arguments
TAIL_CALL = FIRST_CALL.replace("0, unmasked_hi", "unmasked_hi, hi").replace("False, IS", "True, IS")
WHOLE_CALL = """    if WHOLE_TILES:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_desc, v_desc, q_pos, 0, N_KEYS, N_KEYS, qk_scale,
            BLOCK_N, False, IS_CAUSAL, DOT_PRECISION, True,
        )  # fmt: skip
    else:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_desc, v_desc, q_pos, 0, unmasked_hi, N_KEYS, qk_scale,
            BLOCK_N, False, IS_CAUSAL, DOT_PRECISION, False,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_desc, v_desc, q_pos, unmasked_hi, hi, N_KEYS, qk_scale,
            BLOCK_N, True, IS_CAUSAL, DOT_PRECISION, False,
        )  # fmt: skip
"""
L_STORE = "    tl.store(L + bh * N_QUERIES + q_pos, lse, mask=q_pos < N_QUERIES)\n"
L_STORE_WHOLE = (
    """    if WHOLE_TILES:
        tl.make_tensor_descriptor(L + bh * N_QUERIES, [N_QUERIES], [1], [BLOCK_M]).store([q_start], lse)
    else:
"""
    + "    "
    + L_STORE
)
TAIL_RANGE = "acc, l_i, m_i, q, k_desc, v_desc, q_pos, unmasked_hi, hi, N_KEYS, qk_scale,"  # its masked tail
TUNED_D128 = '    triton.Config({"BLOCK_M": 256, "BLOCK_N": 64}, num_warps=8, num_stages=3),\n'
NEXT_DEF = "\n\n# N_QUERIES, N_KEYS and N_SEQS are runtime values"
# The next tile's Q K^T issued before this tile's softmax (FlashAttention-3's overlap within a
# warpgroup, by hand): the product runs on the tensor cores while the same warps compute exp2.
# Whole tiles only (lo < hi); the masked tail keeps part 4's loop. Two score tiles are live at once.
PIPELINED = (
    """
@triton.jit
def _attn_fwd_pipelined(
    acc, l_i, m_i, q, k_desc, v_desc, lo, hi, qk_scale, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr
):  # fmt: skip
    s = tl.dot(q, tl.trans(k_desc.load([lo, 0])), input_precision=DOT_PRECISION)
    for k_start in range(lo, hi, BLOCK_N):
        v = v_desc.load([k_start, 0])
        next_start = tl.minimum(k_start + BLOCK_N, hi - BLOCK_N)  # the last round recomputes its own tile
        s_next = tl.dot(q, tl.trans(k_desc.load([next_start, 0])), input_precision=DOT_PRECISION)
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
        s = s_next
    return acc, l_i, m_i
"""
    + NEXT_DEF
)
PIPELINED_CALL = """    if unmasked_hi > 0:
        acc, l_i, m_i = _attn_fwd_pipelined(
            acc, l_i, m_i, q, k_desc, v_desc, 0, unmasked_hi, qk_scale, BLOCK_N, DOT_PRECISION
        )  # fmt: skip
"""


def more_configs(*configs):
    """A replacement that adds (BLOCK_M, BLOCK_N, warps, stages) configurations to the autotuner's list."""
    lines = "".join(f'    triton.Config({{"BLOCK_M": {m}, "BLOCK_N": {n}}}, num_warps={w}, num_stages={s}),\n'
                    for m, n, w, s in configs)  # fmt: skip
    return TUNED_D128, TUNED_D128 + lines


CANDIDATES = {
    "part 4": [],
    # Triton splits the loop's warps into a producer (the loads) and consumers (products, softmax).
    "warp-specialized key loop": [
        (LOOP, DOC + "    for k_start in tl.range(lo, hi, BLOCK_N, warp_specialize=True):\n")
    ],
    # The causal launch order of part 3's launch-order study, in groups of 4 sequences (L2 reuse).
    "grouped causal order": [(CAUSAL_ORDER, "".join("    " + line + "\n" for line in GROUPED))],
    # Triton 3.6 specializes warps only in a kernel with one loop and no tile product outside it (a
    # second loop, or one masked step after it, and the pass fails or does nothing: compiled for
    # sm_90 to check). So: one loop over every key tile, masked throughout, warp-specialized; the
    # 128 x 128 tile with 2 stages replaces 256 x 64 at D = 128.
    "one warp-specialized loop": [
        (LOOP, DOC + "    for k_start in tl.range(lo, hi, BLOCK_N, warp_specialize=True):\n"),
        (FIRST_CALL, ""),
        (TAIL_RANGE, TAIL_RANGE.replace("unmasked_hi, hi", "0, hi")),
        more_configs((128, 128, 4, 2)),
    ],
    # Two score tiles live spill at D = 128 with 4 warps per 128 rows (compiled for sm_90: 96-1008
    # bytes of stack); 8 warps (64 rows per warpgroup) hold them: 150-250 registers, none spilled.
    # Warp specialization where the loop needs no mask at all: not causal and N_k a multiple of
    # every BLOCK_N (128), decided on the host; every other call runs part 4's two loops. Stored
    # with tl.store after the specialized loop, L came out wrong in whole 128-row tiles (a quarter
    # of the rows at N = 4096; O right), so L goes out through a descriptor here, which needs
    # each sequence's L row on a 16-byte boundary: N_q a multiple of 4.
    "warp-specialized whole tiles": [
        (LOOP, DOC + "    for k_start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):\n"),
        (
            "    DOT_PRECISION: tl.constexpr,\n):  # fmt: skip\n" + DOC,
            "    DOT_PRECISION: tl.constexpr,\n    WS: tl.constexpr,\n):  # fmt: skip\n" + DOC,
        ),
        (FIRST_CALL + TAIL_CALL, WHOLE_CALL),
        (
            "    IS_CAUSAL: tl.constexpr,\n    DOT_PRECISION: tl.constexpr,  #",
            "    IS_CAUSAL: tl.constexpr,\n    WHOLE_TILES: tl.constexpr,\n    DOT_PRECISION: tl.constexpr,  #",
        ),
        (
            'key=["D", "IS_CAUSAL", "N_BUCKET"], prune_configs_by={"early_config_prune": fits_in_smem}',
            'key=["D", "IS_CAUSAL", "WHOLE_TILES", "N_BUCKET"], prune_configs_by={"early_config_prune": fits_in_smem}',
        ),
        (
            FWD_META,
            FWD_META.replace(
                "_dot_precision(Q))",
                "_dot_precision(Q), WHOLE_TILES=not is_causal and n_k % 128 == 0 and n_q % 4 == 0)",
            ),
        ),
        (L_STORE, L_STORE_WHOLE),
        more_configs((128, 128, 4, 2)),
    ],
    "Q K^T issued one tile ahead": [
        (NEXT_DEF, PIPELINED),
        (FIRST_CALL, PIPELINED_CALL),
        more_configs((128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3)),
    ],
}
FIELDS = ["candidate", "B", "H", "N", "D", "dtype", "causal", "graph_ms", "graph_tflops", "speedup", "config",
          "check", *results.PROVENANCE]  # fmt: skip
KEY = ("candidate", "N", "D", "causal")  # a run of some candidates keeps the others' rows


def load(name):
    return variants.load(PART, CANDIDATES[name], f"part5_candidate{list(CANDIDATES).index(name)}")


def run(seq_lens, names=None, save=None):
    """Check and time part 4 and the named candidates (default: every one) at each N."""
    modules = {name: load(name) for name in ["part 4", *(n for n in names or CANDIDATES if n != "part 4")]}
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
    ap.add_argument("--candidate", action="append", choices=list(CANDIDATES),
                    help="time this candidate (repeatable; part 4 always runs); default: all")  # fmt: skip
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The candidates are timed on a CUDA GPU; on a CPU the tests check that each computes attention.")
        return 0
    run_them = lambda save: run(args.n or SEQ_LENS, args.candidate, save)  # noqa: E731
    return results.write_as_measured("part5_candidates.csv", FIELDS, run_them, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
