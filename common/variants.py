"""Kernel variants made by replacing lines of a part's kernel file: the studies that time a change
(what casting P costs, a launch order, a stage doubled, a candidate optimisation) build each variant
this way, so the variant is the shipped kernel with only the named lines different."""

from common import bench, parts, results


def apply(source, replacements, where="the kernel"):
    """source with each (old, new) replaced. Each old text must occur exactly once: a kernel edit that
    moves or duplicates it makes the study fail loudly instead of timing the wrong thing."""
    for old, new in replacements:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"expected one {old.strip()!r} in {where}; found {count}")
        source = source.replace(old, new)
    return source


def load(part, replacements, name):
    """Part `part`'s kernel file with the replacements applied, imported as module `name`."""
    return parts.load_source(name, apply(parts.path(part).read_text(), replacements, f"part {part}'s kernel"))


def time_forwards(modules, row_for, seq_lens, head_dims=(64, 128), b=4, h=8, do_bench=True, save=None):
    """Check and time each module's forward ({label: module}: ablation steps, launch orders,
    candidates) on the same bf16 inputs, for every D in head_dims, causal and not, and N in seq_lens
    (B=b, H=h). row_for(label, causal) gives a row's own columns; each row also gets the shape, what
    bench.measure_forward returns and the provenance. A module that fails to compile or run gets an
    "error: ..." check instead. save(rows so far), if given, runs after every shape."""
    meta, rows = results.provenance(), []
    for d, causal, n, (q, k, v, _) in bench.each_shape(seq_lens, head_dims, b=b, h=h):
        for label, module in modules.items():
            row = dict(row_for(label, causal), B=b, H=h, N=n, D=d, dtype="bf16", causal=int(causal), **meta)
            try:
                row.update(bench.measure_forward(module, q, k, v, causal, do_bench=do_bench))
            except Exception as e:  # a variant the compiler refuses: say why, go on
                row["check"] = f"error: {bench.why(e)}"
            rows.append(row)
            print(f"{label:<34} D={d:<3} causal={causal:d} N={n:>5}  {row.get('tflops') or '-':>7} TFLOP/s "
                  f"(graph {row.get('graph_tflops') or '-':>7})  {row.get('config', '')}  {row['check'][:30]}",
                  flush=True)  # fmt: skip
        if save is not None:
            save(rows)
    return rows
