"""One graded kernel's life: start it locked down, run the cells, hand over its agent, kill it.

:class:`Listener` is the grader's Unix socket for one submission: the kernel's tripwire connects to it
before any submitted code runs, and its agent after the cells (see :mod:`gpucourse.grading.protocol`).
:class:`KernelSession` starts a Jupyter kernel in the sandbox (:mod:`.sandbox`) through the launcher
(:mod:`gpucourse.grading.kernel.launch`: seccomp, not dumpable), talks to it over Unix sockets only
(Jupyter's ``ipc`` transport: the kernel has no network), and runs, each with a time limit:

1. the tripwire's cell (:mod:`gpucourse.grading.kernel.tripwire`), kept out of the input history;
2. the submission's code cells: an error does not stop the run (later cells may still define what is
   graded); a cell that runs out of time is interrupted, and the cells after it are not run;
3. the agent's cell (:mod:`gpucourse.grading.kernel.agent`), which keeps running and answers the
   observer until told to stop.

Every wait has a deadline, and every deadline ends in an interrupt or a kill: no submission can make the
grader wait forever. :meth:`KernelSession.kill` kills every process of the run (:func:`.sandbox.sweep`).
"""

from __future__ import annotations

import hashlib
import os
import queue
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import protocol
from ..kernel import agent as agent_module
from ..kernel import tripwire as tripwire_module
from . import sandbox as sandboxing
from . import seccomp
from .link import KernelLost, Link

__all__ = ["CellRun", "KernelLost", "KernelSession", "Listener", "kernel_env"]

KERNEL_DIR = Path(agent_module.__file__).resolve().parent
PROTOCOL_SRC = Path(protocol.__file__).read_text()
#: Seconds the kernel may take to start and its tripwire or agent to connect.
START_S, CONNECT_S = 120, 30
#: Seconds an interrupted cell or call has to stop before the kernel is killed.
INTERRUPT_GRACE_S = 5.0


def kernel_env(extra: dict | None = None) -> dict:
    """The grader's environment, as the course's setup cell leaves it, for a graded kernel."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCOURSE_GRADING_KEY", "PYTEST_"))}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    env["MPLBACKEND"] = "Agg"
    env["GPUCOURSE_GRADING"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"  # no usercustomize.py or user .pth a previous submission could have left
    env.update(extra or {})
    return env


@dataclass
class CellRun:
    """What running the cells showed, for the report."""

    cell_errors: list = field(default_factory=list)  # {"cell", "ename", "evalue"} of the submission's cells
    stopped_at: str = ""  # the submission's cell that ran out of time (later cells were not run)
    died_at: str = ""  # the cell during which the kernel died
    timings: dict = field(default_factory=dict)


class Listener:
    """The grader's socket for one submission; each kernel (re)start connects a tripwire and an agent."""

    def __init__(self, folder: Path, uid: int | None = None):
        self.token = secrets.token_hex(16)
        self.keys = {protocol.Role.TRIPWIRE: secrets.token_bytes(32), protocol.Role.AGENT: secrets.token_bytes(32)}
        self.address = str(folder / "grader.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        os.chmod(self.address, 0o777)
        if uid is not None:
            os.chown(self.address, uid, 0)
        self._sock.listen(8)
        self._agents: queue.Queue = queue.Queue()
        self.tripwires: list[list] = []  # one list of (kind, body) per tripwire connection
        self.problems: list[str] = []
        self._tripwire_up = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, name="gpucourse-listener", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._hello, args=(conn,), name="gpucourse-hello", daemon=True).start()

    def _hello(self, conn: socket.socket) -> None:
        reader = protocol.Reader(self.keys)
        conn.settimeout(CONNECT_S)
        frames: list = []
        try:
            while not frames:
                data = conn.recv(1 << 16)
                if not data:
                    return conn.close()
                frames = reader.feed(data)
        except (OSError, protocol.ProtocolError) as exc:
            self.problems.append(f"a connection to the grader's socket was refused: {exc}")
            return conn.close()
        kind, body = frames[0]
        if body.get("token") != self.token:
            self.problems.append("a connection to the grader's socket had the wrong token")
            return conn.close()
        conn.settimeout(None)
        if reader.role == protocol.Role.AGENT.value:
            self._agents.put((conn, reader, frames[1:]))
            return None
        records = list(frames[1:])
        self.tripwires.append(records)
        self._tripwire_up.set()
        try:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                records.extend(reader.feed(data))
        except protocol.ProtocolError as exc:
            records.extend(exc.frames)  # the good records read in the same chunk, before the broken one
            records.append(("broken", str(exc)))
        except OSError:
            pass
        finally:
            conn.close()
        return None

    def wait_tripwire(self, timeout: float) -> bool:
        ok = self._tripwire_up.wait(timeout)
        self._tripwire_up.clear()
        return ok

    def wait_agent(self, timeout: float):
        """``(socket, reader, frames already read)`` of the next agent to connect, or None after ``timeout``."""
        try:
            return self._agents.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass


