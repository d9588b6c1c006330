"""Topic 08: profile a training loop, and read the trace in code to see whether the accelerator waits.

One job, traces and what they say about each step:

* **Capture.** :func:`capture_trace` wraps ``tf.profiler.experimental.start/stop``
  around a block, writes into a fresh temporary folder and finds the
  ``plugins/profile/<run>/<host>.xplane.pb`` it produced. :func:`step_marker`
  and :func:`region` label steps and the named ranges inside them
  (``tf.profiler.experimental.Trace``); :func:`run_traced_steps` runs a loop with both.
* **Read, without TensorBoard.** :func:`convert_trace` runs the profiler plugin's
  own converter (the one behind TensorBoard's Profile tab) without its log noise;
  :func:`load_trace` turns its trace-viewer JSON into :class:`TraceEvent` objects;
  :func:`parse_trace` reads trace-viewer JSON. :func:`step_breakdown` splits every
  step into input time, compute time and the rest.

The simulated accelerator and the capstone's benchmark live in
:mod:`gpucourse.simulate`, the live utilisation monitor in :mod:`gpucourse.monitor`.
Importing this module never imports TensorFlow: everything that needs it imports
it when called.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from . import _validate
from ._tf import tf as _tf
from .simulate import TimelineEvent
from ._labrules import answers

__all__ = ["PROFILER_NOISE", "StepBreakdown", "StepSplit", "TraceCapture", "TraceEvent", "capture_trace",
           "convert_trace", "drop_profiler_noise", "find_xplane", "load_trace", "parse_trace", "region",
           "run_traced_steps", "step_breakdown", "step_marker"]


# --------------------------------------------------------------------------- the profiler's log lines

#: Lines the profiler's C++ code writes to stderr (below Python's ``sys.stderr``) on every call, none of
#: them a problem. In a notebook they show in red and read as "something broke".
#:
#: * The plugin's converter (xprof 2.24) first asks its registry of "unified" processors for the tool; for
#:   ``trace_viewer`` and ``kernel_stats`` there is none, so it logs ``E... No UnifiedProfileProcessor
#:   registered for tool: trace_viewer`` at *error* level and ``W... Unified processor not found for tool:
#:   trace_viewer, falling back to legacy.``, then converts with the processor that has always done it
#:   (``xplane_to_tools_data_with_profile_processor.cc``: the lookup runs first while the
#:   ``enable_unified_xprof`` flag is on, and the flag cannot be set from Python). The result is complete.
#: * Its first log line in a process is absl's ``WARNING: All log messages before absl::InitializeLog()
#:   is called are written to STDERR``: the plugin never sets up logging, which changes nothing.
#: * ``I...`` lines are INFO: the converter's progress ("serving tool", "Total time for tool") and the
#:   profiler session's ("Profiler session started", "Collecting XSpace to repository").
#:   ``TF_CPP_MIN_LOG_LEVEL=1`` hides them too, but it is unset on Colab.
#:
#: :func:`drop_profiler_noise` drops exactly these (a test checks each against the real converter); any
#: other line, an error included, is passed on.
PROFILER_NOISE = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "No UnifiedProfileProcessor registered for tool: ",
    "Unified processor not found for tool: ",
)
#: An INFO line of absl/TensorFlow logging: ``I`` then MMDD, a time (absl may print the epoch seconds), a thread id
#: and ``file.cc:line]``.
_INFO_LINE = re.compile(r"^I\d{4} [\d:.]+\s+\d+ [\w./+-]+:\d+\] ")


def drop_profiler_noise(text: str) -> str:
    """``text`` without the lines of :data:`PROFILER_NOISE`, INFO lines and blank lines; each other line kept."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string (what the profiler wrote to stderr), got {type(text).__name__}")
    return "\n".join(ln for ln in text.splitlines()
                     if ln.strip() and not _INFO_LINE.match(ln) and not any(n in ln for n in PROFILER_NOISE))


