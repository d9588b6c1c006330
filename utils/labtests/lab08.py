"""Lab 08 (profiling and the utilisation capstone): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (random traces, spans, timings,
stage functions and profiler step tables), ``observe`` runs the learner's code in the learner's kernel
and returns plain data, and ``judge`` computes every expected answer here from
the case, with the private reference functions below (never with a course
helper). The capstone (q4) measures in the learner's kernel when the learner's
pipeline delivers each element; the judge runs a simulated accelerator on those
deliveries in virtual time (each step exactly 20 ms), so a busy CPU, which
makes every sleep overshoot, cannot turn a too-slow pipeline into a passing one.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math
import time

from gpucourse.grading.items import Fail, expect_raised, isolated, item, outcome, tr

STEP_S, LOAD_S, AUGMENT_S, STEPS = 0.02, 0.005, 0.05, 24  # the capstone's numbers, as the lab states them

#: Public course helpers that answer an item (the grader withholds the item if the learner's code calls one):
#: the tutorial's step breakdown reads exactly what q1 asks for; its verdict helpers (and the table reader
#: behind them) answer q5.
ANSWER_HELPERS = {"q1": ["gpucourse.profiling.step_breakdown"],
                  "q5": ["gpucourse.bottleneck.classify", "gpucourse.bottleneck.group_shares",
                         "gpucourse.bottleneck.format_rows", "gpucourse.bottleneck._step_table"]}
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
        # the second trace's steps always cross 9 -> 10 (it has 3 to 5 steps from 8 or 9): they must be
        # sorted as numbers (a first step of 7 with 3 steps would not cross, and text order would pass)
        return [{"trace": _random_trace(rng, first)} for first in (None, rng.randint(8, 9), None)]

    def observe(ns, case):
        import copy

        given = copy.deepcopy(case["trace"])
        got = ns.function("step_split")(given)
        return {"got": got, "type": type(got).__name__, "mutated": given != case["trace"]}

    def judge(case, seen):
        trace, got = case["trace"], seen["got"]
        if seen["mutated"]:
            raise Fail(tr("step_split must not modify the trace it is given"))
        if seen["type"] != "list" or not all(isinstance(r, dict) for r in got):
            raise Fail(tr("step_split should return a list of dicts, got {kind}: {got}", kind=seen["type"],
                          got=repr(got))[:300])
        want = _split(trace)
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
                elif _rows_match(got, _split(trace, same_thread=False)):
                    hint = tr(" Your numbers include ranges of other threads: count only events with the step's "
                              "own pid and tid.")
                elif _rows_match(got, _split(trace, inside=False)):
                    hint = tr(" Your numbers include a range that starts inside the step but ends after it: count "
                              "only ranges that lie entirely inside the step.")
                raise Fail(tr("step {step}: expected {key} = {want:.4f} ms, got {got}.{hint}", step=w["step"], key=key,
                              want=w[key], got=repr(value), hint=hint))


# --------------------------------------------------------------------------- q2


def _busy(spans, start, end, union=True, clip=True, ordered=True):
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


@item("q2", points=2, title="busy_fraction measures utilisation from busy spans")
class q2:
    def cases(rng):
        cases = [{"spans": [], "start": 0.0, "end": 1.0}, {"spans": [[0.0, 1.0], [0.5, 1.5]], "start": 0.0, "end": 2.0},
                 {"spans": [[-1.0, 0.5], [1.5, 9.0]], "start": 0.0, "end": 2.0},
                 # not in order of start: a merge that does not sort first gets 0.375 (sum: 0.75, union: 0.625)
                 {"spans": [[1.0, 1.5], [0.0, 2.0], [3.0, 3.5]], "start": 0.0, "end": 4.0}]
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
            raise Fail(tr("{call} raised {raised}: {message}, but the window is valid", call=call,
                          raised=seen["raised"], message=seen["message"]))
        window = end - start
        want, got = _busy(spans, start, end) / window, seen["value"]
        if _close(got, want):
            return
        hint = tr(" Overlapping spans count once, and only the part inside [start, end] counts.")
        if _close(got, _busy(spans, start, end, union=False) / window):
            hint = tr(" Overlapping spans count once: merge them (their union), do not add them up.")
        elif _close(got, _busy(spans, start, end, clip=False) / window):
            hint = tr(" Only the part of a span inside [start, end] counts: clip each span to the window.")
        elif _close(got, _busy(spans, start, end, ordered=False) / window):
            hint = tr(" The spans come in any order: sort them by their start before you merge them. A merge that "
                      "walks them as given misses a span that starts before the one it is extending.")
        raise Fail(tr("{call} should be {want:.4f}, got {got}.{hint}", call=call, want=want, got=repr(got), hint=hint))


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
            raise Fail(tr("{call} raised {raised}: {message}, but the inputs are valid", call=call,
                          raised=seen["raised"], message=seen["message"]))
        got, want = seen["value"], _utilisation_bound(step, load, aug, k, prefetch)
        if _close(got, want):
            return
        hint = ""
        if isinstance(got, (int, float)) and got > 1:
            hint = tr(" Utilisation cannot exceed 1: once the input keeps up, the device is busy all the time.")
        elif k is None and prefetch and _close(got, _utilisation_bound(step, load, aug, None, False)):
            hint = tr(" That is the bound without prefetch: prefetch=True runs the whole pipeline in the background, "
                      "so input and compute overlap and the slower side sets the pace, min(1, step / (load + "
                      "augment)).")
        elif k is None and not prefetch and _close(got, _utilisation_bound(step, load, aug, None, True)):
            hint = tr(" That is the bound with prefetch: with prefetch=False and no parallel calls the maps run in "
                      "the training loop's thread, so input and compute take turns, step / (step + load + "
                      "augment).")
        elif k is not None and _close(got, _utilisation_bound(step, load, aug, k, prefetch, "sum")):
            hint = tr(" With parallel maps each stage runs in its own threads, so the slowest stage sets the pace "
                      "(max of load and augment), not their sum.")
        elif k is not None and _close(got, _utilisation_bound(step, load, aug, None, prefetch)):
            hint = tr(" parallel_calls=k (even k=1) runs each map in its own threads: use the parallel formula.")
        raise Fail(tr("{call} should be {want:.4f}, got {got}.{hint}", call=call, want=want, got=repr(got), hint=hint))


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


def _startup_and_util(got, step_s) -> tuple[float, float]:
    """One measurement: when its first element arrived, and the simulated device's steady-state utilisation."""
    return (got[0] if got else math.inf), _steady(_device(got, step_s), step_s)


