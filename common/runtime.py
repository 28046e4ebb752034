"""Where the kernels run: a CUDA GPU if there is one, otherwise the Triton interpreter on the CPU.

Import this module before any `@triton.jit` function is defined. Triton decides at decoration
time whether a kernel is compiled or interpreted, so `TRITON_INTERPRET=1` must already be set
when a part's `flash_attention.py` is executed on a machine without a GPU.
"""

import os
import re
import sys

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU and "TRITON_INTERPRET" not in os.environ:
    # No GPU: run every Triton kernel in Triton's interpreter (numpy on the CPU). Triton reads the
    # switch when triton.language is imported (some of its helpers are themselves @triton.jit
    # functions), so it must be set first; a part imported after triton would fail at its first
    # launch with "Cannot call @triton.jit'd outside of the scope of a kernel". Say so plainly instead.
    if "triton.language" in sys.modules:
        if "transformers" in sys.modules:  # it loads triton as a model class is imported
            who, first = "transformers, imported first, loaded triton", "common.hf (or the part) before transformers"
        else:
            who, first = "triton was imported", "the part (or common.runtime) before triton"
        raise ImportError(
            f"{who} before this project could switch on Triton's interpreter (no CUDA GPU here). "
            f"Import {first}, or set TRITON_INTERPRET=1 in the environment."
        )
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
COMPILED = HAS_GPU and not INTERPRET  # Triton compiles and launches for real: what timings and studies need
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")


def _interpreter_scalars():
    """Triton 3.6's interpreter turns a scalar argument into a Python int with int() of a one-element
    array, which NumPy 2.4 and later refuse ("only 0-dimensional arrays can be converted to Python
    scalars"): every `range()` over a run-time length fails. Triton 3.9 squeezes the array first;
    where the interpreter still does not, the same squeeze is patched in."""
    import inspect

    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or "int(self.handle.data)" not in inspect.getsource(patch):  # squeezes already
        return

    def squeezing(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = squeezing


if INTERPRET:
    _interpreter_scalars()


_PROPERTIES = {}


def properties(device):
    """torch.cuda.get_device_properties(device), asked once per device: a call costs microseconds,
    which a kernel's routing check or grid would otherwise pay on every call."""
    found = _PROPERTIES.get(device)
    if found is None:
        found = _PROPERTIES[device] = torch.cuda.get_device_properties(device)
    return found


def capability(device):
    """The device's compute capability, (9, 0) on Hopper, from its cached properties."""
    found = properties(device)
    return found.major, found.minor


def _descriptor_scratch(size: int, alignment: int, stream):
    """In-kernel tensor descriptors (tl.make_tensor_descriptor) are written by each program into a
    small global-memory scratch buffer (on Hopper: the TMA descriptor, 128 bytes), which Triton asks
    for at launch time. A new one from PyTorch's allocator every launch: one kept across launches
    breaks torch.compile's CUDA graphs (mode="reduce-overhead"), whose warm-up runs allocate into the
    graph's memory pool, and a buffer kept from there is a live allocation the graph does not track
    (one kept per stream failed so: "Detected 1 tensor(s) in the cudagraph pool not tracked as outputs")."""
    return torch.empty(size, dtype=torch.int8, device=DEVICE)


def set_triton_allocator():
    """Give Triton the scratch allocator in the calling thread. Triton keeps it in a context
    variable, which a new thread does not inherit: autograd runs a CUDA backward on a thread of its
    own, so a backward that launches Triton kernels calls this first."""
    triton.set_allocator(_descriptor_scratch)


try:
    import triton

    set_triton_allocator()
    TRITON_VERSION = triton.__version__
except ImportError:  # part 0 needs only PyTorch
    TRITON_VERSION = "none"


def gpu_name() -> str:
    return torch.cuda.get_device_name() if HAS_GPU else "cpu"


def gpu_slug() -> str:
    """A short folder name for results: 'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'rtx-4090',
    'NVIDIA H100 80GB HBM3' -> 'h100' (memory size and kind, form factor left out)."""
    name = gpu_name().lower()
    for word in ("nvidia", "geforce", "tesla"):
        name = name.replace(word, "")
    name = re.sub(r"\b(\d+gb|hbm\w*|sxm\w*|pcie|nvl)\b", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.strip()).strip("-") or "gpu"


def describe() -> str:
    where = gpu_name() if HAS_GPU else "CPU"
    mode = "Triton interpreter" if INTERPRET else "compiled Triton"
    return f"{where}, torch {torch.__version__}, triton {TRITON_VERSION}, {mode}"