@contextlib.contextmanager
def _quiet_profiler():
    """Run the block with the C-level stderr caught; afterwards write what is not noise to ``sys.stderr``.

    Only around the profiler's own calls (start, stop, the converter), never around your code. Without
    ``wurlitzer`` (Windows) the block runs as it is.
    """
    try:
        from wurlitzer import pipes
    except ImportError:
        yield
        return
    caught = io.StringIO()
    try:
        with pipes(stdout=None, stderr=caught):
            yield
    finally:
        kept = drop_profiler_noise(caught.getvalue())
        if kept:
            print(kept, file=sys.stderr)


# --------------------------------------------------------------------------- capturing a trace


@dataclass
class TraceCapture:
    """Where a trace went: filled in by :func:`capture_trace` when its block ends."""

    logdir: str
    xplane_path: str | None = None

    def events(self) -> list["TraceEvent"]:
        """The captured events (see :func:`load_trace`)."""
        if self.xplane_path is None:
            raise ValueError("the trace is not finished yet: read it after the `with capture_trace()` block")
        return load_trace(self.xplane_path)


@contextlib.contextmanager
def capture_trace(logdir: str | os.PathLike | None = None):
    """Profile the ``with`` block with ``tf.profiler.experimental.start/stop``.

    Args:
        logdir: where to write; a fresh temporary folder when None (traces
            are a few hundred kB and do not belong in a repository).

    Yields:
        A :class:`TraceCapture`; its ``xplane_path`` is set when the block ends.
        The profiler is stopped even if the block raises.
    """
    tf = _tf()
    if logdir is None:
        logdir = tempfile.mkdtemp(prefix="gpucourse-trace-")
    elif not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a folder path or None, got {type(logdir).__name__}")
    logdir = os.fspath(logdir)
    capture = TraceCapture(logdir)
    try:
        with _quiet_profiler():
            tf.profiler.experimental.start(logdir)
    except tf.errors.AlreadyExistsError as err:
        raise RuntimeError("another profiler is already running in this process (only one can run at a time); "
                           "stop it with tf.profiler.experimental.stop() and try again") from err
    try:
        yield capture
    finally:
        with _quiet_profiler():
            tf.profiler.experimental.stop()
    capture.xplane_path = find_xplane(logdir)


def find_xplane(logdir: str | os.PathLike) -> str:
    """Path of the newest ``*.xplane.pb`` under ``logdir/plugins/profile/``.

    Raises:
        FileNotFoundError: when the folder holds no trace.
    """
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a folder path, got {type(logdir).__name__}")
    logdir = os.fspath(logdir)
    found = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    if not found:
        raise FileNotFoundError(f"no plugins/profile/<run>/*.xplane.pb under {logdir!r}: was the profiler "
                                "started with this logdir and stopped again?")
    return max(found, key=lambda p: (os.path.getmtime(p), p))


def step_marker(step: int, name: str = "train"):
    """Context manager marking one training step in the trace (``Trace(name, step_num=step, _r=1)``).

    ``_r=1`` makes it a *root* event, which is what the profiler's step
    analysis (and :func:`step_breakdown`) groups the step's work under.
    """
    _validate.whole("step", step, 0)
    _validate.text("name", name)
    return _tf().profiler.experimental.Trace(name, step_num=step, _r=1)


def region(name: str):
    """Context manager for a named range inside a step, e.g. ``region("input")``."""
    _validate.text("name", name)
    return _tf().profiler.experimental.Trace(name)


