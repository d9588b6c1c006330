"""Run a graded kernel as an unprivileged user in a sandbox, and kill every process it started.

:func:`choose` picks the strongest isolation this machine offers, once per process (``probe``):

* ``bubblewrap``: the kernel runs under ``bwrap`` (Debian's ``bubblewrap``) in new user, PID, IPC,
  UTS, network and mount namespaces with every capability dropped. It sees an allow-list
  (:func:`_bwrap_args`): the system's programs and libraries, the Python installation and the
  environment's packages, read-only; the generated copy of the course package (without its tests,
  its answer-bearing helpers disabled: :mod:`.course_copy`) mounted where the package lives; a fresh
  empty ``/tmp``; and its own scratch folder, the only writable one, which holds the grader's socket and
  is its home (with a copy of Matplotlib's font list: :func:`furnish_home`).
  No other checkout, home folder, output folder, hidden test or grading key exists for it, and it has
  no network (it talks to Jupyter and the grader over Unix sockets). ``/proc`` shows
  only the sandbox's own processes, so the grader's command line, working folder and open files
  cannot be read. When the grader runs as root, ``setpriv`` (util-linux) first drops to a
  dedicated uid that owns nothing else on the machine (a fresh one per kernel).
  ``--die-with-parent`` and the PID namespace make the whole sandbox die with its first process:
  whatever session or process group a child made for itself.
* ``user``: root without a working ``bwrap`` (a container that forbids namespaces): ``setpriv``
  to a dedicated uid only. Files are protected by their permissions alone (the grader makes its
  own unreadable to others), ``/proc`` is shared; every process of that uid is killed at the end.
* ``none``: not root and no user namespaces: the kernel runs as the grader's user, with no
  sandbox. It is still killed by process group, the grader becomes a *child subreaper*
  (``PR_SET_CHILD_SUBREAPER``: a child that double-forks or calls ``setsid`` stays in the grader's
  process tree), and every process whose environment carries the run's token is killed too.
  The gradebook's ``isolation`` column says so.

At every level the kernel's launcher also installs a seccomp filter (:mod:`.seccomp`). Only
``bubblewrap`` (or a per-submission container, see :mod:`.runner`) makes a mark *summative*.
``GPUCOURSE_SANDBOX=none|user|bubblewrap`` asks for at most that level (tests use it to simulate a
machine without isolation). :func:`sweep` kills everything of one run and says what the
submission had left running; the grader writes results only after it returned.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LEVELS", "SYSTEM", "TOKEN_ENV", "Sandbox", "choose", "furnish_home", "package_folder", "probe", "started",
           "sweep"]

LEVELS = ("none", "user", "bubblewrap")
TOKEN_ENV = "GPUCOURSE_RUN_TOKEN"
#: Dedicated uids for kernels (root only): a fresh one per kernel, owning no file and no process.
UID_BASE, UID_SPAN = 3_900_000, 100_000
_PROBED: dict[tuple, str] = {}
_STUBS: Path | None = None


@dataclass
class Sandbox:
    """How one kernel runs: ``prefix`` goes in front of its command line."""

    level: str
    note: str  # for the gradebook's isolation column
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    uid: int | None = None
    prefix: list = field(default_factory=list)
    started: float = field(default_factory=lambda: _now())  # on psutil's clock of process start times
    allow_list: bool = False  # the kernel sees only what it needs (bubblewrap's mounts): see _bwrap_args

    def describe(self) -> str:
        return f"{self.level}: {self.note}"


def _now() -> float:
    """Now, as psutil dates a process's start (boot time, whole seconds, + time since boot): comparable
    with ``create_time()`` to the clock tick, where ``time.time()`` may be up to a second off."""
    import psutil

    return psutil.boot_time() + time.clock_gettime(time.CLOCK_BOOTTIME) - 0.05


#: System folders a kernel needs (read-only): programs, libraries, configuration, fonts, the CPU's description.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")


def _bwrap_args(workdir: Path, course: tuple | None = None, hide=(), uid: int | None = None) -> list[str]:
    """bwrap's options: an allow-list of what the kernel sees, no network, the course copy over the course.

    The kernel sees the system folders (:data:`SYSTEM`), the Python installation and the environment's
    packages (read-only), ``course`` = ``(copy, package folder)``: the generated copy of the course package
    mounted where the package lives, and its own scratch folder ``workdir`` (writable); a fresh ``/tmp``,
    ``/dev`` and its own ``/proc``. Nothing else exists for it: no other checkout, home folder, output
    folder, hidden test or grading key. ``hide`` covers anything inside those that it still must not read.

    As root (``uid`` given) bwrap itself sets up the namespaces, keeps only the two capabilities ``setpriv``
    needs to become ``uid``, and setpriv drops them with root; otherwise bwrap makes a user namespace.
    """
    args = ["bwrap"] + ([] if uid is not None else ["--unshare-user"])
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if uid is not None:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for folder in SYSTEM:
        if Path(folder).exists():
            args += ["--ro-bind", folder, folder] if not Path(folder).is_symlink() else \
                ["--symlink", os.readlink(folder), folder]
    args += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
             "--perms", "1777", "--tmpfs", "/dev/shm"]
    needed = [p for p in _needed() if not any(_under(p, Path(f)) for f in SYSTEM)]
    made: set = set()
    args += _expose(needed, made)
    if course is not None:
        copy, target = course
        args += _folders_above(Path(target), made) + ["--ro-bind", str(copy), str(target)]
    args += _folders_above(Path(workdir), made) + ["--bind", str(workdir), str(workdir)]
    stubs = _stub_dir()
    for p in hide:
        p = Path(p)
        if p.exists() and any(_under(p, n) for n in needed):
            args += ["--ro-bind", str(stubs / ("empty" if p.is_dir() else "test.py")), str(p)]
    # the kernel's parent is the sandbox's init (pid 1): ipykernel must not take that for its parent's death
    # (--die-with-parent ends the sandbox when the grader goes)
    return args + ["--setenv", "JPY_PARENT_PID", "1", "--chdir", str(workdir), "--"] + (_setpriv(uid) if uid is not None else [])


def _needed() -> list[Path]:
    """What the kernel must read besides the system: the interpreter's installation and the environment."""
    exe = Path(os.path.realpath(sys.executable))
    found = []
    for p in (sys.base_prefix, sys.prefix, exe.parent.parent):
        p = Path(os.path.realpath(p))
        if p not in found:
            found.append(p)
    return found


