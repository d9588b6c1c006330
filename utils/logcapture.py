"""Capture what TensorFlow's C++ core prints, so notebooks (and tests) can read it.

TensorFlow writes placement logs, warnings and XLA messages from C++ straight
to file descriptors 1 and 2. Python's ``contextlib.redirect_stdout`` never sees
them. Inside JupyterLab, ipykernel forwards those descriptors to the cell, but
under pytest and some other front ends it does not. So a notebook that must
*read* the log (to parse it into a table, say) redirects the descriptors
themselves, using ``wurlitzer``.

    with capture_output() as out:
        tf.matmul(a, b)
    print(out.grep("MatMul"))
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from dataclasses import dataclass, field

__all__ = ["CapturedOutput", "capture_output"]


@dataclass
class CapturedOutput:
    """Text captured by :func:`capture_output`; filled in when the ``with`` block ends."""

    text: str = ""
    method: str = field(default="", repr=False)

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.text.splitlines() if ln.strip()]

    def grep(self, pattern: str) -> list[str]:
        """Lines matching the regular expression ``pattern``."""
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a regular-expression string, got {type(pattern).__name__}")
        rx = re.compile(pattern)
        return [ln for ln in self.lines if rx.search(ln)]

    def __str__(self) -> str:
        return self.text


@contextlib.contextmanager
def capture_output(echo: bool = False):
    """Capture C-level *and* Python-level stdout/stderr inside the ``with`` block.

    Args:
        echo: also print the captured text after the block, so the learner
            still sees it.

    Yields:
        A :class:`CapturedOutput` whose ``text`` is set when the block exits.
        On platforms without ``wurlitzer`` (Windows) only Python-level output is
        captured and ``method`` says so.
    """
    result = CapturedOutput()
    py_buf = io.StringIO()
    try:
        import wurlitzer
    except ImportError:
        wurlitzer = None
    c_out = None
    try:
        with contextlib.redirect_stdout(py_buf), contextlib.redirect_stderr(py_buf):
            if wurlitzer is not None:
                with wurlitzer.pipes(stdout=io.StringIO(), stderr=wurlitzer.STDOUT) as (c_out, _):
                    yield result
            else:
                yield result
    finally:
        c_text = c_out.getvalue() if c_out is not None else ""
        result.text = c_text + py_buf.getvalue()
        result.method = "file descriptors + Python streams" if wurlitzer else "Python streams only (no wurlitzer)"
        if echo and result.text:
            sys.stdout.write(result.text)
