"""What the compiler made of a kernel, for the lab's measurements: compile one configuration
without running it, the GPU's limits, what the autotuner timed, every kernel a call launches with
its compiled binary, and the registers, spills and stack a binary holds. Built on
common/triton_tools.py (the Triton internals the kernels themselves need); Triton has no public API
for these either, and nothing here works in the interpreter, which compiles nothing.
"""

from common import runtime  # noqa: F401, I001  (the interpreter, where there is no GPU, before triton loads)
import re
import subprocess
import tempfile
from pathlib import Path

from triton import knobs
from triton.runtime import driver

from common.triton_tools import jit_function, load


def compile_only(kernel, args, grid, **constexprs):
    """Compile one configuration into Triton's on-disk cache without launching it; returns the
    compiled kernel. `constexprs` holds the kernel's constexpr arguments and num_warps, num_stages.
    A later launch with the same arguments finds it in the cache.
    3.6 to 3.9: JITFunction.warmup(*args, grid=..., **kwargs) compiles and returns a CompiledKernel."""
    return jit_function(kernel).warmup(*args, grid=grid, **constexprs)


def device_properties():
    """What Triton's driver reads off the current GPU: max_shared_mem, max_num_regs,
    multiprocessor_count, warpSize, clock rates, memory bus width.
    3.6 to 3.9: driver.active.utils.get_device_properties(device index) returns them as a dict."""
    return dict(driver.active.utils.get_device_properties(driver.active.get_current_device()))


def timed_configs(tuners, call):
    """Run call() and return how many configurations the autotuners `tuners` (a list) timed during it,
    together: for each, all that survived pruning for a new key, 0 when the key was seen before.
    3.6 to 3.9: each time it benchmarks, Autotuner replaces configs_timings with a new
    {config: time} dict; otherwise it leaves it alone, so it is cleared first.
    3.8 and 3.9: when pruning leaves a single configuration, it is used without being timed (0);
    3.6 times it (1). With Triton's autotuning disk cache switched on (off by default), a hit restores
    the saved timings and counts as timed."""
    for tuner in tuners:
        tuner.configs_timings = None
    call()
    return sum(len(tuner.configs_timings or ()) for tuner in tuners)


def launched(kernels, call):
    """Run call() and return [(kernel name, compiled kernel)] for every launch of `kernels` (jit or
    autotuned kernels) during it, in order. Call it on a warm call: while the autotuner benchmarks
    a new key, every configuration it times is a launch too. A launch hook is set meanwhile, so a
    fast path that skips Triton's launch path while none is set (part 5's) goes through it.
    3.6 to 3.9: JITFunction.run compiles or finds the kernel, launches it and returns the
    CompiledKernel; the autotuner calls the jit function's run, so an instance attribute `run`
    wrapping the method sees every launch. The attribute is removed afterwards."""
    seen = []
    wrapped = []
    for kernel in kernels:
        fn = jit_function(kernel)
        original = fn.run

        def run(*args, _original=original, _name=fn.__name__, **kwargs):
            compiled = _original(*args, **kwargs)
            seen.append((_name, compiled))
            return compiled

        fn.run = run
        wrapped.append(fn)
    hooks = knobs.runtime.launch_enter_hook
    hooks.add(_no_hook)
    try:
        call()
    finally:
        hooks.remove(_no_hook)
        for fn in wrapped:
            del fn.run
    return seen


def _no_hook(*args, **kwargs):
    """A launch hook that does nothing: while it is set, launch_hooked() is true."""


def resources(compiled):
    """What the compiler gave one kernel: warps, stages, shared memory (bytes), registers per thread
    and spilled registers. 3.6 to 3.9: metadata.num_warps, .num_stages and .shared, and n_regs and
    n_spills once the binary is loaded (it is, after a launch)."""
    n_regs, n_spills = load(compiled)
    meta = compiled.metadata
    return dict(num_warps=meta.num_warps, num_stages=meta.num_stages, shared=meta.shared, regs=n_regs, spills=n_spills)


def _on_cubin(tool, cubin, *flags):
    """The output of `tool` (a CUDA binary tool Triton ships: cuobjdump, nvdisasm) run on a cubin."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(path), *flags, f.name], capture_output=True, text=True, check=True).stdout


def binary_resources(cubin):
    """(registers per thread, stack bytes) of a compiled binary (CompiledKernel.asm["cubin"]), read with the
    cuobjdump Triton ships: no GPU needed, so a kernel compiled for another target can be read too."""
    out = _on_cubin("cuobjdump", cubin, "-res-usage")
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {out[-200:]!r}")
    return int(found[1]), int(found[2])


def sass(cubin):
    """A compiled binary's machine code (SASS), as the nvdisasm Triton ships prints it: no GPU needed."""
    return _on_cubin("nvdisasm", cubin, "-c")
