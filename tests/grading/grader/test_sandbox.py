"""gpucourse.grading.grader.sandbox: what a graded kernel can reach, and that nothing it started survives.

Plain Python kernels (no TensorFlow), one per test. The kernel reports what it saw by raising it:
the sandbox lets it write nowhere the test could read.
"""

import ast
import os
from pathlib import Path

import psutil
import pytest

from gpucourse.grading.grader import sandbox
from gpucourse.grading.execute import Cell, run_cells

#: A double fork into a new session that also drops its environment (and with it the run's token).
DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve("/bin/sleep", ["sleep", {marker!r}], {{}})
    os._exit(0)
time.sleep(0.3)
"""

PROBE = """
import glob, os
seen = {{"uid": os.getuid()}}
try:
    open({out!r} + "/gradebook.json", "w").write("[]")
    seen["wrote out"] = True
except OSError as exc:
    seen["wrote out"] = type(exc).__name__
seen["hidden"] = open({hidden!r}).read()[:40] if os.path.exists({hidden!r}) else "absent"
seen["test file"] = open({labtest!r}).read()[:40]
cmds = []
for p in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        cmds.append(open(p, "rb").read().decode(errors="replace"))
    except OSError:
        pass
seen["grader visible"] = {grader_cmd!r} in cmds  # the grader's own command line (bwrap's names tmp paths)
raise RuntimeError(repr(seen))
"""


def _sleepers(marker: str) -> list:
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["cmdline"] == ["sleep", marker] and p.info["status"] != psutil.STATUS_ZOMBIE]


@pytest.mark.skipif(bool(sandbox.probe("bubblewrap")), reason=sandbox.probe("bubblewrap") or "-")
def test_the_sandbox_hides_the_tests_and_output_and_nothing_outlives_it(tmp_path):
    out, hidden = tmp_path / "out", tmp_path / "hidden_lab01.py"
    out.mkdir()
    hidden.write_text("SECRET = 1\n")
    marker = f"301.{os.getpid()}2"
    labtest = str(sandbox._LABTESTS / "lab01.py")
    grader_cmd = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().decode(errors="replace")
    cells = [Cell("cell 1", DAEMON.format(marker=marker), submission=True),
             Cell("cell 2", PROBE.format(out=str(out), hidden=str(hidden), labtest=labtest, grader_cmd=grader_cmd),
                  submission=True)]
    run = run_cells(cells, timeout=120, hide=[str(hidden), str(out)])
    assert run.status == "ok" and run.isolation.startswith("bubblewrap:"), (run.reason, run.isolation)
    seen = ast.literal_eval(run.cell_errors[-1]["evalue"])
    assert seen["wrote out"] in ("OSError", "PermissionError", "FileNotFoundError"), seen  # hidden or read-only
    assert "SECRET" not in seen["hidden"] and "@item" not in seen["test file"], seen
    assert seen["grader visible"] is False, seen
    if os.geteuid() == 0:
        assert seen["uid"] >= sandbox.UID_BASE and "a dedicated uid" in run.isolation
    assert list(out.iterdir()) == []
    assert not _sleepers(marker), "a double-forked daemon outlived the sandbox"
    assert any(f"sleep {marker}" in p for p in run.left_running), run.left_running


def test_without_isolation_the_grader_says_so_and_still_kills_a_daemon(monkeypatch):
    monkeypatch.setenv("GPUCOURSE_SANDBOX", "none")  # a machine with neither root nor user namespaces
    marker = f"302.{os.getpid()}3"
    run = run_cells([Cell("cell 1", DAEMON.format(marker=marker), submission=True)], timeout=120)
    assert run.status == "ok", run.reason
    assert run.isolation.startswith("none: no sandbox (GPUCOURSE_SANDBOX=none)"), run.isolation
    assert not _sleepers(marker), "a double-forked daemon without the run's token escaped the fallback"
    assert any(f"sleep {marker}" in p for p in run.left_running), run.left_running


def test_a_bad_sandbox_setting_names_the_choices(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUCOURSE_SANDBOX", "docker")
    with pytest.raises(ValueError, match="GPUCOURSE_SANDBOX must be one of none, user, bubblewrap, got 'docker'"):
        sandbox.choose(tmp_path)


def test_a_python_in_a_closed_folder_is_mounted_back(tmp_path):
    closed = tmp_path / "home"
    (closed / "py" / "lib").mkdir(parents=True)
    os.chmod(closed, 0o700)
    args = sandbox._expose([closed / "py" / "lib"])
    top = args[1]  # the highest folder others cannot enter (pytest's own tmp folder is one too)
    assert args[0] == "--tmpfs" and (closed / "py").is_relative_to(top)
    assert args[-3:] == ["--ro-bind", str(closed / "py" / "lib"), str(closed / "py" / "lib")]
    assert ["--perms", "0755", "--dir", str(closed / "py")] == args[-7:-3]


def test_an_output_folder_holding_the_course_is_left_visible_read_only(tmp_path):
    args = sandbox._bwrap_args(tmp_path, hide=[str(sandbox._LABTESTS.parent.parent), str(sandbox._LABTESTS)])
    covered = [args[i + 2] for i, a in enumerate(args) if a == "--ro-bind" and "gpucourse-stubs-" in args[i + 1]]
    assert str(sandbox._LABTESTS.parent.parent) not in covered  # the kernel could not import the course
    assert str(sandbox._LABTESTS) in covered and str(sandbox._LABTESTS / "lab01.py") in covered
