"""Inference latency against batch size: p50, p99 and throughput, and the batch size a latency budget allows.

A server that batches requests trades latency for throughput: a bigger batch
keeps the device busier (more examples per second) but every request in it
waits for the whole batch. :func:`measure_latency` times one call per batch
size many times over (after a warm-up, which traces and compiles) and keeps
the distribution, not just the median: users feel the tail, so the table has
p50 and p99. :meth:`LatencyTable.best_under` picks the batch size with the most
throughput whose p99 stays within a budget.

Timing and waiting for results (without copying them to the host) is
:mod:`gpucourse.timing`'s job; this module only organises the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from . import _validate, plots, timing

__all__ = ["LatencyRow", "LatencyTable", "measure_latency"]


@dataclass
class LatencyRow:
    """One batch size: the timed calls, and what a server cares about."""

    batch: int
    timing: timing.Timing

    @property
    def p50_s(self) -> float:
        return self.timing.p50_s

    @property
    def p99_s(self) -> float:
        return self.timing.p99_s

    @property
    def first_call_s(self) -> float | None:
        """The first warm-up call (trace, and with XLA compile): what the first user would wait."""
        return self.timing.first_call_s

    @property
    def throughput(self) -> float:
        """Examples per second when calls run back to back: ``batch * calls / total time``."""
        total = sum(self.timing.times_s)
        return self.batch * len(self.timing.times_s) / total if total > 0 else float("inf")


@dataclass
class LatencyTable:
    """Latency percentiles and throughput for several batch sizes, measured in one run."""

    rows: list[LatencyRow]

    def __getitem__(self, batch: int) -> LatencyRow:
        for r in self.rows:
            if r.batch == batch:
                return r
        raise KeyError(f"no row for batch {batch!r}; measured {[r.batch for r in self.rows]}")

    def best_under(self, p99_budget_s: float) -> LatencyRow | None:
        """The row with the most throughput whose p99 is within ``p99_budget_s``; None if none is."""
        budget = _validate.seconds("p99_budget_s", p99_budget_s, allow_zero=False)
        fits = [r for r in self.rows if r.p99_s <= budget]
        return max(fits, key=lambda r: r.throughput) if fits else None

    def records(self) -> list[dict]:
        """The table as a list of dicts (batch, p50_s, p99_s, p99_over_p50, throughput, first_call_s)."""
        return [{"batch": r.batch, "p50_s": r.p50_s, "p99_s": r.p99_s, "p99_over_p50": r.p99_s / r.p50_s,
                 "throughput": r.throughput, "first_call_s": r.first_call_s} for r in self.rows]

    def table(self) -> str:
        """Plain-text table, one line per batch size."""
        head = ["batch", "p50", "p99", "p99/p50", "examples/s", "first call"]
        lines = [head]
        for rec in self.records():
            lines.append([str(rec["batch"]), timing.format_seconds(rec["p50_s"]), timing.format_seconds(rec["p99_s"]),
                          f"{rec['p99_over_p50']:.1f}x", f"{rec['throughput']:,.0f}",
                          timing.format_seconds(rec["first_call_s"]) if rec["first_call_s"] is not None else "n/a"])
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in lines)

    def plot(self, axes=None, budget_s: float | None = None):
        """Two panels: p50 and p99 against batch size, and throughput against p99 (the trade-off curve)."""
        import matplotlib.pyplot as plt

        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(11, 3.2))
        left, right = axes
        batches = [r.batch for r in self.rows]
        left.plot(batches, [r.p50_s * 1e3 for r in self.rows], "o-", label="p50")
        left.plot(batches, [r.p99_s * 1e3 for r in self.rows], "s--", label="p99")
        left.set(xscale="log", yscale="log", xlabel="batch size", ylabel="latency per call (ms)",
                 title="latency grows with the batch")
        right.plot([r.p99_s * 1e3 for r in self.rows], [r.throughput for r in self.rows], "o-")
        for r in self.rows:
            right.annotate(str(r.batch), (r.p99_s * 1e3, r.throughput), textcoords="offset points", xytext=(4, -10))
        right.set(xscale="log", yscale="log", xlabel="p99 latency (ms)", ylabel="examples / s",
                  title="throughput bought with latency")
        if budget_s is not None:
            for ax, vertical in ((left, False), (right, True)):
                (ax.axvline if vertical else ax.axhline)(budget_s * 1e3, color="grey", linestyle=":",
                                                         label="p99 budget")
        left.legend()
        for ax in axes:
            plots.label_log_axes(ax)
        return axes

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle):
        p.text(self.table())


def measure_latency(make_call: Callable[[int], Callable[[], object]], batch_sizes: Sequence[int], *,
                    calls: int = 200, warmup: int = 3) -> LatencyTable:
    """Time ``make_call(batch)()`` ``calls`` times for each batch size, after ``warmup`` untimed calls.

    Args:
        make_call: given a batch size, returns a zero-argument callable that
            serves one batch of that size (build the input once, outside it).
        batch_sizes: the batch sizes to measure, e.g. ``[1, 8, 64, 256]``.
        calls: timed calls per batch size. p99 of 200 calls rests on the two
            slowest; use a few hundred at least before quoting it.
        warmup: untimed calls first; the first of them is kept as ``first_call_s``.
    """
    _validate.callable_("make_call", make_call)
    batch_sizes = _validate.sequence("batch_sizes", batch_sizes, "batch sizes, e.g. [1, 8, 64]")
    sizes = [_validate.whole("batch size", b, 1) for b in batch_sizes]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"batch_sizes has duplicates: {sizes}")
    calls = _validate.whole("calls", calls, 2, what="timed calls per batch size")
    warmup = _validate.whole("warmup", warmup, 1, what="untimed calls that trace and compile first")
    rows = []
    for b in sizes:
        call = _validate.callable_(f"make_call({b})", make_call(b))
        rows.append(LatencyRow(b, timing.time_fn(call, warmup=warmup, repeats=calls, name=f"batch {b}", items=b)))
    return LatencyTable(rows)
