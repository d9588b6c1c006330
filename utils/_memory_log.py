"""TensorFlow's own words about memory: its GPU allocator's messages, and its log split into whole records.

:func:`allocator_messages` reads the GPU allocator's log messages (growth forced by an environment variable,
running out of memory, freeing regions against fragmentation) out of the installed library, where even the
CPU-only wheel has them; :func:`split_log_records` splits TensorFlow's stderr into whole messages (the
out-of-memory warning spans several lines). Part of topic 03: :mod:`gpucourse.memory` re-exports both (and
:class:`LogRecord`), and notebooks write ``memory.<name>``. Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from . import _validate

__all__ = ["LogRecord", "allocator_messages", "split_log_records"]


# --------------------------------------------------------------------------- the allocator's messages


#: TensorFlow's own log messages about the GPU allocator, as the C++ code builds them: literal pieces
#: (each looked up in the installed library by :func:`allocator_messages`) and, in angle brackets, the
#: values filled in at run time. The pieces are stored apart in the library, so they are joined here.
_MESSAGES = {
    "growth overridden": (  # gpu_bfc_allocator.cc, WARNING, when the variable beats the Python flag
        "Overriding allow_growth setting because the",
        " TF_FORCE_GPU_ALLOW_GROWTH environment variable is set. Original", " config value was ", "<0 or 1>", "."),
    "growth value not parsed": (  # gpu_bfc_allocator.cc, ERROR, for any value but "true" and "false"
        "The TF_FORCE_GPU_ALLOW_GROWTH environment variable is set but could", ' not be parsed: "', "<value>",
        '". Valid', ' values are "true" or "false". Using original config value', " of ", "<0 or 1>", "."),
    "out of memory": (  # bfc_allocator.cc, WARNING, before ResourceExhaustedError
        "Allocator (", "<allocator>", ") ran out of memory trying ", "to allocate ", "<size>", " (rounded to ",
        "<bytes>", ")", "requested by op ", "<op>",
        "\nIf the cause is memory fragmentation maybe the environment ",
        "variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' will ",
        "improve the situation. \nCurrent allocation summary follows."),
    "garbage collection": (  # bfc_allocator.cc, WARNING, at the limit of a growing pool
        "Garbage collection: deallocate free memory regions",
        " (i.e., allocations) so that we can re-allocate a larger",
        " region to avoid OOM due to memory fragmentation. If you",
        " see this message frequently, you are running near the",
        " threshold of the available device memory and re-allocation",
        " may incur great performance overhead. You may try smaller",
        " batch sizes to observe the performance impact.",
        " Set TF_ENABLE_GPU_GARBAGE_COLLECTION=false if you'd like to", " disable this feature."),
}


def _tf_library_paths() -> list[str]:
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = list(spec.submodule_search_locations)[0]
    return sorted(glob.glob(os.path.join(root, "libtensorflow_framework*")))


def allocator_messages(library: str | None = None) -> dict[str, str]:
    """TensorFlow's own log messages about GPU memory, whole, checked against the installed library.

    The GPU allocator's messages (growth forced by ``TF_FORCE_GPU_ALLOW_GROWTH``,
    a value it cannot parse, running out of memory with the hint to try
    ``TF_GPU_ALLOCATOR=cuda_malloc_async`` against fragmentation, freeing
    whole regions to avoid an out-of-memory error) are compiled into
    ``libtensorflow_framework`` even in the CPU-only wheel. The C++ code writes
    each one as several string pieces with values between them, and the
    library stores the pieces apart. Returns ``{key: whole message}`` for the
    messages whose every piece is in the library, the run-time values shown as
    ``<placeholders>``; an empty dict when the library cannot be found (another
    packaging).
    """
    if library is not None:
        _validate.text("library", library, what="path of libtensorflow_framework")
        if not os.path.isfile(library):
            raise ValueError(f"library must be an existing file, got {library!r}")
    data = b"".join(open(path, "rb").read() for path in ([library] if library else _tf_library_paths()))
    found: dict[str, str] = {}
    for key, pieces in _MESSAGES.items():
        literal = [p for p in pieces if not (p.startswith("<") and p.endswith(">")) and len(p) > 3]
        if data and all(p.encode() in data for p in literal):
            found[key] = "".join(pieces)
    return found


# --------------------------------------------------------------------------- the log, as records

#: The start of one record of TensorFlow's C++ log (absl): severity, date, time, thread, file:line.
_LOG_START = re.compile(r"^(?P<severity>[IWEF])\d{4} [\d:.]+\s+\d+ (?P<source>[^\s\]]+)\] ?(?P<message>.*)$")
#: Lines that start a record of their own without that prefix (absl before its initialisation, Python logging).
_OTHER_START = re.compile(r"^(?P<severity>WARNING|ERROR|INFO|FATAL):(?P<source>[\w.]*:?) ?(?P<message>.*)$")


@dataclass
class LogRecord:
    """One message of TensorFlow's log: severity (``I``, ``W``, ``E``, ``F``, or a word), source, whole text."""

    severity: str
    source: str
    message: str


def split_log_records(text: str) -> list[LogRecord]:
    """Split TensorFlow's stderr into whole messages.

    A C++ message may hold newlines (the out-of-memory warning has three lines);
    the lines after the first carry no prefix. Each such continuation line is
    joined (with ``\\n``) to the record it continues, so every record is one whole
    message, never half a sentence. Lines before the first record are records
    of their own, with severity ``""``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be TensorFlow's stderr as a string, got {type(text).__name__}")
    records: list[LogRecord] = []
    for line in text.splitlines():
        m = _LOG_START.match(line) or _OTHER_START.match(line)
        if m:
            records.append(LogRecord(m["severity"], m["source"].rstrip(":"), m["message"]))
        elif records:
            records[-1].message += "\n" + line
        elif line.strip():
            records.append(LogRecord("", "", line))
    return records
