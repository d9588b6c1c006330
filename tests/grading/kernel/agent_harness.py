"""A graded kernel's agent without Jupyter, for the agent's and the link's tests.

:func:`serve_in_thread` runs the agent's real cell (``agent.CELL_TEMPLATE``, with the protocol's and the agent's
texts) in a thread of the test's process, over a namespace the test gives; :func:`serve_in_process` runs it in a
fresh Python process that can be killed. Either way the test holds the grader's end: a :class:`Link` made the
way the grader's listener makes it (hello read, token checked).
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path

from gpucourse.grading import protocol
from gpucourse.grading.grader.link import Link
from gpucourse.grading.kernel import agent

KERNEL_DIR = Path(agent.__file__).parent
PROTOCOL_SRC = Path(protocol.__file__).read_text()
AGENT_SRC = (KERNEL_DIR / "agent.py").read_text()
CONNECT_S = 10.0


class ThreeArgError(Exception):
    """Built like TensorFlow's OpError: ``(node_def, op, message)``."""

    def __init__(self, node_def, op, message):
        super().__init__(message)
        self.node_def, self.op, self.message = node_def, op, message


class Grader:
    """The grader's socket in a short temporary folder (a Unix socket's path has at most 107 bytes)."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="gc-agent-", dir="/tmp")
        self.address = str(Path(self.folder) / "g.sock")
        self.token = secrets.token_hex(8)
        self.key = secrets.token_bytes(32)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(2)
        self.sock.settimeout(CONNECT_S)

    def cell(self) -> str:
        return agent.CELL_TEMPLATE.format(protocol_src=PROTOCOL_SRC, agent_src=AGENT_SRC, address=self.address,
                                          token=self.token, key=self.key.hex())

    def accept(self) -> Link:
        """The agent's connection as the grader's listener takes it: hello first, with the run's token."""
        conn, _ = self.sock.accept()
        conn.settimeout(CONNECT_S)
        reader = protocol.Reader({protocol.Role.AGENT: self.key})
        frames: list = []
        while not frames:
            data = conn.recv(1 << 16)
            assert data, "the agent closed its connection before its hello"
            frames = reader.feed(data)
        kind, body = frames[0]
        assert (kind, body) == ("hello", {"role": "agent", "token": self.token})
        conn.settimeout(None)
        return Link(conn, reader, frames[1:], self.key)

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def serve_in_thread(user_ns: dict):
    """``(link, thread)``: the agent answering calls on ``user_ns`` in a thread; stopped and joined at the end."""
    grader = Grader()
    errors: list = []

    def run():
        try:
            exec(grader.cell(), user_ns)  # noqa: S102 (the grader's own cell)
        except BaseException as exc:  # noqa: BLE001 (reported by the test: serve must not raise)
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-agent", daemon=True)
    thread.start()
    link = grader.accept()
    try:
        yield link, thread, errors
    finally:
        link.stop()
        thread.join(5)
        link.close()
        grader.close()


#: The fresh process's namespace: a function that hangs, and a count of the agent's ``gpucourse.look`` events.
PROCESS_NS = textwrap.dedent("""\
    import sys, time
    _looks = [0]
    def _count(event, args):
        if event == "gpucourse.look":
            _looks[0] += 1
    sys.addaudithook(_count)
    def looks():
        return _looks[0]
    def hang():
        time.sleep(120)
    def call_then_hang(cb):
        cb()
        time.sleep(120)
    def answer():
        return 42
""")


@contextmanager
def serve_in_process(prelude: str = ""):
    """``(link, process)``: the agent in a fresh Python process (killed at the end), after ``prelude``'s code."""
    grader = Grader()
    code = PROCESS_NS + textwrap.dedent(prelude) + f"exec({grader.cell()!r})\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    try:
        link = grader.accept()
        try:
            yield link, proc
        finally:
            link.close()
    finally:
        proc.kill()
        proc.wait(10)
        grader.close()
