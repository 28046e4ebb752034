"""A small Llama (Hugging Face transformers) trained and run the way a user would, with SDPA and with
the Triton parts through common/hf.py: a training step in three modes, and decoding.

    python -m lab.train_step              # a GPU: results/<gpu>/train_step.csv
    python -m lab.train_step --n 1024 --mode eager --part 4

The model is built from a config in code, its weights random from one seed (nothing is downloaded):
4 layers, hidden 512, 8 query heads of D = 64 sharing 2 key/value heads, an MLP of intermediate size
1408 (LLaMA's 8/3 of the hidden size, rounded up to a multiple of 128), a vocabulary of 8192 (small,
so that the output layer and the loss, which grow with it, leave attention a visible share of the
step: about a third of its FLOPs at N = 4096), parameters in bf16, AdamW (lr 1e-3, fused) on the
mean next-token cross-entropy. Batch 8, N = 1024, 2048 and 4096, causal.

The data, the same for every implementation (one seed per N): each row is a segment of 256 tokens
drawn with Zipf-like frequencies (p proportional to 1/rank), repeated to fill N. The loss falls as
the model learns the frequencies, then further if it learns to copy from 256 positions back, which
is attention's work.

Implementations, each under common/hf.py's mask function (no mask for this causal model):
- sdpa_default: transformers' SDPA attention on the backend PyTorch picks (the ran column says
  which), with SDPA's grouped-query path (enable_gqa: K and V keep their 2 heads);
- sdpa_repeat: the same with K and V repeated to 8 heads first (transformers' repeat_kv), as it
  runs where SDPA's grouped-query path is not taken;
- part5 (by default the last part; --part for others): the part through common/hf.py
  (FlashAttention.apply eager; compiled, the torch.library op).

Modes: eager; compiled: torch.compile(model) (Inductor); cudagraphs: torch.compile(model,
mode="reduce-overhead"), Inductor's graph replayed as CUDA graphs. The optimizer step runs eagerly.

Timing is paired: for each N and mode every implementation's model is built and warmed up
(WARMUP = 5 steps, the compiled ones compile in their first), then STEPS - WARMUP rounds each time
one step of every implementation in turn, from the same weights and data. The host's pace moves
during a run (these steps are bound by the host below N = 4096), and it then moves for all alike.
step_ms: the median step, each timed by CUDA events around forward, backward and the optimizer step.
vs_sdpa: the median over rounds of SDPA default's step time over this one's, in the same round (above
1: faster). step_mib: the most memory a timed step allocated above what was allocated before it
(activations, gradients; the weights and the optimizer's state, resident, are not counted). losses:
all STEPS. loss_diff: the largest |loss - SDPA default's loss| over the first 15 steps. check: "ok"
if every loss is finite and loss_diff is within LOSS_TOLERANCE (below).
"""

import gc
import statistics
import sys
import types

import torch

from common import hf, parts
from lab import results, study
from lab.impls import impl_label

SEQ_LENS = (1024, 2048, 4096)
MODES = ("eager", "compiled", "cudagraphs")
B = 8
CONFIG = dict(
    num_hidden_layers=4,
    hidden_size=512,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=1408,
    vocab_size=8192,
    max_position_embeddings=4096,
)
SEED = 0
SEGMENT = 256
LR = 1e-3
STEPS, WARMUP, COMPARED = 30, 5, 15
# The implementations differ only in how attention rounds in bf16, and each step's update carries that
# on. Measured on the H200 (both N, eager and compiled): SDPA's flash backend at most 0.0002 from its
# default over the first 15 steps, parts 4 and 5 at most 0.0004. 0.005 nats (0.05% of the first loss,
# ln 8192 = 9.0) allows ten times that and nothing a different computation would give.
LOSS_TOLERANCE = 0.005
REFERENCE = "sdpa_default"
REPEATED = "sdpa_repeat"
FIELDS = ["impl", "mode", "B", "N", "layers", "hidden", "heads", "kv_heads", "D", "vocab", "dtype", "steps", "warmup",
          "step_ms", "step_mib", "vs_sdpa", "loss_diff", "attention", "check", "losses", *results.PROVENANCE]  # fmt: skip
KEY = ("impl", "mode", "N")


def label(impl):
    """How tables and plots name an implementation."""
    return "SDPA default, K/V repeated" if impl == REPEATED else impl_label(impl)


