"""Topic 08: profile a training loop, read the trace in code, and keep the accelerator busy.

Four jobs:

* **Capture a trace.** :func:`capture_trace` wraps
  ``tf.profiler.experimental.start/stop`` around a block, writes into a fresh
  temporary folder, and finds the ``plugins/profile/<run>/<host>.xplane.pb``
  file it produced. :func:`step_marker` and :func:`region` label steps and the
  named ranges inside them (``tf.profiler.experimental.Trace``), and
  :func:`run_traced_steps` runs a loop with both.
* **Read it without TensorBoard.** :func:`load_trace` converts the ``.xplane.pb``
  with the profiler plugin's own converter (the one TensorBoard's trace viewer
  uses) into :class:`TraceEvent` objects; :func:`parse_trace` does the same for
  trace-viewer JSON. :func:`step_breakdown` splits every step into input time,
  compute time and the rest.
* **Simulate an accelerator and its input pipeline.** A
  :class:`SimulatedDevice` is busy for a fixed time per step (a sleep, so the
  numbers do not depend on how loaded the CPU is); :func:`simulated_pipeline`
  is a tf.data pipeline whose ``load`` and ``augment`` stages each take a fixed
  time per element. :func:`measure_utilisation` runs one against the other and
  reports the fraction of the time the device was busy, and
  :func:`predicted_utilisation` says what that fraction can be at best.
* **Watch utilisation live.** :class:`UtilisationMonitor` samples NVML (GPU)
  or psutil (CPU) utilisation, or any source you give it, into an ipywidgets
  panel that updates from a background thread, and falls back to text without
  ipywidgets. :func:`utilisation_explorer` is a small widget that measures the
  simulated pipeline at the parallelism you pick with a slider.

:func:`benchmark` runs the capstone measurement for ``python -m gpucourse.benchmark``.

Importing this module never imports TensorFlow: everything that needs it
imports it when called.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

__all__ = [
    "AUGMENT_S",
    "LOAD_S",
    "STEP_S",
    "STEPS",
    "SimulatedDevice",
    "SimulatedStage",
    "StepBreakdown",
    "StepSplit",
    "TraceCapture",
    "TraceEvent",
    "UtilisationMonitor",
    "UtilisationReport",
    "benchmark",
    "busy_time",
    "capture_trace",
    "default_sources",
    "explore_once",
    "find_xplane",
    "load_trace",
    "measure_utilisation",
    "parse_trace",
    "predicted_utilisation",
    "region",
    "run_traced_steps",
    "simulated_pipeline",
    "simulated_source",
    "sparkline",
    "step_breakdown",
    "step_marker",
    "utilisation_explorer",
]

#: Device time per training step of the simulated accelerator (seconds).
STEP_S = 0.02
#: Time the simulated ``load`` stage takes per element (seconds).
LOAD_S = 0.005
#: Time the simulated ``augment`` stage takes per element (seconds).
AUGMENT_S = 0.05
#: Steps per measurement: long enough for a steady state, short enough to stay under ~2 s.
STEPS = 24
#: Threads tf.data may use for the simulated pipeline. A sleeping stage blocks a thread
#: without using a core, and TensorFlow's default pool has only one thread per core.
POOL_THREADS = 16


def _tf():
    import tensorflow as tf  # imported lazily: importing gpucourse must stay cheap

    return tf


def _check_seconds(name: str, value, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}")
    return float(value)


def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


def _check_name(name: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


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
        tf.profiler.experimental.start(logdir)
    except tf.errors.AlreadyExistsError as err:
        raise RuntimeError("another profiler is already running in this process (only one can run at a time); "
                           "stop it with tf.profiler.experimental.stop() and try again") from err
    try:
        yield capture
    finally:
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
    _check_count("step", step, minimum=0)
    _check_name("name", name)
    return _tf().profiler.experimental.Trace(name, step_num=step, _r=1)


def region(name: str):
    """Context manager for a named range inside a step, e.g. ``region("input")``."""
    _check_name("name", name)
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

    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    _check_count("steps", steps)
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
    """One complete event of a trace: a named range on one thread. Times in microseconds."""

    name: str
    start_us: float
    dur_us: float
    pid: int = 0
    tid: int = 0
    thread: str = ""
    args: dict = field(default_factory=dict, compare=False, hash=False)

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
    kept; thread names come from the ``thread_name`` metadata events.
    """
    raw = _trace_dict(trace)
    threads = {}
    for ev in raw:
        if isinstance(ev, Mapping) and ev.get("ph") == "M" and ev.get("name") == "thread_name":
            threads[(ev.get("pid"), ev.get("tid"))] = str((ev.get("args") or {}).get("name", ""))
    out = []
    for ev in raw:
        if not isinstance(ev, Mapping) or ev.get("ph") != "X":
            continue
        if not isinstance(ev.get("ts"), (int, float)) or not isinstance(ev.get("dur"), (int, float)):
            raise ValueError(f"complete event without numeric ts/dur: {dict(ev)!r}")
        key = (ev.get("pid", 0), ev.get("tid", 0))
        out.append(TraceEvent(str(ev.get("name", "")), float(ev["ts"]), float(ev["dur"]), key[0] or 0,
                              key[1] or 0, threads.get(key, ""), dict(ev.get("args") or {})))
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


