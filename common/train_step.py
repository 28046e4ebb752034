"""A training step of a small Llama (Hugging Face transformers) with each attention: SDPA, and every
Triton part from 4 on through common/hf.py; eager and compiled.

    python -m common.train_step      # a GPU: results/<gpu>/train_step.csv
    python -m common.train_step --n 1024 --mode eager --part 5

The model is built from a config in code, its weights random from one seed (nothing is downloaded):
4 layers, hidden 512, 8 query heads of D = 64 sharing 2 key/value heads, an MLP of intermediate size
1408 (LLaMA's 8/3 of the hidden size, rounded up to a multiple of 128), a vocabulary of 8192 (small,
so that the output layer and the loss, which grow with it, leave attention a visible share of the
step: about a third of its FLOPs at N = 4096), parameters in bf16, AdamW (lr 1e-3, fused) on the
mean next-token cross-entropy. Batch 8, N = 1024 and 4096, causal.

The data, the same for every implementation (one seed per N): each row is a segment of 256 tokens
drawn with Zipf-like frequencies (p proportional to 1/rank), repeated to fill N. The loss falls as
the model learns the frequencies, then further if it learns to copy from 256 positions back, which
is attention's work.

Implementations:
- sdpa_default: transformers' SDPA attention, on the backend PyTorch picks (the attention column
  says which ran); sdpa_flash: the same pinned to the flash backend (torch.nn.attention.sdpa_kernel).
  Both under common/hf.py's mask function, as the parts are (hf.register_sdpa): no mask for this
  causal model, eager or compiled. Eager, that is transformers' own SDPA path exactly.
- sdpa_hf_mask (compiled only): transformers' SDPA as it comes. Under torch.compile transformers
  cannot rule out packed sequences, so it builds a (batch, 1, N, N) mask and SDPA runs with it.
- part4, part5, ...: each part through common/hf.py (FlashAttention.apply eager; compiled, the
  torch.library op).

Modes: eager, and compiled: torch.compile(model) (Inductor), the optimizer step outside it.

For each implementation, mode and N: STEPS = 30 steps from the same weights and data, the first
WARMUP = 5 not timed (the compiled model compiles in its first). step_ms: the median of the other
25, each timed by CUDA events around forward, backward and the optimizer step, with no
synchronisation in between (losses are read after the last step). peak_mib:
torch.cuda.max_memory_allocated over the timed steps (reset after the warm-up). vs_sdpa: SDPA
default's step time (same mode and N) over this one's (above 1: faster). losses: all 30. loss_diff:
the largest |loss - SDPA default's loss| over the first 15 steps. check: "ok" if every loss is
finite and loss_diff is within LOSS_TOLERANCE (below).
"""

import contextlib
import functools
import gc
import statistics
import sys

import torch

from common import hf, impls, parts, results, study
from common.impls import impl_label

SEQ_LENS = (1024, 4096)
MODES = ("eager", "compiled")
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
HF_MASK = "sdpa_hf_mask"
FIELDS = [
    "impl",
    "mode",
    "B",
    "N",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "D",
    "vocab",
    "dtype",
    "steps",
    "warmup",
    "step_ms",
    "peak_mib",
    "vs_sdpa",
    "loss_diff",
    "attention",
    "check",
    "losses",
    *results.PROVENANCE,
]
KEY = ("impl", "mode", "N")


def label(impl):
    """How tables and plots name an implementation."""
    return "SDPA default, transformers' mask" if impl == HF_MASK else impl_label(impl)


