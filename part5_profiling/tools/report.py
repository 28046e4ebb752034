"""Part 5's tables and figures: the ceilings, the profile of every part, the launch cost, where the
forward's time goes, and the roofline. `make report` fills the README blocks named in TABLES and
calls draw().
"""

import re
import statistics

from common import sweep_report
from common.report import PANELS, yes_no
from common.results import markdown_table, provenance_line, read_csv
from part5_profiling import roofline


def table_ceilings(gpu_dir):
    rows = read_csv(gpu_dir / "part5_ceilings.csv")
    body = [[r["ceiling"], r["shape"], f"{r['value']:,}", r["unit"], r["method"]] for r in rows]
    return "\n".join(
        [
            provenance_line(rows, "python -m part5_profiling.tools.ceilings && make report"),
            "",
            markdown_table(["ceiling", "shape", "value", "unit", "how"], body, "llrll"),
        ]
    )


def _value(rows, **match):
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return found[0]["value"] if found else None


def table_profile(gpu_dir):
    """Per target, pass and shape: GPU time, TFLOP/s, and from the compiler or ncu the main resources."""
    rows = read_csv(gpu_dir / "part5_profile.csv")
    keys = list(dict.fromkeys((r["target"], r["pass"], r["D"], r["causal"]) for r in rows))
    body = []
    for target, pass_, d, causal in keys:
        mine = [r for r in rows if (r["target"], r["pass"], r["D"], r["causal"]) == (target, pass_, d, causal)]
        us = _value(mine, method="cupti", kernel="(all kernels)", metric="time per call")
        tf = _value(mine, method="cupti", kernel="(all kernels)", metric="achieved")
        ncu_ok = any(r["method"] == "ncu" and r["metric"] != "unavailable" for r in mine)
        regs = sorted(
            {
                f"{r['kernel']} {r['value']}"
                for r in mine
                if r["metric"] == "registers per thread" and r["method"] == "compiler"
            }
        )
        spills = sum(int(r["value"]) for r in mine if r["metric"] == "spilled registers")
        # ncu's figures per kernel (a backward pass has three): "dkdv 59; dq 67; preprocess 0.1".
        # On the H200 ncu reported only the hmma pipe counter, which counts wgmma too.
        tensor, stall = [], []
        for kernel in dict.fromkeys(
            r["kernel"] for r in mine if r["method"] == "ncu" and r["kernel"] != "(all kernels)"
        ):
            own = [r for r in mine if r["method"] == "ncu" and r["kernel"] == kernel]
            short = kernel.removeprefix("_attn_").removeprefix("bwd_")
            pipe = _value(own, metric="tensor pipe (wgmma) active, %") or _value(
                own, metric="tensor pipe (mma) active, %"
            )
            if pipe is not None:
                tensor.append(f"{short} {float(pipe):.0f}" if float(pipe) >= 1 else f"{short} <1")
            top = next((r["metric"].split(": ", 1)[1] for r in own if r["metric"].startswith("stall #1")), None)
            if top:
                stall.append(f"{short} {top}")
        tensor = "; ".join(tensor) if tensor else None
        stall = "; ".join(stall) if stall else None
        failed = any(r["metric"] == "error" for r in mine)  # a method that raised: the CSV's note says why
        us, tf = (("error" if failed else "—") if x is None else x for x in (us, tf))
        body.append(
            [
                target,
                pass_,
                d,
                yes_no(causal),
                us,
                tf,
                "; ".join(regs) or "—",
                spills if regs else "—",
                tensor if tensor is not None else "—",
                stall or "—",
                "yes" if ncu_ok else "no",
            ]
        )
    header = [
        "target",
        "pass",
        "D",
        "causal",
        "GPU us per call",
        "TFLOP/s",
        "registers per thread",
        "spills",
        "tensor pipe %",
        "top stall",
        "counters",
    ]
    return "\n".join(
        [
            provenance_line(rows, "python -m part5_profiling.tools.profile --part N && make report"),
            "",
            "B=4, H=8, N=4096, bf16. GPU time: CUPTI kernel records, all of a pass's kernels; registers: "
            "the compiled Triton kernels; tensor pipe and stalls: ncu, where it could read the counters.",
            "",
            markdown_table(header, body, "llrlrrlrrll"),
        ]
    )


def table_launch_cost(gpu_dir):
    rows = read_csv(gpu_dir / "part5_launch_cost.csv")
    timing = [r for r in rows if r["what"] in ("gpu_us", "host_us", "call_us")]
    index = {(r["part"], r.get("mode") or "fwd", r["N"], r["what"]): r["us"] for r in timing}
    commit = {(r["part"], r.get("mode") or "fwd", r["N"]): r["commit"] for r in timing}
    keys = list(dict.fromkeys((r["part"], r.get("mode") or "fwd", r["N"]) for r in timing))

    def vs_sdpa(p, m, n):  # host time against SDPA cuDNN's in the same mode and N, of the same commit's run
        ours, theirs = index.get((p, m, n, "host_us")), index.get(("sdpa_cudnn", m, n, "host_us"))
        same_run = commit.get((p, m, n)) == commit.get(("sdpa_cudnn", m, n))
        return f"{float(ours) / float(theirs):.1f}x" if ours and theirs and same_run else "—"

    body = [
        [p, m, n, *(index.get((p, m, n, w), "—") for w in ("gpu_us", "host_us", "call_us")), vs_sdpa(p, m, n)]
        for p, m, n in keys
    ]
    groups = [r for r in rows if r["what"] == "host, by group (cProfile)"]
    group_body = [[r["part"], r.get("mode") or "fwd", r["group"], r["us"]] for r in groups]
    out = [
        provenance_line(rows, "python -m part5_profiling.tools.launch_cost && make report"),
        "",
        "D=128, non-causal, bf16, B=4, H=8; microseconds per call (bwd: flash_backward called directly; "
        "fwd+bwd: the forward and torch.autograd.grad; one thread: the same with autograd's backward on the "
        "calling thread; floor: a Python autograd.Function that launches nothing). The last column only "
        "where SDPA cuDNN was measured at the same commit:",
        "",
        markdown_table(
            ["part", "mode", "N", "GPU (graph replay)", "host (issuing calls)", "do_bench", "host / SDPA cuDNN's"],
            body,
            "llrrrrr",
        ),
    ]
    if group_body:
        out += [
            "",
            f"Host time by group under cProfile, N = {groups[0]['N']} (shares; cProfile slows Python):",
            "",
            markdown_table(["part", "mode", "group", "us per call"], group_body, "lllr"),
        ]
    paired_csv = gpu_dir / "part5_launch_paired.csv"
    paired = [r for r in read_csv(paired_csv) if r["what"] == "host, paired"] if paired_csv.exists() else []
    if paired:
        cells = {(r["part"], r["N"], r["group"]): r["us"] for r in paired}
        lens = list(dict.fromkeys(r["N"] for r in paired))

        def pair_cell(p, n):
            us, ratio = cells.get((p, n, "us (median of rounds)")), cells.get((p, n, "over SDPA cuDNN (median)"))
            if us is None:
                return "—"
            low, high = cells.get((p, n, "over SDPA cuDNN (lowest)")), cells.get((p, n, "over SDPA cuDNN (highest)"))
            return f"{us:.0f}" + (f" ({ratio:.2f}x, {low:.2f}-{high:.2f})" if ratio is not None else "")

        out += [
            "",
            "The host's time against SDPA cuDNN's, paired: a forward + backward through autograd (its device "
            "thread, as training runs it) of every target in turn, round after round, at "
            f"N = {', '.join(map(str, lens))}. Host us per call, the median of the rounds (in brackets its time "
            "over SDPA cuDNN's in the same round: the median, and the lowest and highest round):",
            "",
            provenance_line(
                paired, "python -m part5_profiling.tools.launch_cost --part 5 --paired-only && make report"
            ),
            "",
            markdown_table(
                ["part", *(f"N = {n}" for n in lens)],
                [[p, *(pair_cell(p, n) for n in lens)] for p in dict.fromkeys(r["part"] for r in paired)],
                "l" + "r" * len(lens),
            ),
        ]
    split = [r for r in rows if r["what"] == "host split"]
    if split:
        cells = {(r["part"], r["mode"], r["group"]): r["us"] for r in split}
        names = ["forward", "backward body", "engine and hand-off", "backward through autograd", "total"]

        def cell(p, m, name):
            median, mean = cells.get((p, m, f"{name} (median)")), cells.get((p, m, f"{name} (mean)"))
            return "—" if median is None else f"{median:.0f} ({mean:.0f})"

        split_keys = list(dict.fromkeys((r["part"], r["mode"]) for r in split))
        out += [
            "",
            f"A forward + backward through autograd split by the clock, N = {split[0]['N']}: the forward, the "
            "backward's body (timed inside the Function's backward, on whichever thread runs it) and the rest "
            "(autograd's engine and the hand-off between threads); SDPA's backward is C++, its body and the rest "
            "one column. Median (mean) us per call, no profiler:",
            "",
            markdown_table(
                ["part", "mode", *names],
                [[p, m, *(cell(p, m, n) for n in names)] for p, m in split_keys],
                "ll" + "r" * len(names),
            ),
        ]
    return "\n".join(out)


