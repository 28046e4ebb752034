"""What every Triton part does around a launch, written once, so that a kernel file holds its idea.

    q, k, v = launch.sequences(Q, K, V)             # (..., N, D) -> contiguous (B*H, N, D)
    launch.run(_attn_fwd, grid, q, k, v, o, lse, n_q, n_k, scale, D=d, IS_CAUSAL=is_causal)
    launch.ahead(flash_backward, Q, K, V, ...)      # the backward's kernels, compiled meanwhile
    launch.Blank(shape, dtype)                      # a stand-in tensor, made only if ahead() runs fn

run(kernel, grid, *args, **constexprs) is kernel[grid](*args, **constexprs), and before it:

- Triton's scratch allocator for this thread (in-kernel tensor descriptors live in it; Triton keeps
  it per thread, and autograd runs a CUDA backward on a thread of its own);
- CUDA's limit on a grid's second and third axes, 65535 (parts 1 and 2 put one row of programs per
  sequence there): past it, a ValueError naming the tensor, not a launch error;
- the first call of a shape class compiles every configuration the autotuner will time side by
  side (triton_tools.compile_together), not one by one as its timing loop would; later calls find
  them in Triton's cache. On a large input the autotuner then times them on a few of its
  sequences (tune()), not on all of it. A shape class is what makes Triton compile or tune
  differently: the kernel, the device, the tensors' dtypes, the constexprs, and for an
  @triton.autotune kernel the values of its key arguments (N_BUCKET). The kernel's integer arguments are do_not_specialize and
  its tensors 16-byte aligned (sequences() sees to it), so nothing else changes a binary.

ahead(fn, *args) calls fn(*args) with every run() inside it written down instead of launched, and
compiles what it wrote down on a background thread: a later run() of one of those classes waits for
that compile instead of starting its own. A forward whose inputs want gradients starts its
backward's kernels so (parts 4 and 5), and the first backward waits only for what is left.

Nothing compiles under Triton's interpreter: there run() only launches, and ahead() does nothing.
"""

# Without a GPU, common.runtime switches on Triton's interpreter, which must happen before triton loads.
from common import runtime, triton_tools  # noqa: I001
import contextvars

import torch
import triton

MAX_GRID_Y = 65535  # CUDA's limit on a launch grid's second (and third) axis

# shape class -> None (compiled, or compiling on the thread that met it first) or, while a compile
# started by ahead() runs, its Future (triton_tools.compile_together keeps this dict)
_compiled = {}
_recording = contextvars.ContextVar("launch_recording", default=None)  # ahead(): the launches written down
_ahead_seen = set()  # the calls ahead() was given: fn, determinism, and each argument's shape, dtype, device
_ahead_started = [0]  # how many compiles ahead() has started (a count: the futures are not kept)
_MAX_SEEN = 4096  # signatures remembered; past this many (lengths that keep changing), start again
_tuned_args = {}  # kernel -> the positions of its autotune key among its arguments
TUNE_SCORES = 2**31  # tune(): past this many scores (sequences x N_q x N_k), timed on fewer sequences
_tuned = set()  # the shape classes tune() has seen


class Blank(tuple):
    """Blank(shape, dtype): a stand-in for a tensor argument of ahead() that the caller does not have
    (the forward's L, before the forward made it); ahead() makes it, on its first tensor's device,
    only when it runs fn: a repeated call allocates nothing."""

    def __new__(cls, shape, dtype):
        return super().__new__(cls, (tuple(shape), dtype))


class _Recorded(Exception):
    """compile_first() under ahead(): every launch the function needs is written down; stop it there."""


def sequences(*tensors):
    """Each (..., N, D) tensor as a contiguous (B*H, N, D) one on a 16-byte boundary, as tensor
    descriptors require: a view where it already is one, else a copy."""
    out = []
    for t in tensors:
        t = t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()  # copies only if strided
        out.append(t if t.data_ptr() % 16 == 0 else t.clone())
    return tuple(out)


def n_bucket(n_q, n_k):
    """The autotuner's shape class for sequence length: the power of two at or above max(N), min 256."""
    return max(256, triton.next_power_of_2(max(n_q, n_k)))


