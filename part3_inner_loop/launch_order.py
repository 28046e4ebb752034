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
shipped column marks them). Each variant is part 3's kernel with one patch, tools/variants/<order>.diff
(applied by common.steps.variant), that makes its order the one for every call (nothing else changes),
checked against the float64 reference before it is timed.
"""

import sys

from common import parts, results, study

ORDERS = {  # the study's names for them -> their patches in tools/variants/
    "sequence-major": "sequence_major",
    "sequence-major, last tile first": "sequence_major_last_first",
    "tile-major, last tile first": "tile_major_last_first",
    "tile-major in groups of 4 sequences, last tile first": "tile_major_grouped",
}
SHIPPED_ORDER = {False: "sequence-major", True: "tile-major, last tile first"}  # part 3's, by causal
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
    modules = {name: parts.load_variant(3, patch) for name, patch in ORDERS.items()}
    return study.time_forwards(
        {name: module.flash_forward for name, module in modules.items()},
        lambda order, causal: dict(order=order, shipped=int(order == SHIPPED_ORDER[causal])),
        seq_lens,
        save=save,
        config=lambda name: parts.forward_config(modules[name]),
    )


def main(argv=None):
    args = study.arguments(__doc__, argv, n=SEQ_LENS)
    if not study.on_gpu("The launch-order study times compiled kernels"):
        return 0
    return results.write_as_measured("part3_launch_order.csv", FIELDS, lambda save: run(args.n, save))


if __name__ == "__main__":
    sys.exit(main())
