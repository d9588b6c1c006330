"""Lab 08 (profiling and the utilisation capstone): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (random traces, spans, timings and
stage functions), ``observe`` runs the learner's code in the learner's kernel
and returns plain data, and ``judge`` computes every expected answer here from
the case, with the private reference functions below (never with a course
helper). The capstone (q4) measures in the learner's kernel when the learner's
pipeline delivers each element; the judge runs a simulated accelerator on those
deliveries in virtual time (each step exactly 20 ms), so a busy CPU, which
makes every sleep overshoot, cannot turn a too-slow pipeline into a passing one.
"""

from __future__ import annotations

import math
import time

from gpucourse.grading.items import Fail, expect_raised, item, outcome

STEP_S, LOAD_S, AUGMENT_S, STEPS = 0.02, 0.005, 0.05, 24  # the capstone's numbers, as the lab states them

#: Public course helpers that answer an item (the grader withholds the item if the learner's code calls one):
#: the tutorial's step breakdown reads exactly what q1 asks for.
ANSWER_HELPERS = {"q1": ["gpucourse.profiling.step_breakdown"]}
UTILISATION_TARGET = 0.90
STARTUP_FACTOR = 5  # the first element may take this many times load + augment (a good pipeline: about 1.3x)


def _close(got, want, abs_tol=1e-9) -> bool:
    return (isinstance(got, (int, float)) and not isinstance(got, bool)
            and math.isclose(got, want, rel_tol=1e-6, abs_tol=abs_tol))


# --------------------------------------------------------------------------- q1


def _random_trace(rng, first=None):
    """A trace-viewer style dict with train steps, their regions, and distractors."""
    pid, tid, other = rng.randint(1, 900), rng.randint(10**6, 10**9), rng.randint(1, 999)
    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": other, "args": {"name": "tf_data_private_threadpool"}},
    ]
    t = rng.uniform(1000, 5000)
    # distractors before the first step: an input range outside any step, an eval step with its own input
    events.append({"ph": "X", "name": "input", "ts": t, "dur": 120.0, "pid": pid, "tid": tid, "args": {}})
    t += 300
    events.append({"ph": "X", "name": "eval 0", "ts": t, "dur": 900.0, "pid": pid, "tid": tid,
                   "args": {"step_num": "0", "step_name": "eval 0"}})
    events.append({"ph": "X", "name": "input", "ts": t + 10, "dur": 500.0, "pid": pid, "tid": tid, "args": {}})
    t += 2000
    first = rng.randint(0, 5) if first is None else first
    for step in range(first, first + rng.randint(3, 5)):
        inp, comp, pad = rng.uniform(100, 30000), rng.uniform(100, 30000), rng.uniform(5, 400)
        dur = inp + comp + 2 * pad
        events.append({"ph": "X", "name": f"train {step}", "ts": t, "dur": dur, "pid": pid, "tid": tid,
                       "args": {"group_id": str(step), "step_name": f"train {step}", "step_num": str(step)}})
        events.append({"ph": "X", "name": "input", "ts": t + pad, "dur": inp, "pid": pid, "tid": tid,
                       "args": {"group_id": str(step)}})
        events.append({"ph": "X", "name": "compute", "ts": t + pad + inp, "dur": comp, "pid": pid, "tid": tid,
                       "args": {"group_id": str(step)}})
        # other threads and other names inside the step do not count
        events.append({"ph": "X", "name": "compute", "ts": t + pad, "dur": comp / 2, "pid": pid, "tid": other,
                       "args": {}})
        events.append({"ph": "X", "name": "IteratorGetNextOp::DoCompute", "ts": t + pad + 1, "dur": inp / 2,
                       "pid": pid, "tid": tid, "args": {}})
        events.append({"ph": "i", "name": "marker", "ts": t + pad, "pid": pid, "tid": tid, "s": "t"})
        # an input range that starts inside the step but ends after it: not entirely inside, does not count
        events.append({"ph": "X", "name": "input", "ts": t + dur - 2.0, "dur": 5.0, "pid": pid, "tid": tid,
                       "args": {}})
        t += dur + rng.uniform(10, 500)
    rng.shuffle(events)
    return {"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": events}


def _split(trace, same_thread=True, inside=True, steps_named="train "):
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


def _rows_match(got, want) -> bool:
    return (isinstance(got, list) and len(got) == len(want)
            and all(isinstance(g, dict) and g.get("step") == w["step"]
                    and all(_close(g.get(k), w[k], 1e-6) for k in ("step_ms", "input_ms", "compute_ms"))
                    for g, w in zip(got, want)))