def table_host_parts(gpu_dir):
    """tools/host_parts.py's ladder (part 5 beside Functions doing a growing share of its work, each over
    SDPA cuDNN's forward + backward of the same round) and its pieces (single operations, host us)."""
    rows = read_csv(gpu_dir / "part5_host_parts.csv")
    ladder = [r for r in rows if r["section"] == "ladder"]
    cells = {(r["target"], r["threads"], r["N"], r["what"]): r["us"] for r in ladder}
    lens = list(dict.fromkeys(r["N"] for r in ladder))
    rungs = ["floor", "tensors", "tensors + torch launches", "tensors + Triton launches", "part 5"]
    rank = lambda t: rungs.index(t) if t in rungs else len(rungs) + (t == "SDPA cuDNN")  # noqa: E731
    keys = sorted(dict.fromkeys((r["target"], r["threads"]) for r in ladder), key=lambda k: rank(k[0]))

    def cell(target, threads, n):
        us = cells.get((target, threads, n, "us (median of rounds)"))
        ratio = cells.get((target, threads, n, "over SDPA cuDNN (median of rounds)"))
        if us is None:
            return "—"
        return f"{us:.0f}" + ("" if ratio is None else f" ({ratio:.2f}x)")

    piece_rows = sorted((r for r in rows if r["section"] == "piece"), key=lambda r: r["date"], reverse=True)
    pieces = [[r["target"], f"{r['us']:.1f}", r["commit"]] for r in piece_rows]  # the latest run's first
    command = "python -m part5_profiling.tools.host_parts && make report"
    return "\n".join(
        [
            provenance_line(ladder, command),
            "",
            "A forward + backward through autograd (torch.autograd.grad), D = 128, non-causal, bf16, B=4, H=8, "
            "on autograd's device thread (as training runs it) and on one thread: host us per call, the median "
            "of the rounds, and in brackets its time over SDPA cuDNN's in the same round. Each rung adds one "
            "ingredient of part 5's call: the floor (a Function that allocates O and returns dO), part 5's "
            "tensors (two allocations and five saved tensors in the forward, five allocations and three "
            "gradients in the backward), its four launches made by PyTorch or by Triton's launcher (a "
            "one-program kernel), then part 5 itself. The rows of part 5 with LEAN off and on are 461acc8's "
            "(the launcher's C function and one descriptor scratch per stream: tried, not kept):",
            "",
            markdown_table(
                ["target", "thread", *(f"N = {n}" for n in lens)],
                [[t, th, *(cell(t, th, n) for n in lens)] for t, th in keys],
                "ll" + "r" * len(lens),
            ),
            "",
            "The pieces, each issued back to back on the calling thread at N = 512 (host us per call; the host's "
            "pace differs between machines, so compare pieces of one commit):",
            "",
            markdown_table(["piece", "us", "commit"], pieces, "lrl"),
        ]
    )


def table_host_check(gpu_dir):
    """Part 5's host split before and after a change to its host path: launch_cost run at each commit in
    turn, each a fresh process, the runs' rows gathered in one CSV with a `run` column; per run and
    threading, the pieces of part 5's forward + backward and SDPA cuDNN's total from the same process."""

    rows = read_csv(gpu_dir / "part5_host_check.csv")
    commits = list(dict.fromkeys(r["commit"] for r in sorted(rows, key=lambda r: (r["date"], r["run"]))))
    split = {
        (r["commit"], r["run"], str(r["part"]), r["mode"], r["group"]): r["us"]
        for r in rows
        if r["what"] == "host split"
    }
    pieces = ["forward", "backward body", "engine and hand-off", "total"]
    modes = list(dict.fromkeys(r["mode"] for r in rows if r["what"] == "host split"))
    body, ratios = [], {}
    runs_of = lambda commit: sorted({r["run"] for r in rows if r["commit"] == commit})  # noqa: E731
    for mode in modes:
        for commit in commits:
            for run in runs_of(commit):
                ours = [split.get((commit, run, "5", mode, f"{p} (median)")) for p in pieces]
                theirs = split.get((commit, run, "sdpa_cudnn", mode, "total (median)"))
                ratio = ours[-1] / theirs if ours[-1] and theirs else None
                ratios.setdefault((mode, commit), []).append(ratio)
                cells = ["—" if x is None else f"{x:.0f}" for x in (*ours, theirs)]
                body.append([mode, commit, run, *cells, "—" if ratio is None else f"{ratio:.2f}x"])
    medians = [
        f"{mode}, {commit}: {statistics.median(xs):.2f}x" for (mode, commit), xs in ratios.items() if None not in xs
    ]
    return "\n".join(
        [
            provenance_line(
                rows,
                "python -m part5_profiling.tools.launch_cost --part 5 --sdpa cudnn` at each commit "
                "in turn, the runs' rows gathered in one CSV with a `run` column; `make report",
            ),
            "",
            f"N = {rows[0]['N']}, D = 128, bf16, B = 4, H = 8: median microseconds per forward + backward through "
            "autograd (each the middle of the run's three rounds), part 5's split in its pieces, SDPA cuDNN's total "
            "in the same process, and part 5's total over cuDNN's:",
            "",
            markdown_table(
                ["mode", "commit", "run", *(f"part 5: {p}" for p in pieces), "cuDNN: total", "part 5 / cuDNN"],
                body,
                "lll" + "r" * (len(pieces) + 2),
            ),
            "",
            "Median of part 5 / cuDNN over the runs: " + "; ".join(medians) + ".",
            "",
            "The same runs, part 5 alone at N = 512: host microseconds per call issuing calls back to back "
            "(`host_us`) for the forward and for flash_backward called directly, and the total under cProfile "
            "(every group added; cProfile slows Python):",
            "",
            markdown_table(
                ["commit", "run", "fwd: host", "bwd: host", "fwd: cProfile", "bwd: cProfile"],
                [[commit, run, *_host_cells(rows, commit, run)] for commit in commits for run in runs_of(commit)],
                "llrrrr",
            ),
        ]
    )


