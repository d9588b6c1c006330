"""Shared fixtures and collection rules for the course's own tests (the notebooks are tested by nbval, or by the
browser test's live run with nbval's comparison: :func:`_run_once`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# As the Makefile and the setup cell do: CPU allocator statistics on every CPU (see gpucourse.colab.setup).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


#: Fixture notebooks are data for the tests that read them (the similarity batch, the i18n drift test), not
#: notebooks to run: nbval would start a kernel for each, and check nothing a test does not already check.
#: (fnmatch's * crosses folders: "*/fixtures/" is every fixtures folder below tests/, e.g. grading/grader/fixtures/.)
collect_ignore_glob = ["fixtures/**/*.ipynb", "*/fixtures/**/*.ipynb"]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def run_python(code: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a fresh TensorFlow runtime) and return the finished process."""
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full)


@pytest.fixture
def fresh_python():
    """Run code in a fresh Python process; asserts it exits 0 and returns its stdout."""
    def run(code: str, env: dict | None = None, timeout: float = 180) -> str:
        proc = run_python(code, env, timeout)
        assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-3000:]}"
        return proc.stdout
    return run


def _gpu_count() -> int:
    from gpucourse.devices import nvml_gpus

    return len(nvml_gpus())


#: The files that take longest, in the order to start them: with two workers, longest first leaves no core
#: idle at the end (the Makefile passes --no-loadscope-reorder, so xdist keeps this order; its own order,
#: by number of tests, started the 9-tutorial browser run late). Within a group, and for every other file,
#: collection order.
LONGEST_FIRST = ("tests/test_browser.py", "tests/test_slurm_real.py", "notebooks/", "tests/labtests/test_item_fixtures",
                 "tests/grading/grader/test_grade_", "tests/grading/grader/test_attacks")


def _start_rank(item) -> int:
    path = item.nodeid.split("::")[0]
    return next((rank for rank, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST))


def _run_once(config, items) -> None:
    """A tutorial is executed once per run: when the browser test runs it live and compares its checked cells
    (``tests/test_browser.py::test_tutorial_checked_outputs``, with nbval's own comparison), nbval's items for
    that tutorial are deselected. Without a browser (outside CI) nbval runs it as before."""
    compared = {i.callspec.params["path"].name for i in items
                if i.nodeid.startswith("tests/test_browser.py::test_tutorial_checked_outputs[")}
    if not compared:
        return
    from tests.browser_tools import can_run

    if not can_run():
        return
    files = {f"notebooks/{name}" for name in compared}
    again = [i for i in items if i.nodeid.split("::")[0] in files]
    if again:
        drop = set(again)
        items[:] = [i for i in items if i not in drop]
        config.hook.pytest_deselected(items=again)


@pytest.hookimpl(trylast=True)  # after -m/-k have deselected: only what really runs counts
def pytest_collection_modifyitems(config, items):
    """A tutorial runs once (:func:`_run_once`). Longest files first (:data:`LONGEST_FIRST`). Tests marked
    ``gpu`` skip cleanly without a GPU; with GPUCOURSE_REQUIRE_GPU=1 (the GPU CI job) they fail."""
    _run_once(config, items)
    items[:] = sorted(items, key=_start_rank)  # stable
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items or _gpu_count() or os.environ.get("GPUCOURSE_REQUIRE_GPU") == "1":
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible)")
    for item in gpu_items:
        item.add_marker(skip)


def pytest_runtest_setup(item):
    """On the GPU CI job a GPU test must never pass or skip for lack of a GPU."""
    if item.get_closest_marker("gpu") and os.environ.get("GPUCOURSE_REQUIRE_GPU") == "1" and not _gpu_count():
        pytest.fail("GPUCOURSE_REQUIRE_GPU=1 but no NVIDIA GPU is visible on this runner")
