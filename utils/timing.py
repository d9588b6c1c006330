"""Honest timing: warm-up, repeats, medians and percentiles, and ratios measured side by side.

Rules this module enforces, because every benchmark in the course needs them:

* **Warm-up first.** The first call of a ``tf.function`` traces and (with XLA)
  compiles; it is reported separately as ``first_call_s``, never mixed into the
  steady-state numbers.
* **Wait for the result, without copying it.** GPU ops run asynchronously: a
  timer that stops when Python regains control measures the launch, not the
  work. Copying the result to the host (``.numpy()``) waits, but on a GPU a
  64 MiB copy costs more than the kernels being compared. :func:`sync` waits
  without a copy: ``tf.test.experimental.sync_devices()`` where a device runs
  asynchronously (a GPU, or eager async mode), otherwise it fetches one element
  of each large result tensor (4 bytes; small results whole) — see :func:`choose_sync`.
* **Median of several repeats**, interleaved round-robin across candidates in
  :func:`compare`, so that a noisy neighbour or CPU frequency drift hits all of
  them alike. For latency, the tail matters too: :meth:`Timing.percentile`
  (p50, p99).
* **Ratios, not absolute seconds.** Absolute times vary 2x between machines and
  runs; ratios measured in one run are what the notebooks state.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from . import _validate
from ._labrules import answers

__all__ = ["Timing", "Comparison", "time_fn", "compare", "sync", "sync_method", "choose_sync", "percentile",
           "format_seconds"]

#: The two ways :func:`sync` waits (see :func:`choose_sync`).
SYNC_METHODS = ("sync_devices", "one_element")


def choose_sync(device_types: Sequence[str], synchronous: bool, has_sync_devices: bool) -> str:
    """Which way :func:`sync` waits, from three facts about the running TensorFlow.

    Args:
        device_types: the logical device types, e.g. ``["CPU", "GPU"]``.
        synchronous: ``tf.config.experimental.get_synchronous_execution()``.
        has_sync_devices: whether ``tf.test.experimental.sync_devices`` exists (TF >= 2.12).

    Returns ``"sync_devices"`` when some device runs asynchronously (any
    non-CPU device: GPU kernels are queued on a CUDA stream and Python gets
    control back at once; or every device, in eager async mode) and the API
    exists: it waits for every device and copies nothing. Otherwise
    ``"one_element"``: fetching one element of each result tensor to the host
    waits for the op that produced it (a data dependency) and copies 4 bytes
    (results up to 64 KiB are fetched whole, which is cheaper than one more op).
    On a CPU in the default synchronous mode an op has finished when it
    returns, so this costs one tiny op per result.
    """
    if isinstance(device_types, (str, bytes)) or not isinstance(device_types, Sequence):
        raise TypeError(f"device_types must be a list of device types like ['CPU', 'GPU'], got {device_types!r}")
    for name, flag in (("synchronous", synchronous), ("has_sync_devices", has_sync_devices)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    asynchronous = (not synchronous) or any(str(t).upper() != "CPU" for t in device_types)
    return "sync_devices" if asynchronous and has_sync_devices else "one_element"


@functools.lru_cache(maxsize=1)
def _device_types() -> tuple[str, ...]:
    """Logical device types of this process (fixed once the runtime has started)."""
    tf = sys.modules["tensorflow"]
    return tuple(sorted({d.device_type for d in tf.config.list_logical_devices()}))


def sync_method() -> str:
    """The method :func:`sync` uses in this process right now: ``"sync_devices"`` or ``"one_element"``.

    Without TensorFlow imported nothing can be pending, and the answer is ``"one_element"``.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "config"):
        return "one_element"
    return choose_sync(_device_types(), bool(tf.config.experimental.get_synchronous_execution()),
                       hasattr(getattr(getattr(tf, "test", None), "experimental", None), "sync_devices"))


def _leaves(result, out: list) -> list:
    if isinstance(result, (list, tuple)):
        for r in result:
            _leaves(r, out)
    elif isinstance(result, dict):
        for r in result.values():
            _leaves(r, out)
    else:
        out.append(result)
    return out


def _is_tf_tensor(obj) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(obj, (tf.Tensor, tf.Variable))


#: Results up to this size are fetched whole: a 64 KiB copy costs less than launching one more op.
SMALL_RESULT_BYTES = 1 << 16