def batches(n, steps=STEPS, b=B, vocab=CONFIG["vocab_size"], seed=SEED):
    """(steps, b, n) token ids: each row a Zipf-like segment of SEGMENT tokens repeated to fill n."""
    g = torch.Generator().manual_seed(seed + n)
    frequency = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    segment = min(SEGMENT, n)
    tokens = torch.multinomial(frequency, steps * b * segment, replacement=True, generator=g)
    return tokens.view(steps, b, segment).repeat(1, 1, -(-n // segment))[..., :n].contiguous()


def sdpa_repeated(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention as it runs without SDPA's grouped-query path: K and V repeated
    to the query heads (its repeat_kv), then one scaled_dot_product_attention call."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = hf.repeat_kv(key, n_rep), hf.repeat_kv(value, n_rep)
    causal = (
        query.shape[2] > 1 and attention_mask is None and (is_causal if is_causal is not None else module.is_causal)
    )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal
    )
    return out.transpose(1, 2).contiguous(), None


def implementations(part_numbers):
    """{impl: the attention implementation's name in transformers}: SDPA default first (the reference)."""
    found = {REFERENCE: hf.register_sdpa(), REPEATED: hf.register_sdpa("sdpa_repeated", sdpa_repeated)}
    return found | {f"part{p}": hf.register(p) for p in part_numbers}


def step(runner, optimizer, ids):
    """One training step; returns the loss (a tensor on the GPU: reading it would wait for the step).
    The loss is cloned: a CUDA graph's output is overwritten by the graph's next replay."""
    loss = runner(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().clone()


def what_ran(impl, fn):
    """(fn(), what the implementation's attention ran): SDPA's backend read off the profiler, or what
    the part's last forward launched, as the benchmark names it."""
    if impl.startswith("part"):
        return fn(), parts.forward_config(parts.load(int(impl.removeprefix("part"))))
    from lab import impls

    out = []
    ran = impls.dispatched_backend(lambda: out.append(fn()))
    return out[0], ran


class Run:
    """One implementation's model in one mode: a fresh model (`config`, weights from SEED, `dtype`,
    `device`) attending with `attention`, AdamW on its parameters; step(ids) runs one training step
    and keeps its loss, and, on a GPU, its CUDA events and the memory it allocated."""

    def __init__(self, impl, attention, mode, config=CONFIG, dtype=torch.bfloat16, device="cuda"):
        self.impl, self.mode = impl, mode
        self.model = hf.llama(attn_implementation=attention, seed=SEED, **config).to(device, dtype)
        self.model.train()
        self.cuda = torch.device(device).type == "cuda"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, fused=self.cuda)
        compile_mode = {"compiled": "default", "cudagraphs": "reduce-overhead"}.get(mode)
        self.runner = self.model if compile_mode is None else torch.compile(self.model, mode=compile_mode)
        self.losses, self.events, self.mib, self.ran, self.error = [], [], [], "", None

    def step(self, ids, timed=False, profiled=False):
        if self.mode == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()
        one = lambda: step(self.runner, self.optimizer, ids)  # noqa: E731
        if not (timed and self.cuda):
            loss, ran = what_ran(self.impl, one) if profiled else (one(), self.ran)
            self.losses.append(loss)
            self.ran = ran
            return
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.losses.append(one())
        end.record()
        self.events.append((start, end))
        self.mib.append((torch.cuda.max_memory_allocated() - before) / 2**20)


def paired(impls, mode, data, **where):
    """{impl: its Run} after len(data) steps of each, as the module docstring says: built and warmed up
    one after another, then timed in rounds. A Run that fails keeps its error and takes no more steps."""
    runs = {}
    for impl, attention in impls.items():
        try:
            run = runs[impl] = Run(impl, attention, mode, **where)
            for i, ids in enumerate(data[:WARMUP]):
                run.step(ids, profiled=i == WARMUP - 1)  # the last warm-up step says what ran
        except Exception as e:  # a configuration that fails (the compiler, memory): say why, go on
            runs[impl] = types.SimpleNamespace(error=results.why(e))
    for ids in data[WARMUP:]:
        for run in runs.values():
            if run.error is None:
                try:
                    run.step(ids, timed=True)
                except Exception as e:
                    run.error = results.why(e)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return runs


def measured(runs):
    """Rows (without provenance) from paired()'s runs: times, paired ratios, memory, losses, checks."""
    times = {i: [s.elapsed_time(e) for s, e in r.events] for i, r in runs.items() if r.error is None and r.events}
    reference = runs.get(REFERENCE)
    reference = None if reference is None or reference.error else torch.stack(reference.losses).float().tolist()
    rows = []
    for impl, run in runs.items():
        row = dict(impl=impl)
        if run.error is not None:
            rows.append(dict(row, check=f"error: {run.error}"))
            continue
        losses = torch.stack(run.losses).float().tolist()
        row.update(attention=run.ran, losses=" ".join(f"{x:.5f}" for x in losses), **compare(losses, reference))
        if impl in times:
            row.update(step_ms=f"{statistics.median(times[impl]):.3f}", step_mib=f"{max(run.mib):.0f}")
            if REFERENCE in times:
                ratios = [a / b for a, b in zip(times[REFERENCE], times[impl])]
                row["vs_sdpa"] = f"{statistics.median(ratios):.3f}"
        rows.append(row)
    return rows


def run(part_numbers, seq_lens, modes, save=None):
    meta, rows = results.provenance(), []
    shape = dict(
        B=B,
        layers=CONFIG["num_hidden_layers"],
        hidden=CONFIG["hidden_size"],
        heads=CONFIG["num_attention_heads"],
        kv_heads=CONFIG["num_key_value_heads"],
        D=CONFIG["head_dim"],
        vocab=CONFIG["vocab_size"],
        dtype="bf16",
        steps=STEPS,
        warmup=WARMUP,
    )
    for n in seq_lens:
        data = batches(n).to("cuda")
        for mode in modes:
            group = [
                dict(r, mode=mode, N=n, **shape, **meta)
                for r in measured(paired(implementations(part_numbers), mode, data))
            ]
            for r in group:
                print(
                    f"N={n:>5} {mode:<10} {label(r['impl']):<28} {r.get('step_ms') or '-':>8} ms  "
                    f"x{r.get('vs_sdpa') or '-':<6} {r.get('step_mib') or '-':>6} MiB  "
                    f"loss diff {r.get('loss_diff') or '-':>8}  {r.get('attention') or ''}  {r['check'][:40]}",
                    flush=True,
                )
            rows += group
            gc.collect()
            torch.cuda.empty_cache()
            torch._dynamo.reset()
            if save is not None:
                save(rows)
    return rows


def compare(losses, reference):
    """loss_diff and check for one run's losses against SDPA default's (None: it did not run)."""
    if not all(abs(x) < float("inf") for x in losses):  # inf, or nan (every comparison with nan is False)
        return dict(check="FAIL: a loss is not finite")
    if reference is None:
        return dict(check="ok: every loss finite; no SDPA default to compare with")
    diff = max(abs(a - b) for a, b in zip(losses[:COMPARED], reference[:COMPARED]))
    if diff <= LOSS_TOLERANCE:
        check = f"ok: the first {COMPARED} losses within {LOSS_TOLERANCE} of SDPA default's"
    else:
        check = f"FAIL: a loss {diff:.4f} from SDPA default's in the first {COMPARED} steps"
    return dict(loss_diff=f"{diff:.5f}", check=check)


def _order(impl):
    fixed = [REFERENCE, REPEATED]
    return (fixed.index(impl), 0) if impl in fixed else (len(fixed), int(impl.removeprefix("part")))


def _cell(value, form):
    return "—" if value is None else form.format(value)


def _shape(f):
    return (
        f"a {f['layers']}-layer Llama: hidden {f['hidden']}, {f['heads']} heads of D = {f['D']} sharing {f['kv_heads']} "
        f"key/value heads, vocabulary {f['vocab']:,}, {f['dtype']}"
    )


def table(gpu_dir):
    """Per N, mode and implementation: step time, its paired ratio to SDPA default's, memory, the loss difference."""
    rows = sorted(
        results.read_csv(gpu_dir / "train_step.csv"), key=lambda r: (r["N"], MODES.index(r["mode"]), _order(r["impl"]))
    )
    body = [[r["N"], r["mode"], label(r["impl"]), r["attention"] or "—", _cell(r["step_ms"], "{:.1f}"), _cell(r["vs_sdpa"], "{:.2f}x"),
             _cell(r["step_mib"], "{:,.0f}"), _cell(r["loss_diff"], "{:.4f}"), str(r["check"]).split(":")[0]] for r in rows]  # fmt: skip
    f = rows[0]
    caption = (
        f"A training step (forward, backward, AdamW) of {_shape(f)}, B={f['B']}, causal. Step time: the median of "
        f"{f['steps'] - f['warmup']} steps after {f['warmup']} of warm-up, the implementations taking turns step by step; "
        "SDPA default's step time over this one's in the same turn, the median (above 1: faster); the memory a step "
        f"allocates above the resident weights and optimizer state; the largest loss difference from SDPA default's in "
        f"the first {COMPARED} steps (same mode):"
    )
    header = ["N", "mode", "attention", "ran", "step ms", "x SDPA default", "step MiB", "loss diff", "check"]
    provenance = results.provenance_line(rows, "python -m lab.train_step && make report")
    return "\n".join([provenance, "", caption, "", results.markdown_table(header, body, "rllrrrrrl")])


def summary(gpu_dir):
    """The README's table: each part's paired step-time ratio to SDPA default per mode and N."""
    rows = [r for r in results.read_csv(gpu_dir / "train_step.csv") if r["impl"].startswith("part")]
    seq_lens = sorted({r["N"] for r in rows})
    cells = {(r["impl"], r["mode"], r["N"]): r["vs_sdpa"] for r in rows}
    impls = sorted({r["impl"] for r in rows}, key=_order)
    body = [[label(i), m, *(_cell(cells.get((i, m, n)), "{:.2f}x") for n in seq_lens)]
            for i in impls for m in MODES if any((i, m, n) in cells for n in seq_lens)]  # fmt: skip
    header = ["attention", "mode", *(f"N = {n}" for n in seq_lens)]
    f = rows[0]
    caption = (
        f"SDPA default's step time over the part's, taking turns ({f['layers']}-layer Llama, D = {f['D']}, {f['heads']} "
        f"heads, {f['kv_heads']} key/value heads, B={f['B']}):"
    )
    table = results.markdown_table(header, body, "ll" + "r" * len(seq_lens))
    return "\n".join([results.provenance_line(rows, "python -m lab.train_step && make report"), "", caption, "", table])


def draw(gpu_dir):
    """train_step.png: step time against N, a panel per mode, a line per implementation."""
    from matplotlib.figure import Figure

    rows = [r for r in results.read_csv(gpu_dir / "train_step.csv") if r["step_ms"] is not None]
    fig = Figure(figsize=(12, 4))
    axes = fig.subplots(1, len(MODES), sharey=True)
    for ax, mode in zip(axes, MODES):
        for impl in sorted({r["impl"] for r in rows}, key=_order):
            points = sorted((r["N"], r["step_ms"]) for r in rows if r["impl"] == impl and r["mode"] == mode)
            if points:
                ax.plot(*zip(*points), marker="o", label=label(impl), ls="--" if impl == REPEATED else "-")
        ax.set_xscale("log", base=2)
        ax.set_title(mode)
        ax.set_xlabel("N (tokens per sequence)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("step time, ms (median)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"A training step of {_shape(rows[0])}, B={rows[0]['B']} — {rows[0]['gpu']}", fontsize=9)
    fig.tight_layout()
    path = gpu_dir / "train_step.png"
    fig.savefig(path, dpi=110)
    return [path]


def main(argv=None):
    extra = [
        (("--part",), dict(type=int, action="append", help="part number (repeatable); default: the last part")),
        (("--mode",), dict(action="append", choices=MODES, help="(repeatable); default all three")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, extra=extra)
    try:
        numbers = parts.require(args.part) if args.part else [max(n for n in parts.available() if parts.uses_triton(n))]
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if not study.on_gpu("The training-step benchmark times a model's steps"):
        return 0
    if not hf.available():
        print("The training-step benchmark needs transformers: pip install -e '.[model]'.")
        return 2
    train = lambda save: run(numbers, args.n, tuple(args.mode or MODES), save)  # noqa: E731
    return results.write_as_measured("train_step.csv", FIELDS, train, key=KEY)


if __name__ == "__main__":
    sys.exit(main())
