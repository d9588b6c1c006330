"""The grader's end of the guard's channel: one Unix socket, authenticated and numbered records.

The guard (:mod:`gpucourse.grading.kernel_guard`) connects before any of the submission's code runs
and sends ``gpucourse-channel-1 <key>``. The grader accepts that one connection and stops listening.
Every later line is ``<hmac-sha256 of body> <body>`` with ``body = repr((seq, kind, detail))``.
:class:`Channel` checks each MAC and that ``seq`` counts up by one: a line the submission wrote into
the socket itself, or a record it stopped, shows up in :attr:`Channel.problems`. Records after
``end`` are ignored: nothing the submission does after the observations counts.

The reading thread only checks MACs and numbers; record bodies are parsed (``ast.literal_eval``)
when :attr:`Channel.records` is first read, in the caller's thread: CPython 3.11's AST builder is
not safe to use from two threads at once. :attr:`Channel.tampered` is set as soon as a record says
the submission replaced something or forged a message, so the grader can stop the run early.
"""

from __future__ import annotations

import ast
import hmac
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .kernel_guard import PROTOCOL

__all__ = ["Channel", "Record"]

#: Longest line accepted (an item's observation is one line).
MAX_LINE = 256 * 1024 * 1024

_HEAD = re.compile(rb"^\((\d+), '([a-z-]+)', ")
_PHASE = rb"""(?:'[^']*'|"[^"]*")"""
_TAMPER = re.compile(rb"^\(\d+, (?:'changed', \(" + _PHASE + rb", \(\('(?:replaced|added)'"
                     rb"|'event', \(" + _PHASE + rb", '(?:forged|ctypes|memory|audit-hook|install-write|output-write)')")


@dataclass
class Record:
    seq: int
    kind: str
    detail: object


@dataclass
class Channel:
    """Listen on a fresh socket; :meth:`start` before the kernel starts, :meth:`close` after it died."""

    raw: list[tuple[int, str, bytes]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    connected: bool = False
    ended: bool = False
    closed_early: bool = False

    def __post_init__(self):
        self.key: bytes | None = None
        self._keyed = threading.Event()
        self._dir = tempfile.mkdtemp(prefix="gpg-")
        os.chmod(self._dir, 0o700)
        self.address = os.path.join(self._dir, "s")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(1)
        self._end = threading.Event()
        self._stop = threading.Event()
        self.tampered = threading.Event()
        self._parsed: list[Record] | None = None
        self._thread = threading.Thread(target=self._serve, name="gpucourse-channel", daemon=True)
        self._conn = None

    @property
    def folder(self) -> str:
        """The private folder of the socket (the sandboxed kernel must reach it)."""
        return self._dir

    def start(self) -> "Channel":
        self._thread.start()
        return self

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
                break
            except socket.timeout:
                continue
            except OSError:
                return
        else:
            return
        self._listener.close()  # one connection only: the guard's
        os.unlink(self.address)
        self._conn = conn
        self.connected = True
        conn.settimeout(0.2)
        buf, key, last = b"", None, 0
        while not self._stop.is_set() and not self.ended:
            try:
                chunk = conn.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                self.closed_early = not self.ended  # tampering only if the kernel was still alive (see runner)
                break
            buf += chunk
            while b"\n" in buf and not self.ended:
                line, buf = buf.split(b"\n", 1)
                if key is None:
                    head, _, hexkey = line.decode("ascii", "replace").partition(" ")
                    if head != PROTOCOL or len(hexkey) != 64:
                        self.problems.append("the grader's channel did not start with the guard's greeting")
                        self.ended = True
                        break
                    key = bytes.fromhex(hexkey)
                    self.key = key  # the runner seals the driver's config with it (kernel_guard.seal)
                    self._keyed.set()
                    continue
                last = self._take(line, key, last)
            if len(buf) > MAX_LINE:
                self.problems.append("an oversized record arrived on the grader's channel")
                break
        self._end.set()

    def _take(self, line: bytes, key: bytes, last: int) -> int:
        mac, _, body = line.partition(b" ")
        want = hmac.new(key, body, "sha256").hexdigest().encode()
        if not hmac.compare_digest(mac, want):
            self.problems.append("a record the grader's guard did not write arrived on its channel")
            self.tampered.set()
            return last
        head = _HEAD.match(body)
        if head is None:
            self.problems.append("an unreadable record arrived on the grader's channel")
            return last
        seq, kind = int(head.group(1)), head.group(2).decode()
        if seq != last + 1:
            self.problems.append(f"records {last + 1}..{seq - 1} from the grader's guard never arrived")
            self.tampered.set()
        self.raw.append((seq, kind, body))
        if _TAMPER.match(body):
            self.tampered.set()
        if kind == "end":
            self.ended = True
        return seq

    @property
    def records(self) -> list[Record]:
        """The records, parsed once (call it from one thread; see the module docstring)."""
        if self._parsed is None or len(self._parsed) != len(self.raw):
            parsed = []
            for seq, kind, body in list(self.raw):
                try:
                    _, _, detail = ast.literal_eval(body.decode("utf-8"))
                except (ValueError, SyntaxError, UnicodeDecodeError, TypeError, MemoryError, RecursionError):
                    self.problems.append("an unreadable record arrived on the grader's channel")
                    continue
                parsed.append(Record(seq, kind, detail))
            self._parsed = parsed
        return self._parsed

    def wait_connected(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.connected and time.monotonic() < deadline and not self._end.is_set():
            time.sleep(0.02)
        return self.connected

    def wait_key(self, timeout: float) -> bytes | None:
        """The guard's channel key (its first line), once it arrived within ``timeout`` seconds, else None."""
        self._keyed.wait(timeout)
        return self.key

    def wait_end(self, timeout: float) -> bool:
        """Wait until the ``end`` record (or the channel closed); True if ``end`` arrived."""
        self._end.wait(timeout)
        return self.ended

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        for sock in (self._conn, self._listener):
            try:
                if sock is not None:
                    sock.close()
            except OSError:
                pass
        shutil.rmtree(self._dir, ignore_errors=True)

    def of_kind(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]
