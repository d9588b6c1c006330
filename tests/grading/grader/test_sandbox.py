"""gpucourse.grading.grader.sandbox: what a graded kernel can reach, and that nothing it started survives.

Plain Python cells (no TensorFlow) in a real graded kernel (:class:`.session.KernelSession`). The kernel reports
what it saw by raising it: the sandbox lets it write nowhere the test could read.
"""

import ast
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

from gpucourse.grading.grader import sandbox
from gpucourse.grading.grader.course_copy import make_copy
from gpucourse.grading.grader.session import KernelSession, Listener, kernel_env

ROOT = Path(__file__).resolve().parents[3]
BWRAP = sandbox.probe("bubblewrap")

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
import glob, os, socket
import gpucourse
package = os.path.dirname(gpucourse.__file__)
seen = {{"uid": os.getuid(), "package": package,
        "labtests in the package": os.path.exists(os.path.join(package, "labtests")),
        "grader in the package": os.path.exists(os.path.join(package, "grading", "grader")),
        "repository files": sorted(p for p in os.listdir(os.path.dirname(package)) if p != "utils")
                            if os.path.isdir(os.path.dirname(package)) else "absent"}}
for name, path in {paths!r}.items():
    seen[name] = os.path.exists(path)
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    seen["internet socket"] = "made"
except OSError as exc:
    seen["internet socket"] = exc.errno
cmds = []
for p in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        cmds.append(open(p, "rb").read().decode(errors="replace"))
    except OSError:
        pass
seen["grader visible"] = {grader_cmd!r} in cmds
raise RuntimeError(repr(seen))
"""


def _run(cells: list[str], lab: str = "01", furnish: bool = True):
    """Run ``cells`` in a graded kernel of ``lab`` (its course copy), kill it; the session afterwards.
    ``furnish``: the kernel's home gets what the runner puts there (:func:`sandbox.furnish_home`)."""
    workdir = Path(tempfile.mkdtemp(prefix="gpucourse-test-sandbox-"))
    copy = make_copy(lab)
    box = sandbox.choose(workdir, copy)
    listener = Listener(workdir, box.uid)
    env = kernel_env({sandbox.TOKEN_ENV: box.token, "HOME": str(workdir), "IPYTHONDIR": str(workdir / ".ipy")})
    if furnish:
        env.update(sandbox.furnish_home(workdir, box.uid))
    if not box.allow_list:
        env["PYTHONPATH"] = str(copy)
    session = KernelSession(workdir, box, listener, env, [(f"cell {i}", c) for i, c in enumerate(cells, 1)], 120)
    try:
        session.start()
    finally:
        session.kill()
        listener.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return session


#: What Matplotlib does in a graded kernel when TensorFlow imports Keras and with it pyplot: read its font list, or
#: scan the system's fonts again (INFO "generated new fontManager").
FONTS = """
import io, logging, os
log = io.StringIO()
logger = logging.getLogger("matplotlib.font_manager")
logger.addHandler(logging.StreamHandler(log))
logger.setLevel(logging.INFO)
import matplotlib
from matplotlib import font_manager
raise RuntimeError(repr({"rescanned": "generated new fontManager" in log.getvalue(), "home": os.environ["HOME"],
                         "cache": matplotlib.get_cachedir(), "fonts": len(font_manager.fontManager.ttflist)}))
"""


def _sleepers(marker: str) -> list:
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["cmdline"] == ["sleep", marker] and p.info["status"] != psutil.STATUS_ZOMBIE]


