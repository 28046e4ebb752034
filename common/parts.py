"""The registry: part number -> that part's package, found by folder name (part<N>_<topic>).

Parts never import each other; everything that compares parts (tests, benchmark, report, diff)
goes through here. Finding parts needs only the standard library (`make diff` uses it without
torch); loading one imports common.runtime first, so a machine without a GPU runs the Triton
parts under the interpreter.

What common/ reads of a part is its interface, in its flash_attention.py, and nothing else:

- FlashAttention (the autograd.Function), flash_attention (the same as a torch.library op),
  flash_forward(Q, K, V, is_causal) -> (O, L), flash_backward(Q, K, V, O, L, dO, is_causal);
- its backward: either common.backward.flash_backward, imported (parts 0-3: the tiled PyTorch
  backward), or kernels of its own (pytorch_backward() below tells which);
- what forward_config() below reads: its forward kernel, _attn_fwd (@triton.autotune'd from part 2
  on), and, where a part routes calls to other kernels (part 5), _last_forward["label"].
"""

import importlib
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

from common import ROOT

PATTERN = re.compile(r"part(\d+)_\w+")


def folders():
    """{part number: folder} for every part<N>_<topic> folder, in order (planned parts included)."""
    found = {int(m.group(1)): p for p in ROOT.iterdir() if p.is_dir() and (m := PATTERN.fullmatch(p.name))}
    return dict(sorted(found.items()))


def folder(n):
    """Part n's folder. ValueError naming the parts that exist if there is none."""
    if n not in folders():
        raise ValueError(f"there is no part {n}; the part folders are {list(folders())}")
    return folders()[n]


def path(n):
    """Part n's kernel file, flash_attention.py (it may not exist yet for a planned part)."""
    return folder(n) / "flash_attention.py"


def available():
    """Part numbers whose flash_attention.py exists, in order."""
    return [n for n, f in folders().items() if (f / "flash_attention.py").exists()]


def uses_triton(n):
    """Whether part n's forward is a Triton kernel (its kernel file imports triton)."""
    return re.search(r"^import triton", path(n).read_text(), re.M) is not None


def require(numbers):
    """The part numbers, checked: one clear line naming what exists if one has no kernel yet."""
    missing = [n for n in numbers if n not in available()]
    if missing:
        planned = [n for n in missing if n in folders()]
        what = "has no kernel yet (its README says what is coming)" if planned else "does not exist"
        raise ValueError(f"part {', '.join(map(str, missing))} {what}; parts with a kernel: {available()}")
    return list(numbers)


def pytorch_backward(module):
    """Whether a loaded part's backward is the tiled PyTorch one that parts 0-3 share (common/backward.py)."""
    from common import backward

    return module.flash_backward is backward.flash_backward


def forward_config(module):
    """What a loaded part's last forward ran, as the benchmark's tables name it: the label its routing
    left (part 5's Gluon kernels: "gluon 2x64x128 s2"), else what the autotuner chose for its
    _attn_fwd ("128x64 w4 s3"); "" for a part whose forward is not autotuned, or not called yet."""
    label = (getattr(module, "_last_forward", None) or {}).get("label")
    if label or not hasattr(module, "_attn_fwd"):
        return label or ""
    from common import triton_tools  # here, not at the top: finding parts needs only the standard library

    return triton_tools.chosen_label(module._attn_fwd)


EXERCISE = "FLASH_ATTENTION_EXERCISE"  # "<part>=<path>": a learner's file graded in that part's place


def exercise_file(n):
    """The learner's file being graded in part n's place (common.exercises sets EXERCISE), or None."""
    part, _, file = os.environ.get(EXERCISE, "").partition("=")
    return Path(file) if file and part.strip() == str(n) else None


def load(n):
    """Import part n's flash_attention module (once; Python caches it) and return it; while an
    exercise on it is graded, the learner's flash_attention.py instead (common.exercises)."""
    require([n])
    import common.runtime  # noqa: F401  (TRITON_INTERPRET is set before the part imports triton)

    mine = exercise_file(n)
    if mine is not None and mine.name == "flash_attention.py":
        name = f"part{n}_exercise"
        return sys.modules[name] if name in sys.modules else load_source(name, mine.read_text())
    return importlib.import_module(f"{folder(n).name}.flash_attention")


_SOURCES = []  # the temporary folder load_source writes into, made once and removed at exit


def load_source(name, source):
    """Import `source`, the text of a kernel file (a part's, changed on purpose: a test's mutation,
    an ablation step, a variant: common.steps.load_variant), as a module called `name`. Its
    torch.library ops register under that name, so it never collides with the part it came from.
    The file lies in one temporary folder per process, removed when the process exits."""
    import common.runtime  # noqa: F401  (TRITON_INTERPRET is set before the source imports triton)

    if not _SOURCES:
        _SOURCES.append(tempfile.TemporaryDirectory(prefix="flash-attention-sources-"))
    path = Path(_SOURCES[0].name) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