def batches(n, steps=STEPS, b=B, vocab=CONFIG["vocab_size"], seed=SEED):
    """(steps, b, n) token ids: each row a Zipf-like segment of SEGMENT tokens repeated to fill n."""
    g = torch.Generator().manual_seed(seed + n)
    frequency = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    segment = min(SEGMENT, n)
    tokens = torch.multinomial(frequency, steps * b * segment, replacement=True, generator=g)
    return tokens.view(steps, b, segment).repeat(1, 1, -(-n // segment))[..., :n].contiguous()


def implementations(part_numbers, mode):
    """{impl: (attention implementation name, context entered around the run)}: SDPA default first (the reference)."""
    unmasked = hf.register_sdpa()
    found = {
        REFERENCE: (unmasked, contextlib.nullcontext),
        "sdpa_flash": (unmasked, functools.partial(impls.sdpa_context, "flash")),
    }
    if mode == "compiled":
        found[HF_MASK] = ("sdpa", contextlib.nullcontext)
    found.update({f"part{p}": (hf.register(p), contextlib.nullcontext) for p in part_numbers})
    return found


def step(runner, optimizer, ids):
    """One training step; returns the loss (a tensor on the GPU: reading it would wait for the step)."""
    loss = runner(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(attention, mode, data, what_ran, config=CONFIG, dtype=torch.bfloat16, device="cuda"):
    """len(data) steps of a fresh model (`config`, weights from SEED, in `dtype` on `device`) attending
    with `attention`, on data (steps, batch, N). Returns (losses, step times in ms, peak MiB, what
    ran, from what_ran(the last warm-up step)). Without CUDA (the CPU tests) nothing is timed:
    times are empty and the peak None."""
    model = hf.llama(attn_implementation=attention, seed=SEED, **config).to(device, dtype)
    model.train()
    with contextlib.ExitStack() as stack:
        runner = model
        if mode == "compiled":
            # A compilation of its own: Inductor's caches are keyed on the graph, not on SDPA's backend
            # flags, so a run pinned to the flash backend would otherwise reuse SDPA default's compiled
            # graph and run cuDNN (seen on the H200: the attention column said so).
            import torch._functorch.config
            import torch._inductor.config

            stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
            stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
            runner = torch.compile(model)
        return _steps(runner, model, data, what_ran, device)


def _steps(runner, model, data, what_ran, device):
    """train()'s loop: AdamW on model's parameters, a step per batch of data through runner (the model,
    or it compiled); the warm-up and the timed steps as the module docstring says."""
    cuda = torch.device(device).type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=cuda)
    data = data.to(device)
    losses, events, ran = [], [], ""
    for i, ids in enumerate(data):
        if i == WARMUP - 1:  # the last warm-up step: profiled, to say what ran
            loss, ran = what_ran(functools.partial(step, runner, optimizer, ids))
            losses.append(loss)
            continue
        if i == WARMUP and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if cuda and i >= WARMUP:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            losses.append(step(runner, optimizer, ids))
            end.record()
            events.append((start, end))
        else:
            losses.append(step(runner, optimizer, ids))
    if cuda:
        torch.cuda.synchronize()
    times = [start.elapsed_time(end) for start, end in events]
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return torch.stack(losses).float().tolist(), times, peak, ran


def sdpa_ran(fn):
    """(fn(), the SDPA backend it ran, read off the profiler): what SDPA default chose."""
    out = []
    ran = impls.dispatched_backend(lambda: out.append(fn()))
    return out[0], ran


def part_ran(module):
    """what_ran for a part: (fn(), what the part's last forward ran, as the benchmark names it)."""
    return lambda fn: (fn(), parts.forward_config(module))


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
        data = batches(n)
        for mode in modes:
            reference = None
            group = []
            for impl, (attention, context) in implementations(part_numbers, mode).items():
                row = dict(impl=impl, mode=mode, N=n, **shape, **meta)
                module = parts.load(int(impl.removeprefix("part"))) if impl.startswith("part") else None
                what_ran = part_ran(module) if module is not None else sdpa_ran
                try:
                    with context():
                        losses, times, peak, ran = train(attention, mode, data, what_ran)
                    row.update(
                        step_ms=f"{statistics.median(times):.3f}",
                        peak_mib=f"{peak:.0f}",
                        attention=ran,
                        losses=" ".join(f"{x:.5f}" for x in losses),
                    )
                    if impl == REFERENCE:
                        reference = losses
                    row.update(compare(losses, reference))
                except Exception as e:  # a configuration that fails (the compiler, memory): say why, go on
                    row["check"] = f"error: {results.why(e)}"
                finally:
                    gc.collect()
                    torch.cuda.empty_cache()
                    torch._dynamo.reset()
                group.append(row)
                print(
                    f"N={n:>5} {mode:<8} {label(impl):<34} {row.get('step_ms') or '-':>9} ms  "
                    f"{row.get('peak_mib') or '-':>6} MiB  loss diff {row.get('loss_diff') or '-':>8}  "
                    f"{row.get('attention') or ''}  {row['check'][:40]}",
                    flush=True,
                )
                if save is not None:
                    save(rows + group)
            base = next((float(r["step_ms"]) for r in group if r["impl"] == REFERENCE and r.get("step_ms")), None)
            for r in group:
                if base is not None and r.get("step_ms"):
                    r["vs_sdpa"] = f"{base / float(r['step_ms']):.3f}"
            rows += group
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


def table(gpu_dir):
    """Per N, mode and implementation: step time, its ratio to SDPA default's, peak memory, the loss difference."""
    order = [REFERENCE, "sdpa_flash", HF_MASK]
    rank = lambda impl: (order.index(impl), 0) if impl in order else (len(order), int(impl.removeprefix("part")))  # noqa: E731
    rows = sorted(
        results.read_csv(gpu_dir / "train_step.csv"),
        key=lambda r: (r["N"], list(MODES).index(r["mode"]), rank(r["impl"])),
    )

    def cell(value, form):
        return "—" if value is None else form.format(value)

    body = [[r["N"], r["mode"], label(r["impl"]), r["attention"] or "—", cell(r["step_ms"], "{:.1f}"), cell(r["vs_sdpa"], "{:.2f}x"),
             cell(r["peak_mib"], "{:,.0f}"), cell(r["loss_diff"], "{:.4f}"), str(r["check"]).split(":")[0]] for r in rows]  # fmt: skip
    f = rows[0]
    caption = (
        f"A training step (forward, backward, AdamW) of a {f['layers']}-layer Llama: hidden {f['hidden']}, {f['heads']} "
        f"heads of D = {f['D']} sharing {f['kv_heads']} key/value heads, vocabulary {f['vocab']:,}, {f['dtype']}, "
        f"B={f['B']}, causal. Step time: the median of {f['steps'] - f['warmup']} steps after {f['warmup']} of warm-up; "
        "peak memory; SDPA default's step time over this one's (above 1: faster); the largest loss difference from "
        f"SDPA default's in the first {COMPARED} steps (same mode):"
    )
    header = ["N", "mode", "attention", "ran", "step ms", "x SDPA default", "peak MiB", "loss diff", "check"]
    provenance = results.provenance_line(rows, "python -m common.train_step && make report")
    return "\n".join([provenance, "", caption, "", results.markdown_table(header, body, "rllrrrrrl")])


def main(argv=None):
    extra = [
        (
            ("--part",),
            dict(type=int, action="append", help="part number (repeatable); default: every Triton part from 4 on"),
        ),
        (("--mode",), dict(action="append", choices=MODES, help="eager or compiled (repeatable); default both")),
    ]
    args = study.arguments(__doc__, argv, n=SEQ_LENS, extra=extra)
    try:
        numbers = (
            parts.require(args.part) if args.part else [n for n in parts.available() if n >= 4 and parts.uses_triton(n)]
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if not study.on_gpu("The training-step benchmark times a model's steps"):
        return 0
    if not hf.available():
        print("The training-step benchmark needs transformers: pip install -e '.[model]'.")
        return 2
    modes = tuple(args.mode or MODES)
    return results.write_as_measured("train_step.csv", FIELDS, lambda save: run(numbers, args.n, modes, save), key=KEY)


if __name__ == "__main__":
    sys.exit(main())
