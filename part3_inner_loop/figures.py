"""Which key tiles each program of part 3's forward visits, and which of those need a mask.

    python -m part3_inner_loop.figures      # draws part3_inner_loop/tile_skipping.png

key_tiles() is the kernel's loop bounds written in Python, and the picture is drawn from it; the
tests check it against brute force (a tile is visited if and only if one of its keys is visible
to one of the program's queries; it is unmasked only if every key is visible to every query).
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def key_tiles(q_start, block_m, block_n, n_keys, causal):
    """(unmasked, masked): the start of each key tile a program visits without and with masks.
    The same arithmetic as _attn_fwd: the first stage ends at the last whole tile below both q_start
    (causal) and N_KEYS; the second runs to the last key any row of the tile can see."""
    hi = min(q_start + block_m, n_keys) if causal else n_keys
    unmasked_hi = min(q_start, n_keys) // block_n * block_n if causal else n_keys // block_n * block_n
    return list(range(0, unmasked_hi, block_n)), list(range(unmasked_hi, hi, block_n))


def tile_map(n_queries, n_keys, block_m, block_n, causal):
    """A grid, query tiles down and key tiles across: 0 skipped, 1 visited without mask, 2 with a mask."""

    def row(q_start):
        unmasked, masked = key_tiles(q_start, block_m, block_n, n_keys, causal)
        return [1 if k in unmasked else 2 if k in masked else 0 for k in range(0, n_keys, block_n)]

    return [row(q_start) for q_start in range(0, n_queries, block_m)]


CASES = [  # (title, N_q, N_k, BLOCK_M, BLOCK_N, causal)
    ("causal, BLOCK_M = 2 x BLOCK_N", 1024, 1024, 128, 64, True),
    ("causal, BLOCK_N = 2 x BLOCK_M, N_q > N_k", 1000, 700, 64, 128, True),
    ("not causal, ragged N_k", 512, 1000, 128, 64, False),
]


def figure():
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    colours = ["#eeeeee", "#4c72b0", "#dd8452"]
    fig = Figure(figsize=(15, 5.2))
    for ax, (title, n_q, n_k, bm, bn, causal) in zip(fig.subplots(1, len(CASES)), CASES):
        grid = tile_map(n_q, n_k, bm, bn, causal)
        ax.imshow(grid, cmap=ListedColormap(colours), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        ax.set_title(f"{title}\nN_q={n_q}, N_k={n_k}, {bm} x {bn} tiles", fontsize=10)
        ax.set(xlabel="key tile (inner loop)", ylabel="query tile (one program each)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        cells = [cell for row in grid for cell in row]
        note = f"{len(cells) - cells.count(0)} of {len(cells)} tiles visited, {cells.count(2)} masked"
        ax.text(0.98, 0.02, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=8, backgroundcolor="white")
    labels = ("skipped: never loaded", "visited, no mask", "visited, masked (diagonal or ragged)")
    fig.legend(handles=[Patch(color=c, label=t) for c, t in zip(colours, labels)], loc="lower center", ncol=3)
    fig.suptitle("Part 3: the key tiles each program of the forward visits")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def draw(folder=HERE):
    """Draw the figure into folder (this part's folder by default); the paths written."""
    path = Path(folder) / "tile_skipping.png"
    figure().savefig(path, dpi=90)
    return [path]


if __name__ == "__main__":
    for path in draw():
        print(f"drew {path}")
