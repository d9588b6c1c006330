"""The trusted half of a timing item: simulated stages and an accelerator that run as the check's callbacks.

One job: pay every simulated cost, and read every clock, on the side that judges (labs 07 and 08). A
timing item hands the learner's pipeline stages whose work is a callback of the check: in the grader
the callback runs in the observer's process (:mod:`gpucourse.grading.grader.link` serves each one in a
thread of its own, so a pipeline's parallel calls really run in parallel), in ``check()`` in the
learner's kernel. The kernel side only wires the callbacks into ``tf.data``::

    line = Timeline(deadline_s=4.0)                                 # observer: the clock and the records
    decode = line.stage("decode", 0.048, lambda v: a * v + b)       # sleeps 48 ms, maps, stamps
    step = line.device(0.032, queued=1)                             # the simulated accelerator
    seen = ns.kernel(_observe, decode, step)                        # kernel: simulate.Stage(0.0, decode), ...
    runs = line.records()                                           # plain data for the judge

* :meth:`Timeline.stage` sleeps the stage's cost, maps the value and records ``[stage, value in, value
  out, start, end]``: who saw which element, and when.
* :meth:`Timeline.device` is the accelerator, one step at a time, on a virtual timeline: a step starts
  when its element arrives and the previous step is done, and lasts exactly ``step_s`` (however busy
  the machine, so a late-waking sleep never counts as work). ``queued=1``: the call returns when the
  step starts, so the host fetches the next element while the device works (a GPU's asynchronous
  dispatch); ``queued=0``: it returns when the step ends (the host waits, as ``simulate.feed`` does).
* After ``deadline_s`` the stages stop sleeping and the device answers True ("stop feeding me"): a
  pipeline far too slow for the check ends there instead of running out the item's time.

:func:`observe_run` makes a fresh timeline, runs an ``@in_kernel`` function with its callbacks and returns
what the kernel said beside the records. The judge reads the records with :func:`lineage` (did every
element that reached the device pass through every stage, each after the one before?),
:func:`device_summary` (start-up and steady-state utilisation), :func:`ran`, :func:`most_at_once` and
:func:`delivered`. Nothing the kernel returns enters these numbers. Times are seconds since the
timeline was made. Standard library only.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .protocol import plain

__all__ = ["Timeline", "delivered", "device_summary", "lineage", "most_at_once", "observe_run", "ran"]

def _whole(name: str, value) -> int:
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"the {name} stage takes one whole number (an int64 element), got {value!r}")
    return value


class Timeline:
    """The observer's clock and records for one run of a pipeline (thread-safe)."""

    def __init__(self, deadline_s: float | None = None):
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._deadline = None if deadline_s is None else self._t0 + float(deadline_s)
        self._free_at = 0.0  # when the simulated device finishes its last step
        self.stages: list[list] = []  # [stage, value in, value out, start, end]
        self.steps: list[list] = []  # [value, arrived, start, end]
        self.marks: dict[str, float] = {}
        self.stopped: float | None = None  # when a callback first found the time up

    def now(self) -> float:
        """Seconds since this timeline was made (the observer's clock)."""
        return time.perf_counter() - self._t0

    def _late(self) -> bool:
        """True once the run's time is up (the first time, it records when)."""
        if self._deadline is None or time.perf_counter() <= self._deadline:
            return False
        with self._lock:
            if self.stopped is None:
                self.stopped = self.now()
        return True

    def stage(self, name: str, seconds: float, fn: Callable[[int], int]) -> Callable[[int], int]:
        """A stage's work: sleep ``seconds``, return ``fn(value)``, record the element and when.

        Once the run's time is up it no longer sleeps, so the pipeline drains at once (no exception, which
        TensorFlow would print from every thread that was running a stage).
        """
        def work(value):
            value = _whole(name, value)
            start = self.now()
            if seconds > 0 and not self._late():
                time.sleep(seconds)
            out = fn(value)
            end = self.now()
            with self._lock:
                self.stages.append([name, value, out, start, end])
            return out

        work.__name__ = f"{name}_stage"
        return work

    def device(self, step_s: float, queued: int = 1) -> Callable[[object], bool]:
        """The accelerator's step: record the element it got, when it arrived, and when the step ran.

        It returns True once the run's time is up: the feeding loop stops there.
        """
        if queued not in (0, 1):
            raise ValueError(f"queued must be 0 (the host waits for the step) or 1, got {queued!r}")

        def step(element=None) -> bool:
            arrived = self.now()
            with self._lock:
                start = max(arrived, self._free_at)
                self._free_at = end = start + step_s
                self.steps.append([plain(element), arrived, start, end])
            if self._late():
                return True
            wait = (end if queued == 0 else start) - self.now()
            if wait > 0:
                time.sleep(wait)
            return False

        return step

    def mark(self, name: str) -> Callable[[], None]:
        """A callback that records when it was called (the first time), e.g. when a function returned."""
        def stamp(*_):
            with self._lock:
                self.marks.setdefault(name, self.now())

        return stamp

    def records(self) -> dict:
        """Everything recorded, as plain data: ``stages``, ``steps``, ``marks`` and ``stopped``."""
        with self._lock:
            return {"stages": [list(r) for r in self.stages], "steps": [list(r) for r in self.steps],
                    "marks": dict(self.marks), "stopped": self.stopped}