def _costs(stage) -> list:
    """What a stage says it costs now: [seconds, per_call_s, holds_gil]."""
    return [stage.seconds, stage.per_call_s, bool(stage.holds_gil)]


def _stage_busy(lanes) -> dict:
    """Seconds each stage was busy in total, from its recorded busy periods."""
    out = {"load": 0.0, "augment": 0.0}
    for e in lanes.events():
        name = e.lane.split(" #")[0]
        if name in out:
            out[name] += e.end_s - e.start_s
    return out


def _check_costs(att, load, aug, n):
    """The stages cost what the case says, before and after the run, and were busy that long."""
    want = [load, 0.0, False], [aug, 0.0, False]
    if any(c != w for c, w in zip(att.get("costs", []), want * 2)) or len(att.get("costs", [])) != 4:
        raise Fail(tr("fast_pipeline changed the stages it was given (their costs are now {costs}; the check made "
                      "them {want}): make the pipeline fast, not its work cheaper", costs=att.get("costs"),
                      want=list(want)))
    for name, cost in (("load", load), ("augment", aug)):
        busy = att.get("busy", {}).get(name, 0.0)
        if busy < 0.9 * n * cost:
            raise Fail(tr("the {name} stage was busy {busy:.0f} ms for {n} elements that cost {cost:.0f} ms each: its "
                          "work was skipped or made cheaper while the check ran", name=name, busy=busy * 1e3, n=n,
                          cost=cost * 1e3))


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
        for _ in range(case["attempts"]):  # up to two measurements; the judge grades the better one (a noisy machine)
            lanes = simulate.Lanes()
            # The stages' functions lead nowhere (no __globals__ of this module); the stages themselves the
            # learner's code may change, so what they cost, and how long they were busy, is observed.
            load = simulate.Stage(case["load_s"], isolated("lambda v: a * v + b", a=a, b=b), "load", lanes=lanes)
            augment = simulate.Stage(case["augment_s"], isolated("lambda v: c * v", c=c), "augment", lanes=lanes)
            ds = fn(simulate.source(values=case["values"]), load, augment)
            if not isinstance(ds, tf.data.Dataset):
                return {"type": type(ds).__name__}
            before = [load.elements, augment.elements]
            costs = [_costs(load), _costs(augment)]
            got, values = _drain(ds, lanes, n + 1)
            attempts.append({"before": before, "got": got, "values": values,
                             "calls": [load.elements, augment.elements],
                             "costs": costs + [_costs(load), _costs(augment)], "busy": _stage_busy(lanes)})
            startup, util = _startup_and_util(got, case["step_s"])
            if startup <= STARTUP_FACTOR * (case["load_s"] + case["augment_s"]) and util >= UTILISATION_TARGET:
                break  # measure again only when the first run fell short
        return {"type": "Dataset", "attempts": attempts}

    def judge(case, seen):
        if seen["type"] != "Dataset":
            raise Fail(tr("fast_pipeline should return a tf.data.Dataset, got {kind}", kind=seen["type"]))
        a, b, c, values = case["a"], case["b"], case["c"], case["values"]
        n, step, load, aug = len(values), case["step_s"], case["load_s"], case["augment_s"]
        want = sorted(c * (a * v + b) for v in values)
        startup_limit = STARTUP_FACTOR * (load + aug)
        best = None
        for att in seen["attempts"]:
            if any(att["before"]):
                raise Fail(tr("fast_pipeline ran load {load} and augment {augment} times before returning: build the "
                              "pipeline only, the work must happen while the accelerator trains",
                              load=att["before"][0], augment=att["before"][1]))
            got = att["values"]
            if len(got) != n or not all(isinstance(v, int) for v in got) or sorted(got) != want:
                raise Fail(tr("with a source of {n} random ints, load(v) = {a}*v + {b} and augment(v) = {c}*v, "
                              "expected {n} elements augment(load(v)) (e.g. {want}), got {count}: {got}...", n=n, a=a,
                              b=b, c=c, want=want[:3], count=len(got), got=got[:3]))
            _check_costs(att, load, aug, n)
            if min(att["calls"]) < n:
                raise Fail(tr("every element must go through load and augment: they ran {load} and {augment} times "
                              "for {n} elements", load=att["calls"][0], augment=att["calls"][1], n=n))
            startup, util = _startup_and_util(att["got"], step)
            key = (startup <= startup_limit, util)
            if best is None or key > best[0]:
                best = (key, startup, util)
        (_, startup, util) = best
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

