"""Run a list of code cells in a fresh kernel with one time limit, then kill the kernel and its children.

:func:`run_cells` is the one place the grader starts a kernel. The kernel runs in a fresh temporary
folder with the grader's environment plus what the course's setup cell would set, and with
``GPUCOURSE_GRADING=1`` (``check()`` then skips its own run: the grader checks every item itself),
a fresh IPython directory without input history, and no user site-packages.
Errors in a cell do not stop the run: later cells may still define what is graded. The kernel
runs in the strongest sandbox the machine offers (:mod:`.sandbox`: an unprivileged user and
bubblewrap's namespaces, which cannot write the grader's output folder nor read the tests). When the
last cell has run, or the time is up, or the kernel died, every process of the run is killed
(:func:`.sandbox.sweep`: the whole PID namespace, the dedicated user's processes, the process group,
adopted orphans and every process carrying the run's token), so nothing the submission left
running (threads, ``atexit`` hooks, child processes in new sessions) acts afterwards;
:attr:`Execution.left_running` names what the submission had left.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox as sandboxing

__all__ = ["Cell", "Execution", "kernel_env", "run_cells"]


@dataclass
class Cell:
    label: str  # "grader setup", "cell 3", "grader checks": used in reasons
    source: str
    submission: bool = False  # errors in the submission's cells are listed in the report


@dataclass
class Execution:
    status: str = "ok"  # ok | timeout | crashed | error
    reason: str = ""
    last_cell: str = ""  # label of the cell that was running when the run stopped
    cell_errors: list[dict] = field(default_factory=list)
    errors: dict = field(default_factory=dict)  # label -> "ename: evalue" for grader cells
    stopped: bool = False  # the grader killed the kernel early (``stop`` was set: tampering seen)
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)  # "kernel start", each grader cell, "submission": seconds
    log_tail: str = ""
    isolation: str = ""  # how the kernel was isolated (:meth:`.sandbox.Sandbox.describe`)
    left_running: list = field(default_factory=list)  # processes the submission left, killed at the end
    survivors: list = field(default_factory=list)  # processes still alive after the kill (should never happen)


def kernel_env(extra: dict | None = None) -> dict:
    """The grader's environment, as the course's setup cell leaves it, for a graded kernel."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # read when TensorFlow is imported (by the guard)
    env["MPLBACKEND"] = "Agg"
    env["GPUCOURSE_GRADING"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"  # no usercustomize.py or user .pth a previous submission could have left
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(extra or {})
    return env


def _kernel_cpu(client) -> float | None:
    """CPU seconds the kernel and its children used so far (for the benchmark), or None."""
    try:
        import psutil

        proc = psutil.Process(client.km.provisioner.pid)
        total = sum(proc.cpu_times()[:2])
        for child in proc.children(recursive=True):
            total += sum(child.cpu_times()[:2])
        return round(total, 2)
    except Exception:  # noqa: BLE001 (diagnostics only)
        return None


def _kill(client, box, run: Execution) -> None:
    """SIGKILL every process of the run (see :func:`.sandbox.sweep`); note what the submission left."""
    prov = getattr(getattr(client, "km", None), "provisioner", None)
    left, survivors = sandboxing.sweep(box, getattr(prov, "pid", None), getattr(prov, "pgid", None))
    run.left_running += [x for x in left if x not in run.left_running]
    run.survivors = survivors


def _kernel_manager(workdir: Path, box):
    """A kernel manager that starts the kernel inside ``box``, its connection file in ``workdir``."""
    from jupyter_client import AsyncKernelManager

    class SandboxedKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.connection_file = str(workdir / "kernel.json")

        def write_connection_file(self, **kwargs):
            super().write_connection_file(**kwargs)
            if box.uid is not None:
                os.chown(self.connection_file, box.uid, box.uid)

        def format_kernel_cmd(self, extra_arguments=None):
            return list(box.prefix) + super().format_kernel_cmd(extra_arguments)

    return SandboxedKernelManager


def run_cells(cells: list[Cell], timeout: float, kernel_name: str = "python3", env: dict | None = None,
              before_cell=None, grace_s: float = 1.0, stop: threading.Event | None = None,
              reach=(), hide=()) -> Execution:
    """Execute ``cells`` in order in one fresh kernel within ``timeout`` seconds in all.

    ``before_cell(index, cell)`` is called before each cell (the grader uses it to wait for the
    guard's connection). When a cell times out or the kernel stops answering, the kernel lives
    ``grace_s`` longer before it is killed. When ``stop`` is set (the guard reported tampering), the
    kernel is killed ``grace_s`` later and the run ends as ``crashed`` with ``stopped`` set. Never raises for
    what the cells do. ``reach``: folders the sandboxed kernel must write besides its own (the guard's
    socket folder); ``hide``: files and folders it must not read (hidden tests, the output folder).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    run = Execution()
    workdir = Path(tempfile.mkdtemp(prefix="gpucourse-grade-"))
    box = sandboxing.choose(workdir, reach, hide)
    run.isolation = box.describe()
    env = dict(env or kernel_env())
    env[sandboxing.TOKEN_ENV] = box.token
    if box.level != "none":
        env["HOME"] = str(workdir)  # the grader's home is not the kernel's
    # A fresh IPython directory: no startup files or history another submission could have written,
    # and nothing of this one (its input history holds the grader's cells) for the next to read.
    env["IPYTHONDIR"] = str(workdir / ".ipython")
    log = workdir.with_suffix(".log")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.source) for c in cells])
    nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True, startup_timeout=120,
                            resources={"metadata": {"path": str(workdir)}},
                            extra_arguments=["--HistoryManager.enabled=False"],
                            kernel_manager_class=_kernel_manager(workdir, box))
    client.shutdown_kernel = "immediate"
    t0 = time.monotonic()
    deadline = t0 + timeout
    index = 0
    try:
        with open(log, "wb") as log_fh, client.setup_kernel(env=env, stdout=log_fh, stderr=log_fh):
            run.timings["kernel start"] = round(time.monotonic() - t0, 2)
            sandboxing.started(getattr(client.km.provisioner, "pid", None))
            done = threading.Event()

            def stop_early():
                while not done.is_set():
                    if stop.wait(0.1):
                        run.stopped = True
                        done.wait(grace_s)  # let the guard report the rest of what the same cell changed
                        if not done.is_set():  # (once the run is over, its own sweep has done this)
                            _kill(client, box, run)
                        return

            if stop is not None:
                threading.Thread(target=stop_early, name="gpucourse-stop", daemon=True).start()
            try:
                for index, (cell, nb_cell) in enumerate(zip(cells, nb.cells)):
                    started = time.monotonic()
                    run.last_cell = cell.label
                    if before_cell is not None:
                        before_cell(index, cell)
                        nb_cell.source = cell.source  # the grader may complete a cell only now (its sealed config)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CellTimeoutError(f"time limit of {timeout:g} s reached")
                    client.timeout = max(1, int(left))
                    # The grader's cells stay out of the kernel's input history (``In``, ``_ih``).
                    client.execute_cell(nb_cell, index, store_history=cell.submission)
                    label = "submission" if cell.submission else cell.label
                    run.timings[label] = round(run.timings.get(label, 0) + time.monotonic() - started, 2)
                    for out in nb_cell.get("outputs", []):
                        if out.get("output_type") != "error":
                            continue
                        text = f"{out.get('ename')}: {out.get('evalue')}"
                        if cell.submission:
                            run.cell_errors.append({"cell": cell.label.split()[-1], "ename": out.get("ename"),
                                                    "evalue": str(out.get("evalue"))[:300]})
                        else:
                            run.errors[cell.label] = text[:500]
            except DeadKernelError:
                raise
            except BaseException:
                if run.stopped:
                    raise
                time.sleep(grace_s)  # a hung or broken kernel: let the guard's watchdog report why
                raise
            finally:
                done.set()
                cpu = _kernel_cpu(client)
                if cpu is not None:
                    run.timings["kernel cpu"] = cpu
                _kill(client, box, run)
    except CellTimeoutError:
        run.status = "timeout"
        run.reason = f"{run.last_cell} was still running when the {timeout:g} s time limit ran out"
    except DeadKernelError:
        run.status = "crashed"
        run.reason = f"the kernel died while running {run.last_cell} (out of memory, os._exit, a segfault...)"
    except Exception as exc:  # the kernel failed to start, zmq trouble, ...
        run.status = "error"
        run.reason = f"grading failed in {run.last_cell or 'kernel start-up'}: {type(exc).__name__}: {exc}"[:500]
    finally:
        _kill(client, box, run)  # again: a kernel that failed to start may have left its sandbox behind
        run.seconds = round(time.monotonic() - t0, 2)
        try:
            run.log_tail = log.read_text(errors="replace")[-2000:]
        except OSError:
            pass
        shutil.rmtree(workdir, ignore_errors=True)
        log.unlink(missing_ok=True)
    return run
