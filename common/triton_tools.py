"""The few Triton internals the kernels and the learner's tools reach for, in one place (what the
lab alone needs of the compiler, such as compiling a configuration without running it or reading a
binary's registers, is lab/compiler.py's).

A launch has to know the shared memory each configuration's binary takes and which configuration
the autotuner chose; the exercises compile part 5's Gluon kernels for sm_90 without a GPU; part 5's host path
(part5_profiling/fast_launch.py) launches a compiled kernel without Triton's per-call Python.
A part's first call compiles several kernels, and the compiler can build them side by side
(compile_together, which common/launch.py calls with the shape class it reads off a kernel's
arguments: arg_names, autotune_keys). Triton has no public API for these, so each function below
says what it touches and how the Triton versions that meet this code behave: 3.6 (the GPU machine),
3.8 and 3.9 (fresh installs). Nothing here works in the interpreter, which compiles nothing;
importing this module is safe everywhere.
"""

# Without a GPU, common.runtime switches on Triton's interpreter, which must happen before triton loads.
from common import runtime  # noqa: F401, I001
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from triton import knobs
from triton.runtime import Autotuner, Heuristics, OutOfResources, driver  # noqa: F401  (OutOfResources: for the sweeps)

try:  # 3.6 to 3.9; an older Triton compiles one kernel at a time (compile_together does nothing)
    from triton.runtime._async_compile import AsyncCompileMode, FutureKernel
    from triton.runtime._async_compile import active_mode as _async_mode
except ImportError:
    AsyncCompileMode = FutureKernel = _async_mode = None


def jit_function(kernel):
    """The plain @triton.jit function under @triton.autotune and @triton.heuristics wrappers.
    3.6 to 3.9: each wrapper keeps the function it wraps in `.fn`."""
    while isinstance(kernel, (Autotuner, Heuristics)):
        kernel = kernel.fn
    return kernel


def shared_memory(compiled):
    """Bytes of shared memory the compiler allocated for one program, known as soon as it compiled.
    3.6 to 3.9: CompiledKernel.metadata.shared."""
    return compiled.metadata.shared


def load(compiled):
    """Load the compiled binary onto the GPU; returns (registers per thread, spilled registers).
    Raises OutOfResources when the kernel cannot run: more shared memory or threads than the GPU has.
    3.6 to 3.9: CompiledKernel._init_handles() loads the binary (otherwise done at the first launch)
    and only then fills n_regs and n_spills."""
    compiled._init_handles()
    return compiled.n_regs, compiled.n_spills


def chosen(kernel):
    """The triton.Config an @triton.autotune kernel ran its last call with; None for a kernel that
    is not autotuned or not called yet. 3.6 to 3.9: Autotuner.best_config, set on every call."""
    return getattr(kernel, "best_config", None)


def config_label(config):
    """A triton.Config of a tiled kernel as the tables write it: '128x64 w4 s3'."""
    return f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']} w{config.num_warps} s{config.num_stages}"


def chosen_label(kernel):
    """config_label of what an @triton.autotune kernel chose for its last call; "" before its first."""
    config = chosen(kernel)
    return "" if config is None else config_label(config)


def launch_hooked():
    """Whether a launch hook is set (a profiler's, such as proton's: its launches must go through
    Triton's own path, which calls the hooks). 3.6 to 3.9 keep the hooks in a HookChain, an object
    that is never None and calls each hook it holds (`calls`): set means non-empty."""
    return bool(knobs.runtime.launch_enter_hook.calls)


def direct_launcher(compiled, tail):
    """launch(n_programs, device_index, *args): `compiled` (the CompiledKernel Triton's launch path
    returned for a call) launched again on a one-axis grid of n_programs with run-time arguments
    args, then `tail` (the values of every parameter after them, constexprs included, in order),
    on the device's current stream, and nothing else: no binding, no cache key, no hooks.
    3.6 to 3.9: CompiledKernel.run is the binary's launcher (a property that loads the binary on its
    first use, which Triton's path has done), called as run(grid_x, grid_y, grid_z, stream,
    function, packed_metadata, launch_metadata, enter_hook, exit_hook, *every argument)."""
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    stream = driver.active.get_current_stream

    def launch(n_programs, device_index, *args):
        run(n_programs, 1, 1, stream(device_index), function, packed, None, None, None, *args, *tail)

    return launch


def arg_names(kernel):
    """Every parameter of a kernel (run-time and constexpr), in order, through its autotune wrapper.
    3.6 to 3.9: JITFunction.arg_names."""
    return jit_function(kernel).arg_names


def autotune_keys(kernel):
    """The names of the arguments an @triton.autotune kernel tunes by (its `key=`); () for a plain
    jit kernel. 3.6 to 3.9: Autotuner.keys holds the list it was given."""
    return tuple(kernel.keys) if isinstance(kernel, Autotuner) else ()


def configs(kernel):
    """The triton.Config list of an @triton.autotune kernel, before pruning; [] for a plain jit kernel.
    3.6 to 3.9: Autotuner.configs."""
    return list(kernel.configs) if isinstance(kernel, Autotuner) else []