def run_traced_steps(dataset: Iterable, step_fn: Callable, steps: int, step_name: str = "train",
                     input_name: str = "input", compute_name: str = "compute") -> int:
    """Run up to ``steps`` training steps, each marked for the profiler.

    Each step is a :func:`step_marker` holding two :func:`region` ranges:
    ``input`` (getting the next element) and ``compute`` (``step_fn(element)``,
    synced so that asynchronous GPU work is inside the range). Returns the
    number of steps run. If the dataset ends first, the trace also holds the
    step that found it empty (an input range only): give it enough elements.
    """
    from .timing import sync

    _validate.callable_("step_fn", step_fn)
    _validate.whole("steps", steps)
    try:
        it = iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be iterable (e.g. a tf.data.Dataset), got {type(dataset).__name__}") from None
    done = 0
    for i in range(steps):
        with step_marker(i, step_name):
            with region(input_name):
                try:
                    element = next(it)
                except StopIteration:
                    break
            with region(compute_name):
                sync(step_fn(element))
        done += 1
    return done


# --------------------------------------------------------------------------- reading a trace


@dataclass(frozen=True)
class TraceEvent:
    """One complete event of a trace: a named range on one thread. Times in microseconds.

    ``thread`` and ``process`` are the names the trace gives the line and the plane the event is on, e.g.
    ``"python"`` on ``"/host:CPU"``, or ``"Stream #7(Compute)"`` on ``"/device:GPU:0"`` in a GPU trace.
    """

    name: str
    start_us: float
    dur_us: float
    pid: int = 0
    tid: int = 0
    thread: str = ""
    args: dict = field(default_factory=dict, compare=False, hash=False)
    process: str = ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def _trace_dict(trace) -> list:
    if isinstance(trace, bytes):
        trace = trace.decode()
    if isinstance(trace, str):
        try:
            trace = json.loads(trace)
        except json.JSONDecodeError as err:
            raise ValueError(f"trace text is not trace-viewer JSON: {err}") from None
    if isinstance(trace, Mapping):
        if "traceEvents" not in trace:
            raise ValueError("trace dict has no 'traceEvents' key: expected trace-viewer JSON")
        trace = trace["traceEvents"]
    if not isinstance(trace, (list, tuple)):
        raise TypeError("trace must be trace-viewer JSON (text, bytes or dict with 'traceEvents') "
                        f"or a list of event dicts, got {type(trace).__name__}")
    return list(trace)


def parse_trace(trace) -> list[TraceEvent]:
    """Turn trace-viewer JSON into :class:`TraceEvent` objects, sorted by start time.

    Only complete events (``"ph": "X"``, with ``ts`` and ``dur`` in µs) are
    kept; thread and process names come from the ``thread_name`` and ``process_name`` metadata events.
    """
    raw = _trace_dict(trace)
    threads, processes = {}, {}
    for ev in raw:
        if isinstance(ev, Mapping) and ev.get("ph") == "M" and ev.get("name") == "thread_name":
            threads[(ev.get("pid"), ev.get("tid"))] = str((ev.get("args") or {}).get("name", ""))
        elif isinstance(ev, Mapping) and ev.get("ph") == "M" and ev.get("name") == "process_name":
            processes[ev.get("pid")] = str((ev.get("args") or {}).get("name", ""))
    out = []
    for ev in raw:
        if not isinstance(ev, Mapping) or ev.get("ph") != "X":
            continue
        if not isinstance(ev.get("ts"), (int, float)) or not isinstance(ev.get("dur"), (int, float)):
            raise ValueError(f"complete event without numeric ts/dur: {dict(ev)!r}")
        key = (ev.get("pid", 0), ev.get("tid", 0))
        out.append(TraceEvent(str(ev.get("name", "")), float(ev["ts"]), float(ev["dur"]), key[0] or 0,
                              key[1] or 0, threads.get(key, ""), dict(ev.get("args") or {}),
                              processes.get(key[0], "")))
    out.sort(key=lambda e: (e.start_us, -e.dur_us))
    return out


def _converter():
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        try:
            from tensorboard_plugin_profile.convert import raw_to_tool_data
        except ImportError:
            raise ImportError("reading .xplane.pb traces needs the profiler plugin: "
                              "pip install tensorboard-plugin-profile") from None
    return raw_to_tool_data


