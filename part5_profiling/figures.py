"""Part 5's figure: the Gluon forward's warp roles, its K/V ring, and one step of a warpgroup.

    python -m part5_profiling.figures     # draws part5_profiling/gluon_ring.png and gluon_step.png

Drawn from gluon_attention.py, which imports without a GPU: the warpgroup count, STAGES, ROWS and
BLOCK_N from its constants (CONFIGS[128], the D = 128 configuration), the order of one step from
_softmax_step's source (step_order() reads it, statement by statement), and the ring's occupancy
from ring.py's model of the hand-off. The timeline is schematic: the order in which a warpgroup
issues its work, with unit lengths, not measured durations.
"""

import ast
import sys
from pathlib import Path

from part5_profiling import gluon_attention
from part5_profiling.gluon_attention import BLOCK_N, CONFIGS, ROWS
from part5_profiling.tools import ring

HERE = Path(__file__).resolve().parent
D = 128  # the configuration drawn
WARPGROUPS, STAGES, PINGPONG = CONFIGS[D]["WARPGROUPS"], CONFIGS[D]["STAGES"], CONFIGS[D]["PINGPONG"]
N_TILES = 6  # key tiles in the ring's picture

# _softmax_step's statements, recognised by a fragment of their source: (kind, what it does, the
# name of its bar in the timeline). {j} is the step's key tile, {p} the one before it.
STATEMENTS = [
    ("vc = kc.next(", None),  # V_{j-1}'s ring position
    ("s0 = gl.zeros(", None),
    ("smem.k.wait(", ("wait", "wait k.ready: K_{j} has landed", None)),
    ("smem.turns.take(", ("wait", "wait turns[WG]: the warpgroup before has issued its products", None)),
    ("smem.turns.pass_on(", ("arrive", "arrive turns[WG + 1]: the next warpgroup's turn", None)),
    ("warpgroup_mma(q, k_buf", ("mma", "issue S_{j} = Q K_{j}^T (async)", "S_{j}")),
    ("smem.v.wait(", ("wait", "wait v.ready: V_{p} has landed", None)),
    ("warpgroup_mma(p_prev, v_buf", ("mma", "issue O += P_{p} V_{p} (async)", "P_{p} V_{p}")),
    ("warpgroup_mma(_operand(cfg, p_prev", ("mma", "issue O += P_{p} V_{p} (async)", "P_{p} V_{p}")),  # fwd9 on
    ("warpgroup_mma_wait(", ("mma_wait", "wait_{n}", None)),  # worded by its count n, in WAITS
    ("smem.k.release(", ("arrive", "arrive k.free: K_{j} released", None)),
    ("_online_softmax(", ("softmax", "softmax of S_{j}: m, P_{j}, l, alpha", "softmax(S_{j})")),
    ("smem.v.release(", ("arrive", "arrive v.free: V_{p} released", None)),
    ("acc = acc *", ("rescale", "O *= alpha", "x alpha")),
    ("p_prev = ", ("convert", "P_{j} to 16 bits, for the next step", "")),
    ("_carried(cfg, p,", ("convert", "P_{j} to 16 bits, for the next step", "")),  # D = 128: no PACK_LATE
    ("return ", None),
]
WAITS = {1: "wait, 1 product left running: S_{j} done", 0: "wait, no product left running: P_{p} V_{p} done"}
LENGTH = dict(mma=1.0, softmax=1.0, rescale=0.3, convert=0.15)  # schematic: S and P V have equal FLOPs


