"""The install: what pyproject.toml asks for, what is installed, and what the README claims agree;
and the first install step (common/install.py) picks a CPU build of torch where it should."""

import re
from importlib import metadata

import pytest

from common import ROOT, install

PYPROJECT = (ROOT / "pyproject.toml").read_text()
README = (ROOT / "README.md").read_text()


def spec(name):
    """The version clauses pyproject.toml's dependencies give a package, e.g. '>=2.11,<2.14'."""
    found = re.search(rf'"{name}\s*([<>=!~][^";]*)', PYPROJECT)
    assert found, f"pyproject.toml names no {name} requirement"
    return found.group(1).replace(" ", "")


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_installed_versions_are_in_the_range_pyproject_claims(name):
    """CI checks the range it claims: whatever pip installed here satisfies pyproject.toml."""
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed (Triton ships for Linux only)")
    assert install.in_range(version, spec(name)), f"{name} {version} is outside {spec(name)}"


def test_readme_states_the_range_pyproject_asks_for():
    """The README's install section names the range pyproject.toml asks for, so the two cannot drift."""
    for name in ("torch", "triton"):
        lower, upper = re.fullmatch(r">=([\d.]+),<([\d.]+)", spec(name)).groups()
        assert re.search(rf"{name}\W[^\n]*{re.escape(lower)}[^\n]*{re.escape(upper)}", README, re.I), (
            f"README.md should state {name}'s range {spec(name)}"
        )


def test_torch_spec_is_read_from_pyproject():
    assert install.torch_spec() == "torch" + spec("torch")


@pytest.mark.parametrize(
    "version, inside",
    [("2.13.0+cpu", True), ("2.11.0", True), ("2.10.1", False), ("2.14.1", False), ("2.14.0+cpu", False)],
)
def test_in_range(version, inside):
    assert install.in_range(version, ">=2.11,<2.14") == inside


def test_cpu_builds_are_picked_newest_first_within_the_range(monkeypatch):
    """`pip index versions torch` lists CUDA and CPU builds together; the step takes only +cpu ones
    inside the range, newest first."""
    listed = (
        "torch (2.15.0)\nAvailable versions: 2.15.0, 2.14.1+cpu, 2.14.1, 2.13.0+cpu, 2.13.0, 2.12.0+cpu, 2.10.0+cpu\n"
    )

    class Done:
        stdout = listed

    monkeypatch.setattr(install, "pip", lambda *args, **kwargs: Done())
    assert install.cpu_builds_listed(">=2.11,<2.14") == ["2.13.0+cpu", "2.12.0+cpu"]
