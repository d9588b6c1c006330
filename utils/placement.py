"""Topic 02: see where every op runs, and read the placement log as data.

TensorFlow tells you where it places ops when you call
``tf.debugging.set_log_device_placement(True)`` **before the runtime starts**.
It then writes two kinds of lines:

* ``Executing op MatMul in device /job:localhost/replica:0/task:0/device:CPU:0``,
  one per eager op (and one per ``tf.function`` call, named ``__inference_...``).
  In IPython/Jupyter/Colab TensorFlow prints them to Python's ``sys.stdout``;
  in a plain script they go to the C++ INFO log, which
  ``TF_CPP_MIN_LOG_LEVEL>=1`` hides.
* ``MatMul: (MatMul): /job:localhost/replica:0/task:0/device:CPU:0``, printed
  by the graph *placer* from C++ (``name: (OpType): device``), once per graph it
  places: a traced ``tf.function``, or the one-op function behind a new eager
  kernel.

This module turns that text into records you can tabulate and test:

* :func:`start_logging` switches the log on, and refuses (with
  :class:`~gpucourse.devices.TooLateError`) once the runtime has started,
  because TensorFlow then silently logs nothing.
* :func:`capture` runs a block of code and gives back its parsed
  :class:`PlacementLog`; :func:`parse_placement_log` parses text you already have.
* :func:`short_device` turns ``/job:localhost/replica:0/task:0/device:CPU:0``
  into ``CPU:0``.
* :func:`attempt` tries to run a small op on a device, with soft placement on
  or off, and reports where it ran or what TensorFlow said;
  :func:`effective_soft_placement` asks the runtime whether soft placement is
  really on (after ``set_log_device_placement(False)`` it may not be, while
  ``tf.config.get_soft_device_placement()`` still says True).
* :func:`probe_logging` runs fresh processes that show which calls make
  logging too late, and what switching the log off really does (the probes
  live in :mod:`gpucourse._placement_probes` and are re-exported here).

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from . import _tf, _validate
from ._placement_probes import OrderProbe, SwitchOffProbe, probe_logging, probe_order
from .devices import TooLateError, runtime_initialized
from ._labrules import answers

__all__ = [
    "Attempt",
    "PLUMBING_OPS",
    "PlacementLog",
    "PlacementRecord",
    "OrderProbe",
    "SwitchOffProbe",
    "TooLateError",
    "attempt",
    "capture",
    "devices_of",
    "effective_soft_placement",
    "logging_enabled",
    "parse_placement_log",
    "probe_logging",
    "probe_order",
    "short_device",
    "start_logging",
]

#: Op types that only move values in and out of a graph; hidden from tables by default.
PLUMBING_OPS = frozenset({"_Arg", "_Retval", "_DeviceArg", "_DeviceRetval"})

# A glog prefix such as "I0000 00:00:1795393191.139464    7452 placer.cc:162] ".
_GLOG = re.compile(r"^[IWEF]\d{4}\s+[\d:.]+\s+\d+\s+\S+:\d+\]\s?")
_EXECUTED = re.compile(r"^Executing op (?P<op>\S+) in device (?P<device>\S+)\s*$")
_PLACED = re.compile(r"^(?P<op>\S+): \((?P<type>[A-Za-z0-9_]+)\): (?P<device>/\S+)\s*$")
_COMPONENT = re.compile(r"^(?:device:)?(?P<type>[A-Za-z][A-Za-z0-9_]*):(?P<index>\d+)$")
_NOT_DEVICE_TYPES = {"JOB", "REPLICA", "TASK"}


# --------------------------------------------------------------------------- device names


@answers('02', 'q1')
def short_device(name: str) -> str:
    """Shorten a device name to ``TYPE:index``.

    ``'/job:localhost/replica:0/task:0/device:CPU:0'`` -> ``'CPU:0'``;
    ``'/device:GPU:1'``, ``'/GPU:1'``, ``'gpu:1'`` -> ``'GPU:1'``.
    The job, replica and task are dropped, so only use it for devices of one process.

    Raises:
        TypeError: ``name`` is not a string (pass ``tensor.device``, not the tensor).
        ValueError: ``name`` does not end in a ``TYPE:index`` device, e.g. ``''``
            (a symbolic tensor has no device yet) or ``'/GPU:*'``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a device string like '/device:CPU:0', got {type(name).__name__}; "
                        "for a tensor pass tensor.device")
    last = name.strip().rstrip("/").rsplit("/", 1)[-1]
    m = _COMPONENT.match(last)
    if not m or m["type"].upper() in _NOT_DEVICE_TYPES:
        raise ValueError(f"expected a device name ending in TYPE:index, like "
                         f"'/job:localhost/replica:0/task:0/device:CPU:0' or 'GPU:1', got {name!r}")
    return f"{m['type'].upper()}:{int(m['index'])}"


