"""Shared machinery for every part: inputs, reference, checks, the PyTorch backward, benchmark.

common/ never imports a part by name: it finds parts through common.parts (folders named
part<N>_<topic>) and loads them generically.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root (the folder holding common/)
# The columns every results row carries (common.results.provenance() fills them). Here, not in
# common.results, so that code which must not import torch (common.coldstart's parent) can name them.
PROVENANCE = ("gpu", "torch", "triton", "commit", "date", "command")
