"""One suite for every part. `pytest --part 1` (or `make test PART=1`) runs part 1's own tests:
those that take the `part` or `exercise` fixture for part 1, and the files named for it
(test_part1_*.py, test_ideas_part1.py). The house's tests (the READMEs, the report, the harness,
the install) run with `pytest --house` (make test-house); `pytest` alone runs everything."""

import re

import pytest
import torch

from common import parts


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        action="append",
        type=int,
        default=None,
        help="part number to test (repeatable); default: every part whose flash_attention.py exists",
    )
    parser.addoption("--house", action="store_true", help="only the house's tests: READMEs, report, harness, install")


def pytest_configure(config):
    config.addinivalue_line("markers", "only_parts(*numbers): run this test only for these parts")
    config.addinivalue_line("markers", "since_part(n): run this test only for part n and the parts after it")
    config.addinivalue_line("markers", "triton_parts: run this test only for parts whose forward is a Triton kernel")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (full-size shapes, bf16 in Triton parts)")
    config.addinivalue_line("markers", "not_selected: a test of parts not chosen with --part (deselected)")
    chosen = config.getoption("--part")
    if chosen:
        try:
            parts.require(chosen)
        except ValueError as e:  # one line and a non-zero exit, not a traceback per test module
            raise pytest.UsageError(str(e)) from None


def _selected(metafunc):
    selected = metafunc.config.getoption("--part") or parts.available()
    only = metafunc.definition.get_closest_marker("only_parts")
    if only is not None:
        selected = [n for n in selected if n in only.args]
    since = metafunc.definition.get_closest_marker("since_part")
    if since is not None:
        selected = [n for n in selected if n >= since.args[0]]
    if metafunc.definition.get_closest_marker("triton_parts") is not None:
        selected = [n for n in selected if parts.uses_triton(n)]
    return selected


def pytest_generate_tests(metafunc):
    if "part" not in metafunc.fixturenames:
        return
    selected = _selected(metafunc)
    if selected:
        metafunc.parametrize("part", selected, ids=[f"part{n}" for n in selected])
    else:  # a test for parts that were not selected: dropped below, instead of an "empty parameter set" skip
        metafunc.parametrize("part", [pytest.param(None, marks=pytest.mark.not_selected)], ids=["none"])


def _part_of(item):
    """The part a test belongs to (its `part` or `exercise` parameter, or the part its file is
    named for), or None for a test of the house."""
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    if params.get("part") is not None:
        return params["part"]
    if "exercise" in params:
        return params["exercise"].part
    named = re.search(r"part(\d+)", item.path.name)
    return int(named[1]) if named else None


def pytest_collection_modifyitems(config, items):
    chosen, house = config.getoption("--part"), config.getoption("--house")
    if chosen or house:  # a part's own tests, or the house's alone
        keep = (lambda n: n is None) if house else (lambda n: n in chosen)
        others = [item for item in items if not keep(_part_of(item))]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if keep(_part_of(item))]
    dropped = [item for item in items if item.get_closest_marker("not_selected")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("not_selected")]


@pytest.fixture(autouse=True)
def _give_back_gpu_memory():
    """PyTorch's caching allocator keeps what a process's largest test took. With several test
    processes on one GPU (pytest -n 8), give it back after each test so that they all fit."""
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """On a GPU, a failed test's report also says how the GPU's memory stood when it failed (this
    process's allocated and reserved memory, and the whole GPU's free memory): with several test
    processes sharing one GPU, it tells an out-of-memory caused by the others from one of its own."""
    report = yield
    if report.failed and torch.cuda.is_available():
        try:
            free, total = torch.cuda.mem_get_info()
            report.sections.append(
                (
                    "GPU memory",
                    f"this process: {torch.cuda.memory_allocated() / 2**30:.2f} GiB "
                    f"allocated, {torch.cuda.memory_reserved() / 2**30:.2f} GiB reserved; the GPU: "
                    f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free",
                )
            )
        except RuntimeError as e:  # a broken CUDA context cannot even say this
            report.sections.append(("GPU memory", f"unreadable: {e}"))
    return report


def _one_shot_timer(kernel_call, quantiles=None):
    """The autotuner's timer in tests: one warm call timed with CUDA events (the real one runs each
    configuration for about 125 ms). Which configuration wins does not matter to a correctness test."""
    kernel_call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kernel_call()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    return [ms] * len(quantiles) if quantiles else ms


def _one_config_each(prune):
    """Wrap Autotuner.prune_configs so that each new shape class runs one configuration, the next
    one in the (already pruned) list: one compilation instead of one per configuration, and over
    the suite every configuration of every kernel is used (each kernel meets more shape classes
    than it has configurations)."""
    turns = {}

    def one(self, kwargs):
        configs = prune(self, kwargs)
        turn = turns[id(self)] = turns.get(id(self), -1) + 1
        return [configs[turn % len(configs)]]

    return one


@pytest.fixture(autouse=True, scope="session")
def _quick_autotuning():
    """On a GPU, every test process autotunes every shape class it meets: it compiles every
    configuration and times each for about 125 ms, minutes of a GPU test run spent choosing tiles.
    Tests only need configurations that run, and all of them tested: here each shape class gets
    one configuration in turn (above), timed once (Triton 3.6-3.9: Autotuner.do_bench is a cached
    property returning the timer; a class-level property replaces it for every kernel)."""
    if not torch.cuda.is_available():
        yield
        return
    from triton.runtime.autotuner import Autotuner

    original_bench, original_prune = Autotuner.__dict__["do_bench"], Autotuner.prune_configs
    Autotuner.do_bench = property(lambda self: _one_shot_timer)
    Autotuner.prune_configs = _one_config_each(original_prune)
    yield
    Autotuner.do_bench, Autotuner.prune_configs = original_bench, original_prune
