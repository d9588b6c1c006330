"""Topic 08: say what limits a training step (input, host or device) from its step-time breakdown.

One job, the verdict on a step and the breakdowns it is read from:

* :data:`CATEGORIES` are the nine step-time categories of the TensorFlow
  profiler (the columns of the input-pipeline analyzer's step table, the
  stacked bars of the overview page's step-time graph), each with the group it
  belongs to: ``input``, ``host`` (kernel launch, host compute, compilation,
  "all others", which includes Python overhead) or ``device``.
* :func:`classify` turns one step, or many (their times summed), into a
  :class:`Verdict`: ``input-bound`` when input takes at least
  :data:`INPUT_BOUND_SHARE` of the step (the profiler's "HIGHLY input-bound"
  threshold), else ``device-bound`` when the device's share is the larger one,
  else ``host-bound``.
* :func:`profiler_step_table` reads the profiler's own step table from a
  captured trace. It has rows on a GPU; on a CPU-only machine the profiler
  finds no device steps and the table is empty.
* :func:`trace_step_table` measures the same columns from a trace with the
  course's reader (:mod:`gpucourse.profiling`): per step, the input ranges, the
  device's busy time and the rest. In a GPU trace the device time is read from
  the GPU's own stream lines and the host's op spans are its kernel launches;
  in a CPU trace (the CPU is the device) it is the time TensorFlow's op kernels ran.

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from . import _validate
from .profiling import TraceEvent, _is_step, _union_us, load_trace, parse_trace
from ._labrules import answers

__all__ = ["CATEGORIES", "GPU_PLANE", "GROUPS", "INPUT_BOUND_SHARE", "STREAM_LINE", "StepTable", "Verdict",
           "classify", "format_rows", "group_shares", "profiler_step_table", "take_minimum", "trace_step_table"]

#: The profiler's step-time categories: column id in the input-pipeline analyzer's step table -> (label, group).
#: Ids and labels as ``xprof/convert/op_stats_to_input_pipeline_analysis.cc`` writes them (the unit tests check
#: them against the installed profiler); the grouping is the course's.
CATEGORIES: dict[str, tuple[str, str]] = {
    "infeedTimeMs": ("Input", "input"),                     # host waits for input + host-to-device copies
    "deviceComputeTimeMs": ("Device compute", "device"),
    "deviceToDeviceTimeMs": ("Device to device", "device"),
    "deviceCollectivesTimeMs": ("Device collective communication", "device"),
    "outfeedTimeMs": ("Output", "device"),                  # device-to-host copies: the device is busy copying
    "kernelLaunchTimeMs": ("Kernel launch", "host"),
    "hostComputeTimeMs": ("Host compute", "host"),
    "compileTimeMs": ("Compilation", "host"),
    "otherTimeMs": ("All others", "host"),                  # includes Python overhead
}
GROUPS = ("input", "host", "device")
STEP_TIME = "stepTimeMs"

#: Input share from which a step is input-bound: the profiler's kHighlyInfeedBoundThresholdInPercent (20%).
INPUT_BOUND_SHARE = 0.20

_ADVICE = {
    "input-bound": "the device waits for data: fix the input pipeline first (parallel map, prefetch, cache; "
                   "topic 07)",
    "host-bound": "the device waits for the host to hand it work (Python, op dispatch, kernel launches): run "
                  "fewer, bigger steps (tf.function, Keras steps_per_execution, XLA); on a GPU whose host is busy "
                  "with tf.data, also TF_GPU_THREAD_MODE=gpu_private",
    "device-bound": "the device is busy: make its work cheaper (mixed precision, XLA fusion, Tensor Core friendly "
                    "shapes; topics 05-06) or spread it over more devices (topic 04)",
}


# --------------------------------------------------------------------------- the verdict


def _row_times(row, where: str) -> tuple[float, dict[str, float]]:
    if not isinstance(row, Mapping):
        raise TypeError(f"{where} must be a dict of step-table columns (e.g. {{'stepTimeMs': 12.0, "
                        f"'infeedTimeMs': 3.0, ...}}), got {type(row).__name__}")
    times = {}
    for key in (STEP_TIME, *CATEGORIES):
        value = row.get(key, 0.0)
        if key == STEP_TIME and key not in row:
            raise ValueError(f"{where} has no {STEP_TIME!r}: every step-table row needs its step time "
                             f"(columns found: {sorted(row)})")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}[{key!r}] must be a number of milliseconds, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}[{key!r}] must be a finite time >= 0 ms, got {value!r}")
        times[key] = value
    return times.pop(STEP_TIME), times


@answers('08', 'q5')
def group_shares(rows) -> dict[str, float]:
    """Share of the step time in each group (``input``, ``host``, ``device``) for one row or many (summed).

    Shares are of the step time (``stepTimeMs``), like the profiler's percentages, so they need not add up to
    exactly 1 (rounding, or time no category claimed).
    """
    if isinstance(rows, Mapping):
        rows = [rows]
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise (TypeError if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)) else ValueError)(
            f"rows must be a step-table row (dict) or a non-empty list of them, got {rows!r}"[:300])
    step_ms, group_ms = 0.0, dict.fromkeys(GROUPS, 0.0)
    for i, row in enumerate(rows):
        step, times = _row_times(row, f"rows[{i}]")
        step_ms += step
        for key, ms in times.items():
            group_ms[CATEGORIES[key][1]] += ms
    if step_ms <= 0:
        raise ValueError("the rows add up to a step time of 0 ms: there is nothing to classify")
    return {g: ms / step_ms for g, ms in group_ms.items()}


@dataclass(frozen=True)
class Verdict:
    """What limits a step: ``kind`` (``input-bound``, ``host-bound`` or ``device-bound``) and why."""

    kind: str
    shares: dict = field(compare=False)

    @property
    def advice(self) -> str:
        return _ADVICE[self.kind]

    def __str__(self) -> str:
        s = self.shares
        return (f"{self.kind}: input {s['input']:.0%}, host {s['host']:.0%}, device {s['device']:.0%} of the "
                f"step time; {self.advice}")


@answers('08', 'q5')
def classify(rows, input_share: float = INPUT_BOUND_SHARE) -> Verdict:
    """The verdict on one step-table row, or on many (their times summed, as the profiler's summary does).

    Input first: ``input-bound`` when the input share is at least ``input_share``. Otherwise the device is
    idle mainly because of the host or busy: ``device-bound`` when the device share is larger than the host
    share, else ``host-bound``.
    """
    _validate.real("input_share", input_share, 0.0, 1.0, strict_min=True, what="a fraction of the step time")
    shares = group_shares(rows)
    if shares["input"] >= input_share:
        kind = "input-bound"
    elif shares["device"] > shares["host"]:
        kind = "device-bound"
    else:
        kind = "host-bound"
    return Verdict(kind, shares)


def take_minimum(rows) -> dict[str, float]:
    """One step-table row: each column's minimum over the steps ``rows``.

    When another process takes the CPU (or the GPU) in the middle of a step, the time lands in whatever column
    was running then, so one interrupted op can make a host-bound step look device-bound. Interruptions only
    ever add time, so each column's minimum over several steps is the step's own cost, as ``timing`` takes the
    best of its repeats. Classify it to judge a step measured on a busy machine.
    """
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a list of step-table rows (dicts), got {type(rows).__name__}")
    if not rows:
        raise ValueError("rows is empty: profile at least one step (more make the minimum closer to the step's "
                         "own cost)")
    times = [_row_times(row, f"rows[{i}]") for i, row in enumerate(rows)]
    return {STEP_TIME: min(step for step, _ in times),
            **{key: min(cols[key] for _, cols in times) for key in CATEGORIES}}


@answers('08', 'q5')
def format_rows(rows, title: str = "") -> str:
    """The rows as a table in ms (input, host and device time of each step) with each step's verdict,
    then all steps together."""
    if isinstance(rows, Mapping):
        rows = [rows]
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise TypeError(f"rows must be a list of step-table rows, got {type(rows).__name__}")
    lines = [title] if title else []
    lines.append(f"{'step':>8} {'step':>9}  {'input':>9} {'host':>9} {'device':>9}  verdict")
    if not rows:
        return "\n".join(lines + ["(no steps)"])
    for name, part in [(str(r.get("stepnum", i)) if isinstance(r, Mapping) else str(i), [r])
                       for i, r in enumerate(rows)] + [("all", list(rows))]:
        step = sum(_row_times(r, "row")[0] for r in part)
        shares = group_shares(part)
        lines.append(f"{name:>8} {step:>6.2f} ms  " + " ".join(f"{shares[g] * step:>6.2f} ms" for g in GROUPS)
                     + f"  {classify(part).kind}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the profiler's own step table


@dataclass
class StepTable:
    """The profiler's step table: ``rows`` (one dict per step, keyed by column id) and its properties."""

    rows: list
    properties: dict

    @property
    def hardware(self) -> str:
        return str(self.properties.get("hardware_type", "unknown"))

    @property
    def conclusion(self) -> str:
        """The profiler's own sentence about input, e.g. 'Your program is HIGHLY input-bound because ...'."""
        return str(self.properties.get("input_conclusion", ""))


@answers('08', 'q5')
def _step_table(data) -> StepTable:
    """Find the step table (the DataTable with a ``stepTimeMs`` column) in the analyzer's JSON output."""
    if isinstance(data, (bytes, str)):
        data = json.loads(data)
    tables = data if isinstance(data, list) else [data]
    for table in tables:
        cols = [c.get("id") for c in table.get("cols", [])] if isinstance(table, Mapping) else []
        if STEP_TIME in cols and "stepnum" in cols:
            rows = []
            for row in table.get("rows", []):
                cells = [c.get("v") if isinstance(c, Mapping) else None for c in row.get("c", [])]
                rows.append({k: v for k, v in zip(cols, cells) if k in CATEGORIES or k in ("stepnum", STEP_TIME)})
            return StepTable(rows, dict(table.get("p", {})))
    raise ValueError("no step table (a table with 'stepnum' and 'stepTimeMs' columns) in the profiler's output")


def profiler_step_table(path: str | os.PathLike) -> StepTable:
    """The step table of the profiler's input-pipeline analyzer for a trace (``.xplane.pb`` or its logdir).

    Runs the converter behind TensorBoard's Profile tab (:func:`gpucourse.profiling.convert_trace` with
    ``"input_pipeline_analyzer"``) and keeps the table the step-time graph is drawn from. On a CPU-only
    machine it has no rows (``hardware == "CPU_ONLY"``).
    """
    from .profiling import convert_trace, find_xplane

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be an .xplane.pb file or a logdir, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        path = find_xplane(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no trace file at {path!r}")
    data, _content_type = convert_trace(path, "input_pipeline_analyzer")
    return _step_table(data)


# --------------------------------------------------------------------------- measured from a trace

#: In a GPU trace the device's own activity is on the planes (trace-viewer processes) named ``/device:GPU:<n>``
#: (TensorFlow's XPlane naming, ``kGpuPlanePrefix``), on the lines (threads) the CUPTI collector names
#: ``Stream #<id>`` or ``Stream #<id>(<kinds>)``, e.g. ``Stream #7(Compute)``, ``Stream #14(MemcpyH2D)``.
#: The same planes also hold lines derived from the host's annotations ("XLA Ops", "TensorFlow Ops", "Steps"):
#: those span whole ops from their first kernel to their last and are not read.
GPU_PLANE = "/device:GPU:"
STREAM_LINE = "Stream #"
#: Copies on a stream, by event name (the collector's ``GetTraceEventTypeName``), and the column they go to;
#: every other event on a stream (kernels, memsets) is device compute.
_COPIES = (("MemcpyH2D", "infeedTimeMs"), ("MemcpyD2D", "deviceToDeviceTimeMs"),
           ("MemcpyP2P", "deviceToDeviceTimeMs"), ("MemcpyD2H", "outfeedTimeMs"))


def _events(events) -> list[TraceEvent]:
    """Events as given, or read from a trace file / logdir, or parsed from trace-viewer JSON."""
    if isinstance(events, list) and events and all(isinstance(e, TraceEvent) for e in events):
        return events
    if isinstance(events, os.PathLike) or (isinstance(events, str) and (events.endswith(".xplane.pb")
                                                                       or os.path.isdir(events))):
        return load_trace(events)
    return parse_trace(events)


def _is_kernel(ev: TraceEvent) -> bool:
    """A TensorFlow op kernel (``long_name`` 'name:Type') or an XLA kernel (``hlo_op``), outside tf.data."""
    return ("long_name" in ev.args or "hlo_op" in ev.args) and not ev.thread.startswith("tf_data")


def _leaves(kernels: list[TraceEvent]) -> list[tuple[float, float]]:
    """The kernels that hold no other kernel on their thread: an op that runs others inside it (an XLA
    launch, a function call run inline) is the host's time around its kernels, not a kernel itself."""
    out, by_thread = [], {}
    for e in kernels:
        by_thread.setdefault((e.pid, e.tid), []).append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.start_us, -e.end_us))
        stack, holders = [], set()
        for e in evs:
            while stack and stack[-1].end_us <= e.start_us:
                stack.pop()
            if stack and e.end_us <= stack[-1].end_us:
                holders.add(id(stack[-1]))
            stack.append(e)
        out += [(e.start_us, e.end_us) for e in evs if id(e) not in holders]
    return out