def _expose(paths, made: set | None = None) -> list[str]:
    """Mount options that make ``paths`` readable in the sandbox, and nothing beside them.

    Each is mounted read-only, with the folders above it made (mode 0755: bwrap's own would be 0700, closed
    to the kernel's user). A folder above one that other users cannot enter on the machine (a Python
    installed under ``/root``, mode 0700) is replaced by an empty tmpfs first. ``made``: folders already made.
    """
    out, covered, made = [], [], set() if made is None else made
    for p in paths:
        for a in reversed(p.parents):
            if a == Path("/") or any(_under(a, c) for c in covered):
                continue
            try:
                closed = not os.stat(a).st_mode & 0o001
            except OSError:
                closed = False
            if closed and a not in made:
                covered.append(a)
                made.add(a)
                out += ["--perms", "0755", "--tmpfs", str(a)]
                break
    for p in paths:
        out += _folders_above(p, made) + ["--ro-bind", str(p), str(p)]
    return out


def _folders_above(p: Path, made: set) -> list[str]:
    """``--dir`` options (mode 0755) for the folders above ``p`` that the sandbox does not have yet."""
    out = []
    for a in reversed(Path(p).parents):  # (the system folders are mounted whole; /tmp is a fresh tmpfs)
        if a in (Path("/"), Path("/tmp")) or a in made or any(_under(a, Path(f)) for f in SYSTEM):
            continue
        made.add(a)
        out += ["--perms", "0755", "--dir", str(a)]
    return out


def _under(p: Path, folder: Path) -> bool:
    try:
        Path(p).resolve().relative_to(folder)
        return True
    except ValueError:
        return False


def _stub_dir() -> Path:
    """Stand-ins mounted over what the kernel must not read (made once per process, readable by all)."""
    global _STUBS
    if _STUBS is None or not _STUBS.is_dir():
        import atexit
        import tempfile

        _STUBS = Path(tempfile.mkdtemp(prefix="gpucourse-stubs-"))
        atexit.register(shutil.rmtree, _STUBS, True)
        (_STUBS / "empty").mkdir()
        (_STUBS / "test.py").write_text('raise ImportError("the grader\'s test files cannot be read while '
                                        'grading")\n')
        for p in (_STUBS, _STUBS / "empty"):
            os.chmod(p, 0o755)
        os.chmod(_STUBS / "test.py", 0o644)
    return _STUBS


