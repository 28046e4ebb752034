"""Part 4's figure: the backward's two loop orders, on one small causal example.

    python -m part4_backward.figures     # draws part4_backward/backward_loops.png

dkdv_query_tiles() and dq_key_tiles() are the loop bounds of _attn_bwd_dkdv (one program per key
tile, walking query tiles) and _attn_bwd_dq (one program per query tile, walking key tiles) written
in Python, and the picture is drawn from them, with the tile sizes of this part's tuned D = 64
configurations (BWD_DKDV[0], BWD_DQ[0]). The tests check both against brute force.
"""

import sys
from pathlib import Path

from part4_backward.flash_attention import BWD_DKDV, BWD_DQ

HERE = Path(__file__).resolve().parent
N = 320  # the example: causal, N_q = N_k = 320 (not a multiple of 128)
DKDV_TILES = (BWD_DKDV[0].kwargs["BLOCK_M"], BWD_DKDV[0].kwargs["BLOCK_N"])  # (query rows, key rows)
DQ_TILES = (BWD_DQ[0].kwargs["BLOCK_M"], BWD_DQ[0].kwargs["BLOCK_N"])
DKDV_PROGRAM, DQ_PROGRAM = 1, 1  # the programs whose walks are numbered: key tile 1, query tile 1


def _cdiv(a, b):
    return -(-a // b)


def dkdv_query_tiles(k_start, block_m, block_n, n_q, causal):
    """(masked, unmasked): the start of each query tile the dK/dV program of key tile k_start visits,
    in its order. The same arithmetic as _attn_bwd_dkdv: causal, query tiles before the one holding
    query k_start see none of the keys; up to the first tile whose every row is past the key tile's
    last key, tiles straddle the diagonal (masked); the rest see every key. Not causal: no mask."""
    if causal:
        lo = k_start // block_m * block_m
        masked_hi = min(_cdiv(k_start + block_n, block_m) * block_m, n_q)
    else:
        lo, masked_hi = 0, 0
    return list(range(lo, masked_hi, block_m)), list(range(max(masked_hi, lo), n_q, block_m))


def dq_key_tiles(q_start, block_m, block_n, n_k, causal):
    """(unmasked, masked): the start of each key tile the dQ program of query tile q_start visits, in
    its order. The same arithmetic as _attn_bwd_dq (the forward's): whole tiles every row sees first,
    then the diagonal and the ragged last key tile, with masks."""
    hi = min(q_start + block_m, n_k) if causal else n_k
    unmasked_hi = min(q_start, n_k) // block_n * block_n if causal else n_k // block_n * block_n
    return list(range(0, unmasked_hi, block_n)), list(range(unmasked_hi, hi, block_n))


def tile_states(n_q, n_k, block_m, block_n, causal, kernel):
    """{(query tile start, key tile start): 1 visited without a mask, 2 with one} for "dkdv" or "dq";
    tiles not in it are skipped."""
    states = {}
    if kernel == "dkdv":
        for k_start in range(0, n_k, block_n):
            masked, unmasked = dkdv_query_tiles(k_start, block_m, block_n, n_q, causal)
            states.update({(q, k_start): 2 for q in masked} | {(q, k_start): 1 for q in unmasked})
    else:
        for q_start in range(0, n_q, block_m):
            unmasked, masked = dq_key_tiles(q_start, block_m, block_n, n_k, causal)
            states.update({(q_start, k): 1 for k in unmasked} | {(q_start, k): 2 for k in masked})
    return states


COLOURS = {0: "#eeeeee", 1: "#4c72b0", 2: "#dd8452"}
RED = "#c00000"


def _box(ax, x, y, w, h, **kw):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, **kw))