def _host_cells(rows, commit, run, n=512):
    """Part 5's host_us of fwd and bwd at N = n in one run, and its cProfile totals of each."""
    mine = [r for r in rows if r["commit"] == commit and r["run"] == run and str(r["part"]) == "5" and r["N"] == n]
    host = {r["mode"]: r["us"] for r in mine if r["what"] == "host_us"}
    profiled = {}
    for r in mine:
        if r["what"] == "host, by group (cProfile)":
            profiled[r["mode"]] = profiled.get(r["mode"], 0) + r["us"]
    cells = [host.get("fwd"), host.get("bwd"), profiled.get("fwd"), profiled.get("bwd")]
    return ["—" if x is None else f"{x:.0f}" for x in cells]


COMPILED_COMMAND = (
    "python -m common.bench --part 5 --sdpa cudnn --compiled --compiled-cudagraphs --mode fwd+bwd --n 512 --n 1024 "
    "--n 2048 --n 4096` with RESULTS_DIR set to a folder of its own, its bench.csv saved as bench_compiled.csv; "
    "`make report"
)
FRAMEWORK_WAYS = {  # column -> the benchmark's name suffix, the column it reads
    "eager": ("", "ms"),
    "torch.compile": ("_compiled", "ms"),
    "torch.compile, CUDA graphs": ("_compiled_cudagraphs", "ms"),
    "eager, replayed from a CUDA graph": ("", "graph_ms"),
}


def table_framework(gpu_dir):
    """Forward + backward of part 5 and SDPA cuDNN, eager and inside torch.compile (with and without
    its CUDA graphs), by do_bench, and the GPU's time alone (the eager call replayed from a CUDA graph
    the benchmark captured): what the host costs, and how much of it the framework hides. Each
    shape's cells come from one run (the run of its eager part 5 row): host numbers compare only
    within a run."""
    rows = [r for r in read_csv(gpu_dir / "bench_compiled.csv") if r["mode"] == "fwd+bwd"]
    shapes = list(dict.fromkeys((r["D"], r["causal"], r["N"]) for r in rows if r["impl"] == "part5"))
    run_of = {(r["D"], r["causal"], r["N"]): r["run_id"] for r in rows if r["impl"] == "part5"}
    cell = {
        (r["impl"], r["D"], r["causal"], r["N"]): r
        for r in rows
        if r["run_id"] == run_of.get((r["D"], r["causal"], r["N"]))
    }

    def us(impl, shape, way):
        suffix, column = FRAMEWORK_WAYS[way]
        r = cell.get((impl + suffix, *shape))
        return None if r is None or r[column] is None else r[column] * 1000

    body = []
    for shape in sorted(shapes, key=lambda s: (s[0], s[1], s[2])):
        d, c, n = shape
        mine = [us("part5", shape, w) for w in FRAMEWORK_WAYS]
        theirs = [us("sdpa_cudnn", shape, w) for w in FRAMEWORK_WAYS]
        show = lambda xs: ["—" if x is None else f"{x:.0f}" for x in xs]  # noqa: E731
        body += [
            [d, yes_no(c), n, "part 5", *show(mine)],
            ["", "", "", "cuDNN", *show(theirs)],
            [
                "",
                "",
                "",
                "part 5 / cuDNN",
                *("—" if a is None or b is None else f"{b / a:.2f}x" for a, b in zip(mine, theirs)),
            ],
        ]
    used = [r for r in rows if r["run_id"] in set(run_of.values())]
    return "\n".join(
        [
            provenance_line(used, COMPILED_COMMAND),
            "",
            "Forward + backward (the forward, then torch.autograd.grad), B=4, H=8, bf16, microseconds per call by "
            "`do_bench` (launched from Python, L2 flushed): eager, inside torch.compile, and inside "
            'torch.compile(mode="reduce-overhead"), which records the compiled forward and backward in CUDA graphs; '
            "and the eager call replayed from a CUDA graph the benchmark captured (the GPU's time alone). "
            "Part 5 / cuDNN: cuDNN's time over part 5's (above 1: part 5 faster). Each shape's cells come from "
            "one run; —: not timed in that run:",
            "",
            markdown_table(["D", "causal", "N", "", *FRAMEWORK_WAYS], body, "llrl" + "r" * len(FRAMEWORK_WAYS)),
        ]
    )


# The targets for part 5 against SDPA cuDNN, by do_bench: (mode, shortest N it applies to, longest,
# the ratio of speeds to reach). A shape's verdict is the median of the runs in bench_runs.csv.
TARGETS = [
    ("fwd", 4096, None, 1.0),
    ("bwd", 4096, None, 1.0),
    ("fwd+bwd", 4096, None, 1.0),
    ("fwd+bwd", 1024, 2048, 0.85),
]
TARGETS_COMMAND = (
    "python -m common.bench --part 5 --sdpa cudnn --mode fwd --mode fwd+bwd --mode bwd "
    "--n 1024 --n 2048 --n 4096 --n 8192 --n 16384 --repeat 3"
)


def target_of(mode, n):
    """The speed ratio to cuDNN part 5 aims at for this mode and N (TARGETS), or None."""
    for m, low, high, ratio in TARGETS:
        if m == mode and n >= low and (high is None or n <= high):
            return ratio
    return None


def met(mode, n, ratios):
    """Whether the median of the runs' ratios (to two places) reaches the target; None without one."""
    target = target_of(mode, n)
    return None if target is None else round(statistics.median(ratios), 2) >= target


def _targets_text():
    """TARGETS in words: "fwd 1.0x from N = 4096; ...; fwd+bwd 0.85x at N = 1024-2048"."""
    return "; ".join(
        f"{mode} {ratio}x " + (f"from N = {low}" if high is None else f"at N = {low}-{high}")
        for mode, low, high, ratio in TARGETS
    )


def run_ratios(rows, column="ms"):
    """{(mode, D, causal, N): [cuDNN's time / part 5's, one per run]} from bench_runs.csv's rows:
    each run's part 5 row against the cuDNN row of the same run (run and run_id), never one another
    invocation of the benchmark left (a ratio above 1: part 5 is faster)."""
    index = {(r["run"], r["run_id"], r["impl"], r["mode"], r["D"], r["causal"], r["N"]): r[column] for r in rows}
    out = {}
    for (run, run_id, impl, *shape), ms in sorted(index.items(), key=lambda kv: (kv[0][0], *kv[0][3:])):
        sdpa = index.get((run, run_id, "sdpa_cudnn", *shape))
        if impl == "part5" and ms and sdpa:
            out.setdefault(tuple(shape), []).append(sdpa / ms)
    return out