def _setpriv(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--no-new-privs", "--"]


def _free_uid() -> int:
    import psutil

    used = {p.info["uids"].real for p in psutil.process_iter(["uids"]) if p.info.get("uids")}
    while True:
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        if uid not in used:
            return uid


def probe(level: str) -> str:
    """'' when a kernel can start at ``level`` here (cached per process), else why not."""
    root = os.geteuid() == 0
    key = (level, root)
    if key in _PROBED:
        return _PROBED[key]
    why = ""
    if level == "user" and not root:
        why = "the grader is not root, so it cannot switch to a dedicated user"
    tools = (["setpriv"] if root else []) + (["bwrap"] if level == "bubblewrap" else [])
    missing = [t for t in tools if shutil.which(t) is None]
    if not why and missing:
        why = f"{' and '.join(missing)} not found (Debian: apt-get install {'bubblewrap' if 'bwrap' in missing else 'util-linux'})"
    if not why:
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="gpucourse-probe-"))
        try:
            uid = _free_uid() if root else None
            if uid is not None:
                os.chown(work, uid, 0)
                os.chmod(work, 0o770)
            package = package_folder()
            cmd = (_bwrap_args(work, (package, package), uid=uid) if level == "bubblewrap" else _setpriv(uid))
            same = f"import sys; assert sys.version == {sys.version!r} and sys.base_prefix == {sys.base_prefix!r}"
            found = "import importlib.util as u; assert u.find_spec('ipykernel') and u.find_spec('gpucourse.grading')"
            cmd += [sys.executable, "-c", f"{same}; {found}; open('ok', 'w')"]
            res = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "HOME": str(work), "PYTHONDONTWRITEBYTECODE": "1"})
            if res.returncode != 0 or not (work / "ok").exists():
                why = f"{tools[-1]} failed: " + (res.stderr.strip().splitlines() or ["no error message"])[-1][:200]
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"{' + '.join(tools)} failed: {exc}"[:200]
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _PROBED[key] = why
    return why


def package_folder() -> Path:
    """Where the course package (``gpucourse``) is imported from in this environment."""
    import gpucourse

    return Path(gpucourse.__file__).resolve().parent


def choose(workdir: Path, course: Path | None = None, hide=()) -> Sandbox:
    """The strongest sandbox available for a kernel working in ``workdir`` (see the module docstring).

    ``course``: the generated copy of the course package the kernel imports instead of the real one
    (:mod:`.course_copy`): mounted over the package in bubblewrap, first on ``PYTHONPATH`` otherwise (then
    the real package stays readable). ``hide``: files and folders it must not see, where they would
    otherwise be visible (hidden tests, the output folder, the grading key).
    """
    want = os.environ.get("GPUCOURSE_SANDBOX", "bubblewrap").strip().lower() or "bubblewrap"
    if want not in LEVELS:
        raise ValueError(f"GPUCOURSE_SANDBOX must be one of {', '.join(LEVELS)}, got {want!r}")
    root = os.geteuid() == 0
    why_not = []
    for level in LEVELS[LEVELS.index(want)::-1]:
        if level == "none":
            asked = " (GPUCOURSE_SANDBOX=none)" if want == "none" else ""
            note = ("no sandbox" + asked + ("; " + "; ".join(why_not) if why_not else "") +
                    ": the kernel ran as the grader's user and could read what that user reads; killed by "
                    "process group, process tree (child subreaper) and run token")
            _become_subreaper()
            return Sandbox("none", note)
        why = probe(level)
        if why:
            why_not.append(why)
            continue
        box = Sandbox(level, "")
        if root:
            box.uid = _free_uid()
            for q in [Path(workdir), *Path(workdir).iterdir()]:  # the user's; root's group lets bwrap enter it
                os.chown(q, box.uid, 0)
            os.chmod(workdir, 0o770)
        if level == "bubblewrap":
            box.prefix = _bwrap_args(Path(workdir), (course / "gpucourse", package_folder()) if course else None,
                                     hide, box.uid)
            box.note = (("PID, IPC, UTS, network and mount namespaces, a dedicated uid" if root else
                         "user, PID, IPC, UTS, network and mount namespaces, as the grader's user") +
                        ", only the Python installation, the environment and the course copy visible")
            box.allow_list = True
        else:
            box.prefix = _setpriv(box.uid)
            _become_subreaper()
            box.note = (f"a dedicated uid, no namespaces ({'; '.join(why_not)}): the kernel could read "
                        "what any user may read")
        return box
    raise AssertionError("unreachable")