#: The profiler's step-table columns (input-pipeline analyzer) and the group the lab puts each in.
_GROUP = {"infeedTimeMs": "input", "deviceComputeTimeMs": "device", "deviceToDeviceTimeMs": "device",
          "deviceCollectivesTimeMs": "device", "outfeedTimeMs": "device", "kernelLaunchTimeMs": "host",
          "hostComputeTimeMs": "host", "compileTimeMs": "host", "otherTimeMs": "host"}
_LABELS = {"stepnum": "Step number", "deviceComputeTimeMs": "Device compute", "deviceToDeviceTimeMs": "Device to device",
           "deviceCollectivesTimeMs": "Device collective communication", "hostComputeTimeMs": "Host compute",
           "kernelLaunchTimeMs": "Kernel launch", "infeedTimeMs": "Input", "outfeedTimeMs": "Output",
           "compileTimeMs": "Compilation", "otherTimeMs": "All others", "tooltip": "tooltip", "stepTimeMs": "Step time"}


def _step(name, step, **ms):
    row = dict.fromkeys(_GROUP, 0.0)
    row.update(ms)
    row.update({"stepnum": name, "stepTimeMs": step})
    return row


def _random_step(rng, name, kind):
    """One step whose verdict is ``kind`` with a clear margin, its time spread over random categories."""
    step = round(rng.uniform(5.0, 80.0), 3)
    if kind == "input-bound":
        shares = {"input": rng.uniform(0.3, 0.8)}
        rest = 1 - shares["input"] - rng.uniform(0.0, 0.05)
        shares["host"] = rest * rng.uniform(0.2, 0.8)
        shares["device"] = rest - shares["host"]
    else:
        shares = {"input": rng.uniform(0.0, 0.12)}
        rest = 1 - shares["input"] - rng.uniform(0.0, 0.05)
        big = rest * rng.uniform(0.65, 0.9)
        shares.update({"host": big, "device": rest - big} if kind == "host-bound" else {"device": big, "host": rest - big})
    ms = {}
    for group, share in shares.items():
        keys = [k for k, g in _GROUP.items() if g == group]
        cuts = sorted(rng.uniform(0, 1) for _ in range(len(keys) - 1))
        parts = [b - a for a, b in zip([0.0, *cuts], [*cuts, 1.0])]
        for key, part in zip(keys, parts):
            ms[key] = round(step * share * part, 4)
    return _step(name, step, **ms)


