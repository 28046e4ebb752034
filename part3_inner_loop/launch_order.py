"""Which program runs first: part 3's kernel with three launch orders, timed in one run.

    python -m part3_inner_loop.launch_order        # GPU: results/<gpu>/part3_launch_order.csv

The grid is one axis of (query tiles) x (sequences) programs; the order is how a program's index
becomes (sequence, query tile). The GPU starts programs roughly in index order, so the order decides
two things: which programs share the L2 cache at any moment (programs of one sequence read the same
K and V), and, causal, whether the long programs (the last query tiles) start early or are left for
the end, where a few of them would run alone. The orders:

- sequence-major: all the query tiles of sequence 0, first to last, then sequence 1, ...
- sequence-major, last tile first: the same, each sequence's tiles from last to first.
- tile-major, last tile first: the last query tile of every sequence, then the one before, ...

Each is part 3's flash_attention.py with its three index lines replaced (nothing else changes);
every variant is checked against the float64 reference before it is timed.
"""

import argparse
import functools
import sys

import torch

from common import bench, parts, results, runtime
from common.inputs import Shape, make_inputs

# The index lines of part 3's kernel, and what each order puts in their place.
INDEX_LINES = ("    tile_m = ", "    bh = ")
ORDERS = {
    "sequence-major": (
        "    tile_m = pid % tl.cdiv(N_QUERIES, BLOCK_M)\n",
        "    bh = (pid // tl.cdiv(N_QUERIES, BLOCK_M)).to(tl.int64)\n",
    ),
    "sequence-major, last tile first": (
        "    tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid % tl.cdiv(N_QUERIES, BLOCK_M)\n",
        "    bh = (pid // tl.cdiv(N_QUERIES, BLOCK_M)).to(tl.int64)\n",
    ),
    "tile-major, last tile first": (
        "    tile_m = tl.cdiv(N_QUERIES, BLOCK_M) - 1 - pid // N_SEQS\n",
        "    bh = (pid % N_SEQS).to(tl.int64)\n",
    ),
}
B, H = 4, 8
HEAD_DIMS = (64, 128)
SEQ_LENS = (1024, 4096, 16384)
FIELDS = ["order", "shipped", "B", "H", "N", "D", "dtype", "causal", "ms", "tflops", "graph_ms", "graph_tflops",
          "config", "check", *results.PROVENANCE]  # fmt: skip


def variant_source(order):
    """Part 3's kernel source with its program-index lines set to `order`."""
    lines = parts.path(3).read_text().splitlines(keepends=True)
    for prefix, replacement in zip(INDEX_LINES, ORDERS[order], strict=True):
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        if len(found) != 1:
            raise ValueError(f"part 3's kernel has {len(found)} lines starting {prefix.strip()!r}; expected 1")
        lines[found[0]] = replacement
    return "".join(lines)


def shipped_order():
    """Which of ORDERS part 3's kernel uses (its index lines, compared without comments)."""
    source = parts.path(3).read_text().splitlines()
    kernel = [line.split("#")[0].rstrip() for line in source if line.startswith(INDEX_LINES)]
    for order, replacement in ORDERS.items():
        if kernel == [line.rstrip() for line in replacement]:
            return order
    return None


def run(seq_lens):
    modules = {order: parts.load_source(f"part3_order{i}", variant_source(order)) for i, order in enumerate(ORDERS)}
    shipped = shipped_order()
    meta = results.provenance()
    rows = []
    for d in HEAD_DIMS:
        for causal in (False, True):
            for n in seq_lens:
                q, k, v, _ = make_inputs(Shape((B, H), n, n, d), torch.bfloat16, runtime.DEVICE, seed=n + d + causal)
                flops = bench.attention_flops(B, H, n, n, d, causal)
                for order, module in modules.items():
                    row = dict(order=order, shipped=int(order == shipped), B=B, H=H, N=n, D=d, dtype="bf16",
                               causal=int(causal), **meta)  # fmt: skip
                    with torch.no_grad():
                        o, lse = module.flash_forward(q, k, v, causal)
                        report = bench.check_slices({"O": o, "L": lse}, q, k, v, causal)
                        row["check"] = ("ok " if report.ok else "FAIL ") + str(report)
                        if report.ok:
                            fn = functools.partial(module.flash_forward, q, k, v, causal)
                            ms, gms = bench.time_ms(fn), bench.graph_time_ms(fn)
                            row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms * 1e-9:.1f}", graph_ms=f"{gms:.4f}",
                                       graph_tflops=f"{flops / gms * 1e-9:.1f}", config=bench.chosen_config(module))  # fmt: skip
                    rows.append(row)
                    print(f"{order:<32} D={d} causal={causal:d} N={n:>5}  {row.get('tflops', '-'):>7} TFLOP/s "
                          f"(graph {row.get('graph_tflops', '-'):>7})  {row.get('config', '')}  {row['check'][:30]}",
                          flush=True)  # fmt: skip
                torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, action="append", help=f"sequence length (repeatable); default {SEQ_LENS}")
    args = ap.parse_args(argv)
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("The launch-order study times compiled kernels and needs a CUDA GPU.")
        return 0
    rows = run(args.n or SEQ_LENS)
    path = results.write_csv(results.results_dir() / "part3_launch_order.csv", rows, FIELDS)
    print(f"wrote {results.shown(path)}")
    return 0 if all(r["check"].startswith("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