# The one background thread of compile_together(..., ahead=device); its thread starts on the first submit.
_AHEAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-ahead")


def compile_together(calls, first_calls=None, key=None, ahead=None):
    """Compile every binary a set of launches is about to need, all at once, before the launches.

    calls: (kernel, args, constexprs) for each launch the caller is about to make, with the arguments
    it will make it with (a grid is not needed); or a function returning that list, called only when
    something is to be compiled (a later call of the class then pays one dict lookup). An
    @triton.autotune kernel gets every configuration its pruning keeps (what its first call would
    compile and time, one by one), a plain jit kernel its one binary. first_calls and key: a dict the
    caller keeps and its shape class; given, only the first call of a class compiles.
    ahead: a torch.device: return at once and compile on a background thread (for that device), so
    that the compile runs while the caller goes on; the caller keeps the tensors in `calls` alive
    until then (a function in `calls` holding them does). Returns that compile's Future (None when
    nothing was started). A later call with the same first_calls and key waits for that compile to
    finish, then returns.

    Compiling a configuration is seconds of the compiler's passes and ptxas (a separate process),
    much of it outside Python's lock, so a pool of threads builds several in about the time of the
    slowest; the launches that follow find them in Triton's cache and only load (and the autotuner
    time) them. Nothing changes what runs: on any failure here, or under the interpreter, or on a
    Triton without AsyncCompileMode, the launches compile one by one as they always did (and raise,
    if a kernel does not compile, from there). A launch made while its kernel is still compiling
    ahead compiles it again on its own thread (Triton's cache holds only finished binaries).
    3.6 to 3.9: with AsyncCompileMode(executor, ignore_errors=True) active,
    JITFunction.warmup(*args, grid=...) submits its compile to the executor and leaves a future in
    the kernel cache, which the mode resolves on exit; Autotuner.warmup warms every configuration
    prune_configs keeps. The mode is a context variable, one per thread."""
    if first_calls is not None:
        if key in first_calls:
            started = first_calls[key]
            if started is not None:
                started.result()  # compiling ahead: wait for it (it raises nothing)
            return
        first_calls[key] = None
    if runtime.INTERPRET or AsyncCompileMode is None:
        return None
    if ahead is None:
        _compile(calls)
        return None
    started = _AHEAD.submit(_compile, calls, ahead)
    if first_calls is not None:
        first_calls[key] = started
    return started


def _compile(calls, device=None):
    """compile_together's work, on the caller's thread or (device given) on the background one."""
    try:
        if device is not None:
            torch.cuda.set_device(device)  # a new thread starts on device 0; warmup compiles for the current one
        calls = list(calls() if callable(calls) else calls)
        with ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="compile-together") as pool:
            with AsyncCompileMode(pool, ignore_errors=True):  # a failed compile is left to the launch
                for kernel, args, constexprs in calls:
                    kernel.warmup(*args, grid=(1,), **constexprs)
    except Exception:  # noqa: BLE001  (an optimisation only: the launches compile what is missing)
        pass


def shared_sizes(kernel, configs, args, constexprs):
    """{config: bytes of shared memory its binary takes on the current GPU} for an @triton.autotune
    kernel's configurations on one launch's arguments (args: every run-time argument, in order;
    constexprs: the launch's keyword arguments); float("inf") where one does not compile. What
    Triton's cache lacks is compiled side by side (under the caller's AsyncCompileMode when one is
    active, compile_together's, else under one of its own).
    3.6 to 3.9: JITFunction.warmup returns the CompiledKernel, or under an active AsyncCompileMode a
    FutureKernel, whose result() waits for the compile (and raises if it failed); modes do not nest."""
    fn = jit_function(kernel)
    meta = {k: v for k, v in constexprs.items() if k != "grid"}  # Autotuner.warmup passes its grid through

    def read():
        started = {}
        for c in configs:
            try:
                started[c] = fn.warmup(*args, grid=(1,), **meta, **c.all_kwargs())
            except Exception:  # noqa: BLE001  (does not compile: it cannot run either)
                pass
        sizes = {c: float("inf") for c in configs}
        for c, compiled in started.items():
            try:
                sizes[c] = shared_memory(compiled.result() if isinstance(compiled, FutureKernel) else compiled)
            except Exception:  # noqa: BLE001
                pass
        return sizes

    if AsyncCompileMode is None or _async_mode.get() is not None:
        return read()
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="compile-together") as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            return read()


def compile_for(fn, signature, constexprs, capability, options, attrs=None, gluon=False):
    """Compile a @triton.jit (gluon: @gluon.jit) function for an NVIDIA GPU of compute capability
    `capability` (90 for sm_90) without one: signature {parameter: "*bf16" | "i32" | "fp32" |
    "constexpr"}, constexprs {name: value}, options {num_warps, num_stages}, attrs the specialisation
    a launch would give ({(index,): [["tt.divisibility", 16]]} for a 16-byte-aligned pointer; none:
    nothing assumed). Returns the CompiledKernel (asm, metadata.shared); raises what the compiler raises.
    3.6 to 3.9: triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda",
    capability, 32), options=...); Gluon's source class is triton.experimental.gluon._runtime.GluonASTSource."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: N814
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