@item("q1", points=3, title="step_split reads input and compute time per step from a trace")
class q1:
    def cases(rng):
        # the second trace's steps cross 9 -> 10: they must be sorted as numbers
        return [{"trace": _random_trace(rng, first)} for first in (None, rng.randint(7, 9), None)]

    def observe(ns, case):
        import copy

        given = copy.deepcopy(case["trace"])
        got = ns.function("step_split")(given)
        return {"got": got, "type": type(got).__name__, "mutated": given != case["trace"]}

    def judge(case, seen):
        trace, got = case["trace"], seen["got"]
        if seen["mutated"]:
            raise Fail("step_split must not modify the trace it is given")
        if seen["type"] != "list" or not all(isinstance(r, dict) for r in got):
            raise Fail(f"step_split should return a list of dicts, got {seen['type']}: {got!r}"[:300])
        want = _split(trace)
        steps, want_steps = [r.get("step") for r in got], [r["step"] for r in want]
        if steps != want_steps:
            hint = ""
            if sorted(steps, key=str) == steps and sorted(steps) == want_steps:
                hint = " Sort by the step number as a number: 9 comes before 10."
            elif len(steps) > len(want_steps) and set(want_steps) <= set(steps):
                hint = " Only the 'train <n>' steps count, not 'eval' ones."
            raise Fail(f"for a trace with steps 'train {want_steps[0]}'..'train {want_steps[-1]}' (plus an 'eval 0' "
                       f"step and ranges outside any step) expected steps {want_steps} in order, got {steps}.{hint}")
        if _rows_match(got, want):
            return
        for row, w in zip(got, want):
            for key in ("step_ms", "input_ms", "compute_ms"):
                value = row.get(key)
                if _close(value, w[key], 1e-6):
                    continue
                hint = (" Count only ranges on the step's own thread (same pid and tid) that lie entirely inside "
                        "the step.")
                if _close(value, w[key] * 1e3, 1e-3):
                    hint = " The trace's ts and dur are in microseconds: divide by 1000 for milliseconds."
                elif _rows_match(got, _split(trace, same_thread=False)):
                    hint = (" Your numbers include ranges of other threads: count only events with the step's own "
                            "pid and tid.")
                elif _rows_match(got, _split(trace, inside=False)):
                    hint = (" Your numbers include a range that starts inside the step but ends after it: count "
                            "only ranges that lie entirely inside the step.")
                raise Fail(f"step {w['step']}: expected {key} = {w[key]:.4f} ms, got {value!r}.{hint}")


# --------------------------------------------------------------------------- q2


def _busy(spans, start, end, union=True, clip=True):
    """Reference: busy time of ``spans`` inside [start, end]; overlaps count once (switches: classic mistakes)."""
    if clip:
        spans = [(max(s, start), min(e, end)) for s, e in spans if min(e, end) > max(s, start)]
    if not union:
        return sum(e - s for s, e in spans)
    total, cur = 0.0, None
    for s, e in sorted(spans):
        if cur is None or s > cur[1]:
            total += cur[1] - cur[0] if cur else 0.0
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0.0)


@item("q2", points=2, title="busy_fraction measures utilisation from busy spans")
class q2:
    def cases(rng):
        cases = [{"spans": [], "start": 0.0, "end": 1.0}, {"spans": [[0.0, 1.0], [0.5, 1.5]], "start": 0.0, "end": 2.0},
                 {"spans": [[-1.0, 0.5], [1.5, 9.0]], "start": 0.0, "end": 2.0}]
        for _ in range(4):
            start = rng.uniform(0, 10)
            end = start + rng.uniform(1, 5)
            spans = []
            for _ in range(rng.randint(3, 8)):
                s = rng.uniform(start - 1, end)
                spans.append([s, s + rng.uniform(0.05, 1.5)])
            spans.append([spans[0][0] + 0.01, spans[0][1] + 0.2])  # always one overlap
            cases.append({"spans": spans, "start": start, "end": end})
        return cases + [{"spans": [[0.0, 1.0]], "start": s, "end": e, "bad": True} for s, e in ((2.0, 2.0), (3.0, 1.0))]

    def observe(ns, case):
        fn = ns.function("busy_fraction")
        return outcome(lambda: fn([tuple(s) for s in case["spans"]], case["start"], case["end"]))

    def judge(case, seen):
        spans, start, end = case["spans"], case["start"], case["end"]
        call = f"busy_fraction({[(round(s, 3), round(e, 3)) for s, e in spans]}, {start:.3f}, {end:.3f})"
        if case.get("bad"):
            return expect_raised(seen, f"busy_fraction([(0, 1)], {start}, {end})", "the window is empty")
        if "raised" in seen:
            raise Fail(f"{call} raised {seen['raised']}: {seen['message']}, but the window is valid")
        window = end - start
        want, got = _busy(spans, start, end) / window, seen["value"]
        if _close(got, want):
            return
        hint = " Overlapping spans count once, and only the part inside [start, end] counts."
        if _close(got, _busy(spans, start, end, union=False) / window):
            hint = " Overlapping spans count once: merge them (their union), do not add them up."
        elif _close(got, _busy(spans, start, end, clip=False) / window):
            hint = " Only the part of a span inside [start, end] counts: clip each span to the window."
        raise Fail(f"{call} should be {want:.4f}, got {got!r}.{hint}")