def load_trace(path: str | os.PathLike) -> list[TraceEvent]:
    """Read a trace (an ``.xplane.pb`` file, or a logdir holding one) into events.

    Uses the converter behind TensorBoard's trace viewer
    (``raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})``), which
    returns ``(json_text, content_type)``; no TensorBoard server or UI is involved.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be an .xplane.pb file or a logdir, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        path = find_xplane(path)
    if not path.endswith(".xplane.pb"):
        raise ValueError(f"expected an .xplane.pb file (or the logdir), got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no trace file at {path!r}")
    data, _content_type = _converter().xspace_to_tool_data([path], "trace_viewer", {})
    if not data:
        raise ValueError(f"the profiler plugin could not convert {path!r} (empty result)")
    return parse_trace(data)


def busy_time(spans: Iterable[tuple[float, float]], start: float | None = None, end: float | None = None) -> float:
    """Total length of the union of ``(start, end)`` spans, optionally clipped to a window.

    Overlapping spans count once: two kernels running at the same time keep
    the device busy for the length of their union, not the sum.
    """
    clipped = []
    for span in spans:
        if not isinstance(span, (tuple, list)) or len(span) != 2:
            raise ValueError(f"each span must be (start, end), got {span!r}")
        s, e = span
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (s, e)) or e < s:
            raise ValueError(f"each span must be two numbers with end >= start, got {span!r}")
        if start is not None:
            s = max(s, start)
        if end is not None:
            e = min(e, end)
        if e > s:
            clipped.append((s, e))
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(clipped):
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
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be a fraction between 0 and 1, got {threshold!r}")
        return "input-bound" if self.input_share > threshold else "compute-bound"

    def rows(self) -> list[dict]:
        """One dict per step (step, step_ms, input_ms, compute_ms, other_ms)."""
        return [{"step": s.step, "step_ms": s.step_ms, "input_ms": s.input_ms, "compute_ms": s.compute_ms,
                 "other_ms": s.other_ms} for s in self.steps]

    def timeline_events(self) -> list[tuple[str, float, float]]:
        """``(lane, start_s, end_s)`` tuples for :func:`gpucourse.plots.timeline`, where the ranges really were."""
        out = []
        for s in self.steps:
            out += [("input", a / 1e6, b / 1e6) for a, b in s.input_spans_us]
            out += [("compute", a / 1e6, b / 1e6) for a, b in s.compute_spans_us]
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
    _check_name("step_name", step_name)
    for label, names in (("input_names", input_names), ("compute_names", compute_names)):
        if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"{label} must be a non-empty list of event names, got {names!r}")
    _check_count("skip", skip, minimum=0)
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
        out.append(StepSplit(int(st.args["step_num"]), st.start_us, st.dur_us / 1e3, busy_time(inp) / 1e3,
                             busy_time(comp) / 1e3, inp, comp))
    return StepBreakdown(out)


# --------------------------------------------------------------------------- the simulated accelerator


class SimulatedDevice:
    """An accelerator that is busy for ``step_s`` seconds per step, and remembers when.

    ``run(batch)`` sleeps, like a host thread waiting for a GPU kernel to finish,
    so the device time is fixed however loaded the CPU is. Every busy span is
    recorded, which is all you need for utilisation.
    """

    def __init__(self, step_s: float = STEP_S):
        self.step_s = _check_seconds("step_s", step_s, allow_zero=False)
        self.spans: list[tuple[float, float]] = []
        self._busy_since: float | None = None

    def run(self, batch=None):
        """One training step on ``batch``: occupies the device for ``step_s``; returns ``batch``."""
        t0 = time.perf_counter()
        self._busy_since = t0
        time.sleep(self.step_s)
        self.spans.append((t0, time.perf_counter()))
        self._busy_since = None
        return batch

    def reset(self) -> None:
        """Forget all recorded steps."""
        self.spans = []
        self._busy_since = None

    def recent_utilisation(self, window_s: float = 0.5) -> float:
        """Percent of the last ``window_s`` seconds the device was busy (for live monitors)."""
        _check_seconds("window_s", window_s, allow_zero=False)
        now = time.perf_counter()
        spans = list(self.spans[-int(window_s / self.step_s) - 2:])
        since = self._busy_since
        if since is not None:
            spans.append((since, now))
        return 100.0 * busy_time(spans, now - window_s, now) / window_s

    def __repr__(self) -> str:
        return f"SimulatedDevice(step_s={self.step_s}, steps_run={len(self.spans)})"


class SimulatedStage:
    """A pipeline stage for ``Dataset.map`` that takes ``seconds`` per element.

    ``fn`` (int -> int) is what the stage computes, so a pipeline that skips
    the stage produces different values. ``calls`` counts the elements it has
    processed (thread-safe: parallel maps call it from several threads).
    """

    def __init__(self, seconds: float, fn: Callable[[int], int] | None = None, name: str = "stage"):
        self.seconds = _check_seconds("seconds", seconds)
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be a function int -> int or None, got {type(fn).__name__}")
        self.fn = fn or (lambda v: v)
        self.name = _check_name("name", name)
        self.calls = 0
        self._lock = threading.Lock()

    def python(self, value: int) -> int:
        """The stage as plain Python: sleep, count, compute."""
        time.sleep(self.seconds)
        with self._lock:
            self.calls += 1
        return int(self.fn(int(value)))

    def __call__(self, x):
        """The stage as a TensorFlow function of one int64 scalar (use it in ``Dataset.map``)."""
        tf = _tf()
        y = tf.py_function(lambda v: tf.constant(self.python(v.numpy()), tf.int64), [x], tf.int64,
                           name=self.name)
        y.set_shape(())
        return y

    def __repr__(self) -> str:
        return f"SimulatedStage({self.name!r}, seconds={self.seconds}, calls={self.calls})"


def simulated_source(n: int = STEPS, values: Sequence[int] | None = None):
    """A cheap source dataset of int64 scalars (``range(n)``, or ``values``).

    Its options give tf.data a private pool of :data:`POOL_THREADS` threads
    (a sleeping stage blocks a thread, and the default pool has one per core)
    and turn off two default rewrites of TF 2.21, the injected final prefetch
    and the automatic parallelisation of stateless maps, so that an
    unoptimised pipeline built on it is honestly unoptimised. Options set on a
    source apply to every pipeline built on top of it.
    """
    tf = _tf()
    if values is None:
        ds = tf.data.Dataset.range(_check_count("n", n))
    else:
        values = [int(v) for v in values]
        if not values:
            raise ValueError("values must not be empty")
        ds = tf.data.Dataset.from_tensor_slices(tf.constant(values, tf.int64))
    options = tf.data.Options()
    options.threading.private_threadpool_size = POOL_THREADS
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    return ds.with_options(options)


def _check_parallel(parallel_calls):
    if parallel_calls is None:
        return None
    if isinstance(parallel_calls, bool) or not isinstance(parallel_calls, int):
        raise TypeError(f"parallel_calls must be None, a whole number >= 1 or tf.data.AUTOTUNE, got {parallel_calls!r}")
    if parallel_calls < 1 and parallel_calls != -1:  # -1 is tf.data.AUTOTUNE
        raise ValueError(f"parallel_calls must be >= 1 (or tf.data.AUTOTUNE), got {parallel_calls!r}")
    return parallel_calls


def simulated_pipeline(n: int = STEPS, load_s: float = LOAD_S, augment_s: float = AUGMENT_S, *,
                       parallel_calls: int | None = None, prefetch: int | None = None, cache: bool = False,
                       load: SimulatedStage | None = None, augment: SimulatedStage | None = None):
    """The course's slow input pipeline, optionally with the standard fixes.

    ``source -> map(load) -> map(augment) [-> cache()] [-> prefetch(prefetch)]``.

    Args:
        parallel_calls: None for plain sequential ``map``; an int (or
            ``tf.data.AUTOTUNE``) for ``num_parallel_calls`` on both maps.
        prefetch: buffer size of a final ``prefetch`` (None: no prefetch).
        cache: cache the augmented elements (helps from the second epoch on).
        load, augment: stages to use instead of fresh :class:`SimulatedStage`
            objects (to count calls, or to change what they compute).
    """
    _check_count("n", n)
    load = load if load is not None else SimulatedStage(load_s, lambda v: 3 * v + 1, "load")
    augment = augment if augment is not None else SimulatedStage(augment_s, lambda v: 2 * v, "augment")
    for label, stage in (("load", load), ("augment", augment)):
        if not isinstance(stage, SimulatedStage):
            raise TypeError(f"{label} must be a SimulatedStage or None, got {type(stage).__name__}")
    parallel_calls = _check_parallel(parallel_calls)
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int)
                                 or (prefetch < 0 and prefetch != -1)):
        raise ValueError(f"prefetch must be None, a buffer size >= 0 or tf.data.AUTOTUNE, got {prefetch!r}")
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be True or False, got {cache!r}")
    kw = {} if parallel_calls is None else {"num_parallel_calls": parallel_calls}
    ds = simulated_source(n).map(load, **kw).map(augment, **kw)
    if cache:
        ds = ds.cache()
    if prefetch is not None:
        ds = ds.prefetch(prefetch)
    return ds


def predicted_utilisation(step_s: float = STEP_S, load_s: float = LOAD_S, augment_s: float = AUGMENT_S,
                          parallel_calls: int | None = None, prefetch: bool = False) -> float:
    """Best steady-state utilisation (0-1) of the simulated pipeline: a bound, not a measurement.

    * sequential maps, no prefetch: input and compute take turns,
      ``step / (step + load + augment)``;
    * sequential maps + prefetch: they overlap, the slower side sets the pace,
      ``min(1, step / (load + augment))``;
    * ``k`` parallel calls on each map: each map runs in its own threads, so the
      slowest *stage* sets the pace, ``min(1, step * k / max(load, augment))``.
    """
    s = _check_seconds("step_s", step_s, allow_zero=False)
    load = _check_seconds("load_s", load_s)
    aug = _check_seconds("augment_s", augment_s)
    k = _check_parallel(parallel_calls)
    if k == -1:
        raise ValueError("AUTOTUNE has no fixed parallelism to predict from: pass the number of calls")
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be True or False, got {prefetch!r}")
    if k is None:
        if not prefetch:
            return s / (s + load + aug)
        return min(1.0, s / (load + aug)) if load + aug > 0 else 1.0
    slowest = max(load, aug)
    return min(1.0, s * k / slowest) if slowest > 0 else 1.0


@dataclass
class UtilisationReport:
    """How busy the device was while a dataset fed it.

    Every step after the first is one cycle: wait for the batch, then compute.
    ``utilisation`` is the steady state over those cycles, busy time divided by
    the time from the end of step 1 to the end of the last step, so it is
    exactly ``step / (step + wait)`` when every wait is the same. The first
    batch's latency (``startup_s``) cannot be hidden by any pipeline and is
    reported apart; ``utilisation_with_startup`` includes it.
    """

    steps: int
    step_s: float
    startup_s: float
    wall_s: float
    busy_s: float
    spans: list[tuple[float, float]] = field(repr=False)
    waits: list[tuple[float, float]] = field(repr=False)
    values: list = field(default_factory=list, repr=False)

    @property
    def utilisation(self) -> float:
        """Steady-state busy fraction (0-1)."""
        return self.busy_s / self.wall_s if self.wall_s > 0 else 1.0

    @property
    def total_s(self) -> float:
        """Wall time from asking for the first batch to the end of the last step."""
        return self.spans[-1][1] - self.waits[0][0]

    @property
    def utilisation_with_startup(self) -> float:
        """Busy fraction over the whole run, including the wait for the first batch."""
        return busy_time(self.spans) / self.total_s if self.total_s > 0 else 0.0

    def timeline_events(self) -> list[tuple[str, float, float]]:
        """``(lane, start_s, end_s)`` tuples for :func:`gpucourse.plots.timeline`."""
        return ([("waiting for input", s, e) for s, e in self.waits]
                + [("device busy", s, e) for s, e in self.spans])

    def __str__(self) -> str:
        from .timing import format_seconds

        return (f"{self.steps} steps: device busy {self.utilisation:.0%} of the time in steady state "
                f"({format_seconds(self.busy_s)} of {format_seconds(self.wall_s)}); "
                f"first batch after {format_seconds(self.startup_s)}")


def _plain(value):
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value


def measure_utilisation(dataset: Iterable, step_s: float = STEP_S, steps: int | None = None,
                        device: SimulatedDevice | None = None, keep_values: bool = True) -> UtilisationReport:
    """Feed ``dataset`` to a :class:`SimulatedDevice` and measure how busy it was.

    Args:
        dataset: any iterable of batches, usually a ``tf.data.Dataset``.
        step_s: device time per step (ignored when ``device`` is given).
        steps: stop after this many steps (default: the whole dataset).
        device: a device to reuse (its earlier spans are cleared).
        keep_values: keep the elements (as Python values) in ``report.values``.
    """
    if device is None:
        device = SimulatedDevice(step_s)
    elif not isinstance(device, SimulatedDevice):
        raise TypeError(f"device must be a SimulatedDevice or None, got {type(device).__name__}")
    if steps is not None:
        _check_count("steps", steps)
    device.reset()
    waits, values = [], []
    t_ask = time.perf_counter()
    try:
        it = iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be iterable (e.g. a tf.data.Dataset), got {type(dataset).__name__}") from None
    while steps is None or len(device.spans) < steps:
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append((t_ask, time.perf_counter()))
        if keep_values:
            values.append(_plain(batch))
        device.run(batch)
        t_ask = time.perf_counter()
    if not device.spans:
        raise ValueError("the dataset produced no elements: nothing to measure")
    spans = list(device.spans)
    if len(spans) == 1:  # no steady state to speak of: use the one step
        wall, busy = spans[0][1] - spans[0][0], spans[0][1] - spans[0][0]
    else:
        wall, busy = spans[-1][1] - spans[0][1], busy_time(spans[1:])
    return UtilisationReport(len(spans), device.step_s, waits[0][1] - waits[0][0], wall, busy, spans, waits,
                             values)


# --------------------------------------------------------------------------- live utilisation monitor

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], top: float = 100.0) -> str:
    """A one-line text chart of percentages: [0, 50, 100] -> '▁▅█'."""
    if not isinstance(top, (int, float)) or top <= 0:
        raise ValueError(f"top must be a positive number, got {top!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"values must be numbers, got {v!r}")
        frac = min(max(v / top, 0.0), 1.0)
        out.append(_SPARK[min(int(frac * len(_SPARK)), len(_SPARK) - 1)])
    return "".join(out)


class _NvmlGpu:
    """Utilisation of one GPU through NVML (what nvidia-smi shows)."""

    def __init__(self, index: int):
        import pynvml

        self._nvml = pynvml
        self._index = index
        self._handle = None
        self._open()

    def _open(self) -> None:
        self._nvml.nvmlInit()  # reference-counted by NVML: each init is paired with one shutdown
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self._index)

    def __call__(self) -> float:
        if self._handle is None:  # closed by a monitor's stop(); a restarted monitor reopens it
            self._open()
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def close(self) -> None:
        if self._handle is None:
            return
        self._handle = None
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


class _CpuLoad:
    """System-wide CPU load since the previous call (psutil)."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point

    def __call__(self) -> float:
        return float(self._psutil.cpu_percent(interval=None))