def furnish_home(home: Path, uid: int | None = None) -> dict:
    """Put in a kernel's new home folder what every kernel of this environment computes alike, and return the
    variables that point the kernel at it: Matplotlib's list of the system's fonts (``fontlist-v*.json``, a copy
    of the grader's own), in the folder ``MPLCONFIGDIR`` names.

    TensorFlow imports Keras, which imports ``matplotlib.pyplot``: in an empty home Matplotlib scans every font
    again (fontconfig's ``fc-list``), half a CPU-second of a graded kernel's start on a 2-core machine. The copy
    is the kernel's (``uid``'s) to change, as the rest of its home. Without the grader's list (Matplotlib not
    installed, or its cache not writable) the kernel builds its own, as before.
    """
    try:
        import matplotlib
        from matplotlib import font_manager
    except ImportError:
        return {}
    found = Path(matplotlib.get_cachedir(), f"fontlist-v{font_manager.FontManager.__version__}.json")
    if not found.is_file():
        return {}
    folder = Path(home) / ".matplotlib"
    folder.mkdir(exist_ok=True)
    shutil.copyfile(found, folder / found.name)
    if uid is not None:
        for p in (folder, folder / found.name):
            os.chown(p, uid, uid)
    return {"MPLCONFIGDIR": str(folder)}


def _become_subreaper() -> None:
    """Orphans of the kernel (double fork, ``setsid``) become this process's children, not init's."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


#: Kernels this process started and has not swept yet: never taken for another run's adopted orphans.
_KERNELS: set[int] = set()


def started(kernel_pid: int | None) -> None:
    """Note a kernel this process just started (see :func:`sweep`)."""
    if kernel_pid:
        _KERNELS.add(kernel_pid)


def _is_ours(proc, box: Sandbox, kernel_pid: int) -> bool:
    """A process of this run: the sandbox's uid, the run's token, or an orphan adopted since it began."""
    import psutil

    try:
        if box.uid is not None and proc.uids().real == box.uid:
            return True
        if (box.level != "bubblewrap" and proc.ppid() == os.getpid() and proc.pid != kernel_pid
                and proc.pid not in _KERNELS and proc.create_time() >= box.started):
            return True
        return proc.environ().get(TOKEN_ENV) == box.token
    except (psutil.Error, OSError):
        return False


def _find(box: Sandbox, kernel_pid: int | None) -> dict:
    import psutil

    found = {}
    if kernel_pid:
        try:
            top = psutil.Process(kernel_pid)
            found[top.pid] = top
            found.update({c.pid: c for c in top.children(recursive=True)})
        except psutil.Error:
            pass
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid != me and proc.pid not in found and _is_ours(proc, box, kernel_pid):
            found[proc.pid] = proc
    return found


def _kernel_chain(proc) -> bool:
    """The kernel itself (started through the grader's launcher) and the sandbox's own processes (bwrap, setpriv)."""
    try:
        cmd = proc.cmdline()
    except Exception:  # noqa: BLE001
        return True
    text = " ".join(cmd)
    return ("ipykernel_launcher" in text or "gpucourse_launch.py" in text
            or (bool(cmd) and Path(cmd[0]).name in ("bwrap", "setpriv")))


def sweep(box: Sandbox, kernel_pid: int | None, pgid: int | None = None, wait_s: float = 5.0) -> tuple[list, list]:
    """SIGKILL every process of this run; ``(left running, survivors)`` as short descriptions.

    *left running*: processes the submission started that were still alive (zombies aside);
    *survivors*: processes still alive ``wait_s`` later (none, unless the kernel can resist SIGKILL).
    """
    import psutil

    left, seen = [], set()
    deadline = time.monotonic() + wait_s
    found = _find(box, kernel_pid)
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and not _kernel_chain(proc):
                left.append(f"`{' '.join(proc.cmdline())[:80] or proc.name()}` (pid {proc.pid})")
        except psutil.Error:
            pass
    while True:
        if pgid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        for proc in found.values():
            seen.add(proc.pid)
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        _reap(found, kernel_pid)
        time.sleep(0.05)
        found = {pid: p for pid, p in _find(box, None).items() if _alive(p)}
        found.update({pid: p for pid, p in _alive_of(seen, kernel_pid).items()})
        if not found or time.monotonic() > deadline:
            break
    survivors = [f"pid {pid}" for pid in found]
    _KERNELS.discard(kernel_pid)
    return left, survivors


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _alive_of(pids, kernel_pid) -> dict:
    import psutil

    out = {}
    for pid in pids:
        if pid == kernel_pid:
            continue
        try:
            proc = psutil.Process(pid)
        except psutil.Error:
            continue
        if _alive(proc):
            out[pid] = proc
    return out


def _reap(found: dict, kernel_pid: int | None) -> None:
    """Collect the zombies of adopted orphans (the kernel itself is its manager's to collect)."""
    for pid, proc in found.items():
        if pid == kernel_pid:
            continue
        try:
            if proc.ppid() == os.getpid():
                os.waitpid(pid, os.WNOHANG)
        except (OSError, Exception):  # noqa: BLE001, S110
            pass
