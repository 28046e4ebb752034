"""Every part's walkthrough.py runs top to bottom (on a CPU: under the interpreter)."""

import os
import subprocess
import sys

from common import parts


def test_walkthrough_runs(part):
    script = parts.path(part).parent / "walkthrough.py"
    assert script.exists(), f"{script} is missing"
    result = subprocess.run([sys.executable, str(script)], cwd=parts.ROOT, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, MPLBACKEND="Agg"))  # fmt: skip
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
