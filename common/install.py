"""The first install step, before `pip install -e ".[dev]"`: torch's CPU build on a machine without a GPU.

    python -m common.install          # `make install` runs it, then pip install -e ".[dev]"

On Linux, the default package index gives torch's CUDA build (about 5.7 GB in a virtual
environment, .venv); without an NVIDIA GPU it is no use, and the CPU build (about 2.2 GB) runs
everything here. So on Linux without `nvidia-smi`, and only where torch is not installed yet, this
installs a CPU build of torch in the range pyproject.toml asks for, from the first place that has
one, and says which:

1. PyTorch's CPU index (https://download.pytorch.org/whl/cpu), given 15 seconds to answer;
2. the default index, if it lists a CPU build (a version ending in +cpu);

and otherwise stops (exit status 1) with what to do, rather than start a multi-GB download that
nobody asked for. With a GPU, on another system, or with torch already there, it does nothing and
pip takes torch from the default index. TORCH=any skips all of it (accept the default index's torch).
Standard library only: it runs before anything is installed.
"""

import os
import platform
import re
import shutil
import subprocess
import sys

from common import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_spec():
    """The torch requirement in pyproject.toml's dependencies, e.g. 'torch>=2.11,<2.14'."""
    found = re.search(r'"(torch\s*[<>=!~][^";]*)"', (ROOT / "pyproject.toml").read_text())
    if found is None:
        raise SystemExit("pyproject.toml names no torch requirement")
    return found.group(1).replace(" ", "")


def _version(text):
    """'2.13.0+cpu' -> (2, 13, 0): the release numbers, for comparing against the range."""
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def in_range(version, spec):
    """Whether a version such as '2.13.0+cpu' satisfies spec's >=, <, <=, > and == clauses."""
    v = _version(version)
    for op, bound in re.findall(r"(>=|<=|==|<|>)([\d.]+)", spec):
        b = _version(bound)
        n = len(b)
        ok = {">=": v >= b, "<=": v[:n] <= b, "==": v[:n] == b, "<": v[:n] < b, ">": v > b}[op]
        if not ok:
            return False
    return True


def pip(*args, quiet=True):
    cmd = [sys.executable, "-m", "pip", *args]
    return subprocess.run(cmd, capture_output=quiet, text=True)


def cpu_builds_listed(spec):
    """CPU builds of torch the default index lists (`pip index versions torch`), newest first, in range."""
    out = pip("index", "versions", "torch")
    listed = re.search(r"Available versions:\s*(.*)", out.stdout or "")
    versions = [v.strip() for v in listed.group(1).split(",")] if listed else []
    return [v for v in versions if v.endswith("+cpu") and in_range(v, spec)]


def main():
    spec = torch_spec()
    if os.environ.get("TORCH") == "any":
        print("TORCH=any: torch comes from the default index as pip chooses it")
        return 0
    try:
        import torch  # noqa: F401

        print(f"torch {torch.__version__} is already installed: keeping it")
        return 0
    except ImportError:
        pass
    if platform.system() != "Linux" or shutil.which("nvidia-smi"):
        print("torch will come from the default index (a GPU build where there is a GPU)")
        return 0
    print(f"No NVIDIA GPU (no nvidia-smi): installing a CPU build of {spec} (about 2.2 GB installed, not 5.7)")
    print(f"  trying PyTorch's CPU index, {CPU_INDEX} ...", flush=True)
    got = pip("--isolated", "install", "--timeout", "15", "--retries", "0", "--index-url", CPU_INDEX, spec)
    if got.returncode == 0:
        print("  installed torch's CPU build from PyTorch's CPU index")
        return 0
    print("  not reachable; looking for a CPU build on the default index ...", flush=True)
    builds = cpu_builds_listed(spec)
    if builds:
        got = pip("install", f"torch=={builds[0]}", quiet=not os.environ.get("VERBOSE"))
        if got.returncode == 0:
            print(f"  installed torch {builds[0]} from the default index")
            return 0
        print((got.stdout or "")[-2000:] + (got.stderr or "")[-2000:], file=sys.stderr)  # why it failed
    print(
        f"Stopped: no CPU build of {spec} is reachable (PyTorch's CPU index did not answer, and the default "
        "index lists none), and the default index's torch for Linux is the CUDA build, several GB. Either "
        f"install a CPU build yourself (pip install '{spec}' --index-url {CPU_INDEX}, from a machine that "
        "reaches it), then run make install again; or accept the CUDA build: TORCH=any make install.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