def _panel(ax, kernel):
    block_m, block_n = DKDV_TILES if kernel == "dkdv" else DQ_TILES
    states = tile_states(N, N, block_m, block_n, True, kernel)
    size_q, size_k = _cdiv(N, block_m) * block_m, _cdiv(N, block_n) * block_n
    extent = max(_cdiv(N, b) * b for b in (*DKDV_TILES, *DQ_TILES))  # the same for both panels
    for q in range(0, N, block_m):
        for k in range(0, N, block_n):
            state = states.get((q, k), 0)
            _box(ax, k, q, block_n, block_m, facecolor=COLOURS[state], edgecolor="white", lw=1.5, alpha=0.85)
    for x, y, w, h in ((N, 0, size_k - N, size_q), (0, N, N, size_q - N)):  # rows and keys past N: zeros
        _box(ax, x, y, w, h, fill=False, hatch="//", edgecolor="#999999", lw=0)
    ax.plot([0, N], [0, N], color="black", lw=0.8, ls="--")  # the diagonal j = i

    # the numbered walk of one program
    if kernel == "dkdv":
        k_start = DKDV_PROGRAM * block_n
        masked, unmasked = dkdv_query_tiles(k_start, block_m, block_n, N, True)
        walk = [(q, k_start) for q in masked + unmasked]
        title = (
            f"(a) _attn_bwd_dkdv: one program per key tile ({block_n} keys),\n"
            f"walking down the query tiles ({block_m} rows); K_j, V_j held, dK_j, dV_j summed"
        )
        where = f"program of key tile {DKDV_PROGRAM}: masked tiles first, then whole ones"
    else:
        q_start = DQ_PROGRAM * block_m
        unmasked, masked = dq_key_tiles(q_start, block_m, block_n, N, True)
        walk = [(q_start, k) for k in unmasked + masked]
        title = (
            f"(b) _attn_bwd_dq: one program per query tile ({block_m} rows),\n"
            f"walking across the key tiles ({block_n} keys); Q_i, dO_i held, dQ_i summed"
        )
        where = f"program of query tile {DQ_PROGRAM}: whole tiles first, then masked ones"
    for step, (q, k) in enumerate(walk, 1):
        _box(ax, k, q, block_n, block_m, fill=False, edgecolor=RED, lw=2.2)
        ax.text(k + block_n / 2, q + block_m / 2, str(step), ha="center", va="center", color="white", weight="bold")
    (q0, k0), (q1, k1) = walk[0], walk[-1]
    if kernel == "dkdv":  # down the key tile's column
        start, end = (k0 + block_n * 0.85, q0 + block_m * 0.2), (k1 + block_n * 0.85, q1 + block_m * 0.8)
    else:  # across the query tile's row
        start, end = (k0 + block_n * 0.2, q0 + block_m * 0.85), (k1 + block_n * 0.8, q1 + block_m * 0.85)
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", color=RED, lw=1.8))

    # D_i: one float per query row, written once by the preprocess, read next to every tile of the row
    strip, width = -0.11 * extent, 0.06 * extent
    _box(ax, strip, 0, width, N, facecolor="#8172b3", alpha=0.35, edgecolor="#8172b3")
    rows = sorted({q for q, _ in walk})
    for q in rows:
        _box(ax, strip, q, width, min(block_m, N - q), fill=False, edgecolor=RED, lw=2)
    ax.text(strip + width / 2, -8, "D_i", ha="center", va="bottom", fontsize=10, color="#4b3f8a", weight="bold")
    read = "read at every step,\none query tile each" if kernel == "dkdv" else "read once, held\nfor the whole walk"
    ax.text(strip - 0.02 * extent, rows[-1] + block_m + 4, read, ha="left", va="top", fontsize=8, color=RED)

    visited = len(states)
    masked_count = sum(s == 2 for s in states.values())
    total = _cdiv(N, block_m) * _cdiv(N, block_n)
    ax.text(
        0.98,
        0.97,
        f"{visited} of {total} tiles visited, {masked_count} masked\n{where}",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8.5,
        backgroundcolor="white",
    )
    ax.set_xlim(strip - 0.03 * extent, extent + 2)
    ax.set_ylim(extent + 2, -20)
    ax.set_xticks(sorted({*range(0, size_k + 1, block_n), N}))
    ax.set_yticks(sorted({*range(0, size_q + 1, block_m), N}))
    ax.tick_params(labelsize=8)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(title, fontsize=10)
    ax.set_aspect("equal")


def figure():
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(15, 8.6))
    axes = fig.subplots(1, 2)
    _panel(axes[0], "dkdv")
    _panel(axes[1], "dq")
    handles = [
        Patch(color=COLOURS[0], label="skipped: every key after every query (causal)"),
        Patch(color=COLOURS[1], label="visited, no mask"),
        Patch(color=COLOURS[2], label="visited, masked (the diagonal)"),
        Patch(facecolor="white", edgecolor="#999999", hatch="//", label=f"past N = {N}: zeros, dropped at the store"),
        Patch(facecolor="#8172b3", alpha=0.35, label="D_i = rowsum(dO_i * O_i), one float per query row"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.07))
    fig.text(
        0.5,
        0.02,
        "Three launches: (1) _attn_bwd_preprocess writes D_i once, for every row;  (2) _attn_bwd_dkdv;  (3) _attn_bwd_dq. "
        "Both kernels recompute P_ij = exp(S_ij - L_i)\nand need D_i for dS_ij = P_ij (dP_ij - D_i): "
        "each reads it from the one vector the preprocess wrote. Red numbers: one program's steps, in order.",
        ha="center",
        fontsize=9.5,
    )
    fig.suptitle(
        f"Part 4: the backward's two loop orders, causal, N_q = N_k = {N}, tiles of part 4's tuned D = 64 "
        f"configurations (dK/dV {DKDV_TILES[0]} x {DKDV_TILES[1]}, dQ {DQ_TILES[0]} x {DQ_TILES[1]})"
    )
    fig.subplots_adjust(top=0.88, bottom=0.17, left=0.05, right=0.98, wspace=0.15)
    return fig


def draw(folder=HERE):
    """Draw the figure into folder (this part's folder by default); the paths written."""
    path = Path(folder) / "backward_loops.png"
    figure().savefig(path, dpi=90)
    return [path]


if __name__ == "__main__":
    for path in draw():
        print(f"drew {path}")
    sys.exit(0)
