"""Topic 07: tuning tf.data input pipelines against a theoretical bound.

An input pipeline and a training step form a two-sided pipeline: the
producer (read records, decode them) and the consumer (the step). The best
any pipeline can do is to keep the slowest of them busy all the time. This
module makes that measurable with *simulated* costs, so that the results
depend on structure, not on how busy the CPU is:

* :class:`Costs` holds the simulated costs (seconds per read, per decode, per
  training step) and computes bounds with :func:`pipeline_bound`.
* :class:`SimulatedWorkload` builds tf.data sources whose reads and decodes
  sleep for those costs, runs a simulated training loop over any dataset,
  counts how often each stage ran (to see what ``cache`` saves) and records a
  timeline of who was busy when (for :func:`gpucourse.plots.timeline`).
* :func:`naive_options` / :func:`describe_options` turn off (and show) what
  TensorFlow 2.21 adds by itself, for an honest baseline.
* :func:`epoch_orders` reads a dataset epoch by epoch (to see a frozen order).
* :func:`benchmark` measures the notebook's pipelines in one go, for
  ``python -m gpucourse.benchmark``.

Sleeping releases the GIL, so simulated work in ``tf.py_function`` runs in
parallel exactly when tf.data runs it in parallel. Importing this module runs
no TensorFlow code.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

__all__ = [
    "Costs",
    "StageCounts",
    "SimulatedWorkload",
    "pipeline_bound",
    "naive_options",
    "describe_options",
    "epoch_orders",
    "build_pipelines",
    "benchmark",
]

#: Threads for latency-bound stages in the tuned pipeline (tf.data's default pool has one per core).
TUNED_POOL_THREADS = 8


def _tf():
    import tensorflow as tf  # imported lazily: importing gpucourse must stay cheap

    return tf


def _check_seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


# --------------------------------------------------------------------------- bounds


def pipeline_bound(n: int, stages: Sequence[tuple[float, float]]) -> float:
    """Shortest possible time to push ``n`` elements through a chain of stages.

    Each stage is ``(seconds_per_element, parallelism)``. Once the pipeline is
    full, one element leaves every ``max(seconds / parallelism)`` seconds (the
    slowest stage, producer or consumer, sets the pace). The first element
    must also pass through every stage once (the fill)::

        bound = sum(seconds) + (n - 1) * max(seconds / parallelism)

    For a producer costing ``P`` and a consumer costing ``C`` this is
    ``P + C + (n - 1) * max(P, C)``: the "max of producer and consumer" plus
    the fill.
    """
    _check_count("n", n)
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or not stages:
        raise TypeError("stages must be a non-empty list of (seconds_per_element, parallelism) pairs")
    total, slowest = 0.0, 0.0
    for i, stage in enumerate(stages):
        if not isinstance(stage, (tuple, list)) or len(stage) != 2:
            raise TypeError(f"stage {i} must be a (seconds_per_element, parallelism) pair, got {stage!r}")
        seconds = _check_seconds(f"stage {i} seconds", stage[0])
        par = stage[1]
        if isinstance(par, bool) or not isinstance(par, (int, float)) or not par >= 1:
            raise ValueError(f"stage {i} parallelism must be a number >= 1, got {par!r}")
        total += seconds
        slowest = max(slowest, seconds / par)
    return total + (n - 1) * slowest


@dataclass(frozen=True)
class Costs:
    """Simulated costs of one input pipeline and its training loop.

    Attributes:
        read_s: reading one record; sequential within a shard (a file).
        decode_s: decoding one record; any number can run in parallel.
        step_s: one training step, consuming one element (or one batch).
        n: elements per epoch (one training step each).
        shards: files the records are spread over (``n`` must divide evenly).
        call_s: fixed cost per decode *call*, whatever its size: what a
            vectorised (batched) decode pays once per batch instead of once
            per element.
    """

    read_s: float = 0.02
    decode_s: float = 0.06
    step_s: float = 0.02
    n: int = 8
    shards: int = 4
    call_s: float = 0.0

    def __post_init__(self):
        for name in ("read_s", "decode_s", "step_s", "call_s"):
            _check_seconds(name, getattr(self, name))
        _check_count("n", self.n)
        _check_count("shards", self.shards)
        if self.n % self.shards:
            raise ValueError(f"n={self.n} records cannot be split evenly over shards={self.shards}; "
                             f"pick n as a multiple of shards")

    @property
    def per_element_s(self) -> float:
        """Producer plus consumer cost of one element when nothing overlaps."""
        return self.read_s + self.call_s + self.decode_s + self.step_s

    @property
    def serial_s(self) -> float:
        """One epoch with no overlap and no parallelism (what a naive pipeline costs)."""
        return self.n * self.per_element_s

    def bound(self, read_parallelism: float = 1, decode_parallelism: float = 1, cached: bool = False,
              batch: int = 1) -> float:
        """Theoretical best time for one epoch (see :func:`pipeline_bound`).

        Args:
            read_parallelism: shards read at once (at most ``shards`` helps).
            decode_parallelism: decodes running at once.
            cached: records come from a warm ``cache()``: no read or decode.
            batch: elements per decode call (vectorised decode); the step
                still runs once per element.
        """
        _check_count("batch", batch)
        if not isinstance(cached, bool):
            raise TypeError(f"cached must be True or False, got {cached!r}")
        if cached:
            return pipeline_bound(self.n, [(self.step_s, 1)])
        read_par = min(read_parallelism, self.shards) if read_parallelism >= 1 else read_parallelism
        decode = (self.call_s / batch + self.decode_s)
        return pipeline_bound(self.n, [(self.read_s, read_par), (decode, decode_parallelism), (self.step_s, 1)])

    @property
    def best_bound_s(self) -> float:
        """The bound with as much parallelism as the work allows: reads per shard, decodes unlimited."""
        return self.bound(read_parallelism=self.shards, decode_parallelism=self.n)

    def to_text(self) -> str:
        """The costs and the two bounds that frame every measurement, as aligned text."""
        ms = 1e3
        rows = [("read", f"{self.read_s * ms:g} ms per record, sequential within each of {self.shards} shards"),
                ("decode", f"{self.decode_s * ms:g} ms per record"
                 + (f" + {self.call_s * ms:g} ms per call" if self.call_s else "") + ", parallelisable"),
                ("train step", f"{self.step_s * ms:g} ms per element"),
                ("elements", f"{self.n} per epoch"),
                ("no overlap", f"{self.serial_s * ms:.0f} ms per epoch"),
                ("bound", f"{self.best_bound_s * ms:.0f} ms per epoch (max(producer, consumer) + fill)")]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __str__(self) -> str:
        return self.to_text()


# --------------------------------------------------------------------------- the simulated workload


@dataclass
class StageCounts:
    """How many records each stage processed (decode counts elements, not calls)."""

    reads: int = 0
    decodes: int = 0
    decode_calls: int = 0
    steps: int = 0


@dataclass
class _Lanes:
    """Timeline recorder: each busy period gets the lowest free slot of its lane."""

    events: list = field(default_factory=list)
    busy: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, lane: str) -> int:
        with self.lock:
            taken = self.busy.setdefault(lane, set())
            slot = next(i for i in range(len(taken) + 1) if i not in taken)
            taken.add(slot)
            return slot

    def end(self, lane: str, slot: int, t0: float, t1: float) -> None:
        with self.lock:
            self.busy[lane].discard(slot)
            self.events.append((lane, slot, t0, t1))


class SimulatedWorkload:
    """Sleep-based reads, decodes and training steps, with counters and a timeline.

    Records are the integers ``0 .. n-1``; shard ``s`` holds records
    ``s, s + shards, s + 2 * shards, ...``. ``decode`` maps record ``i`` to
    ``2 * i + 1``, so a pipeline that skips it is easy to spot.

        w = SimulatedWorkload(Costs())
        ds = w.source().map(w.decode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        seconds = w.train(ds)
        w.counts, w.timeline()
    """

    def __init__(self, costs: Costs | None = None):
        if costs is None:
            costs = Costs()
        if not isinstance(costs, Costs):
            raise TypeError(f"costs must be a gpucourse.pipeline.Costs, got {type(costs).__name__}")
        self.costs = costs
        self._lock = threading.Lock()
        self.reset()

    # ---- bookkeeping
    def reset(self) -> None:
        """Zero the counters and forget the timeline and the delivered elements."""
        with self._lock:
            self.counts = StageCounts()
            self._lanes = _Lanes()
            self.delivered: list[int] = []

    def _busy(self, lane: str, seconds: float) -> None:
        slot = self._lanes.start(lane)
        t0 = time.perf_counter()
        if seconds > 0:
            time.sleep(seconds)
        self._lanes.end(lane, slot, t0, time.perf_counter())

    def _read_py(self, record):
        with self._lock:
            self.counts.reads += 1
        self._busy("read", self.costs.read_s)
        return record

    def _decode_py(self, records):
        import numpy as np

        records = np.asarray(records)
        k = max(int(records.size), 1)
        with self._lock:
            self.counts.decodes += int(records.size)
            self.counts.decode_calls += 1
        self._busy("decode", self.costs.call_s + self.costs.decode_s * k)
        return (records * 2 + 1).astype(np.int64)

    # ---- tf.data building blocks
    def read(self, record):
        """tf.data map function: read one record (``read_s``). Returns the record id."""
        tf = _tf()
        out = tf.py_function(self._read_py, [record], tf.int64)
        out.set_shape(())
        return out

    def decode(self, records):
        """tf.data map function: decode a record, or a batch of them (``call_s + decode_s`` each)."""
        tf = _tf()
        records = tf.convert_to_tensor(records)
        out = tf.py_function(self._decode_py, [records], tf.int64)
        out.set_shape(records.shape)
        return out

    def shard(self, s):
        """The records of shard ``s``, read one after another."""
        tf = _tf()
        return tf.data.Dataset.range(tf.cast(s, tf.int64), self.costs.n, self.costs.shards).map(self.read)

    def source(self, interleave: int | None = None, read: bool = True):
        """Dataset of read (not yet decoded) records.

        Args:
            interleave: ``None`` reads the shards one after another. A number
                reads that many shards at once with
                ``interleave(cycle_length=k, num_parallel_calls=k)``.
            read: ``False`` skips the read stage entirely (records ``0 .. n-1``
                straight from memory), to time the decode alone.
        """
        tf = _tf()
        if not isinstance(read, bool):
            raise TypeError(f"read must be True or False, got {read!r}")
        if not read:
            return tf.data.Dataset.range(self.costs.n)
        shards = tf.data.Dataset.range(self.costs.shards)
        if interleave is None:
            return shards.flat_map(self.shard)
        _check_count("interleave", interleave)
        return shards.interleave(self.shard, cycle_length=interleave, num_parallel_calls=interleave)

    def expected(self) -> list[int]:
        """Sorted decoded values one epoch must deliver."""
        return sorted(2 * i + 1 for i in range(self.costs.n))

    # ---- the consumer
    def train(self, dataset, epochs: int = 1, steps: int | None = None) -> float:
        """Iterate ``dataset`` for ``epochs`` epochs, one simulated step per element; return seconds.

        What the last epoch delivered is kept, flattened, in ``self.delivered``.

        Args:
            steps: stop each epoch after this many steps (default: the whole epoch).
        """
        _check_count("epochs", epochs)
        if steps is not None:
            _check_count("steps", steps)
        if not hasattr(dataset, "__iter__") or not hasattr(dataset, "element_spec"):
            raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
        t0 = time.perf_counter()
        for _ in range(epochs):
            self.delivered = []
            for i, batch in enumerate(dataset):
                self.delivered.extend(batch.numpy().reshape(-1).tolist())
                with self._lock:
                    self.counts.steps += 1
                self._busy("train step", self.costs.step_s)
                if steps is not None and i + 1 >= steps:
                    break
        return time.perf_counter() - t0

    # ---- the timeline
    def timeline(self, since: float | None = None) -> list[tuple[str, float, float]]:
        """Recorded busy periods as ``(lane, start_s, end_s)`` for :func:`gpucourse.plots.timeline`.

        A lane is a stage plus a slot: ``decode #2`` is the second decode
        running at the same time. Lanes are ordered read, decode, train step.
        """
        with self._lanes.lock:
            events = list(self._lanes.events)
        if since is not None:
            events = [e for e in events if e[2] >= since]
        order = {"read": 0, "decode": 1, "train step": 2}
        events.sort(key=lambda e: (order.get(e[0], 3), e[1], e[2]))
        return [(f"{lane} #{slot + 1}", t0, t1) for lane, slot, t0, t1 in events]

    def busy_fraction(self, lane: str = "train step") -> float:
        """Share of the recorded wall time during which ``lane`` was busy (1.0 = never idle)."""
        with self._lanes.lock:
            events = list(self._lanes.events)
        if not events:
            raise ValueError("nothing recorded yet: run train() first")
        mine = [(a, b) for name, _, a, b in events if name == lane]
        if not mine:
            raise ValueError(f"no events on lane {lane!r}; lanes are {sorted({e[0] for e in events})}")
        span = max(e[3] for e in events) - min(e[2] for e in events)
        return sum(b - a for a, b in mine) / span if span > 0 else 1.0


# --------------------------------------------------------------------------- options


def naive_options():
    """``tf.data.Options`` for an honest unoptimised baseline.

    TensorFlow 2.21 appends a prefetch to every pipeline by itself
    (``experimental_optimization.inject_prefetch``) and tunes buffer sizes and
    parallelism (``autotune``). Both are turned off here.
    """
    tf = _tf()
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    return options


def describe_options(obj) -> dict:
    """The options that matter for speed, from a ``Dataset`` or an ``Options``.

    ``None`` means "not set: TensorFlow's default applies".
    """
    tf = _tf()
    if isinstance(obj, tf.data.Dataset):
        obj = obj.options()
    if not isinstance(obj, tf.data.Options):
        raise TypeError(f"expected a tf.data.Dataset or tf.data.Options, got {type(obj).__name__}")
    return {
        "inject_prefetch": obj.experimental_optimization.inject_prefetch,
        "autotune": obj.autotune.enabled,
        "deterministic": obj.deterministic,
        "private_threadpool_size": obj.threading.private_threadpool_size,
        "map_parallelization": obj.experimental_optimization.map_parallelization,
    }


def _with(dataset, *, naive: bool = False, pool: int | None = None, inject_prefetch: bool | None = False):
    tf = _tf()
    options = naive_options() if naive else tf.data.Options()
    if inject_prefetch is not None:
        options.experimental_optimization.inject_prefetch = inject_prefetch
    if pool is not None:
        options.threading.private_threadpool_size = pool
    return dataset.with_options(options)


# --------------------------------------------------------------------------- reading epochs


def epoch_orders(dataset, epochs: int = 2) -> list[list]:
    """The elements of each epoch, in order, with batches flattened: ``[[...], [...]]``.

    Two equal lists mean the order is frozen between epochs.
    """
    _check_count("epochs", epochs)
    tf = _tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    out = []
    for _ in range(epochs):
        order = []
        for element in dataset:
            order.extend(element.numpy().reshape(-1).tolist())
        out.append(order)
    return out


# --------------------------------------------------------------------------- the notebook's pipelines


def build_pipelines(workload: SimulatedWorkload, include_default: bool = True) -> dict:
    """The notebook's pipelines over ``workload``, each step adding one idea.

    Returns ``{name: dataset}``:

    * ``naive``: read, decode, no prefetch, no autotune (``naive_options``).
    * ``TF default``: the same code with TensorFlow's defaults (injected prefetch).
    * ``+ prefetch``: ``prefetch(AUTOTUNE)`` at the end.
    * ``+ parallel decode``: ``map(decode, num_parallel_calls=AUTOTUNE)``.
    * ``+ interleave``: read all shards at once.
    * ``tuned``: plus ``Options.threading.private_threadpool_size`` so
      latency-bound stages are not limited to one thread per core.
    """
    if not isinstance(workload, SimulatedWorkload):
        raise TypeError(f"workload must be a SimulatedWorkload, got {type(workload).__name__}")
    tf = _tf()
    auto, w, k = tf.data.AUTOTUNE, workload, workload.costs.shards
    out = {"naive": _with(w.source().map(w.decode), naive=True)}
    if include_default:
        out["TF default"] = w.source().map(w.decode)
    out["+ prefetch"] = _with(w.source().map(w.decode).prefetch(auto))
    out["+ parallel decode"] = _with(w.source().map(w.decode, num_parallel_calls=auto).prefetch(auto))
    out["+ interleave"] = _with(w.source(interleave=k).map(w.decode, num_parallel_calls=auto).prefetch(auto))
    out["tuned"] = _with(w.source(interleave=k).map(w.decode, num_parallel_calls=auto).prefetch(auto),
                         pool=TUNED_POOL_THREADS)
    return out


def _row(case, median_s, bound_s, baseline_s, note):
    return {"topic": "07 tf.data", "case": case, "median_s": median_s, "bound_s": bound_s,
            "ratio_to_bound": median_s / bound_s if bound_s > 0 else math.inf,
            "speedup": None if baseline_s is None else baseline_s / median_s, "note": note}


def benchmark(quick: bool = False, *, costs: Costs | None = None) -> list[dict]:
    """Measure the topic's pipelines side by side; one row per case.

    Rows have ``topic, case, median_s, bound_s, ratio_to_bound, speedup, note``
    (``speedup`` is against the naive pipeline of the same comparison, or
    None). Takes about 15 s on 2 cores (``quick``: about 8 s).

    Args:
        quick: one timed repeat instead of two, and no "TF default" case.
        costs: the simulated costs of the one-epoch and cache cases (default ``Costs()``).
    """
    if not isinstance(quick, bool):
        raise TypeError(f"quick must be True or False, got {quick!r}")
    if costs is None:
        costs = Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a gpucourse.pipeline.Costs, got {type(costs).__name__}")
    from . import timing

    tf = _tf()
    repeats = 1 if quick else 2
    rows: list[dict] = []

    # 1. one epoch, each tuning step added in turn
    w = SimulatedWorkload(costs)
    pipes = build_pipelines(w, include_default=not quick)
    bound = w.costs.best_bound_s
    cmp = timing.compare({name: (lambda d=d: w.train(d)) for name, d in pipes.items()},
                         warmup=1, repeats=repeats, bound_s=bound)
    notes = {"naive": "no prefetch, no autotune: read + decode + step add up",
             "TF default": "TF 2.21 injects a prefetch by itself",
             "+ prefetch": "producer overlaps the step; decode is now the bottleneck",
             "+ parallel decode": "decodes limited by the default pool (one thread per core)",
             "+ interleave": "reads overlap too, but share the same small pool",
             "tuned": f"private_threadpool_size={TUNED_POOL_THREADS}: latency-bound stages get threads"}
    base = cmp["naive"].median_s
    for name in pipes:
        rows.append(_row(name, cmp[name].median_s, bound, base, notes[name]))

    # 2. cache: the second epoch of a sequential pipeline, with and without a warm cache
    w2 = SimulatedWorkload(costs)
    plain = _with(w2.source().map(w2.decode).prefetch(tf.data.AUTOTUNE))
    cached = _with(w2.source().map(w2.decode).cache().prefetch(tf.data.AUTOTUNE))
    cmp2 = timing.compare({"epoch, no cache": lambda: w2.train(plain), "epoch, warm cache": lambda: w2.train(cached)},
                          warmup=1, repeats=repeats)
    cache_bound = w2.costs.bound(cached=True)
    rows.append(_row("cache: epoch 2", cmp2["epoch, warm cache"].median_s, cache_bound,
                     cmp2["epoch, no cache"].median_s, "records come from memory; bound = the steps alone"))

    # 3. vectorised decode: the producer alone, per-element calls vs one call per batch
    batch = 8
    w3 = SimulatedWorkload(Costs(read_s=0.0, decode_s=0.0005, step_s=0.0, n=64, shards=1, call_s=0.004))
    scalar = _with(w3.source(read=False).map(w3.decode).batch(batch))
    vector = _with(w3.source(read=False).batch(batch).map(w3.decode))
    cmp3 = timing.compare({"scalar": lambda: sum(1 for _ in scalar), "vectorised": lambda: sum(1 for _ in vector)},
                          warmup=1, repeats=repeats)
    c3 = w3.costs
    vec_bound = c3.n * c3.decode_s + (c3.n // batch) * c3.call_s
    rows.append(_row("vectorised decode", cmp3["vectorised"].median_s, vec_bound, cmp3["scalar"].median_s,
                     f"batch({batch}) before map: one call per batch; bound = the decode work alone"))
    return rows