@answers('02', 'q1')
def devices_of(tensors: Iterable) -> list[str]:
    """Short device names of several eager tensors (or variables), in order."""
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Iterable):
        raise TypeError(f"tensors must be a list of tensors, got {type(tensors).__name__}")
    out = []
    for i, t in enumerate(tensors):
        dev = getattr(t, "device", None)
        if not isinstance(dev, str):
            raise TypeError(f"item {i} ({type(t).__name__}) has no .device string; expected an eager tensor")
        out.append(short_device(dev))
    return out


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class PlacementRecord:
    """One placement fact read from the log.

    Attributes:
        kind: ``"executed"`` (an ``Executing op`` line: an eager op or a
            ``tf.function`` call) or ``"placed"`` (a placer line: one node of a
            graph being placed).
        op: the node name (``"mul/y"``) for placed nodes, the op type for executed ops.
        op_type: the op type, e.g. ``"MatMul"`` (``"__inference_f_12"`` for a function call).
        device: the full device name as logged.
    """

    kind: str
    op: str
    op_type: str
    device: str

    @property
    def short(self) -> str:
        """The device as ``TYPE:index``."""
        return short_device(self.device)

    @property
    def is_plumbing(self) -> bool:
        """True for argument/return-value nodes that every function graph has."""
        return self.op_type in PLUMBING_OPS

    @property
    def is_function_call(self) -> bool:
        """True for the ``Executing op __inference_...`` line of a ``tf.function`` call."""
        return self.kind == "executed" and self.op_type.startswith("__inference_")


@dataclass
class PlacementLog:
    """Parsed placement log: the records, plus the raw text they came from."""

    records: list[PlacementRecord] = field(default_factory=list)
    text: str = field(default="", repr=False)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[PlacementRecord]:
        return iter(self.records)

    @property
    def executed(self) -> list[PlacementRecord]:
        """``Executing op`` records, in the order they ran."""
        return [r for r in self.records if r.kind == "executed"]

    @property
    def placed(self) -> list[PlacementRecord]:
        """Placer records, in the order they were printed."""
        return [r for r in self.records if r.kind == "placed"]

    def rows(self, kind: str | None = None, plumbing: bool = False) -> list[tuple[str, str, str, str]]:
        """``(kind, op, op_type, short device)`` rows.

        Args:
            kind: ``"executed"``, ``"placed"`` or None for both.
            plumbing: include ``_Arg``/``_Retval`` nodes.
        """
        _validate.one_of("kind", kind, ("executed", "placed", None))
        return [(r.kind, r.op, r.op_type, r.short) for r in self.records
                if (kind is None or r.kind == kind) and (plumbing or not r.is_plumbing)]

    def op_devices(self, kind: str | None = None, plumbing: bool = False) -> dict[str, list[str]]:
        """Op type -> sorted short devices it appeared on, e.g. ``{"MatMul": ["CPU:0", "CPU:1"]}``."""
        out: dict[str, set[str]] = {}
        for _, _, op_type, dev in self.rows(kind, plumbing):
            out.setdefault(op_type, set()).add(dev)
        return {k: sorted(v, key=_device_sort_key) for k, v in out.items()}

    def devices(self) -> list[str]:
        """Every device that appears in the log (short names, sorted)."""
        return sorted({r.short for r in self.records}, key=_device_sort_key)

    def to_text(self, kind: str | None = None, plumbing: bool = False) -> str:
        """An aligned table: kind, op, op type, device."""
        rows = self.rows(kind, plumbing)
        if not rows:
            return "(no placement lines: was logging switched on before the first op?)"
        head = ("kind", "op", "op type", "device")
        widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle):  # IPython display
        p.text(self.to_text())


