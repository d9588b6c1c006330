"""Honest timing: warm-up, repeats, medians, and ratios measured side by side.

Rules this module enforces, because every benchmark in the course needs them:

* **Warm-up first.** The first call of a ``tf.function`` traces and (with XLA)
  compiles; it is reported separately as ``first_call_s``, never mixed into the
  steady-state numbers.
* **Wait for the result.** GPU ops run asynchronously: a timer that stops
  when Python regains control measures the launch, not the work. Every result
  is synced (``.numpy()`` on tensors) before the clock stops.
* **Median of several repeats**, interleaved round-robin across candidates in
  :func:`compare`, so that a noisy neighbour or CPU frequency drift hits all of
  them alike.
* **Ratios, not absolute seconds.** Absolute times vary 2x between machines and
  runs; ratios measured in one run are what the notebooks state.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

__all__ = ["Timing", "Comparison", "time_fn", "compare", "sync", "format_seconds"]


def sync(result):
    """Block until ``result`` (a tensor, or nested lists/tuples/dicts of them) is computed."""
    if isinstance(result, (list, tuple)):
        for r in result:
            sync(r)
    elif isinstance(result, dict):
        for r in result.values():
            sync(r)
    elif hasattr(result, "numpy") and callable(result.numpy):
        result.numpy()
    return result


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
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a whole number >= 0, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")


def _timed(fn: Callable, args, kwargs) -> float:
    t0 = time.perf_counter()
    sync(fn(*args, **kwargs))
    return time.perf_counter() - t0


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
    if not isinstance(candidates, Mapping) or not candidates:
        raise ValueError("candidates must be a non-empty dict of {name: zero-argument callable}")
    for name, fn in candidates.items():
        if not callable(fn):
            raise TypeError(f"candidate {name!r} is not callable")
    _check_counts(warmup, repeats)
    baseline = baseline if baseline is not None else next(iter(candidates))
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not one of {list(candidates)}")
    if bound_s is not None and not (isinstance(bound_s, (int, float)) and bound_s > 0):
        raise ValueError(f"bound_s must be a positive number of seconds, got {bound_s!r}")
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