def _trap_steps(rng, names):
    """Steps that each catch one classic mistake (the verdict changes if that rule is broken)."""
    k = rng.choice([1.0, 2.0, 4.0])  # powers of two keep the 20% boundary exact
    traps = [
        _step(None, 10.0 * k, infeedTimeMs=2.0 * k, deviceComputeTimeMs=8.0 * k),            # exactly 20%: input
        _step(None, 10.0 * k, infeedTimeMs=0.5 * k, kernelLaunchTimeMs=5.0 * k, deviceComputeTimeMs=4.5 * k),
        _step(None, 10.0 * k, infeedTimeMs=0.5 * k, otherTimeMs=5.0 * k, deviceComputeTimeMs=4.5 * k),
        _step(None, 10.0 * k, infeedTimeMs=0.5 * k, outfeedTimeMs=2.0 * k, deviceComputeTimeMs=3.0 * k,
              hostComputeTimeMs=4.5 * k),                                                      # output is device
        _step(None, 10.0 * k, infeedTimeMs=1.0 * k, hostComputeTimeMs=4.5 * k, deviceComputeTimeMs=4.5 * k),  # tie
        _step(None, 10.0 * k, infeedTimeMs=1.75 * k, compileTimeMs=1.0 * k, deviceComputeTimeMs=4.0 * k),
        # ^ 2.5 ms of the step is in no category: 17.5% of the step, but 26% of the categories' sum
    ]
    for row, name in zip(traps, names):
        row["stepnum"] = name
    return traps


def _verdict(rows, strict=False, groups=None, tie="host", denominator="step"):
    """Reference verdict on rows (summed); the keyword arguments switch on one classic mistake each."""
    groups = groups or _GROUP
    total, by = 0.0, {"input": 0.0, "host": 0.0, "device": 0.0, None: 0.0}
    for row in rows:
        total += row["stepTimeMs"] if denominator == "step" else sum(row[k] for k in _GROUP if groups.get(k))
        for key in _GROUP:
            by[groups.get(key)] += row[key]
    share = {g: by[g] / total for g in ("input", "host", "device")}
    if share["input"] > 0.2 if strict else share["input"] >= 0.2:
        return "input-bound"
    if share["device"] > share["host"] or (tie == "device" and share["device"] == share["host"]):
        return "device-bound"
    return "host-bound"


def _answer(rows, overall="sum", **mistake):
    """Reference answer {"steps": {stepnum: verdict}, "overall": verdict}; ``overall`` and ``mistake`` name a
    classic mistake to recognise it."""
    steps = {r["stepnum"]: _verdict([r], **mistake) for r in rows}
    if overall == "majority":
        kinds = list(steps.values())
        whole = max(sorted(set(kinds)), key=kinds.count)
    elif overall == "mean":
        mean = {k: sum(r[k] / r["stepTimeMs"] for r in rows) / len(rows) for k in _GROUP}
        whole = _verdict([{**mean, "stepTimeMs": 1.0}], **mistake)
    else:
        whole = _verdict(rows, **mistake)
    return {"steps": steps, "overall": whole}


def _mistakes():
    """Classic mistakes, each with a hint (with its leading space): the reference with one rule broken."""
    launch_on_device = {**_GROUP, "kernelLaunchTimeMs": "device"}
    output = tr(" Output (outfeedTimeMs) is device time: the device copying results back.")
    overall = tr(" The overall verdict is neither a vote of the steps nor an average of their shares: add up each "
                 "category over all steps (and the step times), then apply the rule once.")
    return [
        ({"strict": True}, tr(" A step whose input is exactly 20% of the step time is input-bound: use >= 0.2.")),
        ({"groups": launch_on_device}, tr(" Kernel launch (kernelLaunchTimeMs) is host time: the host launching the "
                                          "device's kernels.")),
        ({"groups": {**_GROUP, "otherTimeMs": None}}, tr(" All others (otherTimeMs) is host time (mostly Python "
                                                         "overhead): count it in the host group.")),
        ({"groups": {**_GROUP, "outfeedTimeMs": None}}, output),
        ({"groups": {**_GROUP, "outfeedTimeMs": "host"}}, output),
        ({"tie": "device"}, tr(" A step is device-bound only when the device's share is larger than the host's: a "
                               "tie is host-bound.")),
        ({"denominator": "categories"}, tr(" Shares are of the step time (stepTimeMs), not of the sum of the "
                                           "categories: some time may be in no category.")),
        ({"overall": "majority"}, overall),
        ({"overall": "mean"}, overall),
    ]


