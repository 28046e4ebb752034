"""Part 0's figure: the online softmax of one query row, tile by tile.

    python -m part0_pytorch_reference.figures     # draws part0_pytorch_reference/online_softmax.png

online_softmax() is the inner loop of flash_forward (flash_attention.py) for one query row and
one-column values: the same four lines (m_new, P_ij, alpha, then l_i and O_i rescaled and added to),
kept tile by tile so that the picture can show them. The tests check it against flash_forward on
every prefix of the tiles and against torch.softmax and torch.logsumexp.
"""

import math
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
N_TILES, TILE = 4, 8  # key tiles of one query row, keys per tile (flash_forward's B_k, made small)
SEED = 9  # a row whose max rises at two tile boundaries and stays at the third


def example():
    """(scores, values): one query row's scores S_ij over N_TILES * TILE keys and a value per key."""
    g = torch.Generator().manual_seed(SEED)
    scores = 1.5 * torch.randn(N_TILES * TILE, generator=g, dtype=torch.float64)
    values = 1 + 9 * torch.rand(N_TILES * TILE, generator=g, dtype=torch.float64)
    return scores, values


def online_softmax(scores, values, block_n=TILE):
    """flash_forward's inner loop for one row, one step per key tile: a dict per tile with the max
    before and after (m_old, m), alpha, P (exp(s - m), this tile), the running sum and unnormalised
    output before (l_old, o_old) and after (l, o), and this tile's own sums (tile_l, tile_o)."""
    m = torch.tensor(float("-inf"), dtype=scores.dtype)
    l = torch.zeros((), dtype=scores.dtype)
    o = torch.zeros(values.shape[1:], dtype=values.dtype)
    steps = []
    for j0 in range(0, len(scores), block_n):
        s, v = scores[j0 : j0 + block_n], values[j0 : j0 + block_n]
        m_new = torch.maximum(m, s.max())
        p = torch.exp(s - m_new)  # P_ij, each in [0, 1]
        alpha = torch.exp(m - m_new)  # rescales what was summed against the old max
        tile_l, tile_o = p.sum(), torch.tensordot(p, v, dims=1)
        steps.append(dict(start=j0, m_old=m, m=m_new, alpha=alpha, p=p, l_old=l, o_old=o, tile_l=tile_l, tile_o=tile_o))
        l = alpha * l + tile_l
        o = alpha * o + tile_o
        steps[-1].update(l=l, o=o)
        m = m_new
    return steps


def probabilities(steps):
    """Every key's softmax weight from the final state: P_ij = exp(s_j - m_i) / l_i, with each tile's
    P brought to the last max (the product of the later alphas, which is exp(m_then - m_last))."""
    last = steps[-1]
    return torch.cat([st["p"] * torch.exp(st["m"] - last["m"]) / last["l"] for st in steps])


