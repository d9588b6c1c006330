"""Simulate an accelerator fed by a tf.data input pipeline, and measure each run against its bound.

One job: the sleep-based training loop that topics 07 and 08 both study. Every stage sleeps a
fixed time, so results depend on how a pipeline overlaps work, not on how busy the CPU is
(sleeping releases the GIL: stages run in parallel exactly when tf.data runs them in parallel).

* :class:`Stage`: a ``Dataset.map`` function taking ``seconds`` per element (plus ``per_call_s``
  per call, what a vectorised map pays once per batch); it computes ``fn`` and counts.
* :class:`Device`: the accelerator, busy ``step_s`` per step, one step at a time.
* :class:`Lanes`: the one recorder of :class:`TimelineEvent` ``(lane, start_s, end_s)``;
  concurrent periods of a lane get slots (``decode #2``), so a lane never overlaps itself.
* :func:`source`, :func:`feed`: a record source with honest options, and the training loop
  that feeds a dataset to a device and returns a :class:`Run`.
* :class:`Pipeline`: a pipeline described by stage costs and toggles; :class:`Workload` holds
  its live parts, and ``Workload.run(**toggles)`` returns a :class:`Run` carrying the bound of
  exactly what ran.

One model throughout: the **bound** is the shortest possible epoch (the first element through
every stage, then one element per ``cost / parallelism`` of the slowest thread of work); the
**ratio** is measured time over bound; **utilisation = steps x step time / time**, measured
(``utilisation``) or at best (``best_utilisation``, nominal step time over the bound).
Importing this module runs no TensorFlow code.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from . import _validate
from ._tf import tf as _tf

__all__ = [
    "AUTOTUNE", "AUGMENT_S", "LOAD_S", "POOL_THREADS", "STEPS", "STEP_S", "TOGGLES",
    "Device", "Lanes", "Pipeline", "Run", "Stage", "TimelineEvent", "Workload", "feed", "source",
]

#: Device time per training step (seconds).
STEP_S = 0.02
#: Time of the ``load`` stage per element (seconds).
LOAD_S = 0.005
#: Time of the ``augment`` stage per element (seconds).
AUGMENT_S = 0.05
#: Steps per measurement: long enough for a steady state, short enough to stay under ~2 s.
STEPS = 24
#: Threads tf.data may use for simulated stages. A sleeping stage blocks a thread without
#: using a core, and TensorFlow's default pool has only one thread per core.
POOL_THREADS = 16
#: ``tf.data.AUTOTUNE`` (its value, so that using it needs no TensorFlow import).
AUTOTUNE = -1

#: What a :class:`Pipeline` lets you switch, without changing its costs.
TOGGLES = ("parallel", "interleave", "prefetch", "cache", "threads", "tf_rewrites")
WAIT_LANE = "waiting for input"
DEVICE_LANE = "device"


def _parallel(name: str, value):
    """None (a sequential map), a whole number >= 1, or AUTOTUNE (-1)."""
    if value is None or (type(value) is int and value == AUTOTUNE):
        return value
    return _validate.whole(name, value, 1, what="num_parallel_calls: None, a number >= 1 or tf.data.AUTOTUNE")


def _lanes(lanes):
    if lanes is not None and not isinstance(lanes, Lanes):
        raise TypeError(f"lanes must be a gpucourse.simulate.Lanes or None, got {type(lanes).__name__}")
    return lanes


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


# --------------------------------------------------------------------------- the recorder


class TimelineEvent(NamedTuple):
    """One busy period: ``lane`` (e.g. ``"decode #2"``) from ``start_s`` to ``end_s`` (perf_counter seconds)."""

    lane: str
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class Lanes:
    """Who was busy when: ``with lanes.busy("decode"): ...`` records one period in the lowest free slot."""

    def __init__(self, order: Sequence[str] = ()):
        self._lock = threading.Lock()
        self._order = list(order)
        self.reset()

    def reset(self) -> None:
        """Forget every recorded period."""
        with self._lock:
            self._raw: list[tuple[str, int, float, float]] = []
            self._taken: dict[str, set] = {}

    @contextlib.contextmanager
    def busy(self, lane: str):
        """Record the ``with`` block as one busy period of ``lane``."""
        with self._lock:
            taken = self._taken.setdefault(lane, set())
            slot = min(set(range(len(taken) + 1)) - taken)
            taken.add(slot)
            if lane not in self._order:
                self._order.append(lane)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                taken.discard(slot)
                self._raw.append((lane, slot, t0, time.perf_counter()))

    def record(self, lane: str, start_s: float, end_s: float) -> None:
        """Record a period measured elsewhere (a wait; it never overlaps another of its lane)."""
        with self._lock:
            self._raw.append((lane, 0, start_s, end_s))
            if lane not in self._order:
                self._order.append(lane)

    def events(self, since: float | None = None, until: float | None = None) -> list[TimelineEvent]:
        """Periods ending after ``since`` and starting before ``until``, lane by lane; ``"decode #2"`` is a
        second decode running at once (a lane that never ran twice at once keeps its plain name)."""
        with self._lock:
            raw = [e for e in self._raw if (since is None or e[3] >= since) and (until is None or e[2] <= until)]
            order = {lane: i for i, lane in enumerate(self._order)}
        slots = {}
        for lane, slot, _, _ in raw:
            slots[lane] = max(slots.get(lane, 0), slot + 1)
        raw.sort(key=lambda e: (order.get(e[0], len(order)), e[1], e[2]))
        return [TimelineEvent(f"{lane} #{slot + 1}" if slots[lane] > 1 else lane, t0, t1)
                for lane, slot, t0, t1 in raw]



# --------------------------------------------------------------------------- stages and the device


class Stage:
    """A ``Dataset.map`` function: sleeps ``per_call_s + seconds x elements``, then maps each element by ``fn``.

    ``fn`` (int -> int; None keeps the value) makes a skipped stage visible in the values.
    ``elements`` counts records and ``calls`` invocations (a batch is one call), thread-safely.
    """

    def __init__(self, seconds: float, fn: Callable[[int], int] | None = None, name: str = "stage", *,
                 per_call_s: float = 0.0, lanes: Lanes | None = None):
        self.seconds = _validate.seconds("seconds", seconds)
        self.per_call_s = _validate.seconds("per_call_s", per_call_s)
        if fn is not None:
            _validate.callable_("fn", fn)
        self.fn = fn
        self.name = _validate.text("name", name)
        self.lanes = _lanes(lanes)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Zero the counters."""
        with self._lock:
            self.elements = 0
            self.calls = 0

    def _work(self, values):
        import numpy as np

        values = np.asarray(values)
        k = int(values.size)
        with self._lock:
            self.elements += k
            self.calls += 1
        seconds = self.per_call_s + self.seconds * k
        with self.lanes.busy(self.name) if self.lanes is not None else contextlib.nullcontext():
            if seconds > 0:
                time.sleep(seconds)
        if self.fn is None:
            return values.astype(np.int64)
        flat = [int(self.fn(int(v))) for v in values.reshape(-1)]
        return np.asarray(flat, dtype=np.int64).reshape(values.shape)

    def __call__(self, x):
        """The stage as a TensorFlow function of an int64 scalar or batch (use it in ``Dataset.map``)."""
        tf = _tf()
        x = tf.convert_to_tensor(x)
        y = tf.py_function(self._work, [x], tf.int64, name=self.name.replace(" ", "_"))
        y.set_shape(x.shape)
        return y

    def __repr__(self) -> str:
        return f"Stage({self.name!r}, seconds={self.seconds}, elements={self.elements}, calls={self.calls})"


