"""Kernel side, before any submitted code: a clean standby process that starts worker processes the checks can kill.

Some items must see what survives a real crash. Lab 04's q5 kills a training run with ``SIGKILL``
and starts it again: only what the run saved on disk may survive, as on a cluster. An exception
raised into the learner's loop proves nothing (``except BaseException`` catches it, and the loop
trains on), and a restart inside the same kernel still finds whatever the first run kept in memory.

:func:`start` runs in the grader's first cell, before the guard and before any submitted code. It
imports TensorFlow and Keras (importing initialises no device, so the process can still fork
safely), then forks the *standby*: a process that never runs submitted code and holds no channel
to the grader. It returns ``(standby, stop_standby)``, which the first cell hands to the guard
(:func:`.kernel_guard.install`) and to nothing else: the observation driver reaches the standby only
through the guard's hook (audit event ``gpucourse.worker``), and the guard ends it at the end phase.

* ``standby(cells, path, source, entry, args, stop_at, timeout_s)``: for one request the standby
  forks a *worker* that runs the submission's code cells in a fresh IPython shell (as a restarted
  program runs again from the top), loads the test file from the text the grader read, and calls
  its function ``entry(variables, args, report)``. The standby relays every ``report(value)`` to
  the kernel. The moment a value equals ``stop_at`` it kills the worker with ``SIGKILL``, and then
  every process the worker started: the standby is their *child subreaper*, so a process in a new
  session is found too. A worker still running after ``timeout_s`` is killed the same way. The
  answer is ``{"reports": [...], "ended": "killed" | "timeout" | "exit N" | "signal N", "log": ...}``
  (``log``: the end of what the worker printed).
* ``stop_standby()``: ends the standby and any worker it still has.

Requests are signed with a key made before the submission ran, which lives only in a generator's
frame, and carry a fresh random id; the standby serves a request only with a valid signature and an
id it has not seen, so writing into its pipe directly starts nothing. A worker zeroes its copy of
the key before it runs anything. What a worker does is not watched: it runs the submission's cells
again without the guard, in the kernel's sandbox. What it leaves on disk is all a check may read from it.

The worker never sees a GPU (``CUDA_VISIBLE_DEVICES=-1`` and ``tf.config.set_visible_devices([], "GPU")``
before the cells run, so a cell cannot undo it): the kernel holds them, and what a checkpoint holds does
not depend on the device. This file runs inside the kernel from the text the
grader read; it is a real module so that it can be linted and unit-tested
(``tests/grading/test_kernel_standby.py``).
"""

from __future__ import annotations

__all__ = ["PRELOAD", "STANDBY_FILENAME", "start"]

#: File name the standby's code is compiled under (the guard counts its frames as the grader's).
STANDBY_FILENAME = "<gpucourse-standby>"


#: Imported before the fork, so every worker starts with them loaded (TensorFlow alone takes seconds).
PRELOAD = ("tensorflow", "keras", "numpy", "IPython.core.interactiveshell", "traitlets.config",
           "gpucourse.grading.items")

#: Seconds the kernel waits for the standby beyond a request's own time limit.
ANSWER_GRACE_S = 10.0