def figure():
    from matplotlib.figure import Figure

    scores, values = example()
    raw = online_softmax(scores, values)
    online = probabilities(raw).numpy()
    steps = [{k: v if isinstance(v, int) else v.numpy() if v.dim() else float(v) for k, v in st.items()} for st in raw]
    last = steps[-1]
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    fig = Figure(figsize=(13, 11.5))
    grid = fig.add_gridspec(3, 2, height_ratios=[1.1, 1, 0.9], hspace=0.5, wspace=0.22)

    # 1. the scores, tile by tile, and the running max m_i
    ax = fig.add_subplot(grid[0, :])
    keys, direct = np.arange(len(scores)), torch.softmax(scores, 0)
    ref, lse_ref = float(direct @ values), float(torch.logsumexp(scores, 0))
    scores, direct = scores.numpy(), direct.numpy()
    for t, st in enumerate(steps):
        j = keys[st["start"] : st["start"] + TILE]
        ax.axvspan(j[0] - 0.5, j[-1] + 0.5, color=colours[t], alpha=0.08)
        ax.bar(j, scores[j], color=colours[t], width=0.7)
        ax.plot([j[0] - 0.5, j[-1] + 0.5], [st["m"]] * 2, color="black", lw=2.2)
        if t > 0:
            ax.plot([j[0] - 0.5] * 2, [st["m_old"], st["m"]], color="black", lw=2.2)
            rose = bool(st["m"] > st["m_old"])
            what = f"m rises {st['m_old']:.2f} -> {st['m']:.2f}" if rose else f"m stays {st['m']:.2f}"
            colour, label = "#8b0000" if rose else "#555555", f"{what}\nalpha = exp(m_old - m_new) = {st['alpha']:.2f}"
            arrow = dict(arrowstyle="->", color=colour)
            ax.annotate(
                label, (j[0] - 0.5, st["m"]), (j[0] + 0.2, st["m"] + 1.1), fontsize=9, color=colour, arrowprops=arrow
            )
    ax.set_ylim(scores.min() - 0.6, last["m"] + 2.4)
    for t, st in enumerate(steps):
        ax.text(st["start"] + 3.5, scores.min() - 0.55, f"tile {t}", ha="center", va="bottom", color=colours[t])
    ax.axhline(0, color="#999999", lw=0.6)
    title = "One query row, seen one tile of 8 keys at a time. Black: the running max m_i after each tile"
    ax.set(xlabel="key j", ylabel="score s_j = S_ij", title=title, xlim=(-0.7, len(scores) - 0.3))

    # 2. l_i and O_i: what was kept is scaled by alpha, then this tile's sum is added
    formulas = [
        ("l_i", "l_old", "tile_l", "l", "l_i = alpha * l_i + rowsum(exp(S_ij - m_i))"),
        ("O_i", "o_old", "tile_o", "o", "O_i = alpha * O_i + exp(S_ij - m_i) V_j   (here one value per key, 1 to 10)"),
    ]
    for col, (name, old, tile, new, formula) in enumerate(formulas):
        ax = fig.add_subplot(grid[1, col])
        for t, st in enumerate(steps):
            kept = st["alpha"] * st[old]
            if t > 0:
                ax.bar(t - 0.2, st[old], width=0.35, color="white", edgecolor="#777777", hatch="//")
            ax.bar(t + 0.2, kept, width=0.35, color="#bbbbbb", edgecolor="#777777")
            ax.bar(t + 0.2, st[tile], width=0.35, bottom=kept, color=colours[t])
            ax.text(t + 0.2, st[new], f"{st[new]:.2f}", ha="center", va="bottom", fontsize=9)
            if t > 0 and st["alpha"] < 1:
                arrow = dict(arrowstyle="->", color="#8b0000")
                label = f"x {st['alpha']:.2f}"
                ax.annotate(
                    label,
                    (t + 0.2, kept),
                    (t - 0.2, st[old]),
                    fontsize=9,
                    color="#8b0000",
                    ha="center",
                    va="bottom",
                    arrowprops=arrow,
                )
        ax.set_xticks(range(N_TILES), [f"after tile {t}" for t in range(N_TILES)])
        ax.set_ylabel(name + " (relative to the running max)")
        ax.set_title(formula, fontsize=10)
        ax.set_ylim(0, max(max(st[old], st[new]) for st in steps) * 1.5)
        if col == 0:
            handles = [
                _patch("white", "//", "kept before this tile, against the old max"),
                _patch("#bbbbbb", None, "the same, times alpha: against the new max"),
                _patch(colours[0], None, "this tile's own sum (in the tile's colour)"),
            ]
            ax.legend(handles=handles, loc="upper left", fontsize=8.5)

    # 3. the one division at the end gives the softmax of the whole row
    ax = fig.add_subplot(grid[2, :])
    for t in range(N_TILES):
        j = keys[t * TILE : (t + 1) * TILE]
        ax.bar(j, online[j], color=colours[t], width=0.7)
    ax.plot(keys, direct, "k.", ms=6, label="torch.softmax of all 32 scores at once")
    ax.set(
        ylim=(0, float(direct.max()) * 1.45), xlabel="key j", ylabel="softmax weight", xlim=(-0.7, len(scores) - 0.3)
    )
    ax.legend(loc="upper left", fontsize=9)
    out, lse = last["o"] / last["l"], last["m"] + math.log(last["l"])
    ax.set_title(
        "Bars: exp(s_j - m_i) / l_i from the final m_i and l_i (each tile's P times the later alphas). "
        "Dots: torch.softmax",
        fontsize=10,
    )
    ax.text(
        0.99,
        0.95,
        f"O_i / l_i = {out:.6f}   softmax(s) . v = {ref:.6f}\n"
        f"L_i = m_i + log l_i = {lse:.6f}   logsumexp(s) = {lse_ref:.6f}",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=9,
        family="monospace",
        bbox=dict(facecolor="white", edgecolor="#cccccc"),
    )
    fig.suptitle("Part 0: the online softmax. Only m_i, l_i and O_i are kept; a rising max rescales them by alpha")
    fig.subplots_adjust(top=0.93, bottom=0.05, left=0.07, right=0.98)
    return fig


def _patch(colour, hatch, label):
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor="#777777", hatch=hatch, label=label)


def draw(folder=HERE):
    """Draw the figure into folder (this part's folder by default); the paths written."""
    path = Path(folder) / "online_softmax.png"
    figure().savefig(path, dpi=90)
    return [path]


if __name__ == "__main__":
    for path in draw():
        print(f"drew {path}")
    sys.exit(0)
