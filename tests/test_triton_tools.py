"""common/triton_tools.py's lean launch: which compiled launchers c_launch calls directly (Triton
3.6's C launch function, and only where nothing else needs the Python wrapper), checked on stand-ins
for the launcher, so it runs without a GPU too. tests/test_launch.py runs the launch itself."""

# Without a GPU, common.runtime switches on Triton's interpreter, which must happen before triton loads.
from common import triton_tools  # noqa: I001
import pytest
import triton


class _Launcher:
    """Stands in for Triton 3.6's CudaLauncher: a C `launch` (any builtin) and its metadata."""

    def __init__(self, launch=len, profile_scratch_size=0, launch_pdl=False):
        self.launch, self.profile_scratch_size, self.launch_pdl = launch, profile_scratch_size, launch_pdl


@pytest.fixture
def triton_36(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.6.0")


def test_c_launch_takes_a_plain_36_launcher(triton_36):
    assert triton_tools.c_launch(_Launcher()) is len


@pytest.mark.parametrize(
    "launcher",
    [
        _Launcher(launch=lambda *args: None),  # host-side descriptors: a Python wrapper builds them
        _Launcher(profile_scratch_size=64),  # a profiler's instrumentation needs its own scratch
        _Launcher(launch_pdl=True),  # may start before the kernel ahead of it ends: no shared scratch
    ],
    ids=["python-wrapper", "profile-scratch", "pdl"],
)
def test_c_launch_refuses_what_needs_the_wrapper(triton_36, launcher):
    assert triton_tools.c_launch(launcher) is None


@pytest.mark.parametrize("version", ["3.5.1", "3.8.0", "3.9.0"])
def test_c_launch_only_on_36(monkeypatch, version):
    # 3.9's C launch takes its arguments in another order: a direct call there would launch garbage
    monkeypatch.setattr(triton, "__version__", version)
    assert triton_tools.c_launch(_Launcher()) is None