def _table(rows, rng):
    """The rows as the profiler's step table (a DataTable: cols, rows of cells, properties), columns shuffled."""
    cols = list(_LABELS)
    rng.shuffle(cols)
    tip = lambda r: f"Step {r['stepnum']}, duration: {r['stepTimeMs']:.2f} ms"  # noqa: E731
    return {"cols": [{"id": c, "label": _LABELS[c], "type": "string" if c in ("stepnum", "tooltip") else "number"}
                     | ({"p": {"role": "tooltip"}} if c == "tooltip" else {}) for c in cols],
            "p": {"hardware_type": "GPU", "step_time_graph_column_ids": ",".join(list(_LABELS)[:-1])},
            "rows": [{"c": [{"v": tip(r) if c == "tooltip" else r[c]} for c in cols]} for r in rows]}


def _by_id() -> str:
    return tr("Find each column by its id in table['cols'] (their order is not fixed), and read each row's cells "
              "in that order; stepnum and tooltip hold text.")


def _rows(table):
    ids = [c["id"] for c in table["cols"]]
    return [dict(zip(ids, (c["v"] for c in row["c"]))) for row in table["rows"]]


@item("q5", points=2, title="step_verdicts says input-, host- or device-bound from the profiler's step table")
class q5:
    def cases(rng):
        out = []
        for _ in range(3):
            n = rng.randint(3, 5)
            kinds = [rng.choice(["input-bound", "host-bound", "device-bound"]) for _ in range(n)]
            first = rng.randint(0, 50)
            names = [f"train {first + i}" if rng.random() < 0.5 else str(first + i) for i in range(n + 7)]
            rows = [_random_step(rng, names[i], kind) for i, kind in enumerate(kinds)] + _trap_steps(rng, names[n:])
            rng.shuffle(rows)
            out.append({"table": _table(rows, rng)})
        # the overall verdict sums the steps. One short input-bound step next to two long device-bound ones:
        # the steps' mean input share says input-bound. Then three short input-bound steps next to a long
        # device-bound one: a vote says input-bound too.
        short = _step("train 0", 10.0, infeedTimeMs=9.0, hostComputeTimeMs=0.5, deviceComputeTimeMs=0.5)
        long = [_step(f"train {i}", 100.0, infeedTimeMs=2.0, kernelLaunchTimeMs=8.0, deviceComputeTimeMs=90.0)
                for i in (1, 2)]
        out.append({"table": _table([short, *long], rng)})
        small = [_step(f"train {i}", 10.0, infeedTimeMs=5.0, hostComputeTimeMs=1.0, deviceComputeTimeMs=4.0)
                 for i in range(3)]
        long = _step("train 3", 90.0, infeedTimeMs=4.0, kernelLaunchTimeMs=10.0, deviceComputeTimeMs=76.0)
        out.append({"table": _table(small + [long], rng)})
        return out + [{"table": _table([], rng), "bad": True}]

    def observe(ns, case):
        import copy

        fn = ns.function("step_verdicts")
        return outcome(lambda: fn(copy.deepcopy(case["table"])))

    def judge(case, seen):
        table = case["table"]
        if case.get("bad"):
            return expect_raised(seen, tr("step_verdicts(a table with no rows)"), "there are no steps to judge")
        if "raised" in seen:
            raise Fail(tr("step_verdicts raised {raised}: {message}, but the table has {n} steps. {by_id}",
                          raised=seen["raised"], message=seen["message"], n=len(table["rows"]), by_id=_by_id()))
        got, rows = seen["value"], _rows(table)
        want = _answer(rows)
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
            if got == _answer(rows, overall, **mistake):
                hint = text
                break
        bad = [k for k in want["steps"] if got["steps"][k] != want["steps"][k]]
        if bad:
            r = next(r for r in rows if r["stepnum"] == bad[0])
            split = {g: sum(r[k] for k in _GROUP if _GROUP[k] == g) for g in ("input", "host", "device")}
            raise Fail(tr("step {name} ({ms:g} ms: input {input:g}, host {host:g}, device {device:g} ms) should be "
                          "{want}, got {got}.{hint}", name=repr(bad[0]), ms=r["stepTimeMs"], **split,
                          want=repr(want["steps"][bad[0]]), got=repr(got["steps"][bad[0]]), hint=hint))
        raise Fail(tr("every step is right, but for all {n} steps together expected {want}, got {got}.{hint}",
                      n=len(rows), want=repr(want["overall"]), got=repr(got["overall"]), hint=hint))