def step_order(path=None):
    """_softmax_step's work in the order it is issued: (kind, what, bar, n) per statement that does
    some, n being a warpgroup_mma_wait's count of products it lets run on (None for the others). A
    statement not in STATEMENTS is an error, so a change to the kernel's step changes the picture
    (or stops it) rather than leaving it stale."""
    tree = ast.parse(Path(path or gluon_attention.__file__).read_text())
    step = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_softmax_step")
    order = []
    for stmt in _as_configured(step.body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        text = ast.unparse(stmt)
        match = next((what for fragment, what in STATEMENTS if fragment in text), "unknown")
        if match == "unknown":
            raise ValueError(f"_softmax_step has a statement the figure does not know: {text}")
        if match is None:
            continue
        kind, what, bar = match
        n = stmt.value.args[0].value if kind == "mma_wait" else None  # warpgroup_mma_wait(n, deps=...)
        order.append((kind, WAITS[n] if kind == "mma_wait" else what, bar, n))
    return order


def _as_configured(body):
    """The statements of body as the drawn configuration runs them: an `if smem.turns.ON:` (or `if not
    smem.turns.ON:`) block by CONFIGS[D]["PINGPONG"], and the turn-taking calls only with ping-pong
    on (they do nothing without it)."""
    for stmt in body:
        test = ast.unparse(stmt.test) if isinstance(stmt, ast.If) else ""
        if "turns.ON" in test:
            if test not in ("smem.turns.ON", "not smem.turns.ON"):
                raise ValueError(f"_softmax_step tests ping-pong in a way the figure does not know: {test}")
            wanted = PINGPONG if test == "smem.turns.ON" else not PINGPONG
            yield from _as_configured(stmt.body if wanted else stmt.orelse)
        elif PINGPONG or not any(f in ast.unparse(stmt) for f in ("turns.take(", "turns.pass_on(")):
            yield stmt


def gluon_timeline(order, steps):
    """The schematic timeline of one warpgroup running `steps` calls of _softmax_step (key tiles
    1 ... steps): bars (lane, start, end, name) on the "tensor cores" and "warps" lanes, and the
    issue time of each item of the first step's order. A product starts when it is issued and the
    tensor cores are free, and products finish in the order issued (wgmma groups do); a wait that
    lets n products run on waits for the (n + 1)-th last; softmax, rescale and convert run on the
    warps; waits on landed tiles and arrivals take no time."""
    t = busy_until = 0.0
    finished = []  # the end time of each product issued
    bars, marks = [], []
    for j in range(1, steps + 1):
        for kind, _, bar, n in order:
            name = None if bar is None else bar.format(j=j, p=j - 1)
            if kind == "mma":
                start = max(t, busy_until)
                busy_until = start + LENGTH["mma"]
                finished.append(busy_until)
                bars.append(("tensor cores", start, busy_until, name))
            elif kind == "mma_wait" and len(finished) > n:
                t = max(t, finished[-(n + 1)])
            if j == 1:
                marks.append(t)
            if kind in ("softmax", "rescale", "convert"):
                bars.append(("warps", t, t + LENGTH[kind], name))
                t += LENGTH[kind]
    return bars, marks


def serial_timeline(steps):
    """Part 4's inner loop as written: Q K_j^T, then the softmax, then P_j V_j, each waiting for the last."""
    t, bars = 0.0, []
    for j in range(1, steps + 1):
        for lane, kind, name in (
            ("tensor cores", "mma", f"S_{j}"),
            ("warps", "softmax", f"softmax(S_{j})"),
            ("warps", "rescale", "x alpha"),
            ("warps", "convert", ""),
            ("tensor cores", "mma", f"P_{j} V_{j}"),
        ):
            bars.append((lane, t, t + LENGTH[kind], name))
            t += LENGTH[kind]
    return bars


def ring_occupancy(events):
    """(slot, first event, last event, tile) for each key tile: from the event where the loader's copy
    lands to the one where the last warpgroup releases the slot, in run()'s event order."""
    landed, spans = {}, []
    for index, e in enumerate(events):
        if e["blocked"]:
            continue
        if e["who"] == "loader":
            landed[e["tile"]] = index
        elif e["completes"] is not None:
            spans.append((e["slot"], landed[e["tile"]], index, e["tile"]))
    return spans


BLUE, ORANGE, GREEN, LIGHT_GREEN, GREY = "#4c72b0", "#dd8452", "#55a868", "#a0c8a0", "#999999"


def _box(ax, x, y, w, h, text, colour, fontsize=9, **kw):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="#444444"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **kw)


def _arrow(ax, start, end, colour, dashed=False, **kw):
    style = dict(arrowstyle="->", color=colour, lw=1.8, ls="--" if dashed else "-", **kw)
    ax.annotate("", xy=end, xytext=start, arrowprops=style)