def _device_sort_key(short: str) -> tuple[str, int]:
    kind, _, index = short.partition(":")
    return (kind, int(index) if index.isdigit() else -1)


def parse_placement_log(text) -> PlacementLog:
    """Parse placement-log text into a :class:`PlacementLog`.

    Understands both kinds of line, with or without a glog prefix
    (``I0000 00:00:... placer.cc:162] ``), and ignores every other line.

    Args:
        text: a string, or anything with a string ``.text`` (such as the
            ``CapturedOutput`` of :func:`gpucourse.logcapture.capture_output`).
    """
    if not isinstance(text, str):
        inner = getattr(text, "text", None)
        if not isinstance(inner, str):
            raise TypeError(f"text must be a string (or a CapturedOutput), got {type(text).__name__}")
        text = inner
    records = []
    for raw in text.splitlines():
        line = _GLOG.sub("", raw.strip())
        m = _EXECUTED.match(line)
        if m:
            records.append(PlacementRecord("executed", m["op"], m["op"], m["device"]))
            continue
        m = _PLACED.match(line)
        if m:
            try:
                short_device(m["device"])
            except ValueError:
                continue
            records.append(PlacementRecord("placed", m["op"], m["type"], m["device"]))
    return PlacementLog(records, text)


# --------------------------------------------------------------------------- switching it on, capturing


def logging_enabled() -> bool:
    """Whether TensorFlow's placement-logging flag is on.

    Careful: the flag reads True even when it was set too late to log anything,
    and it reads False after ``set_log_device_placement(False)`` although the
    log carries on. :func:`start_logging` avoids both traps.

    Never switch the log off with ``set_log_device_placement(False)`` once the
    runtime has started: in TF 2.21 that call sets *soft placement* off instead
    (its Python binding, ``TFE_ContextSetLogDevicePlacement`` in
    ``tensorflow/python/tfe_wrapper.cc``, calls the soft-placement setter),
    while ``tf.config.get_soft_device_placement()`` keeps saying True. See
    :func:`effective_soft_placement`; restart the kernel to stop the log.
    """
    if "tensorflow" not in sys.modules:
        return False
    return bool(_tf.tf().debugging.get_log_device_placement())


def _in_ipython() -> bool:
    ip = sys.modules.get("IPython")
    return bool(ip is not None and getattr(ip, "get_ipython", lambda: None)() is not None)


def start_logging(python_lines: bool = True) -> bool:
    """Switch placement logging on; call it before any op runs.

    Safe to call again (a re-run notebook cell): it then does nothing.

    Args:
        python_lines: outside IPython, also send the ``Executing op`` lines to
            Python's ``sys.stdout`` as Jupyter does (otherwise a plain script
            only shows them with ``TF_CPP_MIN_LOG_LEVEL=0``, in the C++ log).
            Uses the hook TensorFlow itself calls when imported under IPython.

    Returns:
        True if this call switched logging on, False if it was already on.

    Raises:
        TooLateError: the runtime has already started (an op ran, a
            ``tf.function`` was traced, or logical devices were listed, e.g. by
            ``devices.setup_logical_devices``). TensorFlow would accept the call
            and log nothing (in TF 2.21 it would set soft placement instead).
    """
    if not isinstance(python_lines, bool):
        raise TypeError(f"python_lines must be True or False, got {python_lines!r}")
    tf = _tf.tf()
    if tf.debugging.get_log_device_placement():
        return False
    if runtime_initialized():
        raise TooLateError(
            "Too late: TensorFlow's runtime has already started, and set_log_device_placement(True) now "
            "changes the flag but logs nothing. Restart the kernel and call placement.start_logging() "
            "right after `import tensorflow`, before setup_logical_devices() or any op.")
    if python_lines and not _in_ipython():
        try:
            from tensorflow.python import pywrap_tfe  # private; what tf does on import under IPython

            pywrap_tfe.TFE_Py_EnableInteractivePythonLogging()
        except (ImportError, AttributeError):  # pragma: no cover - older/newer TF
            pass
    tf.debugging.set_log_device_placement(True)
    return True


