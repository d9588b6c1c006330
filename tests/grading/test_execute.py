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


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_errors_are_recorded_later_cells_still_run_and_children_are_killed(tmp_path):
    pid_file, after = tmp_path / "pid", tmp_path / "after"
    cells = [Cell("grader setup", "import os\nassert os.environ['GPUCOURSE_GRADING'] == '1'"),
             Cell("cell 2", "raise ValueError('boom')", submission=True),
             Cell("cell 3", "import subprocess\np = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                            f"open({str(pid_file)!r}, 'w').write(str(p.pid))", submission=True),
             Cell("grader checks", f"open({str(after)!r}, 'w').write(os.getcwd())\n1 / 0")]
    run = run_cells(cells, timeout=120)
    assert run.status == "ok", run.reason
    assert run.cell_errors == [{"cell": "2", "ename": "ValueError", "evalue": "boom"}]
    assert run.errors == {"grader checks": "ZeroDivisionError: division by zero"}
    assert {"kernel start", "grader setup", "submission", "grader checks"} <= set(run.timings)
    workdir = after.read_text()
    assert not os.path.exists(workdir), "the kernel's fresh folder is removed"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), "a process the submission started in a new session outlived the kernel"


def test_the_time_limit_stops_an_endless_loop():
    t0 = time.monotonic()
    endless = "import time\nwhile True:\n    time.sleep(0.05)"  # endless, without burning a core for 8 s
    run = run_cells([Cell("cell 1", "x = 1", submission=True), Cell("cell 2", endless, submission=True)],
                    timeout=8, grace_s=0.1)
    assert run.status == "timeout" and run.last_cell == "cell 2", run
    assert "cell 2 was still running when the 8 s time limit ran out" in run.reason
    assert time.monotonic() - t0 < 60