def _agent_src() -> str:
    return (KERNEL_DIR / "agent.py").read_text()


class KernelSession:
    """A graded kernel: started by :meth:`start`, answering through :attr:`link`, ended by :meth:`kill`."""

    def __init__(self, workdir: Path, box, listener: Listener, env: dict, cells: list[tuple[str, str]],
                 cells_timeout: float, kernel_name: str = "python3", modules=(), tripwire: bool = True):
        self.workdir, self.box, self.listener, self.env = workdir, box, listener, env
        self.cells, self.cells_timeout, self.kernel_name = cells, cells_timeout, kernel_name
        self.modules, self.tripwire = list(modules), tripwire  # the test files' kernel parts, sent to the agent
        self.restart_later = False  # the observer saw this kernel hang or die: start it again before the next item
        self.seccomp = False
        self._calls = 0
        self.cpu_s = 0.0  # CPU seconds of the kernels this session ran (read just before each is killed)
        self.km = self.kc = None
        self.link: Link | None = None  # the agent's connection, once it is up
        self.run = CellRun()
        self.left_running: list[str] = []
        self.survivors: list[str] = []
        self._skip: set[int] = set()  # cells not to run again after a restart (they hung or killed the kernel)

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Start the kernel, run the tripwire, the cells and the agent. KernelLost if the grader's own cells fail."""
        t0 = time.monotonic()
        self._start_kernel()
        self.run.timings["kernel start"] = round(time.monotonic() - t0, 2)
        if self.tripwire:
            grader_code = [hashlib.sha256(t.encode()).hexdigest() for t in (PROTOCOL_SRC, _agent_src())]
            cell = tripwire_module.CELL_TEMPLATE.format(
                protocol_src=PROTOCOL_SRC, tripwire_src=(KERNEL_DIR / "tripwire.py").read_text(),
                address=self.listener.address, token=self.listener.token,
                key=self.listener.keys[protocol.Role.TRIPWIRE].hex(), grader_code=grader_code)
            status, error = self._execute(cell, CONNECT_S + 30, store_history=False)
            if status != "ok" or error or not self.listener.wait_tripwire(CONNECT_S):
                raise KernelLost(f"the grader's tripwire did not start ({status}; {error or 'it never connected'})")
        self._run_cells()
        self.start_agent()

    def _start_kernel(self) -> None:
        from jupyter_client import KernelManager

        workdir, box = self.workdir, self.box
        (workdir / "gpucourse_launch.py").write_text((KERNEL_DIR / "launch.py").read_text())
        try:
            program = seccomp.program()
        except ValueError:
            program = b""
        (workdir / "gpucourse_filter.bpf").write_bytes(program)
        self.seccomp = bool(program)

        class SandboxedKernelManager(KernelManager):
            def write_connection_file(self, **kwargs):
                super().write_connection_file(**kwargs)
                if box.uid is not None:
                    os.chown(self.connection_file, box.uid, box.uid)

            def format_kernel_cmd(self, extra_arguments=None):
                cmd = super().format_kernel_cmd(extra_arguments)
                at = cmd.index("ipykernel_launcher")  # [python, -m, ipykernel_launcher, -f, file]
                return [*box.prefix, cmd[0], str(workdir / "gpucourse_launch.py"),
                        str(workdir / "gpucourse_filter.bpf"), *cmd[at + 1:], "--HistoryManager.enabled=False"]

        self.km = SandboxedKernelManager(kernel_name=self.kernel_name, transport="ipc",
                                         connection_file=str(workdir / "kernel.json"))
        self.km.ip = str(workdir / "k")
        log = open(workdir.with_suffix(".log"), "ab")  # noqa: SIM115 (closed when the kernel is killed)
        self._log = log
        self.km.start_kernel(env=self.env, cwd=str(workdir), stdout=log, stderr=log)
        sandboxing.started(self._kernel_pid())
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=START_S)
        except RuntimeError as exc:
            raise KernelLost(f"the kernel did not start: {exc}; {self.log_tail()[-300:]}") from None

    def _run_cells(self) -> None:
        deadline = time.monotonic() + self.cells_timeout
        for index, (label, source) in enumerate(self.cells):
            if index in self._skip:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self.run.stopped_at = self.run.stopped_at or label
                break
            started = time.monotonic()
            status, error = self._execute(source, left, store_history=True)
            self.run.timings["submission"] = round(self.run.timings.get("submission", 0)
                                                   + time.monotonic() - started, 2)
            if error and not any(e["cell"] == label for e in self.run.cell_errors):
                self.run.cell_errors.append({"cell": label, **error})
            if status == "timeout":
                self.run.stopped_at = label
                self._skip.add(index)
                if not self.interrupt_and_wait():
                    raise KernelLost(f"{label} was still running when the {self.cells_timeout:g} s for the "
                                     "submission's cells ran out, and did not stop when interrupted")
                self._skip |= set(range(index + 1, len(self.cells)))  # a restarted run stops there too
                break
            if status == "dead":
                self.run.died_at = label
                self._skip.add(index)
                raise KernelLost(f"the kernel died while running {label} (out of memory, os._exit, a segfault...)")

    def start_agent(self) -> None:
        """Run the agent's cell (it keeps running) and wait for it to connect."""
        cell = agent_module.CELL_TEMPLATE.format(
            protocol_src=PROTOCOL_SRC, agent_src=_agent_src(),
            address=self.listener.address, token=self.listener.token, key=self.listener.keys[protocol.Role.AGENT].hex())
        self._agent_msg = self.kc.execute(cell, store_history=False, allow_stdin=False, stop_on_error=False)
        got = self.listener.wait_agent(CONNECT_S)
        if got is None:
            raise KernelLost("the grader's agent did not connect (a cell left the kernel unable to run it)")
        self.link = Link(*got, self.listener.keys[protocol.Role.AGENT])
        for module in self.modules:  # the test files' @in_kernel functions
            answer = self.link.call({"op": "load", **module}, time.monotonic() + CONNECT_S)
            if "raised" in answer:
                raise KernelLost(f"the kernel could not load the checks' code: {answer['raised'].get('message')}")

    # ------------------------------------------------------------------ cells

    def _execute(self, code: str, timeout: float, store_history: bool):
        """``(status, error)``: status ``ok``, ``timeout`` or ``dead``; error ``{"ename", "evalue"}`` or None."""
        msg_id = self.kc.execute(code, store_history=store_history, allow_stdin=False, stop_on_error=False)
        return self._wait_idle(msg_id, time.monotonic() + timeout)

    def _wait_idle(self, msg_id: str, deadline: float):
        error = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", error
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 0.5))
            except queue.Empty:
                if not self.km.is_alive():
                    return "dead", error
                continue
            except Exception:  # noqa: BLE001 (the kernel's messages no longer parse: it broke its own channel)
                return "dead", error
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "error" and error is None:
                error = {"ename": str(content.get("ename"))[:100], "evalue": str(content.get("evalue"))[:300]}
            elif kind == "status" and content.get("execution_state") == "idle":
                return "ok", error

    def interrupt_and_wait(self, msg_id: str | None = None, grace_s: float = INTERRUPT_GRACE_S) -> bool:
        """Interrupt what runs (the kernel's own interrupt, through its control channel); True if it stopped."""
        self.interrupt()
        if msg_id is None:  # a cell: wait for the kernel to be idle again
            probe = self.kc.execute("", store_history=False, allow_stdin=False)
            return self._wait_idle(probe, time.monotonic() + grace_s)[0] == "ok"
        return self._wait_idle(msg_id, time.monotonic() + grace_s)[0] == "ok"

    def interrupt(self) -> None:
        try:
            self.kc.control_channel.send(self.kc.session.msg("interrupt_request", {}))
        except Exception:  # noqa: BLE001 (a dead kernel: the caller's wait says so)
            pass

    # ------------------------------------------------------------------ end

    def _kernel_pid(self):
        return getattr(getattr(self.km, "provisioner", None), "pid", None)

    def stop_agent(self, grace_s: float = 5.0) -> None:
        """Tell the agent to stop and give its cell ``grace_s`` to end."""
        if self.link is None:
            return
        self.link.stop()
        try:
            self._wait_idle(self._agent_msg, time.monotonic() + grace_s)
        except Exception:  # noqa: BLE001, S110 (the kernel is killed next anyway)
            pass

    @property
    def calls(self) -> int:
        """Calls this kernel's agents answered (each is bracketed by two tripwire looks)."""
        return self._calls + (self.link.calls if self.link is not None else 0)

    def _note_cpu(self) -> None:
        """Add the CPU time of this kernel and its children so far (a kernel killed in bubblewrap is never waited
        for, so its time never reaches the grader's own accounting)."""
        import psutil

        try:
            top = psutil.Process(self._kernel_pid())
            self.cpu_s += sum(sum(p.cpu_times()[:2]) for p in [top] + top.children(recursive=True))
        except (psutil.Error, ValueError, TypeError):
            pass

    def kill_tree(self) -> None:
        """SIGKILL this kernel and every process it started, and nothing else (another kernel of the same
        sandbox user lives on). In bubblewrap, the sandbox's init dies with bwrap, and its PID namespace with it."""
        import psutil

        self._note_cpu()
        pid = self._kernel_pid()
        try:
            top = psutil.Process(pid) if pid else None
            procs = ([top] + top.children(recursive=True)) if top else []
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=5)
        self._close()

    def kill(self) -> None:
        """SIGKILL every process of the run; note what the submission left running."""
        self._note_cpu()
        pid = self._kernel_pid()
        pgid = getattr(getattr(self.km, "provisioner", None), "pgid", None)
        left, survivors = sandboxing.sweep(self.box, pid, pgid)
        self.left_running += [x for x in left if x not in self.left_running]
        self.survivors = survivors
        self._close()

    def _close(self) -> None:
        if self.link is not None:
            self._calls += self.link.calls
            self.link.close()
            self.link = None
        for close in (getattr(self.kc, "stop_channels", None), getattr(self.km, "cleanup_resources", None)):
            try:
                if close is not None:
                    close()
            except Exception:  # noqa: BLE001, S110
                pass
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def restart(self) -> None:
        """Kill this kernel and start a fresh one that runs the same cells (minus those that hung or crashed)."""
        self.kill()
        self.start()

    def log_tail(self) -> str:
        try:
            return self.workdir.with_suffix(".log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""
