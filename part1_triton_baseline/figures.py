"""Part 1's figure: the launch grid, and one program's walk over the key tiles.

    python -m part1_triton_baseline.figures     # draws part1_triton_baseline/launch_grid.png

launch_grid(), query_rows() and key_walk() are flash_forward's grid and _attn_fwd's loop bounds
written in Python, with this part's BLOCK_M and BLOCK_N; the picture is drawn from them, on a small
ragged example whose last query tile and last key tile run past the sequence (the tensor
descriptor loads zeros there). The tests check them against brute force.
"""

import sys
from pathlib import Path

from part1_triton_baseline.flash_attention import BLOCK_M, BLOCK_N

HERE = Path(__file__).resolve().parent
N, SEQS = 40, 3  # the example: N_q = N_k = 40 (not a multiple of 16), B * H = 3 sequences
PROGRAM = (2, 1)  # the program whose walk is drawn: (query tile, sequence), the ragged last tile


def launch_grid(n_q, n_seqs, block_m=BLOCK_M):
    """flash_forward's grid, (cdiv(N_q, BLOCK_M), B * H): program (tile_m, bh) = (program_id(0), program_id(1))."""
    return (-(-n_q // block_m), n_seqs)


def query_rows(tile_m, n_q, block_m=BLOCK_M):
    """(q_start, end, padded) of a program's query tile: rows q_start ... end - 1 are the sequence's,
    the last `padded` rows of the tile lie past N_q (loaded as zeros, computed, never stored)."""
    q_start = tile_m * block_m
    return q_start, min(q_start + block_m, n_q), max(q_start + block_m - n_q, 0)


def key_walk(n_k, block_n=BLOCK_N):
    """_attn_fwd's inner loop, `for k_start in range(0, N_KEYS, BLOCK_N)`: (k_start, end, padded) per
    step, the K_j and V_j rows it loads; the last `padded` rows of a tile are zeros, masked to -inf."""
    return [(k, min(k + block_n, n_k), max(k + block_n - n_k, 0)) for k in range(0, n_k, block_n)]


RED, BLUE, ORANGE, GREY = "#c44e52", "#4c72b0", "#dd8452", "#bbbbbb"


def _box(ax, x, y, w, h, **kw):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, **kw))