@pytest.mark.skipif(bool(BWRAP), reason=BWRAP or "-")
def test_the_kernel_sees_only_the_allow_list_and_nothing_outlives_it(tmp_path):
    other = tmp_path / "another-checkout" / "utils" / "labtests"
    other.mkdir(parents=True)
    (other / "lab03.py").write_text("ANSWER = 42\n")
    paths = {"another checkout": str(other / "lab03.py"), "the real tests": str(ROOT / "utils" / "labtests" / "lab03.py"),
             "the repository": str(ROOT / "README.md"), "home": os.path.expanduser("~/.config")}
    marker = f"301.{os.getpid()}2"
    grader_cmd = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().decode(errors="replace")
    session = _run([DAEMON.format(marker=marker), PROBE.format(paths=paths, grader_cmd=grader_cmd)])
    seen = ast.literal_eval(session.run.cell_errors[-1]["evalue"])
    assert session.box.allow_list and session.box.describe().startswith("bubblewrap:"), session.box.describe()
    assert not any(seen[name] for name in paths), seen  # none of them exists for the kernel
    assert seen["labtests in the package"] is False and seen["grader in the package"] is False, seen
    assert seen["repository files"] in ("absent", [], [".venv"]), seen  # only the environment, if it lives there
    assert seen["internet socket"] == 97, seen  # EAFNOSUPPORT: the seccomp filter
    assert seen["grader visible"] is False, seen
    if os.geteuid() == 0:
        assert seen["uid"] >= sandbox.UID_BASE and "a dedicated uid" in session.box.note
    assert session.seccomp
    assert not _sleepers(marker), "a double-forked daemon outlived the sandbox"
    assert any(f"sleep {marker}" in p for p in session.left_running), session.left_running


def test_without_isolation_the_grader_says_so_and_still_kills_a_daemon(monkeypatch):
    monkeypatch.setenv("GPUCOURSE_SANDBOX", "none")  # a machine with neither root nor user namespaces
    marker = f"302.{os.getpid()}3"
    session = _run([DAEMON.format(marker=marker), "import gpucourse\nraise RuntimeError(gpucourse.__file__)"])
    assert session.box.describe().startswith("none: no sandbox (GPUCOURSE_SANDBOX=none)"), session.box.describe()
    assert not session.box.allow_list
    # the copy comes first on the import path (the original package stays readable: a practice grade)
    assert session.run.cell_errors[-1]["evalue"].startswith(str(make_copy("01"))), session.run.cell_errors
    assert not _sleepers(marker), "a double-forked daemon without the run's token escaped the fallback"
    assert any(f"sleep {marker}" in p for p in session.left_running), session.left_running


def test_a_bad_sandbox_setting_names_the_choices(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUCOURSE_SANDBOX", "docker")
    with pytest.raises(ValueError, match="GPUCOURSE_SANDBOX must be one of none, user, bubblewrap, got 'docker'"):
        sandbox.choose(tmp_path)


def test_a_python_in_a_closed_folder_is_mounted_back(tmp_path):
    closed = tmp_path / "home"
    (closed / "py" / "lib").mkdir(parents=True)
    os.chmod(closed, 0o700)
    args = sandbox._expose([closed / "py" / "lib"])
    top = args[args.index("--tmpfs") + 1]  # the highest folder others cannot enter (pytest's tmp folder is one too)
    assert (closed / "py").is_relative_to(top) and args[args.index("--tmpfs") - 2:args.index("--tmpfs")] == [
        "--perms", "0755"]
    assert args[-3:] == ["--ro-bind", str(closed / "py" / "lib"), str(closed / "py" / "lib")]
    assert ["--perms", "0755", "--dir", str(closed / "py")] == args[-7:-3]


def test_the_allow_list_mounts_no_folder_it_does_not_need(tmp_path):
    args = sandbox._bwrap_args(tmp_path, (tmp_path / "copy", sandbox.package_folder()))
    mounted = {args[i + 2] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")}
    assert "/" not in mounted and "/tmp" not in mounted and "/root" not in mounted
    assert str(sandbox.package_folder()) in mounted and str(tmp_path) in mounted
    assert "--unshare-net" in args


@pytest.mark.parametrize("furnished", [True, False], ids=["furnished", "empty home"])
def test_a_kernels_home_holds_the_font_list_so_matplotlib_scans_no_fonts(furnished):
    seen = ast.literal_eval(_run([FONTS], furnish=furnished).run.cell_errors[-1]["evalue"])
    assert seen["cache"].startswith(seen["home"]), seen  # the kernel's own home, writable, not a temporary folder
    assert seen["rescanned"] is not furnished, seen  # an empty home (the control) makes it scan the fonts
    assert seen["fonts"] > 0, seen
