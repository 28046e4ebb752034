"""One suite for every part. `pytest --part 1` (or `make test PART=1`) tests part 1 only;
without --part every part that exists is tested."""

import pytest

from common import parts


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        action="append",
        type=int,
        default=None,
        help="part number to test (repeatable); default: every part whose flash_attention.py exists",
    )


def _selected(config):
    chosen = config.getoption("--part")
    if chosen is None:
        return parts.available()
    missing = [n for n in chosen if n not in parts.available()]
    if missing:
        raise pytest.UsageError(f"part(s) {missing} do not exist yet; available: {parts.available()}")
    return chosen


def pytest_configure(config):
    config.addinivalue_line("markers", "only_parts(*numbers): run this test only for these parts")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (full-size shapes, bf16 in Triton parts)")


def pytest_generate_tests(metafunc):
    if "part" not in metafunc.fixturenames:
        return
    selected = _selected(metafunc.config)
    marker = metafunc.definition.get_closest_marker("only_parts")
    if marker is not None:
        selected = [n for n in selected if n in marker.args]
    metafunc.parametrize("part", selected, ids=[f"part{n}" for n in selected])