def default_sources() -> dict[str, Callable[[], float]]:
    """What to monitor on this machine: each NVIDIA GPU through NVML, else the CPU load through psutil."""
    from .devices import nvml_gpus

    sources: dict[str, Callable[[], float]] = {}
    for gpu in nvml_gpus():
        try:
            sources[f"GPU {gpu.index} (NVML)"] = _NvmlGpu(gpu.index)
        except Exception:
            continue
    if not sources:
        try:
            sources["CPU load (psutil)"] = _CpuLoad()
        except ImportError:
            pass
    return sources


def _widgets():
    try:
        import ipywidgets
    except ImportError:
        return None
    return ipywidgets


class UtilisationMonitor:
    """Sample utilisation sources in a background thread and show them live.

    Each source is a zero-argument callable returning a percentage (0-100).
    With ipywidgets, every source gets a row (label, progress bar, value) that
    updates while your training cell runs; without it, :meth:`stop` prints a
    text summary with a sparkline. Use it as a context manager::

        with UtilisationMonitor() as mon:   # NVML on a GPU, CPU load otherwise
            model.fit(...)
        mon.summary()

    Only ipywidgets API common to 7.7 (Colab) and 8 is used.
    """

    def __init__(self, sources: Mapping[str, Callable[[], float]] | None = None, interval_s: float = 0.25,
                 use_widgets: bool | None = None, history: int = 240):
        if sources is None:
            sources = default_sources()
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("sources must be a non-empty {name: callable returning a percentage} dict")
        bad = [k for k, fn in sources.items() if not isinstance(k, str) or not callable(fn)]
        if bad:
            raise TypeError(f"sources must map names (str) to callables; not for {bad!r}")
        self.sources = dict(sources)
        self.interval_s = _check_seconds("interval_s", interval_s, allow_zero=False)
        self.history = _check_count("history", history)
        if use_widgets is not None and not isinstance(use_widgets, bool):
            raise TypeError(f"use_widgets must be True, False or None (automatic), got {use_widgets!r}")
        w = _widgets()
        if use_widgets and w is None:
            raise ValueError("use_widgets=True but ipywidgets is not installed: pip install 'ipywidgets>=7.7'")
        self._w = w if (use_widgets is None or use_widgets) else None
        self.samples: dict[str, list[tuple[float, float]]] = {k: [] for k in self.sources}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self.widget = self._build() if self._w is not None else None

    # -- display
    def _build(self):
        w = self._w
        self._bars, self._values = {}, {}
        rows = [w.HTML(value="<b>utilisation monitor</b>")]
        for name in self.sources:
            self._bars[name] = w.FloatProgress(value=0.0, min=0.0, max=100.0)
            self._values[name] = w.Label(value="-")
            rows.append(w.HBox([w.Label(value=name), self._bars[name], self._values[name]]))
        self._status = w.Label(value="not started")
        rows.append(self._status)
        box = w.VBox(rows)
        box.add_class("gpucourse-monitor")
        return box

    def _show(self, name: str, value: float) -> None:
        if self.widget is not None:
            self._bars[name].value = max(0.0, min(100.0, value))
            self._values[name].value = f"{value:.0f}%"

    # -- sampling
    def sample(self) -> dict[str, float]:
        """Read every source once, record and show the values. A failing source is reported, not raised."""
        now = time.perf_counter() - self._t0
        got = {}
        for name, fn in self.sources.items():
            try:
                value = float(fn())
            except Exception as err:  # a monitor must never break the training it watches
                self.errors[name] = f"{type(err).__name__}: {err}"
                continue
            got[name] = value
            series = self.samples[name]
            series.append((now, value))
            del series[:-self.history]
            self._show(name, value)
        return got

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self, show: bool = True) -> "UtilisationMonitor":
        """Start sampling in a background thread (and display the widget when ``show``)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("this monitor is already running; call stop() first")
        self._stop.clear()
        if self.widget is not None:
            self._status.value = f"sampling every {self.interval_s:g} s"
            if show:
                from IPython.display import display

                display(self.widget)
        elif show:
            print(f"monitoring {', '.join(self.sources)} every {self.interval_s:g} s "
                  "(text mode: ipywidgets not available)")
        self._thread = threading.Thread(target=self._loop, name="gpucourse-utilisation-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, show: bool = True) -> dict[str, dict[str, float]]:
        """Stop the thread (waits for it), take a last sample and return :meth:`summary`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(2.0, 4 * self.interval_s))
            self._thread = None
        self.sample()
        summary = self.summary()
        if self.widget is not None:
            self._status.value = "stopped: " + "; ".join(f"{k} mean {v['mean']:.0f}%" for k, v in summary.items())
        elif show:
            print(self.to_text())
        for fn in self.sources.values():
            close = getattr(fn, "close", None)
            if callable(close):
                close()
        return summary

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def summary(self) -> dict[str, dict[str, float]]:
        """Per source: mean, max and number of samples."""
        out = {}
        for name, series in self.samples.items():
            vals = [v for _, v in series]
            if vals:
                out[name] = {"mean": statistics.fmean(vals), "max": max(vals), "samples": len(vals)}
        return out

    def to_text(self) -> str:
        """The samples as text: one line per source with mean, max and a sparkline."""
        lines = []
        for name, series in self.samples.items():
            vals = [v for _, v in series]
            if not vals:
                lines.append(f"{name}: no samples" + (f" ({self.errors[name]})" if name in self.errors else ""))
                continue
            lines.append(f"{name}: mean {statistics.fmean(vals):.0f}%, max {max(vals):.0f}% over "
                         f"{len(vals)} samples  {sparkline(vals[-60:])}")
        return "\n".join(lines)

    def __enter__(self) -> "UtilisationMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"UtilisationMonitor(sources={list(self.sources)}, interval_s={self.interval_s}, "
                f"running={self.running})")