def _roles_panel(ax):
    from matplotlib.patches import Rectangle

    ax.set_xlim(0, 12)
    ax.set_ylim(-0.9, 7)
    ax.axis("off")
    loader = (
        "loader: 1 warp\n(24 registers a thread)\n\n"
        "per query tile: Q, once the\nwarpgroups release the last one\n\n"
        "per key tile j, slot s = j % STAGES:\n k.fill: wait k.free[s], TMA K_j -> s\n v.fill: wait v.free[s], TMA V_j -> s"
    )
    _box(ax, 0.1, 1.7, 3.1, 3.6, loader, "#e8e8e8", fontsize=8.5)
    slot_h = 5.6 / STAGES
    for s in range(STAGES):
        y = 0.4 + (STAGES - 1 - s) * slot_h
        ax.add_patch(Rectangle((4.0, y), 3.6, slot_h - 0.2, facecolor="#fafafa", edgecolor=GREY, ls=":"))
        ax.text(5.8, y + slot_h - 0.45, f"slot {s}", ha="center", fontsize=9, weight="bold")
        _box(ax, 4.3, y + 1.05, 1.35, slot_h - 1.75, f"K\n{BLOCK_N} x {D}", "#cfdcf0")
        _box(ax, 5.95, y + 1.05, 1.35, slot_h - 1.75, f"V\n{BLOCK_N} x {D}", "#f6dcc8")
        ax.text(4.15, y + 0.6, f"k/v_ready[{s}]: 1 arrival (the copy's bytes)", fontsize=7.5, color=BLUE)
        ax.text(4.15, y + 0.2, f"k/v.free[{s}]: {WARPGROUPS} arrivals (one per warpgroup)", fontsize=7.5, color=ORANGE)
    ax.text(5.8, 6.55, f"shared memory: Q ({WARPGROUPS} x {ROWS} rows), and a ring of", ha="center", fontsize=9)
    ax.text(5.8, 6.2, f"STAGES = {STAGES} K/V buffers, each with a ready and a free mbarrier", ha="center", fontsize=9)
    wg_h = 5.6 / WARPGROUPS
    for w in range(WARPGROUPS):
        y = 0.4 + (WARPGROUPS - 1 - w) * wg_h
        text = (
            f"softmax warpgroup {w}: 4 warps\nquery rows {w * ROWS}-{(w + 1) * ROWS - 1} of the tile\n\n"
            "per key tile: wgmma S = Q K^T,\nexp2 on its own rows,\nwgmma O += P V;\nk.release, v.release (free)"
        )
        _box(ax, 8.7, y + 0.15, 3.2, wg_h - 0.45, text, "#d9ecd9", fontsize=8.5)
        _arrow(ax, (7.6, 3.2), (8.7, y + wg_h / 2), GREEN)
    _arrow(ax, (3.2, 3.5), (4.0, 3.5), BLUE)
    ax.text(3.6, 3.65, "TMA\ncopy", fontsize=8, color=BLUE, ha="center", va="bottom")
    ax.text(8.15, 3.2, "wgmma\nreads\nK, V\nin place", fontsize=8, color=GREEN, ha="center", va="center")
    _arrow(ax, (10.3, 0.55), (1.65, 1.7), ORANGE, dashed=True, connectionstyle="arc3,rad=-0.2")
    ax.text(
        6.0,
        -0.75,
        f"each warpgroup arrives on free[s] when done with slot s; the last of the {WARPGROUPS} arrivals\n"
        "completes the barrier's phase, and the loader's wait passes: it may refill slot s",
        ha="center",
        fontsize=8.5,
        color=ORANGE,
    )
    other = "; ".join(
        f"D = {d}: {c['WARPGROUPS']} warpgroups, STAGES = {c['STAGES']}" for d, c in CONFIGS.items() if d != D
    )
    ax.set_title(
        f"(a) one program of the forward at D = {D} (CONFIGS[{D}]; {other}):\n"
        f"gl.warp_specialize gives {WARPGROUPS} softmax warpgroups of {ROWS} query rows and 1 loader warp",
        fontsize=10,
    )