def table_targets(gpu_dir):
    """Part 5 over SDPA cuDNN, the median of the runs of bench_runs.csv (with their range), by do_bench
    and by CUDA-graph replay; each target met or missed by the median."""
    rows = [r for r in read_csv(gpu_dir / "bench_runs.csv") if r["impl"] in ("part5", "sdpa_cudnn")]
    runs = max(map(len, run_ratios(rows).values()), default=0)  # runs with both rows, at the most
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if any(r["mode"] == m for r in rows)]
    seq_lens = sorted({r["N"] for r in rows})
    out = [provenance_line(rows, f"{TARGETS_COMMAND} && make report"), ""]
    for column, how in (("ms", "do_bench"), ("graph_ms", "CUDA-graph replay")):
        ratios = run_ratios(rows, column)
        body = []
        for mode in modes:
            for d, c in PANELS:
                cells = []
                for n in seq_lens:
                    xs = ratios.get((mode, d, c, n))
                    if not xs:
                        cells.append("—")
                        continue
                    cell = f"{statistics.median(xs):.2f}" + (f" ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else "")
                    cells.append(f"**{cell}**" if column == "ms" and met(mode, n, xs) is False else cell)
                if any(x != "—" for x in cells):
                    body.append([mode, d, yes_no(c), *cells])
        caption = (
            f"Part 5's speed over SDPA cuDNN's by {how}, the median of {runs} runs (the lowest and highest run in "
            "brackets), B=4, H=8, bf16; each run's part 5 against the same run's cuDNN"
        )
        caption += (
            f". In bold, a median under its target ({_targets_text()}):"
            if column == "ms"
            else ". No targets here: the GPU's time alone, without the host's:"
        )
        align = "llr" + "r" * len(seq_lens)
        out += [caption, "", markdown_table(["mode", "D", "causal", *(f"N = {n}" for n in seq_lens)], body, align), ""]
    verdicts = [met(mode, n, xs) for (mode, _, _, n), xs in run_ratios(rows).items()]
    verdicts = [v for v in verdicts if v is not None]
    out.append(f"Targets met by the median: {sum(verdicts)} of {len(verdicts)} shapes.")
    return "\n".join(out)


def table_fa4(gpu_dir):
    """FlashAttention-4 (`--fa4`), SDPA cuDNN and part 5 in TFLOP/s from bench.csv, each shape's three rows
    from the same invocation of the benchmark (run_id), with FA4 over cuDNN and part 5 over FA4."""
    rows = [r for r in read_csv(gpu_dir / "bench.csv") if r["impl"] in ("fa4", "sdpa_cudnn", "part5")]
    index = {(r["run_id"], r["impl"], r["mode"], r["D"], r["causal"], r["N"]): r for r in rows}
    body, used = [], []
    modes = ("fwd", "bwd", "fwd+bwd")
    fa4_rows = [r for r in rows if r["impl"] == "fa4" and r["mode"] in modes]
    for r in sorted(fa4_rows, key=lambda r: (modes.index(r["mode"]), r["D"], r["causal"], r["N"])):
        key = (r["run_id"], r["mode"], r["D"], r["causal"], r["N"])
        three = [index.get((key[0], impl, *key[1:])) for impl in ("fa4", "sdpa_cudnn", "part5")]
        if not all(x and x["tflops"] for x in three):
            continue
        used += three
        fa4, cudnn, ours = (x["tflops"] for x in three)
        ratios = (f"{fa4 / cudnn:.2f}x", f"{ours / fa4:.2f}x")
        body.append(
            [r["mode"], r["D"], yes_no(r["causal"]), r["N"], f"{fa4:.0f}", f"{cudnn:.0f}", f"{ours:.0f}", *ratios]
        )
    if not body:
        return (
            "No FlashAttention-4 rows in bench.csv: `python -m common.bench --fa4 ...` where flash-attn-4 is installed."
        )
    return "\n".join(
        [
            provenance_line(used, "python -m common.bench --fa4 ... && make report"),
            "",
            "B=4, H=8, bf16, TFLOP/s by `do_bench`, each shape's three rows from one invocation of the benchmark:",
            "",
            markdown_table(
                ["mode", "D", "causal", "N", "FA4", "SDPA cuDNN", "part 5", "FA4 / cuDNN", "part 5 / FA4"],
                body,
                "llrr" + "r" * 5,
            ),
        ]
    )


def table_last_round(gpu_dir):
    """The Gluon forward's persistent grid at D = 64 without a mask: query tiles, rounds of one tile per SM,
    how full the last round is and how much of the grid's tile slots hold real rows, beside the study's
    times of two and three warpgroups (part5_gluon.csv)."""
    from part5_profiling import gluon_attention

    sms = sweep_report.device(gpu_dir, "part2")["multi_processor_count"]  # the limits part 2's sweep read off
    rows = [
        r
        for r in read_csv(gpu_dir / "part5_gluon.csv")
        if r["D"] == 64 and r["causal"] == 0 and r["variant"].endswith("warpgroups, persistent")
    ]
    body = []
    for r in sorted(rows, key=lambda r: (r["N"], r["variant"])):
        warpgroups = int(r["variant"].split()[0])
        block_m = warpgroups * gluon_attention.ROWS
        tiles = -(-r["N"] // block_m) * r["B"] * r["H"]
        rounds = -(-tiles // sms)
        last = tiles - (rounds - 1) * sms
        useful = r["N"] * r["B"] * r["H"] / (rounds * sms * block_m)
        body.append(
            [
                r["N"],
                warpgroups,
                block_m,
                tiles,
                f"{tiles / sms:.2f}",
                f"{last} of {sms}",
                f"{useful:.0%}",
                f"{r['graph_ms']:.4f}",
                f"{r['vs_cudnn']:.2f}x",
            ]
        )
    header = [
        "N",
        "warpgroups",
        "rows per tile",
        "query tiles",
        "tiles per SM",
        "last round",
        "rows in slots",
        "ms (graph)",
        "vs cuDNN",
    ]
    return "\n".join(
        [
            provenance_line(rows, "python -m part5_profiling.tools.gluon_study && make report"),
            "",
            f'D = 64, no mask, B=4, H=8, bf16, {sms} SMs: each program takes a query tile per round. "Rows in '
            "slots\": the real query rows over the rows the grid's rounds could hold (rounds x SMs x rows per "
            "tile), the share of the tile slots doing useful work:",
            "",
            markdown_table(header, body, "rrrrrrrrr"),
        ]
    )


def table_stages(gpu_dir):
    rows = read_csv(gpu_dir / "part5_stages.csv")
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    index = {(r["variant"], r["D"], r["causal"]): r for r in rows}
    body = []
    for d, c in PANELS:
        cells = [index.get((v, d, c)) for v in variants]
        if any(cells):
            body.append([d, yes_no(c), *(_stage_cell(r) for r in cells)])
    return "\n".join(
        [
            provenance_line(rows, "python -m part5_profiling.tools.stages && make report"),
            "",
            f"Part 4's forward, N={rows[0]['N']}, B=4, H=8, bf16: microseconds (CUDA-graph replay), and in "
            "brackets the difference from the original:",
            "",
            markdown_table(["D", "causal", *variants], body, "ll" + "r" * len(variants)),
        ]
    )


def _stage_cell(row):
    if row is None:
        return "—"
    if row["graph_ms"] is None:
        return row["check"].split(":")[0]  # "error": the CSV says why
    delta = "" if row["delta_us"] is None else f" ({row['delta_us']:+.0f})"
    return f"{row['graph_ms'] * 1e3:.0f}{delta}"


def table_candidates(gpu_dir):
    return _candidates_table(
        read_csv(gpu_dir / "part5_candidates.csv"),
        "python -m part5_profiling.tools.candidates",
        "Forward TFLOP/s (CUDA-graph replay), B=4, H=8, bf16, and the speed-up over part 4's kernel:",
    )


def table_bwd_candidates(gpu_dir):
    rows = read_csv(gpu_dir / "part5_bwd_candidates.csv")
    repeatable = {r["candidate"]: r["repeatable"] for r in rows if r["repeatable"] is not None}
    caption = (
        "Backward alone (flash_backward from the forward's O and L), TFLOP/s (CUDA-graph replay; the backward "
        "counts 2.5 times the forward's FLOPs), B=4, H=8, bf16, and the speed-up over part 4's backward. dQ bit for "
        "bit the same in two calls: "
        + ", ".join(f"{name} {'yes' if r else 'no'}" for name, r in repeatable.items())
        + ":"
    )
    return _candidates_table(rows, "python -m part5_profiling.tools.candidates --backward", caption)


def table_gluon(gpu_dir):
    rows = [dict(r, candidate=r["variant"], speedup=r["vs_cudnn"]) for r in read_csv(gpu_dir / "part5_gluon.csv")]
    caption = (
        "Forward TFLOP/s (CUDA-graph replay), B=4, H=8, bf16: part 4's tl kernel, the Gluon kernel's variants "
        "(warpgroups free, or taking turns, ping-pong: `--pingpong`) and SDPA's cuDNN backend, each with its "
        "fraction of cuDNN's speed in the same run; part 5 runs 3 warpgroups with ping-pong at D = 64 and 2 "
        "without at D = 128:"
    )
    command = "python -m part5_profiling.tools.gluon_study && python -m part5_profiling.tools.gluon_study --pingpong"
    return _candidates_table(rows, command, caption)


def table_gluon_order(gpu_dir):
    from part5_profiling import gluon_attention
    from part5_profiling.tools.gluon_study import ORDERS

    rows = read_csv(gpu_dir / "part5_gluon_order.csv")
    rows = [dict(r, candidate=r["variant"], speedup=r["vs_cudnn"]) for r in rows]
    caption = (
        "Forward TFLOP/s (CUDA-graph replay) with the causal mask, B=4, H=8, bf16: part 5's configuration with "
        "its programs taking the longest query tiles first, that many sequences side by side, and SDPA's cuDNN "
        "backend from one run, each with its fraction of cuDNN's speed. Part 5 takes one sequence at a time at "
        f"D = 128 from N = {gluon_attention.SEQUENCE_MAJOR_FROM}, every sequence side by side otherwise:"
    )
    first = list(ORDERS)
    return _candidates_table(rows, "python -m part5_profiling.tools.gluon_study --order", caption, first)


def table_gluon_bwd(gpu_dir):
    from part5_profiling.tools.gluon_study import BWD_CANDIDATES

    rows = read_csv(gpu_dir / "part5_gluon_bwd.csv")
    earlier = {r["candidate"] for r in rows} - set(BWD_CANDIDATES)  # the study no longer times these
    gone = sorted({r["commit"] for r in rows if r["candidate"] in earlier})
    rows = [dict(r, candidate=r["candidate"] + " †") if r["candidate"] in earlier else r for r in rows]
    caption = (
        "Backward alone (from the forward's O and L), TFLOP/s (CUDA-graph replay; the backward counts 2.5 times "
        "the forward's FLOPs), B=4, H=8, bf16, and the speed-up over part 4's backward. The ablations compute "
        'something else on purpose: they say what dQ\'s product and its TMA add cost. "Gluon, one pass" is '
        "part 5's kernel with its programs in part 5's order (sequence-major without a mask; causal, sequence-minor "
        "below N = 8192 and grouped from there); the order columns are the same kernel in the orders part 5 "
        'does not take for that call. "Gluon, addresses hoisted" is the kernel with the shared-memory addresses '
        "of K, V and dS^T left where the compiler hoists them, out of the loop (ADDRESSES_IN_LOOP=False), "
        'and "Gluon, row-order dQ" the kernel before its float32 dQ was kept in fragment order, "Gluon, two dQ '
        'adds at D = 64" the kernel before its warpgroups took turns making dQ at D = 64'
    )
    unmeasured = sorted({r["D"] for r in rows} - {r["D"] for r in rows if r["candidate"] == "Gluon, one pass"})
    if unmeasured:
        caption += (
            f". At D = {', '.join(str(d) for d in unmeasured)} part 5's kernel has changed since the study last ran "
            "there: its columns are the earlier kernel's, and the benchmark times the current one"
        )
    if gone:
        caption += (
            f". †: measured at commit {', '.join(gone)}, by an earlier kernel or with a switch since removed from "
            "`gluon_backward.py`; the command below rewrites the other columns only"
        )
    caption += ":"
    first = [name for name in BWD_CANDIDATES if name != "SDPA cuDNN"]
    return _candidates_table(rows, "python -m part5_profiling.tools.gluon_study --backward", caption, first)


def _candidates_table(rows, command, caption, first=("part 4",)):
    """One column per candidate: those in `first` in that order, then the rest as they come."""
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    names = [n for n in first if n in names] + [n for n in names if n not in first]
    index = {(r["candidate"], r["D"], r["causal"], r["N"]): r for r in rows}
    body = []
    for d, c in PANELS:
        for n in sorted({r["N"] for r in rows}):
            cells = [index.get((name, d, c, n)) for name in names]
            if any(cells):
                body.append([d, yes_no(c), n, *(_candidate_cell(r) for r in cells)])
    return "\n".join(
        [
            provenance_line(rows, f"{command} && make report"),
            "",
            caption,
            "",
            markdown_table(["D", "causal", "N", *names], body, "llr" + "r" * len(names)),
        ]
    )


def table_compiled(gpu_dir):
    rows = read_csv(gpu_dir / "part5_compiled.csv")
    names = sorted(dict.fromkeys(r["candidate"] for r in rows), key=lambda name: name != "part 4")
    body = []
    for name in names:
        for d in sorted({r["D"] for r in rows}):
            group = [r for r in rows if r["candidate"] == name and r["D"] == d]
            ok = [r for r in group if r["status"] == "ok"]
            if not group:
                continue
            warps = ", ".join(str(w) for w in sorted({r["warps_launched"] for r in ok})) or "—"
            body.append(
                [
                    name,
                    d,
                    f"{len(ok)} of {len(group)}",
                    sum(r["warp_specialized"] for r in ok),
                    warps,
                    _span([r["registers"] for r in ok]),
                    _span([r["stack_bytes"] for r in ok]),
                ]
            )
    return "\n".join(
        [
            provenance_line(rows, "TRITON_INTERPRET=0 python -m part5_profiling.tools.compiled && make report"),
            "",
            f"The forward of each candidate compiled for {rows[0]['arch']} at every configuration its autotuner "
            "could pick (causal and not), read off the binary:",
            "",
            markdown_table(
                [
                    "candidate",
                    "D",
                    "compiled",
                    "warp-specialized",
                    "warps launched",
                    "registers / thread",
                    "stack bytes / thread",
                ],
                body,
                "lrrrrrr",
            ),
        ]
    )


def table_compiled_bwd(gpu_dir):
    from part5_profiling.tools.compiled import ADDRESSES

    rows = read_csv(gpu_dir / "part5_compiled_bwd.csv")
    index = {(r["D"], r["causal"], r["addresses"]): r for r in rows}
    body = []
    for d, c in PANELS:
        cells = [index.get((d, c, name)) for name in ADDRESSES]  # in the loop, hoisted
        if any(cells):
            stack = [r["stack_bytes"] if r and r["status"] == "ok" else "—" for r in cells]
            registers = _span([r["registers"] for r in cells if r and r["status"] == "ok"])
            body.append([d, yes_no(c), registers, *stack])
    command = "TRITON_INTERPRET=0 python -m part5_profiling.tools.compiled --backward && make report"
    return "\n".join(
        [
            provenance_line(rows, command),
            "",
            f"Part 5's Gluon backward compiled for {rows[0]['arch']}, read off the binary: registers per thread "
            "(what the launch asks for; each warpgroup then takes its share with setmaxnreg) and the stack its "
            "spills take, with K's, V's and dS^T's shared-memory addresses worked out in the loop (part 5's) "
            "and hoisted out of it (what the compiler does by itself):",
            "",
            markdown_table(
                ["D", "causal", "registers / thread", "stack bytes, in the loop", "stack bytes, hoisted"],
                body,
                "llrrr",
            ),
        ]
    )


def _span(values):
    if not values:
        return "—"
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def _candidate_cell(row):
    if row is None:
        return "—"
    if row["graph_tflops"] is None and row["check"].startswith("FAIL"):  # computed a wrong answer: not timed
        return "wrong " + ", ".join(re.findall(r"(\w+) \S+ FAIL", row["check"]))  # the outputs that failed
    if row["graph_tflops"] is None:
        return row["check"].split(":")[0]  # "error": the CSV says why
    return f"{row['graph_tflops']:.0f}" + (f" ({row['speedup']:.2f}x)" if row["speedup"] is not None else "")


def _train_rows(gpu_dir):
    """train_step.csv's rows in the table's order: N, eager before compiled, SDPA's rows, then the parts."""
    from part5_profiling.tools import train_step

    order = [train_step.REFERENCE, "sdpa_flash", train_step.HF_MASK]
    rank = lambda impl: (order.index(impl), 0) if impl in order else (len(order), int(impl.removeprefix("part")))  # noqa: E731
    rows = read_csv(gpu_dir / "train_step.csv")
    modes = list(train_step.MODES)
    return sorted(rows, key=lambda r: (r["N"], modes.index(r["mode"]), rank(r["impl"]))), train_step


def table_train_step(gpu_dir):
    """Per N, mode and implementation: step time, its ratio to SDPA default's, peak memory, the loss difference."""
    rows, train_step = _train_rows(gpu_dir)
    first = rows[0]

    def cell(value, form):
        return "—" if value is None else form.format(value)

    body = [
        [
            r["N"],
            r["mode"],
            train_step.label(r["impl"]),
            r["attention"] or "—",
            cell(r["step_ms"], "{:.1f}"),
            cell(r["vs_sdpa"], "{:.2f}x"),
            cell(r["peak_mib"], "{:,.0f}"),
            cell(r["loss_diff"], "{:.4f}"),
            str(r["check"]).split(":")[0],
        ]
        for r in rows
    ]
    return "\n".join(
        [
            provenance_line(rows, "python -m part5_profiling.tools.train_step && make report"),
            "",
            f"A training step (forward, backward, AdamW) of a {first['layers']}-layer Llama: hidden {first['hidden']}, "
            f"{first['heads']} heads of D = {first['D']} sharing {first['kv_heads']} key/value heads, vocabulary "
            f"{first['vocab']:,}, {first['dtype']}, B={first['B']}, causal. Step time: the median of "
            f"{first['steps'] - first['warmup']} steps after {first['warmup']} of warm-up (CUDA events); peak memory "
            "over those steps; SDPA default's step time over this one's (above 1: faster); the largest loss "
            f"difference from SDPA default's in the first {train_step.COMPARED} steps (same mode):",
            "",
            markdown_table(
                ["N", "mode", "attention", "ran", "step ms", "x SDPA default", "peak MiB", "loss diff", "check"],
                body,
                "rllrrrrrl",
            ),
        ]
    )


def table_train_summary(gpu_dir):
    """The training step in one small table: per N and mode, SDPA default's step time and each part's,
    the last part's speed against SDPA default's, and its largest loss difference."""
    rows, train_step = _train_rows(gpu_dir)
    parts_ = sorted(
        {r["impl"] for r in rows if r["impl"].startswith("part")}, key=lambda i: int(i.removeprefix("part"))
    )
    last = parts_[-1]
    groups = list(dict.fromkeys((r["N"], r["mode"]) for r in rows))

    def row(n, mode, impl):
        found = [r for r in rows if (r["N"], r["mode"], r["impl"]) == (n, mode, impl)]
        return found[0] if found else {}

    def ms(r):
        return "—" if r.get("step_ms") is None else f"{r['step_ms']:.1f}"

    body = []
    for n, mode in groups:
        mine = row(n, mode, last)
        body.append(
            [
                n,
                mode,
                ms(row(n, mode, train_step.REFERENCE)),
                *(ms(row(n, mode, impl)) for impl in parts_),
                "—" if mine.get("vs_sdpa") is None else f"{mine['vs_sdpa']:.2f}x",
                "—" if mine.get("loss_diff") is None else f"{mine['loss_diff']:.4f}",
            ]
        )
    first = rows[0]
    names = [train_step.label(i) for i in parts_]
    ran = sorted({r["attention"] for r in rows if r["impl"] == train_step.REFERENCE and r["attention"]})
    return "\n".join(
        [
            provenance_line(rows, "make train-bench && make report"),
            "",
            f"Milliseconds per training step of a {first['layers']}-layer Llama (hidden {first['hidden']}, "
            f"{first['heads']} heads of D = {first['D']}, {first['dtype']}, B={first['B']}, causal; the median of "
            f"{first['steps'] - first['warmup']} steps), with SDPA's default backend ({', '.join(ran) or 'as it picks'} here) and with each part; "
            f"{names[-1]}'s speed against SDPA's (above 1: faster) and its largest loss difference from SDPA's in "
            f"the first {train_step.COMPARED} steps:",
            "",
            markdown_table(
                ["N", "mode", "SDPA", *names, f"{names[-1]} / SDPA", "loss diff"],
                body,
                "rl" + "r" * (len(names) + 3),
            ),
        ]
    )


def train_loss_figure(rows, train_step):
    """Top: the loss at every step, one line per implementation and mode (eager solid, compiled
    dashed), a panel per N. Bottom: each loss minus SDPA default's (same mode), with the steps the
    check compares shaded."""
    from matplotlib.figure import Figure

    ns = sorted({r["N"] for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig = Figure(figsize=(6.5 * len(ns), 8))
    axes = fig.subplots(2, len(ns), squeeze=False, sharex=True)
    for col, n in enumerate(ns):
        top, bottom = axes[0][col], axes[1][col]
        for mode, style in (("eager", "-"), ("compiled", "--")):
            mine = {
                r["impl"]: [float(x) for x in str(r["losses"]).split()]
                for r in rows
                if r["N"] == n and r["mode"] == mode and r["losses"]
            }
            reference = mine.get(train_step.REFERENCE)
            for impl, losses in mine.items():
                color = f"C{impls.index(impl) % 10}"
                top.plot(range(len(losses)), losses, style, color=color, label=f"{train_step.label(impl)}, {mode}")
                if reference is not None:
                    diff = [a - b for a, b in zip(losses, reference)]
                    bottom.plot(range(len(diff)), diff, style, color=color)
        bottom.axvspan(
            0, train_step.COMPARED - 1, color="gray", alpha=0.1, label=f"compared (first {train_step.COMPARED})"
        )
        bottom.axhline(0, color="gray", lw=0.8)
        top.set_title(f"N = {n}")
        top.set_ylabel("loss")
        bottom.set_ylabel("loss - SDPA default's loss")
        bottom.set_xlabel("step")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend(fontsize=7)
        bottom.legend(fontsize=7)
    r = rows[0]
    fig.suptitle(
        f"Training a {r['layers']}-layer Llama (hidden {r['hidden']}, D = {r['D']}, {r['dtype']}, B={r['B']}) — {r['gpu']}"
    )
    fig.tight_layout()
    return fig


def draw_train_loss(gpu_dir):
    """part5_train_loss.png from train_step.csv, if it exists; returns the path, or None."""
    if not (gpu_dir / "train_step.csv").exists():
        return None
    rows, train_step = _train_rows(gpu_dir)
    path = gpu_dir / "part5_train_loss.png"
    train_loss_figure(rows, train_step).savefig(path, dpi=110)
    return path


# ------------------------------------------------------------------------------------ the ladder
LADDER_COMMAND = "python -m part5_profiling.tools.ladder"
LADDER_SHAPES = [(64, 0), (128, 1)]  # the two the lesson's table shows; the log shows all four
BASELINES = {"fwd": ("part4", "sdpa_cudnn"), "bwd": ("part4", "sdpa_cudnn")}


def _ladder_rows(gpu_dir):
    rows = read_csv(gpu_dir / "part5_ladder.csv")
    return rows, {(r["step"], r["mode"], r["D"], r["causal"]): r for r in rows if r["mode"]}


def _ladder_steps(rows, ladder):
    return [r["step"] for r in rows if str(r["step"]).startswith(ladder) and r["step"][len(ladder) :].isdigit()]


def _ladder_cell(row):
    """TFLOP/s (x cuDNN) of a ladder row, or why it has none."""
    if row is None or not row.get("graph_tflops"):
        return "-" if row is None else (row.get("check") or "-").split(":")[0]
    share = f" ({row['vs_cudnn']:.2f})" if row.get("vs_cudnn") else ""
    return f"{row['graph_tflops']:.0f}{share}"


def _part4_counters(gpu_dir):
    """{(pass, D, causal): (tensor pipe %, top stall)} of part 4's main kernels (part5_profile.csv)."""
    kernels = {"fwd": "_attn_fwd", "bwd": "_attn_bwd_dkdv"}
    found = {}
    for r in read_csv(gpu_dir / "part5_profile.csv"):
        if r["target"] == "part4" and r["method"] == "ncu" and r["kernel"] == kernels.get(r["pass"]):
            key = (r["pass"], r["D"], r["causal"])
            pipe, stall = found.get(key, (None, None))
            if r["metric"] == "tensor pipe (mma) active, %":
                pipe = r["value"]
            elif str(r["metric"]).startswith("stall #1: "):
                stall = f"{r['metric'].removeprefix('stall #1: ')} {r['value']:.1f}"
            found[key] = (pipe, stall)
    return found


def table_ladder(gpu_dir):
    """The lesson's progression: each step's pass at two shapes with its share of cuDNN's speed and
    the tensor pipe's active share, and the top stall; the forward's steps time the forward, the
    backward's the backward alone. Part 4's counters come from the profile of every part."""
    rows, index = _ladder_rows(gpu_dir)
    part4 = _part4_counters(gpu_dir)
    names = {"part4": "part 4's `tl` kernels", "sdpa_cudnn": "SDPA cuDNN"}
    body = []
    for ladder in ("fwd", "bwd"):
        for step in ["part4", *dict.fromkeys(_ladder_steps(rows, ladder)), "sdpa_cudnn"]:
            label = names.get(step) or next(r["label"] for r in rows if r["step"] == step)
            line = [f"`{step}`" if step not in names else "", label, ladder]
            for d, c in LADDER_SHAPES:
                row = index.get((step, ladder, d, c)) or {}
                pipe = part4.get((ladder, d, c), (None, None))[0] if step == "part4" else row.get("tensor_pipe_pct")
                line += [_ladder_cell(index.get((step, ladder, d, c))), "-" if pipe is None else f"{pipe:.0f}%"]
            row = index.get((step, ladder, 128, 1)) or {}
            stall = f"{row['stall_1']} {row['stall_1_value']:.1f}" if row.get("stall_1") else "-"
            body.append([*line, part4.get((ladder, 128, 1), (None, "-"))[1] if step == "part4" else stall])
    head = ["step", "what it adds", "pass"]
    for d, c in LADDER_SHAPES:
        head += [f"D = {d}{' causal' if c else ''}", "tensor pipe"]
    return "\n".join(
        [
            provenance_line(rows, f"{LADDER_COMMAND} && make report"),
            "",
            "N = 4096, B=4, H=8, bf16, CUDA-graph replay, each step checked on the timed inputs first: TFLOP/s of "
            "the step's pass (the backward alone counts 2.5 times the forward's FLOPs) and, in brackets, its speed "
            "over SDPA cuDNN's; the tensor pipe's active share and the top stall at D = 128 causal (warps stalled per "
            "instruction issued), from ncu; part 4's counters from the profile of every part:",
            "",
            markdown_table([*head, "top stall"], body, "lll" + "rr" * len(LADDER_SHAPES) + "l"),
        ]
    )


def step_line(name):
    """The README's line under step `name`: its pass's TFLOP/s at the two shapes with the change on
    the step before (part 4 before the first), the tensor pipe at each, the top stall at the second."""
    ladder = name.rstrip("0123456789")

    def line(gpu_dir):
        rows, index = _ladder_rows(gpu_dir)
        order = ["part4", *dict.fromkeys(_ladder_steps(rows, ladder))]
        before = order[order.index(name) - 1].replace("part4", "part 4")
        found = [
            (index.get((name, ladder, d, c)), index.get((order[order.index(name) - 1], ladder, d, c)))
            for d, c in LADDER_SHAPES
        ]
        if not all(row and row.get("graph_tflops") for row, _ in found):
            return f"_{name}: not measured._"
        cells = []
        for (d, c), (row, prev) in zip(LADDER_SHAPES, found):
            change = row["graph_tflops"] / prev["graph_tflops"] - 1
            change = "±0%" if abs(change) < 0.005 else f"{change:+.0%}"
            cells.append(f"{row['graph_tflops']:.0f} TFLOP/s at D = {d}{' causal' if c else ''} ({change})")
        pipes = " / ".join(f"{row['tensor_pipe_pct']:.0f}%" for row, _ in found)
        row = found[-1][0]
        return f"_Measured: {', '.join(cells)} on {before}; tensor pipe {pipes}; top stall {row['stall_1']} {row['stall_1_value']:.1f}._"

    return line


def table_ladder_all(gpu_dir):
    """The log's table: every step at every shape and mode, the shipped kernels of earlier commits too."""
    rows, index = _ladder_rows(gpu_dir)
    body = []
    for step in dict.fromkeys(r["step"] for r in rows):
        label = next(r["label"] for r in rows if r["step"] == step)
        for mode in ("fwd", "bwd", "fwd+bwd"):
            cells = [index.get((step, mode, d, c)) for d, c in PANELS]
            if any(cells):
                body.append([step, label, mode, *(_ladder_cell(x) for x in cells)])
        failed = [r for r in rows if r["step"] == step and not r["mode"]]
        body += [[step, label, "", r["check"][:80], "", "", ""] for r in failed]
    head = ["step", "what", "mode", *(f"D = {d}{' causal' if c else ''}" for d, c in PANELS)]
    return "\n".join(
        [
            provenance_line(rows, f"{LADDER_COMMAND} && make report"),
            "",
            "N = 4096, B=4, H=8, bf16: TFLOP/s by CUDA-graph replay and, in brackets, the speed over SDPA cuDNN's in "
            "the same mode; a backward step's fwd+bwd is part 5's forward followed by it. `fwd_before` and "
            "`bwd_before` are the shipped kernels of the commit before the ladder (the kernels regrouped into its "
            "steps), timed in the same run:",
            "",
            markdown_table(head, body, "lll" + "r" * len(PANELS)),
        ]
    )


def table_ladder_compiled(gpu_dir):
    rows = read_csv(gpu_dir / "part5_ladder_compiled.csv")
    fields = ["partitions", "warps", "smem", "registers", "stack", "wgmma", "wgmma_waits", "barrier_waits"]
    body = [[r["step"], r["D"], yes_no(r["causal"] == "True"), *(r[f] for f in fields)] for r in rows]
    head = ["step", "D", "causal", "warp_specialize", "warps", "shared memory", "registers", "stack bytes"]
    head += ["wgmma", "wgmma waits (leaving n: count)", "mbarrier waits"]
    return "\n".join(
        [
            provenance_line(rows, "TRITON_INTERPRET=0 python -m part5_profiling.tools.ladder --compile --save"),
            "",
            "Each step's main kernel compiled for sm_90 (the H200's architecture) with Triton's compiler and ptxas "
            "on a CPU, read off the binary: registers per thread at launch (setmaxnreg then moves them between "
            "partitions), stack bytes (spills), "
            "the products, and the waits on products and barriers in the PTX:",
            "",
            markdown_table(head, body, "lll" + "r" * 8),
        ]
    )


def ladder_figure(rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = {(r["step"], r["mode"], r["D"], r["causal"]): r for r in rows if r["mode"]}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (ladder, mode, title) in zip(axes, (("fwd", "fwd", "forward"), ("bwd", "bwd", "backward alone"))):
        order = ["part4", *dict.fromkeys(_ladder_steps(rows, ladder))]
        for i, (d, c) in enumerate(PANELS):
            ys = [(index.get((s, mode, d, c)) or {}).get("graph_tflops") for s in order]
            color = f"C{i}"
            ax.plot(range(len(order)), ys, "o-", color=color, label=f"D = {d}{' causal' if c else ''}")
            cudnn = (index.get(("sdpa_cudnn", mode, d, c)) or {}).get("graph_tflops")
            if cudnn:
                ax.axhline(cudnn, color=color, linestyle=":", linewidth=1)
        ax.set_xticks(range(len(order)), ["part 4", *order[1:]])
        ax.set_title(f"{title}: each step, N = 4096 (dotted: SDPA cuDNN)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (CUDA-graph replay)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_ladder(gpu_dir):
    if not (gpu_dir / "part5_ladder.csv").exists():
        return None
    path = gpu_dir / "part5_ladder.png"
    ladder_figure(read_csv(gpu_dir / "part5_ladder.csv")).savefig(path, dpi=110)
    return path


def draw(gpu_dir):
    drawn = (roofline.draw(gpu_dir), draw_train_loss(gpu_dir), draw_ladder(gpu_dir))
    return [path for path in drawn if path is not None]


STEP_NAMES = [f"fwd{i}" for i in range(1, 8)] + [f"bwd{i}" for i in range(1, 7)]
TABLES = {
    **{f"part5-step-{name}": step_line(name) for name in STEP_NAMES},
    "part5-ladder": table_ladder,
    "part5-ladder-all": table_ladder_all,
    "part5-ladder-compiled": table_ladder_compiled,
    "part5-ceilings": table_ceilings,
    "part5-profile": table_profile,
    "part5-launch-cost": table_launch_cost,
    "part5-stages": table_stages,
    "part5-candidates": table_candidates,
    "part5-bwd-candidates": table_bwd_candidates,
    "part5-compiled": table_compiled,
    "part5-compiled-bwd": table_compiled_bwd,
    "part5-framework": table_framework,
    "part5-host-check": table_host_check,
    "part5-host-parts": table_host_parts,
    "part5-gluon": table_gluon,
    "part5-last-round": table_last_round,
    "part5-fa4": table_fa4,
    "part5-targets": table_targets,
    "part5-gluon-bwd": table_gluon_bwd,
    "part5-gluon-order": table_gluon_order,
    "part5-train-step": table_train_step,
    "part5-train-summary": table_train_summary,
}

LOG = [  # (heading, what it measured, table): results/<gpu>/part5_log.md, in this order (common/report.py)
    (
        "The ladder",
        "Every step of the Gluon forward and backward (steps/), checked and then timed at N = 4096 in every mode, "
        "beside part 4, SDPA cuDNN and the shipped kernels of the commit before the ladder.",
        "part5-ladder-all",
    ),
    (
        "The ladder compiled",
        "Every step compiled for the H200 on any machine: what each step adds, as the binary shows it.",
        "part5-ladder-compiled",
    ),
    (
        "Targets",
        "Part 5 against SDPA cuDNN in several whole runs of the benchmark, one after another: the median of the "
        "runs' ratios, which decides each target (a single run on this GPU moves by a few percent).",
        "part5-targets",
    ),
    (
        "FlashAttention-4",
        "The best kernels' distance: FlashAttention-4's Hopper path (the flash-attn-4 package, CuTe DSL; the "
        "FlashAttention-3 design) timed in the benchmark beside SDPA cuDNN and part 5.",
        "part5-fa4",
    ),
    (
        "Ceilings",
        "What the GPU reaches at all, measured beside the datasheet's figures: bf16 matrix products of "
        "attention's shapes and a square one, and a device-to-device copy; the roofline's roofs.",
        "part5-ceilings",
    ),
    (
        "The profile of every part",
        "Each part's forward and backward at N = 4096: GPU time from CUPTI, registers and spills from the "
        "compiler, tensor-pipe activity and stalls from ncu where it could read the counters.",
        "part5-profile",
    ),
    (
        "Where the forward's time goes",
        "Part 4's forward with one stage of its inner loop done twice or left out, timed by CUDA-graph replay: "
        "the cost of each stage from the difference.",
        "part5-stages",
    ),
    (
        "Launch cost",
        "Microseconds per call on the GPU (graph replay), on the host (issuing the calls) and by `do_bench`, "
        "and where the host's time goes.",
        "part5-launch-cost",
    ),
    (
        "The host path before and after",
        "Part 5's host split (launch cost's last table) at the commit before a change to its host path and at "
        "the change, in interleaved fresh processes, beside SDPA cuDNN's in each.",
        "part5-host-check",
    ),
    (
        "Host parts",
        "Where a short forward + backward's host time goes: part 5 beside Functions that do a growing share of "
        "its work (its tensors, its launches), each paired with SDPA cuDNN round by round, and the single "
        "operations a call is made of.",
        "part5-host-parts",
    ),
    (
        "What the framework hides",
        "Forward + backward of part 5 and SDPA cuDNN, eager and inside torch.compile (with and without its CUDA "
        "graphs), by `do_bench`, beside the GPU's time alone (CUDA-graph replay): the host's cost per call, and "
        "whether the framework takes it off.",
        "part5-framework",
    ),
    (
        "What the compiler makes of the candidates",
        "Each candidate forward compiled for the H200 at every configuration its autotuner could pick, read off "
        "the binary: whether it compiled, warp specialisation, registers and stack.",
        "part5-compiled",
    ),
    (
        "Candidate forwards",
        "Candidate changes to part 4's forward, each checked and timed by CUDA-graph replay against part 4's kernel.",
        "part5-candidates",
    ),
    (
        "Candidate backwards",
        "Candidate changes to part 4's backward, each checked on dQ, dK and dV and timed against part 4's backward.",
        "part5-bwd-candidates",
    ),
    (
        "The Gluon forward",
        "The Gluon forward's variants, part 4's `tl` forward and SDPA cuDNN, each as a fraction of the speed of "
        "cuDNN's row of its own run (the study without and with `--pingpong` measure some variants alike: the "
        "later run's row stands).",
        "part5-gluon",
    ),
    (
        "The forward's causal order",
        "The Gluon forward with the mask, its programs taking the longest query tiles first with that many "
        "sequences side by side, timed from one run beside SDPA cuDNN.",
        "part5-gluon-order",
    ),
    (
        "The forward's last round",
        "The Gluon forward's persistent grid at D = 64 without a mask, where three warpgroups make 192-row tiles: "
        "how full the grid's last round is at each N, with the study's times of two and three warpgroups.",
        "part5-last-round",
    ),
    (
        "The Gluon backward",
        "The one-pass Gluon backward in each program order, its ablations and part 4's backward, checked and "
        "timed from one run.",
        "part5-gluon-bwd",
    ),
    (
        "The Gluon backward's spills",
        "Part 5's Gluon backward compiled for the H200 on any machine: registers, and the stack its spills "
        "take with its operand addresses in the loop and hoisted.",
        "part5-compiled-bwd",
    ),
    (
        "A training step",
        "A whole training step (forward, backward, AdamW) of a small Llama with each attention: step time "
        "against SDPA default's, peak memory, and how far the loss moves from SDPA's.",
        "part5-train-step",
    ),
]