# --------------------------------------------------------------------------- the explorer widget


def explore_once(parallel_calls: int, steps: int = STEPS, step_s: float = STEP_S, load_s: float = LOAD_S,
                 augment_s: float = AUGMENT_S) -> str:
    """Measure the simulated pipeline with ``parallel_calls`` on both maps; one line of text.

    The text starts with ``"utilisation: <n>%"``, then the predicted bound.
    """
    k = _check_parallel(parallel_calls)
    if k is None or k == -1:
        raise ValueError(f"parallel_calls must be a whole number >= 1 here, got {parallel_calls!r}")
    rep = measure_utilisation(simulated_pipeline(steps, load_s, augment_s, parallel_calls=k), step_s,
                              keep_values=False)
    bound = predicted_utilisation(step_s, load_s, augment_s, parallel_calls=k)
    calls = "call" if k == 1 else "calls"
    return (f"utilisation: {rep.utilisation:.0%} with {k} parallel {calls} "
            f"(predicted bound {bound:.0%}; sequential baseline bound "
            f"{predicted_utilisation(step_s, load_s, augment_s):.0%})")


def utilisation_explorer(max_parallel: int = 8, steps: int = STEPS, step_s: float = STEP_S,
                         load_s: float = LOAD_S, augment_s: float = AUGMENT_S):
    """A widget: pick the parallelism of the simulated pipeline, press Measure, read the utilisation.

    It always measures the course's baseline pipeline (``map(load)`` then
    ``map(augment)``, both with ``num_parallel_calls`` from the slider), never
    your own code. Each measurement takes well under 3 s. Without ipywidgets
    it prints how to call :func:`explore_once` instead and returns None.
    """
    _check_count("max_parallel", max_parallel)
    _check_count("steps", steps)
    w = _widgets()
    if w is None:
        print("ipywidgets is not installed, so no explorer widget. Measure from code instead:\n"
              "    print(profiling.explore_once(parallel_calls=4))")
        return None
    title = w.HTML(value=(f"<b>Utilisation explorer</b>: device step {step_s * 1e3:.0f} ms, load "
                          f"{load_s * 1e3:.0f} ms, augment {augment_s * 1e3:.0f} ms per element, {steps} steps"))
    slider = w.IntSlider(value=1, min=1, max=max_parallel, step=1, description="parallel calls")
    button = w.Button(description="Measure")
    result = w.HTML(value="utilisation: not measured yet")
    history = w.Label(value="")
    runs: list[str] = []

    def measure(_=None):
        button.disabled = True
        try:
            text = explore_once(slider.value, steps, step_s, load_s, augment_s)
            runs.append(f"{slider.value}: {text.split()[1]}")
            history.value = "so far (parallel calls: utilisation): " + ", ".join(runs[-8:])
        except Exception as err:  # show, never raise into the widget machinery
            text = f"utilisation: measurement failed ({type(err).__name__}: {err})"
        finally:
            button.disabled = False
        result.value = text

    button.on_click(measure)
    box = w.VBox([title, w.HBox([slider, button]), result, history])
    box.add_class("gpucourse-explorer")
    return box