class Device:
    """The accelerator: ``run(batch)`` is busy ``step_s`` (a sleep, like a host thread waiting for a GPU
    kernel, so it does not depend on the CPU load), one step at a time; ``spans`` says when."""

    def __init__(self, step_s: float = STEP_S, lanes: Lanes | None = None):
        self.step_s = _validate.seconds("step_s", step_s, allow_zero=True)
        self.lanes = _lanes(lanes) or Lanes([WAIT_LANE, DEVICE_LANE])
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget all recorded steps."""
        self.spans: list[tuple[float, float]] = []
        self.busy_since: float | None = None  # when the step in progress started

    def run(self, batch=None):
        """One training step on ``batch``: occupies the device for ``step_s``; returns ``batch``."""
        with self._lock:
            with self.lanes.busy(DEVICE_LANE):
                t0 = self.busy_since = time.perf_counter()
                if self.step_s > 0:
                    time.sleep(self.step_s)
                t1 = time.perf_counter()
            self.spans.append((t0, t1))
            self.busy_since = None
        return batch

    @property
    def steps(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        return f"Device(step_s={self.step_s}, steps_run={self.steps})"


def source(n: int = STEPS, values: Sequence[int] | None = None, *, threads: int | None = POOL_THREADS,
           honest: bool = True):
    """A cheap source of int64 scalars, ``range(n)`` or ``values``, with options for every pipeline built on it.

    ``threads``: a private tf.data pool (None: TensorFlow's default, one thread per core, which caps
    sleeping stages). ``honest``: turn off TF 2.21's injected final prefetch and automatic
    parallelisation of stateless maps, so an unoptimised pipeline is honestly unoptimised.
    """
    tf = _tf()
    if values is None:
        ds = tf.data.Dataset.range(_validate.whole("n", n))
    else:
        if not isinstance(values, Iterable) or isinstance(values, (str, bytes)):
            raise TypeError(f"values must be a list of whole numbers, got {type(values).__name__}")
        if not (values := list(values)):
            raise ValueError("values must not be empty: give at least one record")
        values = [_validate.whole("each value", v, None) for v in values]
        ds = tf.data.Dataset.from_tensor_slices(tf.constant(values, tf.int64))
    return _with_options(ds, threads, _flag("honest", honest))


def _with_options(ds, threads, honest: bool):
    tf = _tf()
    options = tf.data.Options()
    if threads is not None:
        options.threading.private_threadpool_size = _validate.whole("threads", threads, 1)
    if honest:
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
    return ds.with_options(options)


# --------------------------------------------------------------------------- a run


def _plain(value):
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value


@dataclass
class Run:
    """One epoch fed to a device: its waits and steps, and (from ``Workload.run``) the bound of what ran.

    ``seconds`` runs from asking for the first element to the end of the last step.
    """

    steps: int
    step_s: float
    waits: list = field(repr=False)
    spans: list = field(repr=False)
    values: list = field(default_factory=list, repr=False)
    timeline: list = field(default_factory=list, repr=False)
    bound_s: float | None = None

    seconds = property(lambda self: self.spans[-1][1] - self.waits[0][0])
    #: Measured device time (one step at a time: spans never overlap, so it is their sum).
    busy_s = property(lambda self: sum(e - s for s, e in self.spans))
    #: The wait for the first element: latency no pipeline can hide.
    startup_s = property(lambda self: self.waits[0][1] - self.waits[0][0])

    @property
    def utilisation(self) -> float:
        """Steps x step time / time, measured over the whole run (0-1)."""
        return self.busy_s / self.seconds if self.seconds > 0 else 1.0

    @property
    def steady_utilisation(self) -> float:
        """The same after the first step: from the end of step 1 to the end of the last (startup excluded)."""
        if self.steps < 2:
            return self.utilisation
        window = self.spans[-1][1] - self.spans[0][1]
        return sum(e - s for s, e in self.spans[1:]) / window if window > 0 else 1.0

    @property
    def ratio(self) -> float | None:
        """Measured time over the bound (1.00: no pipeline could do better); None without a bound."""
        return None if self.bound_s is None else self.seconds / self.bound_s

    @property
    def best_utilisation(self) -> float | None:
        """Steps x step time / bound: the most this run could have been busy; None without a bound."""
        if self.bound_s is None:
            return None
        return min(1.0, self.steps * self.step_s / self.bound_s) if self.bound_s > 0 else 1.0

    def __str__(self) -> str:
        from .timing import format_seconds

        text = (f"{self.steps} steps in {format_seconds(self.seconds)}: device busy {self.utilisation:.0%} "
                f"({self.steady_utilisation:.0%} after the first step, which waited {format_seconds(self.startup_s)})")
        if self.bound_s is not None:
            text += (f"; bound {format_seconds(self.bound_s)}, ratio {self.ratio:.2f}x, "
                     f"best utilisation {self.best_utilisation:.0%}")
        return text


def feed(dataset: Iterable, device: Device | None = None, *, step_s: float = STEP_S, steps: int | None = None,
         keep_values: bool = True) -> Run:
    """The training loop: one element of ``dataset`` (any iterable) per step of ``device`` (default: a new
    one with ``step_s``; its earlier steps are forgotten), for ``steps`` steps or the whole dataset.
    ``keep_values`` keeps the elements, as Python values, in ``run.values``."""
    if device is None:
        device = Device(step_s)
    elif not isinstance(device, Device):
        raise TypeError(f"device must be a gpucourse.simulate.Device or None, got {type(device).__name__}")
    if steps is not None:
        steps = _validate.whole("steps", steps)
    _flag("keep_values", keep_values)
    try:
        it = iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be iterable (e.g. a tf.data.Dataset), got {type(dataset).__name__}") from None
    device.reset()
    waits, values = [], []
    t_start = t_ask = time.perf_counter()
    while steps is None or device.steps < steps:
        try:
            batch = next(it)
        except StopIteration:
            break
        t_got = time.perf_counter()
        waits.append((t_ask, t_got))
        device.lanes.record(WAIT_LANE, t_ask, t_got)
        if keep_values:
            values.append(_plain(batch))
        device.run(batch)
        t_ask = time.perf_counter()
    if not device.spans:
        raise ValueError("the dataset produced no elements: nothing to feed the device")
    return Run(device.steps, device.step_s, waits, list(device.spans), values,
               device.lanes.events(since=t_start, until=device.spans[-1][1]))


# --------------------------------------------------------------------------- a pipeline and its bound


@dataclass(frozen=True)
class Pipeline:
    """A simulated input pipeline and training loop, described by costs and toggles (nothing runs yet).

    Records ``0 .. n-1`` are read (``read_s`` each, one after another within each of ``shards``
    shards), mapped through ``stages`` (``(name, seconds_per_element)`` pairs, each computing
    ``2 * v + 1``) and fed to a device busy ``step_s`` per element. The toggles (see ``TOGGLES``):
    ``parallel`` (``num_parallel_calls`` of the maps: None for sequential maps, a number or
    ``AUTOTUNE`` for all, or a ``{stage: value}`` dict), ``interleave`` (read that many shards at
    once), ``cache`` (after the last map), ``prefetch`` (``prefetch(AUTOTUNE)`` at the end),
    ``threads`` (tf.data's private pool; None: one thread per core) and ``tf_rewrites`` (keep TF's
    injected prefetch and map parallelisation; off, so that every overlap is one you asked for).
    """

    stages: tuple = (("load", LOAD_S), ("augment", AUGMENT_S))
    step_s: float = STEP_S
    n: int = STEPS
    read_s: float = 0.0
    shards: int = 1
    parallel: object = None
    interleave: int | None = None
    prefetch: bool = False
    cache: bool = False
    threads: int | None = POOL_THREADS
    tf_rewrites: bool = False

    def __post_init__(self):
        stages = self.stages
        if isinstance(stages, Mapping):
            stages = tuple(stages.items())
        if isinstance(stages, (str, bytes)) or not isinstance(stages, Iterable):
            raise TypeError(f"stages must be a list of (name, seconds_per_element) pairs, got {stages!r}")
        checked = []
        for i, pair in enumerate(stages):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"stage {i} must be a (name, seconds_per_element) pair, got {pair!r}")
            checked.append((_validate.text(f"stage {i} name", pair[0]),
                            _validate.seconds(f"seconds of stage {pair[0]!r}", pair[1])))
        names = [name for name, _ in checked]
        if len(set(names)) != len(names) or "read" in names:
            raise ValueError(f"stage names must be unique and not 'read' (the reading stage), got {names}")
        object.__setattr__(self, "stages", tuple(checked))
        _validate.seconds("step_s", self.step_s)
        _validate.whole("n", self.n)
        _validate.seconds("read_s", self.read_s)
        _validate.whole("shards", self.shards)
        if self.n % self.shards:
            raise ValueError(f"n={self.n} records cannot be split evenly over shards={self.shards}; "
                             "pick n as a multiple of shards")
        par = self.parallel
        if isinstance(par, tuple) and par and all(isinstance(x, tuple) for x in par):  # normalised already
            par = dict(par)
        if isinstance(par, Mapping):
            if set(par) - set(names):
                raise ValueError(f"parallel names unknown stage(s) {sorted(set(par) - set(names))}; "
                                 f"the stages are {names}")
            par = tuple((name, _parallel(f"parallel[{name!r}]", par.get(name))) for name in names)
        else:
            par = tuple((name, _parallel("parallel", par)) for name in names)
        object.__setattr__(self, "parallel", par)
        if self.interleave is not None:
            _validate.whole("interleave", self.interleave)
        for flag in ("prefetch", "cache", "tf_rewrites"):
            _flag(flag, getattr(self, flag))
        if self.threads is not None:
            _validate.whole("threads", self.threads)

    #: Whether records are read (a read stage) or come straight from memory.
    reads = property(lambda self: self.read_s > 0 or self.shards > 1)

    def parallel_of(self, stage: str):
        """``num_parallel_calls`` of one stage (None: a sequential map)."""
        return dict(self.parallel)[stage]

    def replace(self, **changes) -> "Pipeline":
        """A copy with some fields changed, e.g. ``p.replace(prefetch=True)``."""
        return replace(self, **changes)

    def workload(self, fns: Mapping[str, Callable[[int], int]] | None = None) -> "Workload":
        """The live parts (stages, device, recorder); ``fns`` replaces what named stages compute."""
        return Workload(self, fns)

    def run(self, epochs: int = 1) -> Run:
        """Build, run ``epochs`` epochs on fresh parts, and return the last epoch's :class:`Run`."""
        w = self.workload()
        for _ in range(_validate.whole("epochs", epochs) - 1):
            w.run()
        return w.run()


