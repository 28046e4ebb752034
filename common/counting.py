"""What a Triton kernel does, counted under the interpreter (TRITON_INTERPRET=1, a CPU): its dot
products, exponentials, selects (tl.where: a mask applied), loads and atomics, summed over every
program of the launches made inside the block. A test's way to see an idea that only costs time
(tiles skipped, masks only where needed, exp2), where a timer would need a GPU.

    with counting("dot", "select") as counts:
        module.flash_forward(q, k, v, True)
    counts["dot"]   # two per key tile a program visits: Q K^T and P V
"""

import collections
import contextlib

# Our name -> the interpreter's builder method (Triton 3.6 to 3.9) that every such operation goes through.
OPS = {
    "dot": "create_dot",
    "exp": "create_exp",
    "exp2": "create_exp2",
    "select": "create_select",
    "load": "create_load",
    "masked_load": "create_masked_load",
    "descriptor_load": "create_descriptor_load",
    "atomic_rmw": "create_atomic_rmw",
}


@contextlib.contextmanager
def counting(*names):
    """Count the operations named (keys of OPS) while the block runs: yields a Counter. Needs the
    interpreter: a compiled kernel runs on the GPU, where nothing here sees it (RuntimeError)."""
    from common import runtime

    if not runtime.INTERPRET:
        raise RuntimeError("counting sees kernels under Triton's interpreter only (TRITON_INTERPRET=1, a CPU)")
    from triton.runtime.interpreter import InterpreterBuilder

    counts, saved = collections.Counter(), {}
    for name in names:
        method = OPS[name]
        original = saved[method] = getattr(InterpreterBuilder, method)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        setattr(InterpreterBuilder, method, counted)
    try:
        yield counts
    finally:
        for method, original in saved.items():
            setattr(InterpreterBuilder, method, original)