def smem_limit():
    """Shared memory one program may use, read off the GPU (227 KB on Hopper, 99 KB on Ada).
    Without a GPU nothing is pruned for real; Hopper's value keeps the arithmetic printable."""
    if not torch.cuda.is_available():
        return 227 * 1024
    return torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin


def fitting(kernel, configs, named_args, constexprs):
    """What a prune keeps: the configurations whose binary, compiled for this GPU, fits the shared
    memory one program may use there (smem_limit), by the compiler's own figure. No one arithmetic
    fits every GPU: for Hopper's TMA loads the compiler keeps num_stages buffers of each streamed
    tile, for the cp.async copies of Ampere and Ada num_stages - 1 (results/targets.csv has both).
    named_args and constexprs: what the autotuner hands its early_config_prune (the launch's
    arguments). If none fits, the smallest is kept, and its launch raises Triton's OutOfResources.
    Without a GPU, or under the interpreter, nothing compiles: `configs` as they are."""
    if runtime.INTERPRET or not torch.cuda.is_available():
        return configs
    sizes = triton_tools.shared_sizes(kernel, configs, list(named_args.values()), constexprs)
    if all(size == float("inf") for size in sizes.values()):  # none compiled: the autotuner meets why
        return configs
    return [c for c in configs if sizes[c] <= smem_limit()] or [min(configs, key=sizes.get)]


def shape_class(kernel, args, constexprs):
    """What makes Triton compile or tune this launch differently from another (see the top)."""
    tuned = _tuned_args.get(kernel)
    if tuned is None:
        names = triton_tools.arg_names(kernel)
        tuned = _tuned_args[kernel] = tuple(i for i, n in enumerate(names) if n in triton_tools.autotune_keys(kernel))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return (
        kernel,
        tensors[0].device if tensors else None,
        tuple(t.dtype for t in tensors),
        tuple(sorted(constexprs.items())),
        tuple(args[i] for i in tuned if i < len(args)),
    )


def run(kernel, grid, *args, via=None, **constexprs):
    """kernel[grid](*args, **constexprs), with the allocator, the grid's limit and the first call's
    compile (see the top). via: a launcher to call instead, as via(shape class, grid, *args,
    **constexprs) (part 5's fast_launch.Launch, whose grid gives a number of programs)."""
    key = shape_class(kernel, args, constexprs)
    recording = _recording.get()
    if recording is not None:  # under ahead(): written down, not launched
        recording.append((key, kernel, args, constexprs))
        return None
    runtime.set_triton_allocator()
    if via is None:
        _check_grid(kernel, grid, args, constexprs)
    triton_tools.compile_together([(kernel, args, constexprs)], _compiled, key)
    tune(kernel, grid, args, constexprs, key)
    if via is not None:
        return via(key, grid, *args, **constexprs)
    return kernel[grid](*args, **constexprs)