# --------------------------------------------------------------------------- q3


def _utilisation_bound(step, load, aug, k, prefetch, variant=""):
    """Reference: best steady-state utilisation. ``variant`` names a classic mistake, to recognise it."""
    if k is None:
        if not prefetch:
            return step / (step + load + aug)
        pace = step / (load + aug)
        return pace if variant == "no cap" else min(1.0, pace)
    slowest = load + aug if variant == "sum" else max(load, aug)
    pace = step * k / slowest
    return pace if variant == "no cap" else min(1.0, pace)


@item("q3", points=2, title="utilisation_bound predicts the best utilisation of a pipeline")
class q3:
    def cases(rng):
        cases = []
        for _ in range(3):
            step = rng.uniform(0.01, 0.05)
            load = rng.uniform(0.3, 0.9) * step
            aug = rng.uniform(1.2, 2.5) * step
            combos = [(load, aug, None, False), (load, aug, None, True), (load, aug, 1, False), (load, aug, 2, True),
                      (aug, load, rng.randint(3, 8), False), (aug, aug, 2, False), (0.2 * step, 0.3 * step, None, True)]
            cases += [{"step": step, "load": a, "aug": b, "k": k, "prefetch": p} for a, b, k, p in combos]
        return cases + [{"bad": True}]

    def observe(ns, case):
        fn = ns.function("utilisation_bound")
        if case.get("bad"):
            return outcome(lambda: fn(0.02, 0.01, 0.01, parallel_calls=0, prefetch=False))
        return outcome(lambda: fn(case["step"], case["load"], case["aug"], parallel_calls=case["k"],
                                  prefetch=case["prefetch"]))

    def judge(case, seen):
        if case.get("bad"):
            return expect_raised(seen, "utilisation_bound(..., parallel_calls=0)", "parallel_calls must be >= 1")
        step, load, aug, k, prefetch = case["step"], case["load"], case["aug"], case["k"], case["prefetch"]
        call = (f"utilisation_bound(step_s={step:.4f}, load_s={load:.4f}, augment_s={aug:.4f}, "
                f"parallel_calls={k}, prefetch={prefetch})")
        if "raised" in seen:
            raise Fail(f"{call} raised {seen['raised']}: {seen['message']}, but the inputs are valid")
        got, want = seen["value"], _utilisation_bound(step, load, aug, k, prefetch)
        if _close(got, want):
            return
        hint = ""
        if isinstance(got, (int, float)) and got > 1:
            hint = " Utilisation cannot exceed 1: once the input keeps up, the device is busy all the time."
        elif k is not None and _close(got, _utilisation_bound(step, load, aug, k, prefetch, "sum")):
            hint = (" With parallel maps each stage runs in its own threads, so the slowest stage sets the pace "
                    "(max of load and augment), not their sum.")
        elif k is not None and _close(got, _utilisation_bound(step, load, aug, None, prefetch)):
            hint = " parallel_calls=k (even k=1) runs each map in its own threads: use the parallel formula."
        raise Fail(f"{call} should be {want:.4f}, got {got!r}.{hint}")


# --------------------------------------------------------------------------- q4


def _drain(ds, lanes, steps):
    """Take up to ``steps`` elements as soon as each is ready: delivery times in seconds after the first
    ``load`` started (the pipeline's own clock, without iterator start-up), and the elements."""
    got, values = [], []
    it = iter(ds)
    while len(got) < steps:
        try:
            element = next(it)
        except StopIteration:
            break
        got.append(time.perf_counter())
        values.append(element)
    starts = [e.start_s for e in lanes.events() if e.lane.split(" #")[0] == "load"]
    base = min(starts) if starts else (got[0] if got else 0.0)
    return [g - base for g in got], values