def _one_element(tensor):
    """Fetch ``tensor`` to the host if it is small, else one element of it (a 1-element Slice op that
    depends on it). Either way the host waits for the op that produced ``tensor``; returns the NumPy value."""
    tf = sys.modules["tensorflow"]
    size = tensor.shape.num_elements()
    if size is None or size * tensor.dtype.size <= SMALL_RESULT_BYTES:
        return tensor.numpy()
    rank = tensor.shape.rank
    return tf.raw_ops.Slice(input=tensor, begin=[0] * rank, size=[1] * rank).numpy()


def sync(result, method: str | None = None):
    """Block until ``result`` (a tensor, or nested lists/tuples/dicts of them) is computed; return it.

    ``method`` is ``None`` (choose with :func:`sync_method`), ``"sync_devices"``
    or ``"one_element"``. Neither copies a whole result to the host. Objects
    that are not TensorFlow tensors but have a ``.numpy()`` method (lazy
    wrappers) are materialised with it; plain Python and NumPy values are
    already computed.
    """
    if method is None:
        method = sync_method()
    else:
        _validate.one_of("method", method, SYNC_METHODS)
    leaves = _leaves(result, [])
    if method == "sync_devices":
        sys.modules["tensorflow"].test.experimental.sync_devices()
    for leaf in leaves:
        if _is_tf_tensor(leaf):
            if method == "one_element" and leaf.dtype.name not in ("resource", "variant", "string"):
                _one_element(leaf)
        elif hasattr(leaf, "numpy") and callable(leaf.numpy) and type(leaf).__module__.split(".")[0] != "numpy":
            leaf.numpy()
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linear between order statistics (NumPy's default).

    With ``n`` sorted values the percentile sits at rank ``(n - 1) * q / 100``;
    p99 of 100 values is therefore between the 99th and 100th smallest, and
    p99 of fewer than ~100 values is close to the maximum: measure at least a
    few hundred calls before quoting a p99.
    """
    q = _validate.real("q", q, 0.0, 100.0, what="a percentile between 0 and 100")
    values = _validate.sequence("values", values, "numbers (e.g. timings in seconds)")
    data = sorted(_validate.real("each value", v, finite=False) for v in values)
    rank = (len(data) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def format_seconds(seconds: float) -> str:
    """1.2e-5 -> '12.0 µs', 0.0123 -> '12.3 ms', 2.5 -> '2.50 s'."""
    if not isinstance(seconds, (int, float)) or math.isnan(seconds):
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


@dataclass
class Timing:
    """Wall-clock times of one callable: steady-state repeats plus the first call."""

    name: str
    times_s: list[float]
    first_call_s: float | None = None
    items: int | None = None  # work items per call (e.g. examples), for throughput

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile of the repeats, in seconds (see :func:`percentile`)."""
        return percentile(self.times_s, q)

    @property
    def p50_s(self) -> float:
        """The median, as a latency percentile."""
        return self.percentile(50)

    @property
    def p99_s(self) -> float:
        """The 99th percentile: 1 call in 100 is slower. Needs a few hundred repeats to mean anything."""
        return self.percentile(99)

    @property
    def spread(self) -> float:
        """(max - min) / median: a quick noise indicator; above ~0.3 be careful."""
        return (max(self.times_s) - min(self.times_s)) / self.median_s if self.median_s > 0 else 0.0

    @property
    def throughput(self) -> float | None:
        """Items per second at the median, when ``items`` is known."""
        return self.items / self.median_s if self.items and self.median_s > 0 else None

    def __str__(self) -> str:
        s = f"{self.name}: median {format_seconds(self.median_s)} over {len(self.times_s)} runs"
        if self.first_call_s is not None:
            s += f" (first call {format_seconds(self.first_call_s)})"
        return s


def _check_counts(warmup, repeats):
    _validate.whole("warmup", warmup, 0, what="untimed calls before timing")
    _validate.whole("repeats", repeats, 1, what="timed calls")


def _timed(fn: Callable, args, kwargs, method: str | None = None) -> float:
    method = method or sync_method()  # decided before the clock starts
    t0 = time.perf_counter()
    sync(fn(*args, **kwargs), method)
    return time.perf_counter() - t0


@answers('09', 'q5')
def time_fn(fn: Callable, *args, warmup: int = 1, repeats: int = 5, name: str | None = None,
            items: int | None = None, **kwargs) -> Timing:
    """Time ``fn(*args, **kwargs)``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    The first warm-up call is timed separately (``first_call_s``) because it
    includes tracing and compilation.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _check_counts(warmup, repeats)
    first = None
    for i in range(warmup):
        t = _timed(fn, args, kwargs)
        if i == 0:
            first = t
    times = [_timed(fn, args, kwargs) for _ in range(repeats)]
    return Timing(name or getattr(fn, "__name__", "fn"), times, first, items)


@dataclass
class Comparison:
    """Several timings measured side by side, with ratios to a baseline and to a bound."""

    timings: list[Timing]
    baseline: str | None = None
    bound_s: float | None = None
    bound_label: str = "bound"
    notes: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Timing:
        for t in self.timings:
            if t.name == name:
                return t
        raise KeyError(f"no timing called {name!r}; have {[t.name for t in self.timings]}")

    def speedup(self, name: str) -> float:
        """How many times faster ``name`` is than the baseline (median / median)."""
        if self.baseline is None:
            raise ValueError("this comparison has no baseline")
        return self[self.baseline].median_s / self[name].median_s

    def to_bound(self, name: str) -> float:
        """Median of ``name`` divided by the theoretical bound (1.0 = at the limit)."""
        if self.bound_s is None:
            raise ValueError("this comparison has no bound")
        return self[name].median_s / self.bound_s

    def rows(self) -> list[dict]:
        """The table as a list of dicts (name, median_s, speedup, to_bound, spread)."""
        out = []
        for t in self.timings:
            row = {"name": t.name, "median_s": t.median_s, "spread": t.spread}
            if self.baseline is not None:
                row["speedup"] = self.speedup(t.name)
            if self.bound_s is not None:
                row["to_bound"] = self.to_bound(t.name)
            if t.throughput is not None:
                row["throughput"] = t.throughput
            out.append(row)
        return out

    def table(self) -> str:
        """Plain-text table; ratios first, because they are what carries over to your machine."""
        head = ["", "median"]
        if self.baseline is not None:
            head.append(f"x vs {self.baseline}")
        if self.bound_s is not None:
            head.append(f"/ {self.bound_label}")
        head.append("spread")
        lines = [head]
        for r in self.rows():
            line = [r["name"], format_seconds(r["median_s"])]
            if "speedup" in r:
                line.append(f"{r['speedup']:.2f}x")
            if "to_bound" in r:
                line.append(f"{r['to_bound']:.2f}")
            line.append(f"{r['spread']:.0%}")
            lines.append(line)
        if self.bound_s is not None:
            lines.append([f"({self.bound_label})", format_seconds(self.bound_s)] + [""] * (len(head) - 2))
        widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
        return "\n".join("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle):
        p.text(self.table())


@answers('09', 'q5')
def compare(candidates: Mapping[str, Callable], *, warmup: int = 1, repeats: int = 5,
            baseline: str | None = None, bound_s: float | None = None, bound_label: str = "bound",
            items: int | None = None) -> Comparison:
    """Time several zero-argument callables side by side, interleaving the repeats.

    Args:
        candidates: ``{"name": fn}``; each ``fn()`` is one unit of work.
        baseline: name the speedups are relative to (default: the first).
        bound_s: the theoretical best time for one unit of work, if known.
        items: work items per call, to report throughput.
    """
    _validate.mapping("candidates", candidates, "{name: zero-argument callable}")
    for name, fn in candidates.items():
        if not callable(fn):
            raise TypeError(f"candidate {name!r} is not callable")
    _check_counts(warmup, repeats)
    baseline = baseline if baseline is not None else next(iter(candidates))
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not one of {list(candidates)}")
    if bound_s is not None:
        _validate.seconds("bound_s", bound_s, allow_zero=False)
    first: dict[str, float | None] = {n: None for n in candidates}
    for i in range(warmup):
        for n, fn in candidates.items():
            t = _timed(fn, (), {})
            if i == 0:
                first[n] = t
    times: dict[str, list[float]] = {n: [] for n in candidates}
    for _ in range(repeats):
        for n, fn in candidates.items():
            times[n].append(_timed(fn, (), {}))
    timings = [Timing(n, times[n], first[n], items) for n in candidates]
    return Comparison(timings, baseline, bound_s, bound_label)