# --------------------------------------------------------------------------- benchmark


def benchmark(quick: bool = False) -> list[dict]:
    """The capstone measured side by side: slow, prefetch-only and tuned pipelines.

    Each row has ``topic, case, median_s, bound_s, ratio_to_bound, speedup,
    utilisation, note``. ``median_s`` is the median wall time of one epoch of
    20 steps (3 repeats after a warm-up); ``bound_s`` is the fastest an epoch
    can be (the first batch's latency, which no pipeline hides, plus the
    device time); ``utilisation`` is the median steady-state busy fraction.
    Takes ~12 s (``quick``: ~3 s, 12 steps, one run each).
    """
    from .timing import compare

    if not isinstance(quick, bool):
        raise TypeError(f"quick must be True or False, got {quick!r}")
    steps = 12 if quick else 20
    tf = _tf()
    cases = {
        "slow: sequential maps": dict(),
        "prefetch only": dict(prefetch=1),
        "parallel maps x4 + prefetch": dict(parallel_calls=4, prefetch=tf.data.AUTOTUNE),
    }
    predicted = {
        "slow: sequential maps": predicted_utilisation(),
        "prefetch only": predicted_utilisation(prefetch=True),
        "parallel maps x4 + prefetch": predicted_utilisation(parallel_calls=4, prefetch=True),
    }
    reports: dict[str, list[UtilisationReport]] = {k: [] for k in cases}

    def run(name):
        def go():
            reports[name].append(measure_utilisation(simulated_pipeline(steps, **cases[name]), STEP_S,
                                                     keep_values=False))
        return go

    bound_s = LOAD_S + AUGMENT_S + steps * STEP_S
    comp = compare({name: run(name) for name in cases}, warmup=0 if quick else 1, repeats=1 if quick else 3,
                   bound_s=bound_s, bound_label="epoch bound")
    rows = []
    for name in cases:
        util = statistics.median(r.utilisation for r in reports[name][-len(comp[name].times_s):])
        rows.append({
            "topic": "08 capstone",
            "case": name,
            "median_s": comp[name].median_s,
            "bound_s": bound_s,
            "ratio_to_bound": comp.to_bound(name),
            "speedup": comp.speedup(name),
            "utilisation": util,
            "note": (f"{steps} steps of {STEP_S * 1e3:.0f} ms; steady-state utilisation, predicted bound "
                     f"{predicted[name]:.0%}"),
        })
    return rows