def _device(got, step_s) -> list:
    """Steps of a simulated accelerator fed with these deliveries, in virtual time: a step starts once its
    element is there and the previous step is done, and takes exactly ``step_s`` however loaded the machine is."""
    spans, end = [], 0.0
    for g in got:
        start = max(g, end)
        end = start + step_s
        spans.append([start, end])
    return spans


def _steady(spans, step_s) -> float:
    """Steps x step time / time after the first step."""
    if len(spans) < 2:
        return 0.0
    return (len(spans) - 1) * step_s / (spans[-1][1] - spans[0][1])


@item("q4", points=5, title="fast_pipeline keeps the simulated accelerator busy >= 90% of the time")
class q4:
    def cases(rng):
        return [{"values": [rng.randint(-10**6, 10**6) for _ in range(STEPS)], "a": rng.randint(2, 9),
                 "b": rng.randint(-50, 50), "c": rng.randint(2, 9), "step_s": STEP_S, "load_s": LOAD_S,
                 "augment_s": AUGMENT_S, "attempts": 2}]

    def observe(ns, case):
        import tensorflow as tf

        from gpucourse import simulate

        fn = ns.function("fast_pipeline")
        a, b, c, n = case["a"], case["b"], case["c"], len(case["values"])
        attempts = []
        for _ in range(case["attempts"]):  # two measurements; the judge grades the better one (a noisy machine)
            lanes = simulate.Lanes()
            load = simulate.Stage(case["load_s"], lambda v: a * v + b, "load", lanes=lanes)
            augment = simulate.Stage(case["augment_s"], lambda v: c * v, "augment", lanes=lanes)
            ds = fn(simulate.source(values=case["values"]), load, augment)
            if not isinstance(ds, tf.data.Dataset):
                return {"type": type(ds).__name__}
            before = [load.elements, augment.elements]
            got, values = _drain(ds, lanes, n + 1)
            attempts.append({"before": before, "got": got, "values": values,
                             "calls": [load.elements, augment.elements]})
        return {"type": "Dataset", "attempts": attempts}

    def judge(case, seen):
        if seen["type"] != "Dataset":
            raise Fail(f"fast_pipeline should return a tf.data.Dataset, got {seen['type']}")
        a, b, c, values = case["a"], case["b"], case["c"], case["values"]
        n, step, load, aug = len(values), case["step_s"], case["load_s"], case["augment_s"]
        want = sorted(c * (a * v + b) for v in values)
        startup_limit = STARTUP_FACTOR * (load + aug)
        best = None
        for att in seen["attempts"]:
            if any(att["before"]):
                raise Fail(f"fast_pipeline ran load {att['before'][0]} and augment {att['before'][1]} times before "
                           "returning: build the pipeline only, the work must happen while the accelerator trains")
            got = att["values"]
            if len(got) != n or not all(isinstance(v, int) for v in got) or sorted(got) != want:
                raise Fail(f"with a source of {n} random ints, load(v) = {a}*v + {b} and augment(v) = {c}*v, "
                           f"expected {n} elements augment(load(v)) (e.g. {want[:3]}), got {len(got)}: {got[:3]}...")
            if min(att["calls"]) < n:
                raise Fail(f"every element must go through load and augment: they ran {att['calls'][0]} and "
                           f"{att['calls'][1]} times for {n} elements")
            startup, util = att["got"][0], _steady(_device(att["got"], step), step)
            key = (startup <= startup_limit, util)
            if best is None or key > best[0]:
                best = (key, startup, util)
        (_, startup, util) = best
        if startup > startup_limit:
            raise Fail(f"the first element took {startup * 1e3:.0f} ms to arrive, but one element needs only "
                       f"load + augment = {(load + aug) * 1e3:.0f} ms (allowed: {startup_limit * 1e3:.0f} ms). "
                       "Holding elements back (for example batch then unbatch) only hides a slow pipeline from the "
                       "steady-state measure; make the stages themselves keep up.")
        if util < UTILISATION_TARGET:
            seq, pre = step / (step + load + aug), min(1.0, step / (load + aug))
            raise Fail(f"measured steady-state utilisation {util:.0%} over {n} steps of {step * 1e3:.0f} ms (load "
                       f"{load * 1e3:.0f} ms, augment {aug * 1e3:.0f} ms per element); needs >= "
                       f"{UTILISATION_TARGET:.0%}. Bounds: sequential maps {seq:.0%}, prefetch alone {pre:.0%}; "
                       "the slowest stage must keep up.")