@contextlib.contextmanager
def capture(echo: bool = False):
    """Capture the placement log of the code in the ``with`` block.

    Yields a :class:`PlacementLog` that is filled in when the block ends::

        with placement.capture() as log:
            y = tf.matmul(x, x)
        print(log.op_devices())

    Both the C++ placer lines and the Python ``Executing op`` lines are
    captured, but not interleaved: the placer lines come first.

    Args:
        echo: also print everything captured (log lines and your prints) afterwards.
    """
    if not isinstance(echo, bool):
        raise TypeError(f"echo must be True or False, got {echo!r}")
    from .logcapture import capture_output

    log = PlacementLog()
    with capture_output(echo=echo) as out:
        yield log
    parsed = parse_placement_log(out.text)
    log.records, log.text = parsed.records, parsed.text


# --------------------------------------------------------------------------- trying a device


@dataclass
class Attempt:
    """The outcome of :func:`attempt`: where the op ran, or what TensorFlow said."""

    requested: str
    soft: bool
    ran_on: str | None = None  # short device name, None if TensorFlow refused
    error: str | None = None  # "ExceptionType: first sentence of the message"

    @property
    def ok(self) -> bool:
        return self.ran_on is not None

    def __str__(self) -> str:
        what = f"ran on {self.ran_on}" if self.ok else self.error
        return f"tf.device({self.requested!r}), soft placement {'on' if self.soft else 'off'}: {what}"


def _first_sentence(text: str, limit: int = 120) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.split(". ", 1)[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


@answers('02', 'q3')
def attempt(device: str, soft: bool, fn: Callable | None = None) -> Attempt:
    """Run ``fn()`` (default: a 2x2 matmul) under ``tf.device(device)`` with soft placement set to ``soft``.

    The previous soft-placement setting is restored afterwards, even on error.
    ``InvalidArgumentError`` (no such device, or no kernel for it) and
    ``ValueError`` (a malformed device string) become ``Attempt.error``;
    anything else propagates.
    """
    if not isinstance(device, str):
        raise TypeError(f"device must be a string like '/GPU:0', got {type(device).__name__}")
    if not isinstance(soft, bool):
        raise TypeError(f"soft must be True or False, got {soft!r}")
    if fn is not None:
        _validate.callable_("fn", fn)
    tf = _tf.tf()

    def default():
        return tf.matmul(tf.ones((2, 2)), tf.ones((2, 2)))

    before = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(soft)
    try:
        with tf.device(device):
            result = (fn or default)()
        return Attempt(device, soft, ran_on=short_device(result.device))
    except (tf.errors.InvalidArgumentError, ValueError) as err:
        msg = getattr(err, "message", None) or str(err)
        return Attempt(device, soft, error=f"{type(err).__name__}: {_first_sentence(msg)}")
    finally:
        tf.config.set_soft_device_placement(before)


def effective_soft_placement() -> bool:
    """Whether the eager runtime really falls back when a device is missing (soft placement).

    ``tf.config.get_soft_device_placement()`` reports the *Python* setting. After
    ``tf.debugging.set_log_device_placement(False)`` in a started runtime the two
    disagree: TF 2.21's binding of that call switches the runtime's soft
    placement off and leaves the Python setting at True. This asks the runtime:
    it runs one tiny op on a CPU that does not exist and sees whether it lands
    somewhere else or raises. Before the runtime starts it returns the setting
    (nothing has diverged yet, and running an op would start the runtime).

    Fix a False with ``tf.config.set_soft_device_placement(True)``.
    """
    tf = _tf.tf()
    if not runtime_initialized():
        return bool(tf.config.get_soft_device_placement())
    from .logcapture import capture_output

    missing = f"/device:CPU:{len(tf.config.list_logical_devices('CPU')) + 7}"
    with capture_output():  # the probe op would otherwise appear in a placement log
        try:
            with tf.device(missing):
                tf.zeros(())
            return True
        except tf.errors.InvalidArgumentError:
            return False
