"""The tripwire in a fresh process, as the graded kernel gets it, with "learner" code from a file of its own.

:func:`run` starts a Python process that runs the grader's tripwire cell (``tripwire.CELL_TEMPLATE``: the
protocol's and the tripwire's texts, this test's socket, token and key), then the learner's code from a file in
a temporary folder (outside the Python installation and the course package, as a notebook cell's code is),
through ``runpy`` (library code, as IPython is). The test's end reads the records, checked by the real
:class:`~gpucourse.grading.protocol.Reader`, until the process exits.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpucourse.grading import protocol
from gpucourse.grading.kernel import tripwire

PROTOCOL_SRC = Path(protocol.__file__).read_text()
TRIPWIRE_SRC = Path(tripwire.__file__).read_text()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Run:
    records: list            # (kind, body) in the order sent, the hello first
    learner: str             # the learner file's path, as the tripwire names it
    stdout: str
    stderr: str
    returncode: int
    broken: str = ""         # the Reader's complaint, if a frame was refused
    folder: str = field(default="", repr=False)

    def flags(self) -> list[tuple[str, str, str]]:
        return [(b["category"], b["detail"], b["where"]) for k, b in self.records if k == "flag"]

    def categories(self) -> list[str]:
        return [category for category, _, _ in self.flags()]

    def looks(self) -> list[dict]:
        return [b for k, b in self.records if k == "look"]

    def at(self, line: int, function: str = "<module>") -> str:
        """How the tripwire names a line of the learner's file."""
        return f"{self.learner}:{line} {function}"


def run(learner: str, *, grader_code=(), install: str | None = None, python: str = "venv", timeout: float = 60) -> Run:
    """Run ``learner`` (dedented) after the tripwire; ``install``: code that installs it instead of the cell;
    ``python``: "venv" (this environment's) or "base" (the installation it was made from, with no venv)."""
    folder = tempfile.mkdtemp(prefix="gc-tw-", dir="/tmp")
    try:
        address = str(Path(folder) / "g.sock")
        token, key = secrets.token_hex(8), secrets.token_bytes(32)
        path = Path(folder) / "learner.py"
        path.write_text(textwrap.dedent(learner))
        if install is None:
            install = tripwire.CELL_TEMPLATE.format(protocol_src=PROTOCOL_SRC, tripwire_src=TRIPWIRE_SRC,
                                                    address=address, token=token, key=key.hex(),
                                                    grader_code=list(grader_code))
        else:
            install = textwrap.dedent(install).format(protocol_src=repr(PROTOCOL_SRC),
                                                      tripwire_src=repr(TRIPWIRE_SRC), address=repr(address),
                                                      token=repr(token), key=repr(key))
        script = f"import runpy\nexec({install!r})\nrunpy.run_path({str(path)!r}, run_name='__main__')\n"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(1)
        server.settimeout(timeout)
        executable = sys.executable if python == "venv" else getattr(sys, "_base_executable", sys.executable)
        proc = subprocess.Popen([executable, "-c", script], cwd=folder, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        out: dict = {}
        drain = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate(timeout=timeout))))
        drain.start()
        records, broken = [], ""
        try:
            conn, _ = server.accept()
            conn.settimeout(timeout)
            reader = protocol.Reader({protocol.Role.TRIPWIRE: key})
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                records += reader.feed(data)
        except protocol.ProtocolError as exc:
            broken = str(exc)
        finally:
            server.close()
            drain.join(timeout)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not records or records[0] == ("hello", {"role": "tripwire", "token": token})
        return Run(records, str(path), out.get("stdout", ""), out.get("stderr", ""), proc.returncode, broken, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
