"""Lab 08's reference answers and the capstone's bar: what each item's judge compares the learner's answer with.

Each step's input and compute time in a trace (q1), the busy time of spans (q2), the best utilisation of a
pipeline (q3), the capstone's utilisation bar, start-up allowance and time limit (q4), and the verdict on a
profiler's step table (q5); the keyword arguments of each switch on one classic mistake, so that a judge can
name it. Used by :mod:`gpucourse.labtests.lab08` (its cases and observations) and
:mod:`gpucourse.labtests._lab08_judges`; never sent to the graded kernel.
"""

from __future__ import annotations

import math

from ..grading.timeline import device_summary

__all__ = ["GROUP", "Q4_DEADLINE_S", "STARTUP_FACTOR", "UTILISATION_TARGET", "answer", "busy", "q4_summary",
           "step_split", "utilisation_bound", "verdict"]


# --------------------------------------------------------------------------- q1


def step_split(trace, same_thread=True, inside=True, steps_named="train "):
    """Reference: per step, its duration and the input and compute time on its thread inside it (ms).

    The keyword arguments switch off one rule each, to recognise a classic mistake in a wrong answer.
    """
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith(steps_named) and "step_num" in e.get("args", {})]
    rows = []
    for st in sorted(steps, key=lambda e: int(e["args"]["step_num"])):
        start, end = st["ts"], st["ts"] + st["dur"]
        mine = [e for e in events if e is not st and (not same_thread or (e["pid"], e["tid"]) == (st["pid"], st["tid"]))
                and (e["ts"] >= start and e["ts"] + e["dur"] <= end if inside else e["ts"] < end and e["ts"] >= start)]
        rows.append({"step": int(st["args"]["step_num"]), "step_ms": st["dur"] / 1e3,
                     "input_ms": sum(e["dur"] for e in mine if e["name"] == "input") / 1e3,
                     "compute_ms": sum(e["dur"] for e in mine if e["name"] == "compute") / 1e3})
    return rows


# --------------------------------------------------------------------------- q2


def busy(spans, start, end, union=True, clip=True, ordered=True):
    """Reference: busy time of ``spans`` inside [start, end]; overlaps count once (switches: classic mistakes;
    ``ordered=False`` merges the spans in the order given, without sorting them first)."""
    if clip:
        spans = [(max(s, start), min(e, end)) for s, e in spans if min(e, end) > max(s, start)]
    if not union:
        return sum(e - s for s, e in spans)
    total, cur = 0.0, None
    for s, e in (sorted(spans) if ordered else spans):
        if cur is None or s > cur[1]:
            total += cur[1] - cur[0] if cur else 0.0
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0.0)


# --------------------------------------------------------------------------- q3


def utilisation_bound(step, load, aug, k, prefetch, variant=""):
    """Reference: best steady-state utilisation. ``variant`` names a classic mistake, to recognise it."""
    if k is None:
        if not prefetch:
            return step / (step + load + aug)
        pace = step / (load + aug)
        return pace if variant == "no cap" else min(1.0, pace)
    slowest = load + aug if variant == "sum" else max(load, aug)
    pace = step * k / slowest
    return pace if variant == "no cap" else min(1.0, pace)


# --------------------------------------------------------------------------- q4


#: The capstone's bar. Measured through the grader (2 cores at load 7, the steps on the observer's virtual
#: timeline): the solution 0.94-1.0, two parallel calls of the 50 ms augment 0.78-0.80, prefetch alone 0.34.
UTILISATION_TARGET = 0.90
STARTUP_FACTOR = 5  # the first element may take this many times load + augment (a good pipeline: 1.2-1.7x)

#: A run stops here (a sequential pipeline needs 24 x 55 ms = 1.3 s, the solution about 0.6 s): only a pipeline
#: that is far too slow ever reaches it, and it then fails in seconds instead of running out the item's time.
Q4_DEADLINE_S = 5.0


def q4_summary(run, case) -> tuple[float, float]:
    got = device_summary(run)
    startup = math.inf if got["startup"] is None or run["stopped"] is not None else got["startup"]
    return startup, got["utilisation"]


# --------------------------------------------------------------------------- q5


#: The profiler's step-table columns (input-pipeline analyzer) and the group the lab puts each in.
GROUP = {"infeedTimeMs": "input", "deviceComputeTimeMs": "device", "deviceToDeviceTimeMs": "device",
         "deviceCollectivesTimeMs": "device", "outfeedTimeMs": "device", "kernelLaunchTimeMs": "host",
         "hostComputeTimeMs": "host", "compileTimeMs": "host", "otherTimeMs": "host"}


def verdict(rows, strict=False, groups=None, tie="host", denominator="step"):
    """Reference verdict on rows (summed); the keyword arguments switch on one classic mistake each."""
    groups = groups or GROUP
    total, by = 0.0, {"input": 0.0, "host": 0.0, "device": 0.0, None: 0.0}
    for row in rows:
        total += row["stepTimeMs"] if denominator == "step" else sum(row[k] for k in GROUP if groups.get(k))
        for key in GROUP:
            by[groups.get(key)] += row[key]
    share = {g: by[g] / total for g in ("input", "host", "device")}
    if share["input"] > 0.2 if strict else share["input"] >= 0.2:
        return "input-bound"
    if share["device"] > share["host"] or (tie == "device" and share["device"] == share["host"]):
        return "device-bound"
    return "host-bound"


def answer(rows, overall="sum", **mistake):
    """Reference answer {"steps": {stepnum: verdict}, "overall": verdict}; ``overall`` and ``mistake`` name a
    classic mistake to recognise it."""
    steps = {r["stepnum"]: verdict([r], **mistake) for r in rows}
    if overall == "majority":
        kinds = list(steps.values())
        whole = max(sorted(set(kinds)), key=kinds.count)
    elif overall == "mean":
        mean = {k: sum(r[k] / r["stepTimeMs"] for r in rows) / len(rows) for k in GROUP}
        whole = verdict([{**mean, "stepTimeMs": 1.0}], **mistake)
    else:
        whole = verdict(rows, **mistake)
    return {"steps": steps, "overall": whole}
