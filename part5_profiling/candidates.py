"""Candidate changes to part 4's forward and backward, each checked and timed on its own against part 4.

    python -m part5_profiling.candidates              # GPU: results/<gpu>/part5_candidates.csv
    python -m part5_profiling.candidates --backward   # GPU: results/<gpu>/part5_bwd_candidates.csv

A candidate is part 4's kernel file with a few lines replaced (CANDIDATES below). Unlike the stage
variants, every candidate must compute the same attention: each is checked against the float64
reference on the inputs it is timed on before it is timed. Part 5's kernel takes a candidate only
where this run shows it pays. Shapes: B=4, H=8, D 64 and 128, causal and not, N = 4096 and 16384,
bf16; CUDA-graph replay, median; each candidate autotuned for itself. The backward's candidates
(BWD_CANDIDATES) are timed the same way on flash_backward alone, from the forward's O and L.
"""

import argparse
import functools
import sys

import torch

from common import bench, results, runtime, triton_tools, variants
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
BWD_DKDV_END = "]\nBWD_DQ = ["  # the end of part 4's dK/dV configurations
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
    # Triton 3.6 specializes warps in a kernel with one loop, and only at 4 warps: with part 4's
    # second loop the pass fails (compiled.py shows both). So: one loop over every key tile, masked
    # throughout, warp-specialized; the 128 x 128 tile with 2 stages added for D = 128.
    "one warp-specialized loop": [
        (LOOP, DOC + "    for k_start in tl.range(lo, hi, BLOCK_N, warp_specialize=True):\n"),
        (FIRST_CALL, ""),
        (TAIL_RANGE, TAIL_RANGE.replace("unmasked_hi, hi", "0, hi")),
        more_configs((128, 128, 4, 2)),
    ],
    # Warp specialization where the loop needs no mask at all: not causal and N_k a multiple of
    # every BLOCK_N (128), decided on the host; every other call runs part 4's two loops. Stored
    # with tl.store after the specialized loop, L came out wrong in whole 128-row tiles (O right),
    # so L goes out through a descriptor here, which needs
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
    # Two live score tiles spill at D = 128 with 4 warps per 128 rows; 8 warps (64 rows per
    # warpgroup) hold them without spilling (compiled.py shows both): those tiles are added.
    "Q K^T issued one tile ahead": [
        (NEXT_DEF, PIPELINED),
        (FIRST_CALL, PIPELINED_CALL),
        more_configs((128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3)),
    ],
}
# The backward's candidates, timed by --backward: flash_backward alone, from the forward's O and L.
ATOMIC_ADD = """            dq_ptrs = DQ + q_pos[:, None] * D + tl.arange(0, D)[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=in_range[:, None], sem="relaxed")
"""  # part 4's atomics variant: one atomic per element of dQ_i's tile
TMA_DQ = """            if TMA_REDUCE:
                DQ.atomic_add([q_start, 0], dq)  # one TMA reduce-add; rows past N_QUERIES are dropped
            else:  # the interpreter has no TMA reduce: part 4's element-wise atomics
                dq_ptrs = DQ + q_pos[:, None] * D + tl.arange(0, D)[None, :]
                tl.atomic_add(dq_ptrs, dq, mask=in_range[:, None], sem="relaxed")
"""
DQ_OFFSET = "    DQ += bh * N_QUERIES * D\n"
DQ_DESCRIPTOR = (
    """    if TMA_REDUCE:
        if ATOMIC_DQ:
            DQ = tl.make_tensor_descriptor(DQ + bh * N_QUERIES * D, [N_QUERIES, D], [D, 1], [BLOCK_M, D])
    else:
    """
    + DQ_OFFSET
)
MORE_DKDV = "".join(
    f'    triton.Config({{"BLOCK_M": {m}, "BLOCK_N": {n}}}, num_warps={w}, num_stages={st}),\n'
    for m, n, w, st in ((64, 128, 8, 2), (64, 64, 8, 2), (32, 128, 8, 3))
)  # 8 warps: the extra dQ tile fits without spilling at D = 128 (compiled for sm_90)
BWD_CANDIDATES = {
    "part 4": [],
    # FlashAttention-3's dQ: the dK/dV kernel adds each dS_ij K_j tile into a float32 dQ with one TMA
    # reduce-add (cp.reduce.async.bulk) instead of part 4's element-wise atomics, and the dQ kernel,
    # which recomputes S and dP, is skipped: five tile products per tile pair instead of seven. The
    # additions' order varies, so dQ is not bitwise repeatable. Made the default here to be timed.
    "dQ by TMA reduce-add": [
        (ATOMIC_ADD, TMA_DQ),
        (DQ_OFFSET, DQ_DESCRIPTOR),
        (
            "def flash_backward(Q, K, V, O, L, dO, is_causal, atomic_dq=False):",
            "def flash_backward(Q, K, V, O, L, dO, is_causal, atomic_dq=True):",
        ),
        (BWD_DKDV_END, MORE_DKDV + "]\nTMA_REDUCE = tl.constexpr(not INTERPRET)\nBWD_DQ = ["),
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


BWD_FIELDS = ["candidate", "B", "H", "N", "D", "dtype", "causal", "graph_ms", "graph_tflops", "speedup", "config",
              "repeatable", "check", *results.PROVENANCE]  # fmt: skip


def check_and_time_backward(backward, o, lse, q, k, v, do, causal, flops, checked=True):
    """Row fields for one backward (a call -> dQ, dK, dV, from the forward's O and L): checked
    against the float64 reference on dQ, dK and dV, with `repeatable` saying whether two calls give
    dQ bit for bit, then timed by CUDA-graph replay if the check passed. checked=False: an ablation
    that computes something else on purpose, timed as it is."""
    dq, dk, dv = backward()
    fields = dict(check="not checked: computes something else on purpose")
    if checked:
        report = bench.check_slices({"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}, q, k, v, causal, do)
        fields = dict(check=("ok " if report.ok else "FAIL ") + str(report),
                      repeatable=int(torch.equal(backward()[0], dq)))  # fmt: skip
        if not report.ok:
            return fields
    ms = bench.graph_time_ms(backward)
    return dict(fields, graph_ms=f"{ms:.4f}", graph_tflops=f"{flops / ms * 1e-9:.1f}")


def run_backward(seq_lens, names=None, save=None):
    """Check and time part 4's backward and the named backward candidates: flash_backward alone from
    the forward's O and L (check_and_time_backward)."""
    names = ["part 4", *(n for n in names or BWD_CANDIDATES if n != "part 4")]
    modules = {
        name: variants.load(PART, BWD_CANDIDATES[name], f"part5_bwd_candidate{i}") for i, name in enumerate(names)
    }
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, do) in bench.each_shape(seq_lens, HEAD_DIMS, b=B, h=H):
        base = None
        flops = bench.attention_flops(B, H, n, n, d, causal, "bwd")
        for name, module in modules.items():
            row = dict(candidate=name, B=B, H=H, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                o, lse = module.flash_forward(q, k, v, causal)
                backward = functools.partial(module.flash_backward, q, k, v, o, lse, do, causal)
                row.update(check_and_time_backward(backward, o, lse, q, k, v, do, causal, flops))
                if row.get("graph_ms"):
                    ms = float(row["graph_ms"])
                    base = ms if name == "part 4" else base
                    config = triton_tools.chosen(module._attn_bwd_dkdv)
                    row.update(speedup=f"{base / ms:.3f}" if base else "", config=bench.config_label(config))
            except Exception as e:  # a variant the compiler refuses: say why, go on
                row["check"] = f"error: {bench.why(e)}"
            rows.append(row)
            print(f"{name:<24} D={d:<3} causal={causal:d} N={n:>5}  {row.get('graph_tflops') or '-':>7} TFLOP/s  "
                  f"{row.get('config', '')}  repeatable={row.get('repeatable', '-')}  {row['check'][:40]}", flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, action="append", help=f"sequence length (repeatable); default {SEQ_LENS}")
    ap.add_argument("--candidate", action="append", choices=[*CANDIDATES, *BWD_CANDIDATES],
                    help="time this candidate (repeatable; part 4 always runs); default: all")  # fmt: skip
    ap.add_argument("--backward", action="store_true", help="the backward's candidates: part5_bwd_candidates.csv")
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The candidates are timed on a CUDA GPU; on a CPU the tests check that each computes attention.")
        return 0
    if args.backward:
        run_them = lambda save: run_backward(args.n or SEQ_LENS, args.candidate, save)  # noqa: E731
        return results.write_as_measured("part5_bwd_candidates.csv", BWD_FIELDS, run_them, key=KEY)
    run_them = lambda save: run(args.n or SEQ_LENS, args.candidate, save)  # noqa: E731
    return results.write_as_measured("part5_candidates.csv", FIELDS, run_them, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
