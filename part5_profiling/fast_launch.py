"""Part 5's host path: a kernel's launches without Triton's per-call Python.

Below N = 4096 a call's Python takes longer than its kernels (tools/launch_cost.py measures both:
results/h200/part5_launch_cost.csv), and under cProfile a third of part 4's forward's host time,
and nearly half of its backward's, is Triton's generic launch path: the autotuner's key, binding
the arguments, the compile-cache key, the grid, the launch metadata, worked out again on every
call for the same answer. Launch works it out once per shape class: the first call of a class goes
through Triton (compile, autotune) and Launch keeps what it launched; later calls of the class hand
their arguments straight to the compiled binary. flash_attention.py opts in by launching its kernels
through Launch objects. The Triton internals this touches are in common/triton_tools.py.

CUDA graphs and torch.compile hide the same cost through public API (the benchmark's graph-replay
column, and the flash_attention op under torch.compile); this is what an eager call can save.
"""

from common import triton_tools
from common.runtime import INTERPRET


class Launch:
    """One kernel's launches, cheaper.

    launch(key, grid, *args, **constexprs) launches the kernel on args (the kernel's leading,
    run-time parameters, in order) with the constexprs given by keyword. key must tell apart every
    call that Triton would compile or tune differently: the caller's device, dtype, D, causal flag,
    the autotuner's length bucket, ...; its integer parameters must be do_not_specialize and its
    pointers 16-byte aligned, so that nothing else changes the binary. grid(config kwargs) -> the
    number of programs (one grid axis).

    The first call of a key, every call under the interpreter, and every call while a launch hook
    is set (a profiler's) go through Triton's own path; so does every call on a Triton whose
    compiled kernel lacks what the direct launch reads (triton_tools.direct_launcher)."""

    def __init__(self, kernel):
        self.kernel = kernel  # a triton.autotune'd kernel or a plain triton.jit (or gluon.jit) one
        self.names = kernel.arg_names  # every parameter, run-time and constexpr, in order
        self.known = {}  # key -> (direct launcher, the autotuner's triton.Config or None, its kwargs)

    def __call__(self, key, grid, *args, **constexprs):
        known = self.known.get(key)
        if known is None or known[0] is None or INTERPRET or triton_tools.launch_hooked():
            compiled = self.kernel[lambda meta: (grid(meta),)](*args, **constexprs)
            if not INTERPRET:
                config = triton_tools.chosen(self.kernel)  # the autotuner's choice for this key
                blocks = config.kwargs if config is not None else {}
                every = {**constexprs, **blocks}
                tail = tuple(every[name] for name in self.names[len(args) :])
                try:
                    direct = triton_tools.direct_launcher(compiled, tail)
                except AttributeError:  # another Triton's internals: its public path, every call
                    direct = None
                self.known[key] = (direct, config, blocks)
            return
        launch, config, blocks = known
        if config is not None:
            self.kernel.best_config = config  # what Triton's path leaves there (parts.forward_config reads it)
        launch(grid(blocks), args[0].device.index, *args)