def _bound_s(p: Pipeline, warm: bool = False) -> float:
    """Shortest possible epoch of ``p``: fill + (n - 1) x the slowest thread of work per element.

    Work that runs in one thread adds up; a parallel map (or parallel interleave)
    is its own thread of work, ``k`` elements at a time, and so is the work
    before a prefetch. Whatever has no thread of its own runs in the training
    loop, with the step. ``warm``: a full cache replays the maps for free.
    """
    n, fill = p.n, p.step_s
    units, current = [], 0.0
    if not (warm and p.cache):
        if p.reads:
            fill += p.read_s
            if p.interleave is not None:
                units.append((p.read_s, min(p.interleave, p.shards)))
            else:
                current += p.read_s
        for name, seconds in p.stages:
            fill += seconds
            k = p.parallel_of(name)
            if k is None:
                current += seconds
            else:
                if current:
                    units.append((current, 1))
                units.append((seconds, n if k == AUTOTUNE else min(k, n)))
                current = 0.0
    if p.prefetch or p.tf_rewrites:
        units.append((current, 1))
        current = 0.0
    units.append((current + p.step_s, 1))
    return fill + (n - 1) * max(t / k for t, k in units)


class Workload:
    """The live parts of a :class:`Pipeline`: a read stage, its map stages, a device and one recorder.

    Build datasets yourself (``w.source()``, ``w.stage("decode")``, then ``w.train(ds)``), or let
    ``w.run(**toggles)`` build the pipeline with toggles changed (once per variant, so a cache stays warm).
    """

    def __init__(self, pipeline: Pipeline | None = None, fns: Mapping[str, Callable[[int], int]] | None = None):
        pipeline = Pipeline() if pipeline is None else pipeline
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"pipeline must be a gpucourse.simulate.Pipeline, got {type(pipeline).__name__}")
        fns = dict(fns or {})
        if set(fns) - {name for name, _ in pipeline.stages}:
            raise ValueError(f"fns names unknown stage(s) {sorted(set(fns) - {n for n, _ in pipeline.stages})}")
        self.pipeline = pipeline
        self.lanes = Lanes(["read"] + [name for name, _ in pipeline.stages] + [WAIT_LANE, DEVICE_LANE])
        self.read = Stage(pipeline.read_s, None, "read", lanes=self.lanes)
        self.stages = {name: Stage(s, fns.get(name, lambda v: 2 * v + 1), name, lanes=self.lanes)
                       for name, s in pipeline.stages}
        self.device = Device(pipeline.step_s, self.lanes)
        self.delivered: list[int] = []
        self._steps = 0
        self._built: dict[tuple, list] = {}

    def stage(self, name: str) -> Stage:
        """The map stage ``name`` (use it as ``ds.map(w.stage("decode"))``)."""
        if name not in self.stages:
            raise ValueError(f"no stage {name!r}; this workload has {list(self.stages)}")
        return self.stages[name]

    def reset(self) -> None:
        """Zero the counters and forget the timeline and the delivered elements."""
        for st in [self.read, *self.stages.values()]:
            st.reset()
        self.device.reset()
        self.lanes.reset()
        self.delivered = []
        self._steps = 0

    @property
    def counts(self) -> dict[str, int]:
        """Elements each stage processed, plus the device's steps: ``{"read": 8, "decode": 8, "steps": 8}``."""
        out = {"read": self.read.elements} if self.pipeline.reads else {}
        out.update({name: st.elements for name, st in self.stages.items()})
        out["steps"] = self._steps
        return out

    def expected(self) -> list[int]:
        """Sorted values one epoch delivers through every stage (a stage maps v to ``fn(v)``)."""
        values = list(range(self.pipeline.n))
        for st in self.stages.values():
            values = [int(st.fn(v)) for v in values]
        return sorted(values)

    def source(self, interleave: int | None = None, read: bool | None = None):
        """Records, read when the pipeline reads (shard ``s`` holds ``s, s + shards, ...``, read in turn); no
        options set. ``interleave=k`` reads ``k`` shards at once; ``read=False`` serves records from memory."""
        tf = _tf()
        p = self.pipeline
        read = p.reads if read is None else _flag("read", read)
        if not read:
            return tf.data.Dataset.range(p.n)
        shards = tf.data.Dataset.range(p.shards)

        def shard(s):
            return tf.data.Dataset.range(tf.cast(s, tf.int64), p.n, p.shards).map(self.read)

        if interleave is None:
            return shards.flat_map(shard)
        k = _validate.whole("interleave", interleave)
        return shards.interleave(shard, cycle_length=k, num_parallel_calls=k)

    def build(self, **toggles):
        """The pipeline's dataset, with :class:`Pipeline` toggles changed (``parallel=4``, ``prefetch=True``...)."""
        return self._build(**toggles)[0]

    def _build(self, **toggles):
        if set(toggles) - set(TOGGLES):
            raise ValueError(f"unknown toggle(s) {sorted(set(toggles) - set(TOGGLES))}; toggles are {TOGGLES} "
                             "(for other costs or sizes make a new Workload)")
        p = self.pipeline.replace(**toggles)
        tf = _tf()
        ds = self.source(interleave=p.interleave)
        for name, _ in p.stages:
            k = p.parallel_of(name)
            ds = ds.map(self.stages[name]) if k is None else ds.map(self.stages[name], num_parallel_calls=k)
        if p.cache:
            ds = ds.cache()
        if p.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        return _with_options(ds, p.threads, honest=not p.tf_rewrites), p

    def train(self, dataset, steps: int | None = None) -> Run:
        """One epoch of ``dataset`` on the device; the values it delivered go to ``delivered`` (flattened)."""
        if not hasattr(dataset, "__iter__") or not hasattr(dataset, "element_spec"):
            raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
        run = feed(dataset, self.device, steps=steps)
        self._steps += run.steps
        self.delivered = [v for batch in run.values for v in (batch if isinstance(batch, list) else [batch])]
        return run

    def run(self, steps: int | None = None, **toggles) -> Run:
        """Build the pipeline (toggles changed as in :meth:`build`), run one epoch, attach its bound."""
        key = repr(sorted(toggles.items()))
        if key not in self._built:
            self._built[key] = [*self._build(**toggles), False]
        entry = self._built[key]
        ds, p, warm = entry
        run = self.train(ds, steps)
        run.bound_s = _bound_s(p, warm) if steps is None else None
        if steps is None:
            entry[2] = True  # a full epoch completes a cache
        return run

