"""The observer's end of the agent's connection: calls with a deadline, and the callbacks served here.

The agent (:mod:`gpucourse.grading.kernel.agent`) answers one ``call`` at a time. While the learner's code
runs, it may call functions the check handed over: those calls come back here as ``callback`` frames and
run in this process, each in a thread of its own (a ``tf.data`` pipeline calls them from several threads at
once), so the check counts and times them where the learner's code cannot reach.
"""

from __future__ import annotations

import itertools
import threading
import time

from .. import protocol
from ..items import KernelLost, ProcessKilled

__all__ = ["CallTimeout", "KernelLost", "Link", "ProcessKilled"]


class CallTimeout(Exception):
    """A call did not answer before its deadline (the caller interrupts the kernel, then waits a little more)."""


class Link:
    """One agent connection. ``call`` sends a request and waits for its result, serving callbacks meanwhile."""

    def __init__(self, conn, reader: protocol.Reader, early: list, key: bytes):
        self.conn, self.reader, self.key = conn, reader, key
        self._seq = 0
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict = {}  # call id -> [event, body]
        self._callbacks: dict = {}  # function id -> callable
        self.closed = threading.Event()
        self.killed = False  # the check killed this process on purpose
        self.calls = 0  # calls answered (a call whose kernel hung or died may lack its looks)
        self.problem = ""
        for kind, body in early:
            self._dispatch(kind, body)
        threading.Thread(target=self._read, name="gpucourse-link", daemon=True).start()

    # ------------------------------------------------------------------ sending

    def _send(self, kind: str, body) -> None:
        with self._lock:
            self.conn.sendall(protocol.encode(self.key, self._seq, kind, body))
            self._seq += 1

    def pack(self, value):
        """``value`` as plain data, a callable becoming ``{"__callback__": n}`` (served by this link)."""
        if callable(value) and not isinstance(value, type):
            fid = next(self._ids)
            self._callbacks[fid] = value
            return {"__callback__": fid}
        if isinstance(value, (list, tuple)):
            return [self.pack(v) for v in value]
        if isinstance(value, dict):
            return {protocol.plain_key(k): self.pack(v) for k, v in value.items()}
        return protocol.plain(value)

    def call(self, body: dict, deadline: float) -> dict:
        """Send ``body`` (``op`` and its fields) and return the agent's result body; CallTimeout or KernelLost."""
        call_id = next(self._ids)
        self._pending[call_id] = [threading.Event(), None]
        try:
            self._send("call", {"id": call_id, **body})
        except OSError as exc:
            if self.killed:
                raise ProcessKilled("the check killed the process") from None
            raise KernelLost(f"the kernel's agent is gone ({exc})") from None
        self.last_call = call_id
        return self.wait(call_id, deadline)

    def wait(self, call_id: int, deadline: float) -> dict:
        slot = self._pending.get(call_id)
        if slot is None:
            raise KernelLost("no such call")
        while not slot[0].is_set():
            left = deadline - time.monotonic()
            if self.closed.is_set() and not slot[0].is_set():
                if self.killed:
                    raise ProcessKilled("the check killed the process")
                raise KernelLost(self.problem or "the kernel stopped answering (it died, or its agent was stopped)")
            if left <= 0:
                raise CallTimeout(call_id)
            slot[0].wait(min(left, 0.2))
        self._pending.pop(call_id, None)
        self.calls += 1  # answered calls only: the agent raised a look before and after each of them
        return slot[1]

    def stop(self) -> None:
        try:
            self._send("stop", {})
        except OSError:
            pass

    def close(self) -> None:
        self.closed.set()
        try:
            self.conn.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ receiving

    def _read(self) -> None:
        try:
            while True:
                data = self.conn.recv(1 << 16)
                if not data:
                    break
                for kind, body in self.reader.feed(data):
                    self._dispatch(kind, body)
        except protocol.ProtocolError as exc:
            self.problem = f"the kernel's agent sent a broken frame ({exc})"
        except OSError:
            pass
        except Exception as exc:  # noqa: BLE001 (a signed frame the observer cannot use: the agent is not ours)
            self.problem = f"the kernel's agent sent a frame the grader cannot use ({type(exc).__name__}: {exc})"
        finally:
            self.closed.set()

    def _dispatch(self, kind: str, body) -> None:
        if not isinstance(body, dict):
            return
        if kind == "result":
            slot = self._pending.get(body.get("id"))
            if slot is not None and not slot[0].is_set():  # the first answer counts (an interrupt can add one)
                slot[1] = body
                slot[0].set()
        elif kind == "callback":
            threading.Thread(target=self._serve_callback, args=(body,), name="gpucourse-callback",
                             daemon=True).start()

    def _serve_callback(self, body: dict) -> None:
        fn = self._callbacks.get(body.get("fn"))
        args, kwargs = body.get("args"), body.get("kwargs")
        try:
            if fn is None or not isinstance(args, list) or not isinstance(kwargs, dict):
                raise RuntimeError("the grader has no such callback")
            reply = {"cb": body.get("cb"), "ok": protocol.plain(fn(*args, **kwargs))}
        except BaseException as exc:  # noqa: BLE001 (handed to the learner's code, as the check meant)
            kind = type(exc)
            name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            reply = {"cb": body.get("cb"), "raise": {"type": name, "message": str(exc)[:1000]}}
        try:
            self._send("reply", reply)
        except OSError:  # the kernel is gone (the check killed it from this very callback)
            pass