def _grid_panel(ax):
    tiles, seqs = launch_grid(N, SEQS)
    for t in range(tiles):
        q_start, end, padded = query_rows(t, N)
        for b in range(seqs):
            chosen = (t, b) == PROGRAM
            _box(ax, b, t, 0.92, 0.88, facecolor="#f4d6d6" if chosen else "#e8eef7", edgecolor=RED if chosen else BLUE)
            if chosen:
                _box(ax, b, t, 0.92, 0.88, fill=False, edgecolor=RED, lw=3)
            rows = f"rows {q_start}-{q_start + BLOCK_M - 1}"
            note = f"\n({end}-{q_start + BLOCK_M - 1}: past N_q)" if padded else ""
            ax.text(b + 0.46, t + 0.44, f"program ({t}, {b})\n{rows}{note}", ha="center", va="center", fontsize=8.5)
    ax.set_xlim(-0.1, seqs)
    ax.set_ylim(tiles, -0.1)
    ax.set_xticks([b + 0.46 for b in range(seqs)], [str(b) for b in range(seqs)])
    ax.set_yticks([t + 0.44 for t in range(tiles)], [str(t) for t in range(tiles)])
    ax.set_xlabel("program_id(1): sequence (batch * head)")
    ax.set_ylabel("program_id(0): query tile")
    ax.set_title(
        f"(a) grid = (cdiv(N_q, BLOCK_M), B*H) = {launch_grid(N, SEQS)}\n"
        f"{tiles * seqs} programs, each owns {BLOCK_M} query rows of one sequence",
        fontsize=10,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _walk_panel(ax):
    tile_m, seq = PROGRAM
    q_start, q_end, _ = query_rows(tile_m, N)
    walk = key_walk(N)
    size = max(k + BLOCK_N for k, _, _ in walk)  # the padded extent the tiles cover
    _box(ax, 0, 0, N, N, facecolor="white", edgecolor="black", lw=1.2)
    _box(ax, 0, q_start, size, BLOCK_M, facecolor="#f4d6d6", edgecolor=RED, lw=0)
    for x, y, w, h in ((N, 0, size - N, size), (0, N, N, size - N)):  # past N_k, past N_q: zeros
        _box(ax, x, y, w, h, facecolor=GREY, hatch="//", edgecolor="#777777", alpha=0.55)
    for step, (k_start, k_end, padded) in enumerate(walk, 1):
        _box(ax, k_start, q_start, BLOCK_N, BLOCK_M, fill=False, edgecolor=RED, lw=2.5)
        ax.text(k_start + BLOCK_N / 2, q_start + 4, f"step {step}", ha="center", va="center", color=RED, weight="bold")
        label = f"K_{step - 1}, V_{step - 1}\nkeys {k_start}-{k_start + BLOCK_N - 1}"
        if padded:
            label += f"\n({k_end}-{k_start + BLOCK_N - 1}: zeros)"
        ax.text(k_start + BLOCK_N / 2, -1.5, label, ha="center", va="bottom", fontsize=8.5)
        if step > 1:
            ax.annotate(
                "",
                xy=(k_start + 3, q_start + 4),
                xytext=(k_start - 3, q_start + 4),
                arrowprops=dict(arrowstyle="->", color=RED, lw=1.5),
            )
    ax.text(N / 2, N / 2 - 8, f"sequence {seq}: S = Q K^T\n{N} x {N}, never stored", ha="center", fontsize=9)
    ax.text(
        size / 2,
        size + 1.5,
        f"hatched: rows {N}-{size - 1} and keys {N}-{size - 1}, past the sequence:\n"
        "the tensor descriptor loads them as zeros",
        ha="center",
        va="top",
        fontsize=8.5,
    )
    ax.set_xlim(-1, size + 1)
    ax.set_ylim(size + 7, -11)
    ax.set_xticks([0, 16, 32, N, size])
    ax.set_yticks([0, 16, q_start, N, size])
    ax.set_xlabel("key j (inner loop, one K_j, V_j tile per step)")
    ax.set_ylabel("query i")
    ax.set_title(
        f"(b) program {PROGRAM}: query rows {q_start}-{q_start + BLOCK_M - 1}, every key tile in turn", fontsize=10
    )


def _tile_panel(ax):
    from matplotlib.patches import Patch

    tile_m, _ = PROGRAM
    q_start, q_end, _ = query_rows(tile_m, N)
    k_start, k_end, _ = key_walk(N)[-1]
    for r in range(BLOCK_M):
        for c in range(BLOCK_N):
            past_q, past_k = q_start + r >= q_end, k_start + c >= k_end
            colour = ORANGE if past_k else (GREY if past_q else BLUE)
            _box(ax, c, r, 1, 1, facecolor=colour, edgecolor="white", lw=0.5, hatch="//" if past_k and past_q else None)
            if past_k and not past_q:
                ax.text(c + 0.5, r + 0.5, "-inf", ha="center", va="center", fontsize=6.5, color="white")
    ax.set_xlim(0, BLOCK_N)
    ax.set_ylim(BLOCK_M, 0)
    ax.set_xticks(
        [0.5, k_end - k_start - 0.5, BLOCK_N - 0.5], [str(k_start), str(k_end - 1), str(k_start + BLOCK_N - 1)]
    )
    ax.set_yticks(
        [0.5, q_end - q_start - 0.5, BLOCK_M - 0.5], [str(q_start), str(q_end - 1), str(q_start + BLOCK_M - 1)]
    )
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(f"(c) its last step: S_ij, a {BLOCK_M} x {BLOCK_N} tile in registers", fontsize=10)
    handles = [
        Patch(color=BLUE, label="a real score"),
        Patch(color=ORANGE, label="zero key: would score 0, so set to -inf\n(keep = k_pos < N_KEYS, on every tile)"),
        Patch(color=GREY, label="zero query row: computed, never stored"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8.5, frameon=False)


def _walk_text():
    tile_m, _ = PROGRAM
    q_start, q_end, padded = query_rows(tile_m, N)
    lines = [
        f"program {PROGRAM}:  q = Q[{q_start}:{q_start + BLOCK_M}], loaded once ({padded} zero rows past N_q = {N})",
        "  m_i = -inf, l_i = 0 (BLOCK_M,); acc = 0 (BLOCK_M, D): float32, in registers, kept from step to step",
    ]
    for step, (k_start, _, pad) in enumerate(key_walk(N), 1):
        zeros = f"  ({pad} zero rows -> masked to -inf)" if pad else ""
        lines.append(
            f"  step {step}: load K[{k_start}:{k_start + BLOCK_N}], V[{k_start}:{k_start + BLOCK_N}]; "
            f"S = Q K^T; update m_i, l_i, acc{zeros}"
        )
    lines.append(f"  store O[{q_start}:{q_end}] = acc / l_i and L[{q_start}:{q_end}] (rows {q_end}+ dropped)")
    return "\n".join(lines)


def figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 7.8))
    grid = fig.add_gridspec(2, 3, height_ratios=[1, 0.3], width_ratios=[1, 1.15, 0.9], wspace=0.28, hspace=0.35)
    _grid_panel(fig.add_subplot(grid[0, 0]))
    _walk_panel(fig.add_subplot(grid[0, 1]))
    _tile_panel(fig.add_subplot(grid[0, 2]))
    ax = fig.add_subplot(grid[1, :])
    ax.axis("off")
    ax.text(0.02, 0.95, _walk_text(), family="monospace", fontsize=9.5, va="top", transform=ax.transAxes)
    fig.suptitle(
        f"Part 1: one program per (query tile, sequence), looping over the key tiles. "
        f"N_q = N_k = {N}, BLOCK_M = BLOCK_N = {BLOCK_M}, {SEQS} sequences"
    )
    fig.subplots_adjust(top=0.9, bottom=0.02, left=0.05, right=0.98)
    return fig


def draw(folder=HERE):
    """Draw the figure into folder (this part's folder by default); the paths written."""
    path = Path(folder) / "launch_grid.png"
    figure().savefig(path, dpi=90)
    return [path]


if __name__ == "__main__":
    for path in draw():
        print(f"drew {path}")
    sys.exit(0)
