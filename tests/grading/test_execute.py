"""gpucourse.grading.execute: one fresh kernel per run, errors recorded, a time limit, nothing left running.

Plain Python kernels (no TensorFlow), so each run costs a kernel start only.
"""

import os
import time

import psutil

from gpucourse.grading.execute import Cell, kernel_env, run_cells


def test_kernel_env_is_the_setup_cells_environment_without_user_site(monkeypatch):
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    env = kernel_env({"EXTRA": "1"})
    assert env["GPUCOURSE_GRADING"] == "1" and env["PYTHONNOUSERSITE"] == "1" and env["MPLBACKEND"] == "Agg"
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "1" and env["EXTRA"] == "1" and "PYTEST_CURRENT_TEST" not in env


def _sleepers(marker: str) -> list:
    """Processes still running ``sleep <marker>`` (zombies aside)."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == ["sleep", marker] and proc.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(proc.pid)
    return out


def test_errors_are_recorded_later_cells_still_run_and_children_are_killed():
    marker = f"300.{os.getpid()}1"  # a command line no other process has
    cells = [Cell("grader setup", "import os\nassert os.environ['GPUCOURSE_GRADING'] == '1'"),
             Cell("cell 2", "raise ValueError('boom')", submission=True),
             Cell("cell 3", f"import subprocess\np = subprocess.Popen(['sleep', {marker!r}], start_new_session=True)",
                  submission=True),
             Cell("grader checks", "raise ZeroDivisionError(os.getcwd())")]
    run = run_cells(cells, timeout=120)
    assert run.status == "ok", run.reason
    assert run.cell_errors == [{"cell": "2", "ename": "ValueError", "evalue": "boom"}]
    assert run.errors["grader checks"].startswith("ZeroDivisionError: ")
    assert {"kernel start", "grader setup", "submission", "grader checks"} <= set(run.timings)
    workdir = run.errors["grader checks"].split(": ", 1)[1]
    assert not os.path.exists(workdir), "the kernel's fresh folder is removed"
    assert not _sleepers(marker), "a process the submission started in a new session outlived the kernel"
    assert any(f"sleep {marker}" in p for p in run.left_running), run.left_running


def test_the_time_limit_stops_an_endless_loop():
    t0 = time.monotonic()
    endless = "import time\nwhile True:\n    time.sleep(0.05)"  # endless, without burning a core for 8 s
    run = run_cells([Cell("cell 1", "x = 1", submission=True), Cell("cell 2", endless, submission=True)],
                    timeout=8, grace_s=0.1)
    assert run.status == "timeout" and run.last_cell == "cell 2", run
    assert "cell 2 was still running when the 8 s time limit ran out" in run.reason
    assert time.monotonic() - t0 < 60
