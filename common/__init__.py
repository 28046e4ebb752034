"""Shared machinery for every part: inputs, reference, checks, the PyTorch backward, benchmark.

common/ never imports a part by name: it finds parts through common.parts (folders named
part<N>_<topic>) and loads them generically.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root (the folder holding common/)
