"""Every part's walkthrough.py runs top to bottom as a module from the repository root (on a CPU:
under the interpreter), and converts to a notebook that executes, as `make notebook PART=N RUN=1` does."""

import json
import os
import subprocess
import sys

import pytest

from common import ROOT, parts


def _run(args, **kwargs):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)


def _failed(what, result):
    return f"{what} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_walkthrough_runs(part):
    """`python -m <part folder>.walkthrough`, in a fresh process."""
    folder = parts.folder(part)
    assert (folder / "walkthrough.py").exists(), f"{folder.name}/walkthrough.py is missing"
    module = f"{folder.name}.walkthrough"
    result = _run([sys.executable, "-m", module], env=dict(os.environ, MPLBACKEND="Agg"))
    assert result.returncode == 0, _failed(f"python -m {module}", result)


def test_walkthrough_notebook_executes(part, tmp_path):
    """The Makefile's notebook command with RUN=1, written to a temporary file: the notebook gets the
    standard python3 kernelspec, every code cell runs (from the repository root) without an error."""
    reason = "converting and running notebooks needs jupytext, nbconvert and ipykernel (pip install -e '.[dev]')"
    for module in ("jupytext", "nbconvert", "ipykernel"):
        pytest.importorskip(module, reason=reason)
    script = parts.folder(part) / "walkthrough.py"
    notebook = tmp_path / "walkthrough.ipynb"
    command = [sys.executable, "-m", "jupytext", "--to", "ipynb", "--set-kernel", "python3"]
    command += ["--execute", "--run-path", str(ROOT), "--output", str(notebook), str(script)]
    result = _run(command)
    assert result.returncode == 0, _failed(f"executing {script.relative_to(ROOT)} as a notebook", result)

    nb = json.loads(notebook.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert cells and all(c["execution_count"] for c in cells), "a code cell did not run"
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, errors
    assert any(c["outputs"] for c in cells), "no cell printed anything"
