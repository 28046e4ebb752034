"""What every part and a learner use, one floor under the parts:

- the kernels' support: launch (around a Triton launch), library (the torch.library op), validate
  (clear errors on bad input), runtime (GPU or interpreter), triton_tools (the Triton internals we
  reach for), backward (the tiled PyTorch backward of parts 0-3);
- the ground truth and its rule: inputs, reference, check;
- the learner's tools: parts (the registry), steps (the ladders), diff (make diff), exercises and
  counting (make exercise / make check), hf (a part in a Hugging Face model), install.

What measures and publishes (the benchmark, the sweeps, the report) is the lab, in lab/, a floor up:
it imports common and loads parts through the registry; nothing here imports it. common/ never
imports a part by name either: parts.py finds them by folder (part<N>_<topic>) and loads them.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root (the folder holding common/)
# The columns every results row carries (lab.results.provenance() fills them). Here, not in
# lab.results, so that code which must not import torch (lab.coldstart's parent) can name them.
PROVENANCE = ("gpu", "torch", "triton", "commit", "date", "command")