def _eager_kernels(inside: list[TraceEvent]) -> list[TraceEvent]:
    """Eager single ops run their kernel inside ``KernelAndDeviceFunc::Run`` under an ``EagerExecute`` of a
    non-function op (``is_func`` '0'); function calls are left out (their ops have their own events)."""
    ops = {}
    for e in inside:
        if e.name == "EagerExecute" and e.args.get("is_func") == "0":
            ops.setdefault((e.pid, e.tid), []).append(e)
    out = []
    for e in inside:
        if e.name == "KernelAndDeviceFunc::Run":
            if any(o.start_us <= e.start_us and e.end_us <= o.end_us for o in ops.get((e.pid, e.tid), ())):
                out.append(e)
    return out


def _is_device_stream(ev: TraceEvent) -> bool:
    """An event on one of a GPU's stream lines: a kernel or a copy as the GPU ran it."""
    return GPU_PLANE in ev.process and ev.thread.startswith(STREAM_LINE)


def _device_column(ev: TraceEvent) -> str:
    for prefix, column in _COPIES:
        if ev.name.startswith(prefix):
            return column
    return "deviceComputeTimeMs"


def _claim(order) -> tuple[dict[str, float], float]:
    """Give every moment to the first column in ``order`` ((column, spans) pairs) whose spans cover it.

    Returns the µs each column got and the µs all of them cover together."""
    taken, covered, out = [], 0.0, {}
    for column, spans in order:
        taken += spans
        now = _union_us(taken)
        out[column] = out.get(column, 0.0) + now - covered
        covered = now
    return out, covered