def tune(kernel, grid, args, constexprs, key=None):
    """Before the first launch of an @triton.autotune kernel's shape class on a large input, have the
    autotuner time its configurations on the input's leading sequences alone: its choice, kept under
    the same key, then costs milliseconds, where timing every configuration several times on the
    whole input took tens of seconds (part 4 at B = 9, H = 32, N = 65536: 33 s forward, 68 s
    backward). Large: more than TUNE_SCORES scores (sequences x N_QUERIES x N_KEYS); the leading m
    sequences hold about that many, at least one (a sequence of 64k queries is hundreds of programs:
    the GPU stays full). Every tensor argument of the first one's leading length is cut to m
    (outputs too: the real launch writes them after; key/value tensors of grouped heads are shorter
    and stay whole), N_SEQS is set to m (whole groups of Q_PER_KV), and the grid's sequence axis
    (the second; or the first, tiles x sequences) scaled by m / n. run() calls it; a caller
    that launches by other means calls it itself. Not for a kernel whose autotuner resets or restores
    arguments (one that accumulates into its outputs)."""
    if runtime.INTERPRET or not isinstance(kernel, triton.runtime.Autotuner) or len(kernel.configs) < 2:
        return
    key = key if key is not None else shape_class(kernel, args, constexprs)
    if key in _tuned or kernel.reset_to_zero or kernel.restore_value:
        return
    _tuned.add(key)
    names = triton_tools.arg_names(kernel)
    values = dict(zip(names, args))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or "N_QUERIES" not in values or "N_KEYS" not in values:
        return
    n, scores = tensors[0].shape[0], values["N_QUERIES"] * values["N_KEYS"]
    if n * scores <= TUNE_SCORES:
        return
    group = values.get("Q_PER_KV", 1)  # grouped heads: whole groups of query sequences
    m = -(-max(1, int(TUNE_SCORES // scores)) // group) * group
    if m >= n:
        return
    cut = [a[:m] if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == n else a for a in args]
    if "N_SEQS" in values:
        cut[names.index("N_SEQS")] = m

    def fewer(meta):
        g = grid(meta)
        g = tuple(g) if isinstance(g, (tuple, list)) else (g,)
        return (g[0], m, *g[2:]) if len(g) > 1 else (g[0] * m // n,)

    kernel[fewer](*cut, **constexprs)


def compile_first(key, calls):
    """For a caller that launches by other means (part 5's Gluon kernels): compile `calls`, a list of
    (kernel, args, constexprs) or a function returning one, together on the first call of the shape
    class `key`, or wait for ahead()'s compile of it. Under ahead(): write them down and stop the
    function there (it launches nothing after)."""
    recording = _recording.get()
    if recording is not None:
        recording.extend((key, *call) for call in (calls() if callable(calls) else calls))
        raise _Recorded
    triton_tools.compile_together(calls, _compiled, key)


def ahead(fn, *args):
    """Start compiling, on a background thread, the kernels fn(*args) would launch whose shape class
    has not been met; return at once. fn runs here with its launches written down, not made; the
    arguments stand in for the real ones (what the compiler sees of a tensor is its dtype and
    whether its address is 16-byte aligned; a Blank is made into one). Once per signature (fn,
    shapes, dtypes, devices, values, deterministic algorithms or not); nothing under the interpreter
    or while torch.compile traces."""
    if runtime.INTERPRET or torch.compiler.is_compiling():
        return
    signature = (fn, torch.are_deterministic_algorithms_enabled(), *map(_describe, args))
    if signature in _ahead_seen:
        return
    if len(_ahead_seen) >= _MAX_SEEN:
        _ahead_seen.clear()
    _ahead_seen.add(signature)
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    args = [torch.empty(a[0], dtype=a[1], device=device) if isinstance(a, Blank) else a for a in args]
    calls = []
    token = _recording.set(calls)
    try:
        fn(*args)
    except _Recorded:
        pass
    except Exception:  # noqa: BLE001  (an optimisation only: the launches compile what is missing)
        return
    finally:
        _recording.reset(token)
    new = {}
    for key, kernel, call_args, constexprs in calls:
        if key not in _compiled:
            new.setdefault(key, []).append((kernel, call_args, constexprs))
    if not new or device is None:
        return
    started = triton_tools.compile_together([c for group in new.values() for c in group], ahead=device)
    if started is not None:
        _ahead_started[0] += 1
        for key in new:
            _compiled[key] = started


def recording():
    """Whether ahead() is writing this thread's launches down (a launch made by other means than
    run() must not be made then)."""
    return _recording.get() is not None


def ahead_started():
    """How many compiles ahead() has started in this process."""
    return _ahead_started[0]


def _describe(a):
    return (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a


def _check_grid(kernel, grid, args, constexprs):
    """ValueError if the grid's second or third axis passes MAX_GRID_Y, naming the tensor whose
    leading dimension (its (batch * head) sequences) it holds. Looked at only when a tensor is that big."""
    big = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] > MAX_GRID_Y]
    if not big:
        return
    if callable(grid):  # the grid of an autotuned launch: its axes past the first do not depend on the tiles
        tuned = triton_tools.configs(kernel)
        grid = grid({**constexprs, **(tuned[0].kwargs if tuned else {})})
    names = triton_tools.arg_names(kernel)
    for n in tuple(grid)[1:]:
        if n > MAX_GRID_Y:
            name = next((names[i] for i in big if args[i].shape[0] == n), names[big[0]])
            raise ValueError(
                f"{name} holds {n} (batch * head) sequences, a row of programs each: "
                f"this launch grid allows {MAX_GRID_Y} on its second axis"
            )