def start(preload=PRELOAD):
    """Fork the standby; return ``(standby, stop_standby)`` (see the module docstring).

    Both run inside the guard's audit hook, so they run nothing the submission could have defined or
    rebound: every name they use was captured here, before the submission ran (a unit test checks
    their bytecode), they get exact plain data (the guard copies the request), requests are written
    with ``repr`` and answers read with ``marshal`` (built-in types only, no encoder or decoder to patch).
    """
    import importlib
    import marshal
    import os
    import hashlib
    import select
    import signal
    import time

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 (the worker imports it again and reports what fails)
            continue
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    key = bytearray(os.urandom(32))
    pid = os.fork()
    if pid == 0:  # the standby
        try:
            os.close(req_w)
            os.close(resp_r)
            _serve(req_r, resp_w, key)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    sign = _signer(bytes(key), hashlib.sha256)
    next(sign)
    key[:] = bytes(len(key))  # from here on only the generator's frame holds it
    loads, dumps, from_bytes, monotonic, urandom = marshal.loads, repr, int.from_bytes, time.monotonic, os.urandom
    write, read, wait_readable, waitpid, kill, sleep = os.write, os.read, select.select, os.waitpid, os.kill, time.sleep
    _type, _dict, _len, _RuntimeError, _BaseException = type, dict, len, RuntimeError, BaseException
    WNOHANG, SIGKILL, grace = os.WNOHANG, signal.SIGKILL, ANSWER_GRACE_S
    pending = [b""]

    def send(message) -> None:
        body = dumps(message).encode()
        data = sign.send(body).encode() + b" " + body + b"\n"
        while data:
            data = data[write(req_w, data):]

    def receive(deadline: float):
        """One answer (a 4-byte length, then marshal data), or None when the time is up or the pipe closed."""
        while True:
            have = pending[0]
            if _len(have) >= 4 and _len(have) >= 4 + from_bytes(have[:4], "big"):
                size = from_bytes(have[:4], "big")
                pending[0] = have[4 + size:]
                return loads(have[4:4 + size])
            left = deadline - monotonic()
            if left <= 0 or not wait_readable([resp_r], [], [], left)[0]:
                return None
            chunk = read(resp_r, 1 << 16)
            if not chunk:
                return None
            pending[0] = have + chunk

    def standby(cells, path, source, entry, args, stop_at=None, timeout_s=60.0):
        """Run ``entry`` of the test file ``path`` in a fresh worker after ``cells``; see the module docstring."""
        ident = urandom(16).hex()
        send({"id": ident, "cells": cells, "path": path, "source": source, "entry": entry, "args": args,
              "stop_at": stop_at, "timeout_s": timeout_s + 0.0})
        reports, deadline = [], monotonic() + timeout_s + grace
        while True:
            message = receive(deadline)
            if message is None:
                raise _RuntimeError("the grader's standby process did not answer")
            if _type(message) is not _dict or message.get("id") != ident:
                continue  # an answer to an earlier request (its item timed out)
            if "report" in message:
                reports.append(message["report"])
            elif "ended" in message:
                return {"reports": reports, "ended": message["ended"], "log": message.get("log", "")}

    def stop_standby(wait_s: float = 2.0) -> None:
        """End the standby; a worker it still runs dies with it (``PR_SET_PDEATHSIG``), the rest in the sweep."""
        try:
            send({"id": urandom(16).hex(), "quit": True})
        except _BaseException:  # noqa: BLE001 (a broken pipe: kill it below)
            wait_s = 0
        deadline = monotonic() + wait_s
        while monotonic() < deadline:
            try:
                if waitpid(pid, WNOHANG)[0]:
                    return
            except _BaseException:  # noqa: BLE001 (collected already)
                return
            sleep(0.02)
        try:
            kill(pid, SIGKILL)
            waitpid(pid, 0)
        except _BaseException:  # noqa: BLE001, S110
            pass

    return standby, stop_standby


def _signer(key: bytes, sha256):
    """A generator that signs request bodies: ``send(body)`` returns sha256(key + body) in hex."""
    body = yield ""
    while True:
        body = yield sha256(key + body).hexdigest()


# ------------------------------------------------------------------------------------ the standby


def _serve(req_r: int, resp_w: int, key: bytearray) -> None:
    """The standby's loop: one worker per signed request, until ``quit`` or the kernel closes the pipe."""
    import ast
    import hashlib
    import hmac
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the Stop button interrupts the kernel's process group
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _become_subreaper()
    pending, seen = b"", set()
    while True:
        while b"\n" not in pending:
            chunk = os.read(req_r, 1 << 16)
            if not chunk:
                return
            pending += chunk
        line, _, pending = pending.partition(b"\n")
        signature, _, body = line.partition(b" ")
        if not hmac.compare_digest(signature, hashlib.sha256(bytes(key) + body).hexdigest().encode()):
            continue  # not from the grader's driver
        try:
            request = ast.literal_eval(body.decode())
        except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
            continue
        if not isinstance(request, dict) or request.get("id") in seen:
            continue  # a request played again
        seen.add(request.get("id"))
        if request.get("quit"):
            return
        ended, log = _run_worker(request, req_r, resp_w, key)
        _send(resp_w, {"id": request.get("id"), "ended": ended, "log": log})


def _send(fd: int, message) -> None:
    """One answer to the kernel: a 4-byte length, then ``marshal`` data (plain built-in types)."""
    import marshal
    import os

    body = marshal.dumps(message)
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data):]


def _prctl(*args) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(*args, *(0,) * (5 - len(args)))
    except Exception:  # noqa: BLE001, S110 (not Linux)
        pass