def convert_trace(path: str | os.PathLike, tool: str = "trace_viewer", params: Mapping | None = None):
    """What TensorBoard's Profile tab shows for a trace: ``(data, content_type)`` for one of its tools.

    This is the plugin's own converter, ``xprof.convert.raw_to_tool_data.xspace_to_tool_data([path], tool,
    params)`` (no TensorBoard server or UI), called with the lines of :data:`PROFILER_NOISE` dropped from
    what it writes to stderr; any other line still shows. ``path`` is an ``.xplane.pb`` file or a logdir
    holding one; ``tool`` a tool name such as ``"trace_viewer"`` (JSON text), ``"input_pipeline_analyzer"``,
    ``"framework_op_stats"``, ``"kernel_stats"`` or ``"memory_profile"`` (JSON bytes).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be an .xplane.pb file or a logdir, got {type(path).__name__}")
    _validate.text("tool", tool, "a profiler tool name such as 'trace_viewer'")
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of tool options (or None), got {type(params).__name__}")
    params = dict(params or {})
    path = os.fspath(path)
    if os.path.isdir(path):
        path = find_xplane(path)
    if not path.endswith(".xplane.pb"):
        raise ValueError(f"expected an .xplane.pb file (or the logdir), got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no trace file at {path!r}")
    converter = _converter()
    with _quiet_profiler():
        return converter.xspace_to_tool_data([path], tool, params)


def load_trace(path: str | os.PathLike) -> list[TraceEvent]:
    """Read a trace (an ``.xplane.pb`` file, or a logdir holding one) into events.

    Converts it with :func:`convert_trace` (the converter behind TensorBoard's trace viewer,
    ``"trace_viewer"``), which returns ``(json_text, content_type)``, and parses the JSON.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be an .xplane.pb file or a logdir, got {type(path).__name__}")
    data, _content_type = convert_trace(path, "trace_viewer")
    if not data:
        raise ValueError(f"the profiler plugin could not convert {os.fspath(path)!r} (empty result)")
    return parse_trace(data)


@answers('08', 'q2')
def _union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of one thread's ranges: a range nested in another of the same name counts once."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


@dataclass
class StepSplit:
    """One step of a trace, split into input, compute and the rest. Times in milliseconds."""

    step: int
    start_us: float
    step_ms: float
    input_ms: float
    compute_ms: float
    input_spans_us: list = field(default_factory=list, repr=False)
    compute_spans_us: list = field(default_factory=list, repr=False)

    @property
    def other_ms(self) -> float:
        """Time inside the step that is neither input nor compute (Python, bookkeeping)."""
        return max(0.0, self.step_ms - self.input_ms - self.compute_ms)

    @property
    def input_share(self) -> float:
        """Fraction of the step spent waiting for input."""
        return self.input_ms / self.step_ms if self.step_ms > 0 else 0.0


