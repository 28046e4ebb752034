"""The registry: part number -> that part's flash_attention.py, loaded by path.

Parts never import each other; everything that compares parts (tests, benchmark, diff) goes
through here. Loading a part imports common.runtime first, so a machine without a GPU runs the
Triton parts under the interpreter.
"""

import importlib.util
import sys
from pathlib import Path

import common.runtime  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

ROOT = Path(__file__).resolve().parent.parent

FOLDERS = {
    0: "part0_pytorch_reference",
    1: "part1_triton_baseline",
    2: "part2_tile_tuning",
    3: "part3_inner_loop",
    4: "part4_backward",
    5: "part5_profiling",
}
TRITON_PARTS = {1, 2, 3, 4, 5}  # parts whose forward is a Triton kernel

_loaded = {}


def path(n):
    return ROOT / FOLDERS[n] / "flash_attention.py"


def available():
    """Part numbers whose flash_attention.py exists, in order."""
    return [n for n in FOLDERS if path(n).exists()]


def uses_triton(n):
    return n in TRITON_PARTS


def load(n):
    """Import part n's flash_attention.py (once) and return the module."""
    if n not in FOLDERS:
        raise ValueError(f"no part {n}; parts are {sorted(FOLDERS)}")
    if not path(n).exists():
        raise FileNotFoundError(f"part {n} ({FOLDERS[n]}) has no flash_attention.py yet")
    if n not in _loaded:
        name = f"{FOLDERS[n]}.flash_attention"
        spec = importlib.util.spec_from_file_location(name, path(n))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _loaded[n] = module
    return _loaded[n]
