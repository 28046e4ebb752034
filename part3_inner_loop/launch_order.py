"""Which program runs first: part 3's kernel with different launch orders, timed in one run.

    python -m part3_inner_loop.launch_order        # GPU: results/<gpu>/part3_launch_order.csv

The grid is one axis of (query tiles) x (sequences) programs; the order is how a program's index
becomes (sequence, query tile). The GPU starts programs roughly in index order, so the order decides
two things: which programs share the L2 cache at any moment (programs of one sequence read the same
K and V), and, causal, whether the long programs (the last query tiles) start early or are left for
the end, where a few of them would run alone. The orders:

- sequence-major: all the query tiles of sequence 0, first to last, then sequence 1, ...
- sequence-major, last tile first: the same, each sequence's tiles from last to first.
- tile-major, last tile first: the last query tile of every sequence, then the one before, ...
- tile-major in groups of 4 sequences: the same within each group of 4 sequences, group after
  group: the heavy tiles still start first within a group, and the programs running together
  read the K and V of about 4 sequences, not all of them.

Part 3 ships the tile-major order (ungrouped) for causal calls and sequence-major otherwise (the CSV's shipped
column marks them). Each variant is part 3's flash_attention.py with its index map replaced by one
order for every call (nothing else changes), checked against the float64 reference before it is timed.
"""

import argparse
import sys

from common import parts, results, runtime, variants

# What each order puts after `pid = tl.program_id(0)` in place of part 3's choice.
ORDERS = {
    "sequence-major": (
        "    tile_m = pid % tl.cdiv(N_QUERIES, BLOCK_M)",
        "    bh = (pid // tl.cdiv(N_QUERIES, BLOCK_M)).to(tl.int64)",
    ),
    "sequence-major, last tile first": (
        "    tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid % tl.cdiv(N_QUERIES, BLOCK_M)",
        "    bh = (pid // tl.cdiv(N_QUERIES, BLOCK_M)).to(tl.int64)",
    ),
    "tile-major, last tile first": (
        "    tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid // N_SEQS",
        "    bh = (pid % N_SEQS).to(tl.int64)",
    ),
    "tile-major in groups of 4 sequences, last tile first": (
        "    n_tiles = tl.cdiv(N_QUERIES, BLOCK_M)",
        "    first = pid // (4 * n_tiles) * 4  # the group's first sequence",
        "    in_group = tl.minimum(N_SEQS - first, 4)  # the last group may hold fewer",
        "    rest = pid - first * n_tiles",
        "    tile_m = n_tiles - 1 - rest // in_group",
        "    bh = (first + rest % in_group).to(tl.int64)",
    ),
}
PID = "    pid = tl.program_id(0)\n"
B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (1024, 4096, 16384)
FIELDS = ["order", "shipped", "B", "H", "N", "D", "dtype", "causal", "ms", "tflops", "graph_ms", "graph_tflops",
          "config", "check", *results.PROVENANCE]  # fmt: skip


def index_block(source):
    """(start, end): the lines of part 3's kernel that map the program index to (tile_m, bh), from
    the one after `pid = tl.program_id(0)` up to the first blank line."""
    lines = source.splitlines(keepends=True)
    if lines.count(PID) != 1:
        raise ValueError(f"part 3's kernel has {lines.count(PID)} lines {PID.strip()!r}; expected 1")
    start = lines.index(PID) + 1
    return start, lines.index("\n", start)


def variant_source(order):
    """Part 3's kernel source with its program-index map replaced by `order`, for every call."""
    lines = parts.path(3).read_text().splitlines(keepends=True)
    start, end = index_block("".join(lines))
    return "".join(lines[:start] + [line + "\n" for line in ORDERS[order]] + lines[end:])


def shipped_order(causal):
    """Which of ORDERS part 3's kernel uses for causal (True) or non-causal (False) calls: its index
    map is either one order, or `if IS_CAUSAL:` one order `else:` another. None if neither."""
    source = parts.path(3).read_text()
    start, end = index_block(source)
    block = [line.strip() for line in source.splitlines()[start:end]]
    if block[:1] == ["if IS_CAUSAL:"] and "else:" in block:
        split = block.index("else:")
        block = block[1:split] if causal else block[split + 1 :]
    for order, lines in ORDERS.items():
        if block == [line.strip() for line in lines]:
            return order
    return None


def run(seq_lens, save=None):
    modules = {order: parts.load_source(f"part3_order{i}", variant_source(order)) for i, order in enumerate(ORDERS)}
    shipped = {causal: shipped_order(causal) for causal in (False, True)}
    return variants.time_forwards(modules, lambda order, causal: dict(order=order, shipped=int(order == shipped[causal])),
                                  seq_lens, HEAD_DIMS, B, H, save=save)  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, action="append", help=f"sequence length (repeatable); default {SEQ_LENS}")
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The launch-order study times compiled kernels and needs a CUDA GPU.")
        return 0
    return results.write_as_measured("part3_launch_order.csv", FIELDS, lambda save: run(args.n or SEQ_LENS, save))


if __name__ == "__main__":
    sys.exit(main())