def observe_run(ns, fn: Callable, deadline_s: float | None, build: Callable[[Timeline], list]) -> tuple:
    """Run the ``@in_kernel`` function ``fn`` with the arguments ``build(timeline)`` makes from a fresh
    :class:`Timeline` (its callbacks, which stop the run after ``deadline_s``); return ``(what the kernel
    returned, the timeline's records)``.

    An exception after the run's time was up is the stop, not the learner's error: the kernel's answer is
    then ``{"type": "Dataset"}`` and the records say ``stopped``. Any other exception passes on.
    """
    line = Timeline(deadline_s=deadline_s)
    try:
        seen = ns.kernel(fn, *build(line))
    except Exception:
        if line.stopped is None:
            raise
        seen = {"type": "Dataset"}
    return seen, line.records()


# --------------------------------------------------------------------------- reading the records (the judge)


def _flat(element) -> list:
    """The values of one element the device got (a scalar, or a batch of any nesting)."""
    if isinstance(element, list):
        return [v for sub in element for v in _flat(sub)]
    return [element]


def lineage(records: dict, order: list[str]) -> dict:
    """Check that every value the device got came out of every stage of ``order`` (first stage first), in time.

    For each value of each step it takes the latest record of the last stage whose output is that value and
    that *ended before the step arrived*, then the latest record of the stage before whose output was that
    record's input and that ended before it started, and so on (a record may serve several elements: a
    cache replays what a stage made once). Returns ``{"sources":
    [first stage's inputs, in delivery order], "begun": [per step, when the first of its records started],
    "missing": None}`` or, at the first value that has no such chain, ``"missing": {"value", "stage",
    "late"}``: ``late`` is True when a record with the right value exists but ran too late (the element
    reached the device, or the next stage, before this stage had finished).
    """
    by_out: dict[str, dict] = {name: {} for name in order}
    for name, value_in, out, start, end in records.get("stages", []):
        if name in by_out:
            by_out[name].setdefault(repr(out), []).append([start, end, value_in])
    for table in by_out.values():
        for recs in table.values():
            recs.sort(key=lambda r: r[1])
    sources, begun = [], []
    for element, arrived, _, _ in records.get("steps", []):
        first = arrived
        for value in _flat(element):
            want, before = value, arrived
            for name in reversed(order):
                recs = by_out[name].get(repr(want), [])
                pick = next((r for r in reversed(recs) if r[1] <= before), None)
                if pick is None:
                    return {"sources": sources, "begun": begun,
                            "missing": {"value": value, "stage": name, "late": bool(recs)}}
                want, before = pick[2], pick[0]
                first = min(first, pick[0])
            sources.append(want)
        begun.append(first)
    return {"sources": sources, "begun": begun, "missing": None}


def device_summary(records: dict, begin: str | None = None) -> dict:
    """Start-up and steady-state utilisation of the simulated device, from the records alone.

    ``startup``: from the first stage's first start (or the mark ``begin``, if earlier) to the first step's
    start. ``utilisation``: steps x step time / time, from the end of the first step to the end of the last
    (the steady state: the fill is graded by ``startup``). ``elements``: values the device got.
    """
    steps, stages = records.get("steps", []), records.get("stages", [])
    starts = [r[3] for r in stages]
    if begin and begin in records.get("marks", {}):
        starts.append(records["marks"][begin])
    t0 = min(starts) if starts else (steps[0][1] if steps else 0.0)
    out = {"steps": len(steps), "elements": sum(len(_flat(s[0])) for s in steps),
           "startup": (steps[0][2] - t0) if steps else None, "utilisation": 0.0}
    if len(steps) >= 2:
        busy = sum(e - s for _, _, s, e in steps[1:])
        out["utilisation"] = busy / (steps[-1][3] - steps[0][3])
    return out


def delivered(records: dict) -> list:
    """Every value the device got, in order (batches flattened)."""
    return [v for element, *_ in records.get("steps", []) for v in _flat(element)]


def ran(records: dict, stage: str) -> int:
    """How often ``stage`` ran."""
    return sum(r[0] == stage for r in records.get("stages", []))


def most_at_once(records: dict, stages) -> int:
    """The most runs of ``stages`` (names) that were working at the same moment, from their stamps."""
    edges = sorted([(r[3], 1) for r in records.get("stages", []) if r[0] in stages] +
                   [(r[4], -1) for r in records.get("stages", []) if r[0] in stages])
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most