def _become_subreaper() -> None:
    """Orphans of the workers (a process that called ``setsid`` or double-forked) come back to this process,
    and no worker (the submission's cells, unwatched) may read this process's memory, where the key is."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER (else only the worker's process group is killed)
    _prctl(4, 0)  # PR_SET_DUMPABLE 0: workers inherit it


def _children() -> list[int]:
    import os

    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def _kill_tree(pid: int | None) -> None:
    """SIGKILL the worker ``pid`` (not yet collected, so its pid is still its own) and its process group,
    collect it, then kill every process it started, which this subreaper has adopted by then."""
    import os
    import signal

    if pid is not None:
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except OSError:
                pass
        try:
            os.waitpid(pid, 0)  # once collected, its orphans are this process's children
        except ChildProcessError:
            pass
    for _ in range(100):  # each round kills the processes just orphaned to this one (the sweep gets the rest)
        children = _children()
        if not children:
            return
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
            except OSError:
                pass


def _run_worker(request: dict, req_r: int, resp_w: int, key: bytearray) -> tuple[str, str]:
    """Fork one worker for ``request``, relay its reports, kill it at ``stop_at``; ``(how it ended, log tail)``."""
    import json
    import os
    import select
    import tempfile
    import time

    log = tempfile.mktemp(prefix="gpucourse-worker-", suffix=".log")  # noqa: S306 (the worker creates it)
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        key[:] = bytes(len(key))  # the submission's cells run here, unwatched: they must not sign requests
        try:
            os.close(rep_r)
            os.close(req_r)
            os.close(resp_w)
            _work(request, rep_w, log)
            code = 0
        except BaseException:  # noqa: BLE001 (into the log, whose end goes back with the answer)
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(rep_w)
    stop_at, pending, ended = request.get("stop_at"), b"", None
    deadline = time.monotonic() + float(request.get("timeout_s", 60.0))
    open_pipe, reaped = True, False
    while ended is None:
        left = deadline - time.monotonic()
        if left <= 0:
            ended = "timeout"
            break
        if not open_pipe:  # the worker closed its end: wait for it to exit
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ended, reaped = _status(status), True
                break
            time.sleep(0.02)
            continue
        if not select.select([rep_r], [], [], left)[0]:
            continue
        chunk = os.read(rep_r, 1 << 16)
        if not chunk:
            open_pipe = False
            continue
        pending += chunk
        while b"\n" in pending and ended is None:
            line, _, pending = pending.partition(b"\n")
            try:
                value = json.loads(line)
            except ValueError:
                continue
            _send(resp_w, {"id": request.get("id"), "report": value})
            if stop_at is not None and value == stop_at:
                ended = "killed"
    os.close(rep_r)
    _kill_tree(None if reaped else pid)  # a reaped worker's pid may already be another process's
    return ended, _tail(log)


def _status(status: int) -> str:
    import os

    return f"exit {os.waitstatus_to_exitcode(status)}" if os.WIFEXITED(status) else f"signal {os.WTERMSIG(status)}"


def _tail(path: str, size: int = 2000) -> str:
    import os

    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            text = f.read().decode("utf-8", "replace")
        os.unlink(path)
    except OSError:
        return ""
    return text


# ------------------------------------------------------------------------------------ a worker


def _work(request: dict, report_w: int, log: str) -> None:
    """In the worker: run the submission's cells, then the test's entry function with ``report``."""
    import json
    import os
    import signal
    import sys

    os.setsid()  # its own process group, out of the kernel's
    _prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL: it dies with the standby
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # read when TensorFlow first looks for GPUs: not yet
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    out = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdout = sys.stderr = out
    sys.stdin = open(os.devnull)  # noqa: SIM115
    dumps = json.dumps

    def report(value) -> None:
        data = (dumps(value) + "\n").encode()
        while data:
            data = data[os.write(report_w, data):]

    if "tensorflow" in sys.modules:  # (preloaded) a cell that sets CUDA_VISIBLE_DEVICES again comes too late now
        try:
            sys.modules["tensorflow"].config.set_visible_devices([], "GPU")
        except Exception:  # noqa: BLE001, S110 (the cells meet the same error and say so in the log)
            pass
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    for source in request.get("cells") or ():
        shell.run_cell(source, store_history=False)
    from gpucourse.grading.items import load_test_source

    module = load_test_source(request["source"], request["path"])
    entry = getattr(module, request["entry"])
    variables = {k: v for k, v in shell.user_ns.items() if isinstance(k, str) and not k.startswith("_")}
    entry(variables, request.get("args"), report)