@dataclass
class StepBreakdown:
    """Every step of a trace, split into input and compute."""

    steps: list[StepSplit]

    def _total(self, attr: str) -> float:
        return sum(getattr(s, attr) for s in self.steps)

    @property
    def step_ms(self) -> float:
        return self._total("step_ms")

    @property
    def input_ms(self) -> float:
        return self._total("input_ms")

    @property
    def compute_ms(self) -> float:
        return self._total("compute_ms")

    @property
    def input_share(self) -> float:
        """Fraction of all step time spent waiting for input: the headline number of a profile."""
        return self.input_ms / self.step_ms if self.step_ms > 0 else 0.0

    def verdict(self, threshold: float = 0.2) -> str:
        """'input-bound' when more than ``threshold`` of the step time waits for input."""
        if not 0 < _validate.real("threshold", threshold) < 1:
            raise ValueError(f"threshold must be a fraction between 0 and 1, got {threshold!r}")
        return "input-bound" if self.input_share > threshold else "compute-bound"

    def rows(self) -> list[dict]:
        """One dict per step (step, step_ms, input_ms, compute_ms, other_ms)."""
        return [{"step": s.step, "step_ms": s.step_ms, "input_ms": s.input_ms, "compute_ms": s.compute_ms,
                 "other_ms": s.other_ms} for s in self.steps]

    def timeline_events(self) -> list[TimelineEvent]:
        """Where the ranges really were, as ``(lane, start_s, end_s)`` events for :func:`gpucourse.plots.timeline`."""
        out = []
        for s in self.steps:
            out += [TimelineEvent("input", a / 1e6, b / 1e6) for a, b in s.input_spans_us]
            out += [TimelineEvent("compute", a / 1e6, b / 1e6) for a, b in s.compute_spans_us]
        return out

    def table(self) -> str:
        lines = [f"{'step':>4}  {'step':>9}  {'input':>9}  {'compute':>9}  {'other':>8}  input share"]
        for s in self.steps:
            lines.append(f"{s.step:>4}  {s.step_ms:>6.1f} ms  {s.input_ms:>6.1f} ms  {s.compute_ms:>6.1f} ms  "
                         f"{s.other_ms:>5.1f} ms  {s.input_share:>10.0%}")
        lines.append(f"{'all':>4}  {self.step_ms:>6.1f} ms  {self.input_ms:>6.1f} ms  {self.compute_ms:>6.1f} ms  "
                     f"{max(0.0, self.step_ms - self.input_ms - self.compute_ms):>5.1f} ms  {self.input_share:>10.0%}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle):
        p.text(self.table())


def _is_step(ev: TraceEvent, step_name: str) -> bool:
    return "step_num" in ev.args and (ev.name == step_name or ev.name.startswith(step_name + " "))


@answers('08', 'q1')
def step_breakdown(events, step_name: str = "train", input_names: Sequence[str] = ("input",),
                   compute_names: Sequence[str] = ("compute",), skip: int = 0) -> StepBreakdown:
    """Split every step of a trace into input time and compute time.

    A step is an event named ``step_name`` (or ``"<step_name> <n>"``, as the
    trace viewer names them) with a ``step_num`` argument: what
    :func:`step_marker` writes. Its input (compute) time is the union of the
    events named in ``input_names`` (``compute_names``) on the same thread that
    lie entirely inside the step.

    Args:
        events: :class:`TraceEvent` objects, or anything :func:`parse_trace` reads.
        skip: leave out the first ``skip`` steps (e.g. the one that traced the function).
    """
    _validate.text("step_name", step_name)
    for label, names in (("input_names", input_names), ("compute_names", compute_names)):
        if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"{label} must be a non-empty list of event names, got {names!r}")
    _validate.whole("skip", skip, 0)
    if not (isinstance(events, list) and all(isinstance(e, TraceEvent) for e in events)):
        events = parse_trace(events)
    steps = sorted((e for e in events if _is_step(e, step_name)), key=lambda e: e.start_us)
    if not steps:
        names = sorted({e.name.split(" ")[0] for e in events if "step_num" in e.args})
        raise ValueError(f"no step events named {step_name!r} in the trace"
                         + (f" (step names found: {names})" if names else "")
                         + ": wrap each step in profiling.step_marker(i)")
    out = []
    for st in steps[skip:]:
        inside = [e for e in events if e is not st and (e.pid, e.tid) == (st.pid, st.tid)
                  and e.start_us >= st.start_us and e.end_us <= st.end_us]
        inp = [(e.start_us, e.end_us) for e in inside if e.name in input_names]
        comp = [(e.start_us, e.end_us) for e in inside if e.name in compute_names]
        out.append(StepSplit(int(st.args["step_num"]), st.start_us, st.dur_us / 1e3, _union_us(inp) / 1e3,
                             _union_us(comp) / 1e3, inp, comp))
    return StepBreakdown(out)
