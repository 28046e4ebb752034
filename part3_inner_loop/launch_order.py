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

Part 3 ships the tile-major order (ungrouped) for causal calls and sequence-major otherwise (the CSV's
shipped column marks them). Each variant is part 3's kernel with its ORDER switch (variants.py) set
to one order for every call (nothing else changes), checked against the float64 reference before it
is timed.
"""

import sys

from common import results, study
from part3_inner_loop import variants

SEQ_LENS = (1024, 4096, 16384)
FIELDS = [
    "order",
    "shipped",
    *results.SHAPE_FIELDS,
    "ms",
    "tflops",
    "graph_ms",
    "graph_tflops",
    "config",
    "check",
    *results.PROVENANCE,
]


def run(seq_lens, save=None):
    forwards = {name: variants.forward(order=order) for name, order in variants.ORDERS.items()}
    shipped = variants.SHIPPED_ORDER
    return study.time_forwards(
        forwards,
        lambda order, causal: dict(order=order, shipped=int(order == shipped[causal])),
        seq_lens,
        save=save,
        config=lambda _: variants.chosen(),
    )


def main(argv=None):
    args = study.arguments(__doc__, argv, n=SEQ_LENS)
    if not study.on_gpu("The launch-order study times compiled kernels"):
        return 0
    return results.write_as_measured("part3_launch_order.csv", FIELDS, lambda save: run(args.n, save))


if __name__ == "__main__":
    sys.exit(main())
