"""Small matplotlib helpers shared by the notebooks.

Each function draws on an ``ax`` you pass (or a new figure) and returns the
``Axes``; end the notebook cell with ``plt.show()``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from . import _validate

__all__ = ["ratio_bars", "comparison_bars", "timeline", "lines", "label_log_axes"]


def _axes(ax, figsize):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def ratio_bars(values: Mapping[str, float], *, reference: float = 1.0, reference_label: str = "bound",
               xlabel: str = "ratio", title: str = "", ax=None):
    """Horizontal bars of ratios (e.g. time / theoretical bound) with a reference line."""
    _validate.mapping("values", values, "{label: ratio}")
    bad = [k for k, v in values.items() if not isinstance(v, (int, float))]
    if bad:
        raise TypeError(f"values must be numbers; not for {bad}")
    ax = _axes(ax, (6.5, 0.45 * len(values) + 1.2))
    names = list(values)[::-1]
    vals = [values[n] for n in names]
    bars = ax.barh(names, vals, color="#4c72b0")
    ax.axvline(reference, color="#c44e52", linestyle="--", label=f"{reference_label} = {reference:g}")
    for bar, v in zip(bars, vals):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.2f}", va="center", fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, max(vals + [reference]) * 1.18)
    if title:
        ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    return ax


def comparison_bars(comparison, *, title: str = "", ax=None):
    """Bar chart of a :class:`gpucourse.timing.Comparison`: median time per candidate, bound as a line."""
    rows = comparison.rows()
    ax = _axes(ax, (6.5, 0.45 * len(rows) + 1.2))
    names = [r["name"] for r in rows][::-1]
    ms = [r["median_s"] * 1e3 for r in rows][::-1]
    ax.barh(names, ms, color="#55a868")
    if comparison.bound_s is not None:
        ax.axvline(comparison.bound_s * 1e3, color="#c44e52", linestyle="--",
                   label=f"{comparison.bound_label} {comparison.bound_s * 1e3:.1f} ms")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("median time (ms)")
    if title:
        ax.set_title(title)
    return ax


def timeline(events: Sequence[tuple[str, float, float]], *, title: str = "", ax=None, colors=None):
    """Gantt-style timeline: one lane per label, a bar per ``(lane, start_s, end_s)`` event.

    Used to show when the input pipeline and the training step overlap. Slots of
    one stage (``"decode #1"``, ``"decode #2"``, as :class:`gpucourse.simulate.Lanes`
    names them) share a colour.
    """
    events = _validate.sequence("events", events, "(lane, start_s, end_s) tuples")
    for ev in events:
        if isinstance(ev, (str, bytes)) or not isinstance(ev, Sequence) or len(ev) != 3:
            raise TypeError(f"each event must be a (lane, start_s, end_s) tuple, got {ev!r}")
        start = _validate.real("an event's start_s", ev[1])
        if _validate.real("an event's end_s", ev[2]) < start:
            raise ValueError(f"each event must end at or after its start, got {ev!r}: swap start_s and end_s")
    lanes = list(dict.fromkeys(ev[0] for ev in events))
    groups = list(dict.fromkeys(str(lane).split(" #")[0] for lane in lanes))
    ax = _axes(ax, (8, min(0.6, 0.25 + 3.0 / len(lanes)) * len(lanes) + 1.2))
    palette = colors or ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    t0 = min(ev[1] for ev in events)
    for i, lane in enumerate(lanes):
        spans = [((s - t0) * 1e3, (e - s) * 1e3) for name, s, e in events if name == lane]
        ax.broken_barh(spans, (i - 0.4, 0.8), color=palette[groups.index(str(lane).split(" #")[0]) % len(palette)])
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.set_xlabel("time (ms)")
    ax.invert_yaxis()
    if title:
        ax.set_title(title)
    return ax


def lines(x: Sequence[float], ys: Mapping[str, Sequence[float]], *, xlabel: str = "", ylabel: str = "",
          title: str = "", ax=None, marker: str = "o"):
    """One line per series in ``ys`` against the shared ``x``."""
    _validate.mapping("ys", ys, "{label: list of y values}")
    for k, v in ys.items():
        if len(v) != len(x):
            raise ValueError(f"series {k!r} has {len(v)} values but x has {len(x)}")
    ax = _axes(ax, (6.5, 4))
    for label, values in ys.items():
        ax.plot(list(x), list(values), marker=marker, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def label_log_axes(ax):
    """Plain numbers (``3``, ``30``, ``0.01``) as the tick labels of ``ax``'s log-scaled axes; returns ``ax``.

    Matplotlib's default log labels are TeX (``$\\mathdefault{3\\times10^{0}}$``), drawn by its mathtext
    parser; a learner reads "3 ms" more easily from ``3`` than from 3x10^0, and the labels then need no parser.
    Call it after ``set_xscale("log")`` / ``set_yscale("log")``; linear axes are left alone.
    """
    from matplotlib.axes import Axes
    from matplotlib.ticker import LogFormatter

    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_formatter(LogFormatter())
            # as matplotlib's default minor formatter: labels only when the axis spans few decades
            axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    return ax