def _ring_panel(ax):
    events, errors = ring.run(N_TILES, STAGES, WARPGROUPS)
    assert not errors, errors
    colours = [BLUE, ORANGE]
    for slot, first, last, tile in ring_occupancy(events):
        phase = (tile // STAGES) & 1
        ax.barh(slot, last - first + 1, left=first - 0.5, height=0.55, color=colours[phase], alpha=0.9)
        ax.text(
            (first + last) / 2,
            slot,
            f"K_{tile}\nphase bit {phase}",
            ha="center",
            va="center",
            fontsize=9,
            color="white",
        )
    for index, e in enumerate(events):
        if e["who"] == "loader" and e["blocked"]:
            ax.plot(index, e["slot"] + 0.36, "^", color="black", ms=8)
            ax.text(index, e["slot"] + 0.45, f"K_{e['tile']}", ha="center", va="top", fontsize=8)
    ax.set_yticks(range(STAGES), [f"slot {s}" for s in range(STAGES)])
    ax.set_ylim(STAGES - 0.35, -0.5)
    ax.set_xlabel("event in the model (ring.run, loader first): an order, not a time")
    ax.set_title(
        f"(b) the K ring in ring.py's model: {N_TILES} key tiles, STAGES = {STAGES}, {WARPGROUPS} warpgroups\n"
        "K_j goes to slot j % STAGES, phase bit (j // STAGES) & 1. A bar: from the copy landing\n"
        "to the last warpgroup's release. Triangle: the loader's wait on free blocks (for that tile)",
        fontsize=9.5,
    )


def _timeline_panel(ax):
    from matplotlib.patches import Patch

    order, steps = step_order(), 3
    lanes = {
        ("part 4", "tensor cores"): 0,
        ("part 4", "warps"): 1,
        ("part 5", "tensor cores"): 2.7,
        ("part 5", "warps"): 3.7,
    }
    colour = {"tensor cores": BLUE, "warps": GREEN}
    gluon, marks = gluon_timeline(order, steps)
    ends = {}
    for who, bars in (("part 4", serial_timeline(steps)), ("part 5", gluon)):
        for lane, start, end, name in bars:
            c = colour[lane] if name not in ("x alpha", "") else LIGHT_GREEN
            ax.barh(lanes[(who, lane)], end - start, left=start, height=0.7, color=c, edgecolor="white")
            if name not in ("x alpha", ""):
                ax.text(
                    (start + end) / 2, lanes[(who, lane)], name, ha="center", va="center", fontsize=8.5, color="white"
                )
        ends[who] = max(end for _, _, end, _ in bars)
        ax.text(ends[who] + 0.08, lanes[(who, "warps")], f"{steps} steps done", va="center", fontsize=8.5)
    times = sorted(set(marks))
    for t in times:
        numbers = [i for i, m in enumerate(marks, 1) if m == t]
        label = f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 2 else ", ".join(map(str, numbers))
        ax.annotate(label, xy=(t, 4.1), xytext=(t, 4.55), ha="center", fontsize=8, arrowprops=dict(arrowstyle="-"))
    ax.set_yticks(
        [*lanes.values(), 4.45],
        [
            "part 4: tensor cores",
            "part 4: the warps",
            "part 5, one warpgroup:\ntensor cores",
            "part 5, one warpgroup:\nits warps",
            "step 1: when each line\nof the list is issued",
        ],
    )
    ax.set_ylim(4.85, -0.6)
    ax.set_xlim(-0.1, ends["part 4"] + 1.3)
    ax.set_xticks([])
    ax.set_xlabel(
        "order of issue, schematic: unit lengths (S = Q K^T and P V have equal FLOPs), not measured durations"
    )
    listing = "\n".join(f"{i:>2}  {what.format(j='j', p='j-1')}" for i, (_, what, _, _) in enumerate(order, 1))
    ax.text(
        1.01,
        1.0,
        "_softmax_step, in order:\n\n" + listing,
        transform=ax.transAxes,
        va="top",
        fontsize=8.5,
        family="monospace",
    )
    ax.legend(
        handles=[
            Patch(color=BLUE, label="a product on the tensor cores (tl.dot / wgmma)"),
            Patch(color=GREEN, label="softmax on the warps: max, exp2, sum"),
            Patch(color=LIGHT_GREEN, label="O *= alpha, then P to 16 bits"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 0.3),
        fontsize=8.5,
        frameon=False,
    )
    ax.set_title(
        "Part 4's loop as written: Q K^T, then the softmax, then P V, each waiting for the last.\n"
        "Part 5's _softmax_step issues S_j and P_{j-1} V_{j-1} together, and computes the softmax of S_j "
        "on its warps while the tensor cores multiply P V",
        fontsize=10,
    )


def ring_figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(17, 7.2))
    grid = fig.add_gridspec(1, 2, width_ratios=[1.35, 1], wspace=0.12)
    _roles_panel(fig.add_subplot(grid[0, 0]))
    _ring_panel(fig.add_subplot(grid[0, 1]))
    fig.suptitle("Part 5: the Gluon forward (gluon_attention.py): who does what, and the K/V ring between them")
    fig.subplots_adjust(top=0.84, bottom=0.09, left=0.01, right=0.98)
    return fig


def step_figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(17, 5.6))
    _timeline_panel(fig.subplots())
    fig.suptitle("Part 5: one step of a softmax warpgroup (_softmax_step) beside part 4's serial chain")
    fig.subplots_adjust(top=0.82, bottom=0.08, left=0.11, right=0.73)
    return fig


def draw(folder=HERE):
    """Draw the figures into folder (this part's folder by default); the paths written."""
    paths = [Path(folder) / "gluon_ring.png", Path(folder) / "gluon_step.png"]
    for path, figure in zip(paths, (ring_figure, step_figure)):
        figure().savefig(path, dpi=90)
    return paths


if __name__ == "__main__":
    for path in draw():
        print(f"drew {path}")
    sys.exit(0)