def trace_step_table(events, step_name: str = "train",
                     input_names: Sequence[str] = ("input", "IteratorGetNextOp::DoCompute"), skip: int = 0) -> list:
    """Per step of a trace, the profiler's step-table columns measured from the trace (times in ms).

    A step is an event named ``step_name`` with a ``step_num`` (:func:`gpucourse.profiling.step_marker`
    writes them; Keras' TensorBoard callback names its steps ``"Profiled batch"``). The host's events count
    when they lie inside the step, on any thread:

    * the **input** ranges: the events named in ``input_names``;
    * the host's **op spans**: graph ops (events with a ``long_name``), XLA ops (``hlo_op``) and eager ops'
      kernels (their ``KernelAndDeviceFunc::Run``, which includes a little of the runtime's own work); an
      op that holds other ops on its thread (an XLA launch) counts as those only, and tf.data's own threads
      are left out.

    What the op spans are depends on the trace:

    * **GPU trace** (it has events on a GPU's stream lines: processes named ``/device:GPU:<n>``, threads
      named ``Stream #<id>...``, as TensorFlow's CUPTI collector writes them and the trace viewer's
      converter passes them on). On a GPU a host op span is the host *launching* the op's kernels, so the
      device's time is read from the streams instead: the kernels and copies that ran during the step
      (clipped to it; device work that runs on after the step's host range ends counts where it runs).
      Each moment of the step goes to the first that covers it, the profiler's own priority:
      ``deviceComputeTimeMs`` (kernels), ``deviceToDeviceTimeMs`` (``MemcpyD2D``/``P2P``),
      ``outfeedTimeMs`` (``MemcpyD2H``), ``infeedTimeMs`` (input ranges and ``MemcpyH2D``),
      ``kernelLaunchTimeMs`` (the host's op spans, including those of ops placed on the CPU), then
      ``otherTimeMs``. The GPU's other lines, derived from the host's annotations ("XLA Ops",
      "TensorFlow Ops", "Steps": each spans an op from its first kernel to its last), are not read.
    * **CPU trace** (no GPU stream events): the CPU is the device, so the op spans are the device's time.
      ``infeedTimeMs`` is the union of the input ranges; ``deviceComputeTimeMs`` the op spans outside them
      (kernels that run inside an input range are the input's own work); ``otherTimeMs`` the rest:
      Python, op dispatch, waiting. The other columns are 0: a CPU trace has no launches or copies.
    """
    _validate.text("step_name", step_name)
    if isinstance(input_names, str) or not input_names or not all(isinstance(n, str) for n in input_names):
        raise TypeError(f"input_names must be a non-empty list of event names, got {input_names!r}")
    _validate.whole("skip", skip, 0)
    events = _events(events)
    steps = sorted((e for e in events if _is_step(e, step_name)), key=lambda e: e.start_us)
    if not steps:
        names = sorted({e.name.rsplit(" ", 1)[0] for e in events if "step_num" in e.args})
        raise ValueError(f"no step events named {step_name!r} in the trace"
                         + (f" (step names found: {names})" if names else "")
                         + ": wrap each step in profiling.step_marker(i), or pass the name your steps have")
    device = [e for e in events if _is_device_stream(e)]
    host = sorted((e for e in events if GPU_PLANE not in e.process), key=lambda e: e.start_us)
    rows = []
    for st in steps[skip:]:
        inside = [e for e in host if st.start_us <= e.start_us and e.end_us <= st.end_us and e is not st]
        inp = [(e.start_us, e.end_us) for e in inside if e.name in input_names]
        ops = _leaves([e for e in inside if _is_kernel(e)] + _eager_kernels(inside))
        if device:
            on_device = {"deviceComputeTimeMs": [], "deviceToDeviceTimeMs": [], "outfeedTimeMs": [], "infeedTimeMs": []}
            for e in device:
                start, end = max(e.start_us, st.start_us), min(e.end_us, st.end_us)
                if start < end:
                    on_device[_device_column(e)].append((start, end))
            order = [(c, on_device[c]) for c in ("deviceComputeTimeMs", "deviceToDeviceTimeMs", "outfeedTimeMs")]
            order += [("infeedTimeMs", inp + on_device["infeedTimeMs"]), ("kernelLaunchTimeMs", ops)]
        else:
            order = [("infeedTimeMs", inp), ("deviceComputeTimeMs", ops)]
        claimed, covered_us = _claim(order)
        row = dict.fromkeys(CATEGORIES, 0.0)
        row.update({column: us / 1e3 for column, us in claimed.items()})
        row.update({"stepnum": str(st.args["step_num"]), STEP_TIME: st.dur_us / 1e3,
                    "otherTimeMs": max(0.0, st.dur_us - covered_us) / 1e3})
        rows.append(row)
    return rows
