"""Lab 08's judges: from a case and what the observer saw, pass, or a Fail that names the learner's mistake.

``judge_qN`` is the ``judge`` of item qN of :mod:`gpucourse.labtests.lab08`, where its cases are drawn and
observed (the capstone's runs are the observer's records, :mod:`gpucourse.grading.timeline`). It runs on the
grader's side (and in the learner's own ``check()``), never in the graded kernel, and compares with
:mod:`gpucourse.labtests._lab08_reference`. Every message goes through ``tr`` (the zh_CN catalogue,
``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from ..grading.items import Fail, expect_raised, tr
from ..grading.timeline import lineage
from ._lab08_reference import (GROUP, Q4_DEADLINE_S, STARTUP_FACTOR, UTILISATION_TARGET, answer, busy, q4_summary,
                               step_split, utilisation_bound)

__all__ = ["judge_q1", "judge_q2", "judge_q3", "judge_q4", "judge_q5"]


def _close(got, want, abs_tol=1e-9) -> bool:
    return (isinstance(got, (int, float)) and not isinstance(got, bool)
            and math.isclose(got, want, rel_tol=1e-6, abs_tol=abs_tol))


# --------------------------------------------------------------------------- q1


def _rows_match(got, want) -> bool:
    return (isinstance(got, list) and len(got) == len(want)
            and all(isinstance(g, dict) and g.get("step") == w["step"]
                    and all(_close(g.get(k), w[k], 1e-6) for k in ("step_ms", "input_ms", "compute_ms"))
                    for g, w in zip(got, want)))


def judge_q1(case, seen):
    trace, got = case["trace"], seen["got"]
    if seen["mutated"]:
        raise Fail(tr("step_split must not modify the trace it is given"))
    if seen["type"] != "list" or not all(isinstance(r, dict) for r in got):
        raise Fail(tr("step_split should return a list of dicts, got {kind}: {got}", kind=seen["type"],
                      got=repr(got))[:300])
    want = step_split(trace)
    steps, want_steps = [r.get("step") for r in got], [r["step"] for r in want]
    if steps != want_steps:
        hint = ""
        if sorted(steps, key=str) == steps and sorted(steps) == want_steps:
            hint = tr(" Sort by the step number as a number: 9 comes before 10.")
        elif len(steps) > len(want_steps) and set(want_steps) <= set(steps):
            hint = tr(" Only the 'train <n>' steps count, not 'eval' ones.")
        raise Fail(tr("for a trace with steps 'train {first}'..'train {last}' (plus an 'eval 0' step and ranges "
                      "outside any step) expected steps {want} in order, got {got}.{hint}", first=want_steps[0],
                      last=want_steps[-1], want=want_steps, got=steps, hint=hint))
    if _rows_match(got, want):
        return
    for row, w in zip(got, want):
        for key in ("step_ms", "input_ms", "compute_ms"):
            value = row.get(key)
            if _close(value, w[key], 1e-6):
                continue
            hint = tr(" Count only ranges on the step's own thread (same pid and tid) that lie entirely inside "
                      "the step.")
            if _close(value, w[key] * 1e3, 1e-3):
                hint = tr(" The trace's ts and dur are in microseconds: divide by 1000 for milliseconds.")
            elif _rows_match(got, step_split(trace, same_thread=False)):
                hint = tr(" Your numbers include ranges of other threads: count only events with the step's "
                          "own pid and tid.")
            elif _rows_match(got, step_split(trace, inside=False)):
                hint = tr(" Your numbers include a range that starts inside the step but ends after it: count "
                          "only ranges that lie entirely inside the step.")
            raise Fail(tr("step {step}: expected {key} = {want:.4f} ms, got {got}.{hint}", step=w["step"], key=key,
                          want=w[key], got=repr(value), hint=hint))


# --------------------------------------------------------------------------- q2


def judge_q2(case, seen):
    spans, start, end = case["spans"], case["start"], case["end"]
    call = f"busy_fraction({[(round(s, 3), round(e, 3)) for s, e in spans]}, {start:.3f}, {end:.3f})"
    if case.get("bad"):
        return expect_raised(seen, f"busy_fraction([(0, 1)], {start}, {end})", "the window is empty")
    if "raised" in seen:
        raise Fail(tr("{call} raised {raised}: {message}, but the window is valid", call=call,
                      raised=seen["raised"], message=seen["message"]))
    window = end - start
    want, got = busy(spans, start, end) / window, seen["value"]
    if _close(got, want):
        return
    hint = tr(" Overlapping spans count once, and only the part inside [start, end] counts.")
    if _close(got, busy(spans, start, end, union=False) / window):
        hint = tr(" Overlapping spans count once: merge them (their union), do not add them up.")
    elif _close(got, busy(spans, start, end, clip=False) / window):
        hint = tr(" Only the part of a span inside [start, end] counts: clip each span to the window.")
    elif _close(got, busy(spans, start, end, ordered=False) / window):
        hint = tr(" The spans come in any order: sort them by their start before you merge them. A merge that "
                  "walks them as given misses a span that starts before the one it is extending.")
    raise Fail(tr("{call} should be {want:.4f}, got {got}.{hint}", call=call, want=want, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q3


def judge_q3(case, seen):
    if case.get("bad"):
        return expect_raised(seen, "utilisation_bound(..., parallel_calls=0)", "parallel_calls must be >= 1")
    step, load, aug, k, prefetch = case["step"], case["load"], case["aug"], case["k"], case["prefetch"]
    call = (f"utilisation_bound(step_s={step:.4f}, load_s={load:.4f}, augment_s={aug:.4f}, "
            f"parallel_calls={k}, prefetch={prefetch})")
    if "raised" in seen:
        raise Fail(tr("{call} raised {raised}: {message}, but the inputs are valid", call=call,
                      raised=seen["raised"], message=seen["message"]))
    got, want = seen["value"], utilisation_bound(step, load, aug, k, prefetch)
    if _close(got, want):
        return
    hint = ""
    if isinstance(got, (int, float)) and got > 1:
        hint = tr(" Utilisation cannot exceed 1: once the input keeps up, the device is busy all the time.")
    elif k is None and prefetch and _close(got, utilisation_bound(step, load, aug, None, False)):
        hint = tr(" That is the bound without prefetch: prefetch=True runs the whole pipeline in the background, "
                  "so input and compute overlap and the slower side sets the pace, min(1, step / (load + "
                  "augment)).")
    elif k is None and not prefetch and _close(got, utilisation_bound(step, load, aug, None, True)):
        hint = tr(" That is the bound with prefetch: with prefetch=False and no parallel calls the maps run in "
                  "the training loop's thread, so input and compute take turns, step / (step + load + "
                  "augment).")
    elif k is not None and _close(got, utilisation_bound(step, load, aug, k, prefetch, "sum")):
        hint = tr(" With parallel maps each stage runs in its own threads, so the slowest stage sets the pace "
                  "(max of load and augment), not their sum.")
    elif k is not None and _close(got, utilisation_bound(step, load, aug, None, prefetch)):
        hint = tr(" parallel_calls=k (even k=1) runs each map in its own threads: use the parallel formula.")
    raise Fail(tr("{call} should be {want:.4f}, got {got}.{hint}", call=call, want=want, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q4


def judge_q4(case, seen):
    if seen["type"] != "Dataset":
        raise Fail(tr("fast_pipeline should return a tf.data.Dataset, got {kind}", kind=seen["type"]))
    a, b, c, values = case["a"], case["b"], case["c"], case["values"]
    n, step, load, aug = len(values), case["step_s"], case["load_s"], case["augment_s"]
    want = sorted(c * (a * v + b) for v in values)
    startup_limit = STARTUP_FACTOR * (load + aug)
    best = None
    for run in seen["runs"]:
        built = run["marks"].get("built", math.inf)
        early = {name: sum(r[0] == name and r[3] < built for r in run["stages"]) for name in ("load", "augment")}
        if any(early.values()):
            raise Fail(tr("fast_pipeline ran load {load} and augment {augment} times before returning: build the "
                          "pipeline only, the work must happen while the accelerator trains",
                          load=early["load"], augment=early["augment"]))
        got = [v for element, *_ in run["steps"] for v in (element if isinstance(element, list) else [element])]
        if run["stopped"] is None and (len(got) != n or not all(isinstance(v, int) for v in got)
                                       or sorted(got) != want):
            raise Fail(tr("with a source of {n} random ints, load(v) = {a}*v + {b} and augment(v) = {c}*v, "
                          "expected {n} elements augment(load(v)) (e.g. {want}), got {count}: {got}...", n=n, a=a,
                          b=b, c=c, want=want[:3], count=len(got), got=got[:3]))
        miss = lineage(run, ["load", "augment"])["missing"]
        if miss is not None and miss["late"]:
            raise Fail(tr("the element {value} reached the accelerator before its {stage} had finished: "
                          "every element must be loaded, then augmented, then trained on",
                          value=miss["value"], stage=miss["stage"]))
        if miss is not None:
            raise Fail(tr("every element must go through load and augment: {value} reached the accelerator "
                          "without passing through {stage}", value=miss["value"], stage=miss["stage"]))
        startup, util = q4_summary(run, case)
        key = (startup <= startup_limit, util)
        if best is None or key > best[0]:
            best = (key, startup, util, run)
    (_, startup, util, run) = best
    if run["stopped"] is not None:
        raise Fail(tr("your pipeline delivered only {k} of {n} elements in {seconds:g} s, when the check stopped "
                      "it: it is far too slow (the accelerator needs one element every {step:.0f} ms)",
                      k=len(run["steps"]), n=n, seconds=Q4_DEADLINE_S, step=step * 1e3))
    if startup > startup_limit:
        raise Fail(tr("the first element took {startup:.0f} ms to arrive, but one element needs only load + "
                      "augment = {need:.0f} ms (allowed: {limit:.0f} ms). Holding elements back (for example batch "
                      "then unbatch) only hides a slow pipeline from the steady-state measure; make the stages "
                      "themselves keep up.", startup=startup * 1e3, need=(load + aug) * 1e3,
                      limit=startup_limit * 1e3))
    if util < UTILISATION_TARGET:
        seq, pre = step / (step + load + aug), min(1.0, step / (load + aug))
        raise Fail(tr("measured steady-state utilisation {util:.0%} over {n} steps of {step:.0f} ms (load "
                      "{load:.0f} ms, augment {aug:.0f} ms per element); needs >= {target:.0%}. Bounds: sequential "
                      "maps {seq:.0%}, prefetch alone {pre:.0%}; the slowest stage must keep up.", util=util, n=n,
                      step=step * 1e3, load=load * 1e3, aug=aug * 1e3, target=UTILISATION_TARGET, seq=seq, pre=pre))


# --------------------------------------------------------------------------- q5


def _mistakes():
    """Classic mistakes, each with a hint (with its leading space): the reference with one rule broken."""
    launch_on_device = {**GROUP, "kernelLaunchTimeMs": "device"}
    output = tr(" Output (outfeedTimeMs) is device time: the device copying results back.")
    overall = tr(" The overall verdict is neither a vote of the steps nor an average of their shares: add up each "
                 "category over all steps (and the step times), then apply the rule once.")
    return [
        ({"strict": True}, tr(" A step whose input is exactly 20% of the step time is input-bound: use >= 0.2.")),
        ({"groups": launch_on_device}, tr(" Kernel launch (kernelLaunchTimeMs) is host time: the host launching the "
                                          "device's kernels.")),
        ({"groups": {**GROUP, "otherTimeMs": None}}, tr(" All others (otherTimeMs) is host time (mostly Python "
                                                        "overhead): count it in the host group.")),
        ({"groups": {**GROUP, "outfeedTimeMs": None}}, output),
        ({"groups": {**GROUP, "outfeedTimeMs": "host"}}, output),
        ({"tie": "device"}, tr(" A step is device-bound only when the device's share is larger than the host's: a "
                               "tie is host-bound.")),
        ({"denominator": "categories"}, tr(" Shares are of the step time (stepTimeMs), not of the sum of the "
                                           "categories: some time may be in no category.")),
        ({"overall": "majority"}, overall),
        ({"overall": "mean"}, overall),
    ]


def _by_id() -> str:
    return tr("Find each column by its id in table['cols'] (their order is not fixed), and read each row's cells "
              "in that order; stepnum and tooltip hold text.")


def _rows(table):
    ids = [c["id"] for c in table["cols"]]
    return [dict(zip(ids, (c["v"] for c in row["c"]))) for row in table["rows"]]


def judge_q5(case, seen):
    table = case["table"]
    if case.get("bad"):
        return expect_raised(seen, tr("step_verdicts(a table with no rows)"), "there are no steps to judge")
    if "raised" in seen:
        raise Fail(tr("step_verdicts raised {raised}: {message}, but the table has {n} steps. {by_id}",
                      raised=seen["raised"], message=seen["message"], n=len(table["rows"]), by_id=_by_id()))
    got, rows = seen["value"], _rows(table)
    want = answer(rows)
    if not (isinstance(got, dict) and isinstance(got.get("steps"), dict) and isinstance(got.get("overall"), str)):
        raise Fail(tr("step_verdicts should return {{'steps': {{stepnum: verdict, ...}}, 'overall': verdict}}, "
                      "got {got}", got=repr(got))[:300])
    if got == want:
        return
    if set(got["steps"]) != set(want["steps"]):
        raise Fail(tr("expected one verdict per step, keyed by the stepnum column ({want}), got keys {got}. "
                      "{by_id}", want=sorted(want["steps"]), got=sorted(map(str, got["steps"])), by_id=_by_id()))
    hint = ""
    for mistake, text in _mistakes():
        overall = mistake.pop("overall", "sum")
        if got == answer(rows, overall, **mistake):
            hint = text
            break
    bad = [k for k in want["steps"] if got["steps"][k] != want["steps"][k]]
    if bad:
        r = next(r for r in rows if r["stepnum"] == bad[0])
        split = {g: sum(r[k] for k in GROUP if GROUP[k] == g) for g in ("input", "host", "device")}
        raise Fail(tr("step {name} ({ms:g} ms: input {input:g}, host {host:g}, device {device:g} ms) should be "
                      "{want}, got {got}.{hint}", name=repr(bad[0]), ms=r["stepTimeMs"], **split,
                      want=repr(want["steps"][bad[0]]), got=repr(got["steps"][bad[0]]), hint=hint))
    raise Fail(tr("every step is right, but for all {n} steps together expected {want}, got {got}.{hint}",
                  n=len(rows), want=repr(want["overall"]), got=repr(got["overall"]), hint=hint))
