"""Simulate an accelerator fed by a tf.data input pipeline, and measure each run against its bound.

One job: the sleep-based training loop that topics 07 and 08 both study. Every stage sleeps a
fixed time, so results depend on how a pipeline overlaps work, not on how busy the CPU is
(sleeping releases the GIL: stages run in parallel exactly when tf.data runs them in parallel).

* The parts (from :mod:`gpucourse._simparts`, used from here): :class:`Stage`, a ``Dataset.map``
  function taking ``seconds`` per element plus ``per_call_s`` per call (what a vectorised map pays
  once per batch), asleep or, with ``holds_gil=True``, computing in Python; :class:`Device`, the
  accelerator, busy ``step_s`` per step, one step at a time; :class:`Lanes`, the one recorder of
  :class:`TimelineEvent` ``(lane, start_s, end_s)``; :func:`source`, a record source with honest
  options; :func:`feed`, the training loop, which returns a :class:`Run`.
* :class:`Pipeline`: a pipeline described by stage costs and toggles (see ``TOGGLES``), optionally
  batched (``batch``) and vectorised (``vectorise``: batch before the maps); :class:`Workload`
  holds its live parts, and ``Workload.run(**toggles)`` returns a :class:`Run` carrying the bound
  of exactly what ran.
* :func:`benchmark`: topic 08's capstone measured on these parts, for ``python -m gpucourse.benchmark``.

One model throughout: the **bound** is the shortest possible epoch (the first batch through
every stage, then one batch per ``cost / parallelism`` of the slowest thread of work); the
**ratio** is measured time over bound; **utilisation = steps x step time / time**, measured
(``utilisation``) or at best (``best_utilisation``, nominal step time over the bound).
Importing this module runs no TensorFlow code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from . import _validate
from ._simparts import (AUGMENT_S, AUTOTUNE, DEVICE_LANE, LOAD_S, POOL_THREADS, STEP_S, STEPS, WAIT_LANE, Device,
                        Lanes, Run, Stage, TimelineEvent, _flag, _parallel, _with_options, feed, source)
from ._tf import tf as _tf
from ._labrules import answers

__all__ = [
    "AUTOTUNE", "AUGMENT_S", "LOAD_S", "POOL_THREADS", "STEPS", "STEP_S", "TOGGLES",
    "Device", "Lanes", "Pipeline", "Run", "Stage", "TimelineEvent", "Workload", "benchmark", "feed", "source",
]

#: What a :class:`Pipeline` lets you switch, without changing its costs.
TOGGLES = ("parallel", "interleave", "prefetch", "cache", "threads", "tf_rewrites", "vectorise")


def _per_stage(name: str, value, names: list, check: Callable):
    """One value for every stage, or a ``{stage: value}`` dict (missing stages get ``check(None)``'s default),
    normalised to a tuple of ``(stage, value)`` pairs in stage order."""
    if isinstance(value, tuple) and value and all(isinstance(x, tuple) for x in value):  # normalised already
        values = {v for _, v in value}
        value = values.pop() if len(values) == 1 else dict(value)  # one value for all: keep it for new stages
    if isinstance(value, Mapping):
        if set(value) - set(names):
            raise ValueError(f"{name} names unknown stage(s) {sorted(set(value) - set(names))}; "
                             f"the stages are {names}")
        return tuple((stage, check(f"{name}[{stage!r}]", value.get(stage))) for stage in names)
    return tuple((stage, check(name, value)) for stage in names)


# --------------------------------------------------------------------------- a pipeline and its bound


def _call_s(name: str, value):
    return 0.0 if value is None else _validate.seconds(name, value)


@dataclass(frozen=True)
class Pipeline:
    """A simulated input pipeline and training loop, described by costs and toggles (nothing runs yet).

    Records ``0 .. n-1`` are read (``read_s`` each, one after another within each of ``shards``
    shards), mapped through ``stages`` (``(name, seconds_per_element)`` pairs, each computing
    ``2 * v + 1``; each call of a map also costs ``per_call_s``: one value, or a ``{stage: seconds}``
    dict) and fed to a device busy ``step_s`` per step: one step per element, or per batch of
    ``batch`` elements (``batch``, after the maps and the cache). The toggles (see ``TOGGLES``):
    ``parallel`` (``num_parallel_calls`` of the maps: None for sequential maps, a number or
    ``AUTOTUNE`` for all, or a ``{stage: value}`` dict), ``interleave`` (read that many shards at
    once), ``cache`` (after the last map), ``prefetch`` (``prefetch(AUTOTUNE)`` at the end),
    ``threads`` (tf.data's private pool; None: one thread per core), ``tf_rewrites`` (keep TF's
    injected prefetch and map parallelisation; off, so that every overlap is one you asked for) and
    ``vectorise`` (batch *before* the maps, so each map runs once per batch; needs ``batch``).
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
    batch: int | None = None
    vectorise: bool = False
    per_call_s: object = 0.0

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
        object.__setattr__(self, "parallel", _per_stage("parallel", self.parallel, names, _parallel))
        object.__setattr__(self, "per_call_s", _per_stage("per_call_s", self.per_call_s, names, _call_s))
        if self.interleave is not None:
            _validate.whole("interleave", self.interleave)
        for flag in ("prefetch", "cache", "tf_rewrites", "vectorise"):
            _flag(flag, getattr(self, flag))
        if self.threads is not None:
            _validate.whole("threads", self.threads)
        if self.batch is not None:
            _validate.whole("batch", self.batch)
            if self.n % self.batch:
                raise ValueError(f"n={self.n} records do not make whole batches of batch={self.batch}; "
                                 "pick n as a multiple of batch")
        if self.vectorise and self.batch is None:
            raise ValueError("vectorise=True batches before the maps, so it needs a batch size: set batch too")

    #: Whether records are read (a read stage) or come straight from memory.
    reads = property(lambda self: self.read_s > 0 or self.shards > 1)
    #: Training steps per epoch (one per batch, or per element without ``batch``).
    steps = property(lambda self: self.n // (self.batch or 1))

    def parallel_of(self, stage: str):
        """``num_parallel_calls`` of one stage (None: a sequential map)."""
        return dict(self.parallel)[stage]

    def call_s_of(self, stage: str) -> float:
        """The fixed cost of one call of a stage's map (seconds)."""
        return dict(self.per_call_s)[stage]

    def bound(self, warm: bool = False) -> float:
        """The shortest possible epoch of this pipeline, in seconds (``warm``: served by a full cache)."""
        return _bound_s(self, _flag("warm", warm))

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


@answers('07', 'q1')
@answers('08', 'q3')
def _bound_s(p: Pipeline, warm: bool = False) -> float:
    """Shortest possible epoch of ``p``: the first batch through every stage, then ``steps - 1`` batches at
    the pace of the slowest thread of work.

    Work that runs in one thread adds up; a parallel map (or parallel interleave) is its own thread of
    work, ``k`` items at a time (items are elements, or batches for a vectorised map), and so is the work
    before a prefetch. Whatever has no thread of its own runs in the training loop, with the step. The
    first batch needs its ``b`` elements through the per-element work (one element through every stage,
    then ``b - 1`` more at the slowest per-element pace), then the per-batch work once, then its step.
    ``warm``: a full cache replays the reads and maps for free. Without ``batch``, ``b = 1``.
    """
    b, m = p.batch or 1, p.steps
    # each thread of work: [seconds per element, seconds per batch, parallelism over elements or batches]
    units, current = [], [0.0, 0.0]
    fill_elements = fill_batches = 0.0

    def close(k=1):
        if current[0] or current[1]:
            units.append((current[0], current[1], k))
        current[:] = [0.0, 0.0]

    if not (warm and p.cache):
        if p.reads:
            fill_elements += p.read_s
            if p.interleave is not None:
                units.append((p.read_s, 0.0, min(p.interleave, p.shards)))
            else:
                current[0] += p.read_s
        for name, seconds in p.stages:
            k, call = p.parallel_of(name), p.call_s_of(name)
            per_batch = p.vectorise  # one call per batch: per-call cost once, per-element cost b times
            cost = (0.0, call + b * seconds) if per_batch else (seconds + call, 0.0)
            fill_elements += cost[0]
            fill_batches += cost[1]
            if k is None:
                current[0] += cost[0]
                current[1] += cost[1]
            else:
                close()
                items = m if per_batch else p.n
                units.append((*cost, items if k == AUTOTUNE else min(k, items)))
    if p.prefetch or p.tf_rewrites:
        close()
    units.append((current[0], current[1] + p.step_s, 1))  # the training loop's thread
    element_pace = max([e / k for e, _, k in units if e > 0], default=0.0)
    fill = fill_elements + (b - 1) * element_pace + fill_batches + p.step_s
    return fill + (m - 1) * max((b * e + t) / k for e, t, k in units)


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
        self.stages = {name: Stage(s, fns.get(name, lambda v: 2 * v + 1), name, lanes=self.lanes,
                                   per_call_s=pipeline.call_s_of(name)) for name, s in pipeline.stages}
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
        """The pipeline's dataset, with :class:`Pipeline` toggles changed (``parallel=4``, ``prefetch=True``...):
        ``source``, ``batch`` if vectorised, the maps, ``cache``, ``batch`` otherwise, ``prefetch``."""
        return self._build(**toggles)[0]

    def _build(self, **toggles):
        if set(toggles) - set(TOGGLES):
            raise ValueError(f"unknown toggle(s) {sorted(set(toggles) - set(TOGGLES))}; toggles are {TOGGLES} "
                             "(for other costs or sizes make a new Workload)")
        p = self.pipeline.replace(**toggles)
        tf = _tf()
        ds = self.source(interleave=p.interleave)
        if p.vectorise:
            ds = ds.batch(p.batch)
        for name, _ in p.stages:
            k = p.parallel_of(name)
            ds = ds.map(self.stages[name]) if k is None else ds.map(self.stages[name], num_parallel_calls=k)
        if p.cache:
            ds = ds.cache()
        if p.batch is not None and not p.vectorise:
            ds = ds.batch(p.batch)
        if p.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        ds = _with_options(ds, p.threads, honest=not p.tf_rewrites)
        if p.batch is not None and not p.tf_rewrites:
            # TF fuses map + batch into one op that maps ahead in a thread of its own: a hidden prefetch
            options = tf.data.Options()
            options.experimental_optimization.map_and_batch_fusion = False
            ds = ds.with_options(options)
        return ds, p

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


# --------------------------------------------------------------------------- the capstone, for the benchmark


def benchmark(quick: bool = False) -> list[dict]:
    """Topic 08's capstone side by side (slow, prefetch only, tuned), for ``python -m gpucourse.benchmark``.

    Rows have ``topic, case, median_s, bound_s, ratio_to_bound, speedup, utilisation, note``: the median
    epoch (3 repeats after a warm-up), the bound of that pipeline, and the median measured utilisation
    (steps x step time / time) beside the best it could be. About 12 s (``quick``: one run each, ~3 s).
    """
    import statistics

    from .timing import compare

    if not isinstance(quick, bool):
        raise TypeError(f"quick must be True or False, got {quick!r}")
    base = Pipeline(n=12 if quick else 20)
    cases = {"slow: sequential maps": {}, "prefetch only": {"prefetch": True},
             "parallel maps x4 + prefetch": {"parallel": 4, "prefetch": True}}
    work = {name: base.workload() for name in cases}
    runs: dict[str, list] = {name: [] for name in cases}

    def go(name):
        return lambda: runs[name].append(work[name].run(**cases[name]))

    comp = compare({name: go(name) for name in cases}, warmup=0 if quick else 1, repeats=1 if quick else 3)
    rows = []
    for name in cases:
        timed = runs[name][-len(comp[name].times_s):]
        bound = timed[0].bound_s
        rows.append({"topic": "08 capstone", "case": name, "median_s": comp[name].median_s, "bound_s": bound,
                     "ratio_to_bound": comp[name].median_s / bound, "speedup": comp.speedup(name),
                     "utilisation": statistics.median(r.utilisation for r in timed),
                     "note": f"{base.n} steps of {base.step_s * 1e3:.0f} ms; best utilisation "
                             f"{timed[0].best_utilisation:.0%}"})
    return rows
