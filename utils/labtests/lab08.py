"""Public tests of lab 08: reading a trace, utilisation, and the capstone pipeline.

Every item builds fresh inputs (random traces, spans, timings, stage functions)
and compares behaviour, never source text. The capstone (q4) is graded on the
measured steady-state utilisation of a sleep-based simulated accelerator, so
it does not depend on how busy the CPU is.
"""

from __future__ import annotations

import math
import random

from gpucourse.grading.items import Fail, expect_raises, item

UTILISATION_TARGET = 0.90
STARTUP_FACTOR = 5  # the first element may take this many times load + augment (a good pipeline: about 1.3x)


# --------------------------------------------------------------------------- q1


def _random_trace(rng, first=None):
    """A trace-viewer style dict with train steps, their regions, and distractors; plus the expected split."""
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
    expected = []
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
        expected.append({"step": step, "step_ms": dur / 1e3, "input_ms": inp / 1e3, "compute_ms": comp / 1e3})
        # an input range that starts inside the step but ends after it: not entirely inside, does not count
        events.append({"ph": "X", "name": "input", "ts": t + dur - 2.0, "dur": 5.0, "pid": pid, "tid": tid,
                       "args": {}})
        t += dur + rng.uniform(10, 500)
    rng.shuffle(events)
    return {"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": events}, expected


@item("q1", points=3, title="step_split reads input and compute time per step from a trace")
def q1(ns):
    import copy

    fn = ns.function("step_split")
    rng = random.Random()
    for first in (None, rng.randint(7, 9), None):  # the second trace's steps cross 9 -> 10: sort as numbers
        trace, expected = _random_trace(rng, first)
        given = copy.deepcopy(trace)
        got = fn(given)
        if given != trace:
            raise Fail("step_split must not modify the trace it is given")
        if not isinstance(got, list) or not all(isinstance(r, dict) for r in got):
            raise Fail(f"step_split should return a list of dicts, got {type(got).__name__}: {got!r}"[:300])
        steps = [r.get("step") for r in got]
        want_steps = [r["step"] for r in expected]
        if steps != want_steps:
            raise Fail(f"for a trace with steps 'train {want_steps[0]}'..'train {want_steps[-1]}' (plus an "
                       f"'eval 0' step and ranges outside any step) expected steps {want_steps} in order, "
                       f"got {steps}")
        for row, want in zip(got, expected):
            for key in ("step_ms", "input_ms", "compute_ms"):
                value = row.get(key)
                if not isinstance(value, (int, float)) or not math.isclose(value, want[key], rel_tol=1e-6,
                                                                            abs_tol=1e-6):
                    raise Fail(f"step {want['step']}: expected {key} = {want[key]:.4f} (the trace's ts and dur "
                               f"are in microseconds), got {value!r}. Count only ranges on the step's own "
                               "thread (same pid and tid) that lie inside the step.")


# --------------------------------------------------------------------------- q2


def _union(spans, start, end):
    clipped = sorted((max(s, start), min(e, end)) for s, e in spans if min(e, end) > max(s, start))
    total, cur = 0.0, None
    for s, e in clipped:
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0.0)


@item("q2", points=2, title="busy_fraction measures utilisation from busy spans")
def q2(ns):
    fn = ns.function("busy_fraction")
    rng = random.Random()
    cases = [([], 0.0, 1.0), ([(0.0, 1.0), (0.5, 1.5)], 0.0, 2.0), ([(-1.0, 0.5), (1.5, 9.0)], 0.0, 2.0)]
    for _ in range(4):
        start = rng.uniform(0, 10)
        end = start + rng.uniform(1, 5)
        spans = []
        for _ in range(rng.randint(3, 8)):
            s = rng.uniform(start - 1, end)
            spans.append((s, s + rng.uniform(0.05, 1.5)))
        spans.append((spans[0][0] + 0.01, spans[0][1] + 0.2))  # always one overlap
        cases.append((spans, start, end))
    for spans, start, end in cases:
        want = _union(spans, start, end) / (end - start)
        got = fn(list(spans), start, end)
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            shown = [(round(s, 3), round(e, 3)) for s, e in spans]
            raise Fail(f"busy_fraction({shown}, {start:.3f}, {end:.3f}) should be {want:.4f}, got {got!r}. "
                       "Overlapping spans count once, and only the part inside [start, end] counts.")
    for start, end in ((2.0, 2.0), (3.0, 1.0)):
        expect_raises(lambda: fn([(0.0, 1.0)], start, end), f"busy_fraction([(0, 1)], {start}, {end})",
                      "the window is empty")


# --------------------------------------------------------------------------- q3


@item("q3", points=2, title="utilisation_bound predicts the best utilisation of a pipeline")
def q3(ns):
    from gpucourse import profiling

    fn = ns.function("utilisation_bound")
    rng = random.Random()
    cases = []
    for _ in range(3):
        step = rng.uniform(0.01, 0.05)
        load = rng.uniform(0.3, 0.9) * step
        aug = rng.uniform(1.2, 2.5) * step
        cases += [(step, load, aug, None, False), (step, load, aug, None, True),
                  (step, load, aug, 1, False), (step, load, aug, 2, True),
                  (step, aug, load, rng.randint(3, 8), False), (step, aug, aug, 2, False)]
    for step, load, aug, k, prefetch in cases:
        want = profiling.predicted_utilisation(step, load, aug, parallel_calls=k, prefetch=prefetch)
        got = fn(step, load, aug, parallel_calls=k, prefetch=prefetch)
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-6):
            raise Fail(f"utilisation_bound(step_s={step:.4f}, load_s={load:.4f}, augment_s={aug:.4f}, "
                       f"parallel_calls={k}, prefetch={prefetch}) should be {want:.4f}, got {got!r}")
    expect_raises(lambda: fn(0.02, 0.01, 0.01, parallel_calls=0, prefetch=False),
                  "utilisation_bound(..., parallel_calls=0)", "parallel_calls must be >= 1")


# --------------------------------------------------------------------------- q4


@item("q4", points=5, title="fast_pipeline keeps the simulated accelerator busy >= 90% of the time")
def q4(ns):
    import tensorflow as tf

    from gpucourse import profiling

    fn = ns.function("fast_pipeline")
    rng = random.Random()
    n = profiling.STEPS
    values = [rng.randint(-10**6, 10**6) for _ in range(n)]
    a, b, c = rng.randint(2, 9), rng.randint(-50, 50), rng.randint(2, 9)
    startup_limit = STARTUP_FACTOR * (profiling.LOAD_S + profiling.AUGMENT_S)
    best = None
    for attempt in range(2):  # one retry, only for a borderline result on a very noisy machine
        load = profiling.SimulatedStage(profiling.LOAD_S, lambda v: a * v + b, "load")
        augment = profiling.SimulatedStage(profiling.AUGMENT_S, lambda v: c * v, "augment")
        ds = fn(profiling.simulated_source(values=values), load, augment)
        if not isinstance(ds, tf.data.Dataset):
            raise Fail(f"fast_pipeline should return a tf.data.Dataset, got {type(ds).__name__}")
        if load.calls or augment.calls:
            raise Fail(f"fast_pipeline ran load {load.calls} and augment {augment.calls} times before returning: "
                       "build the pipeline only, the work must happen while the accelerator trains")
        rep = profiling.measure_utilisation(ds, profiling.STEP_S, steps=n + 1)
        want = sorted(c * (a * v + b) for v in values)
        got = sorted(int(v) for v in rep.values) if all(isinstance(v, int) for v in rep.values) else rep.values
        if len(rep.values) != n or got != want:
            raise Fail(f"with a source of {n} random ints, load(v) = {a}*v + {b} and augment(v) = {c}*v, expected "
                       f"{n} elements augment(load(v)) (e.g. {want[:3]}), got {len(rep.values)}: "
                       f"{rep.values[:3]}...")
        if load.calls < n or augment.calls < n:
            raise Fail(f"every element must go through load and augment: they ran {load.calls} and "
                       f"{augment.calls} times for {n} elements")
        if rep.startup_s <= startup_limit and rep.utilisation >= UTILISATION_TARGET:
            return
        best = rep if best is None or (rep.startup_s <= startup_limit, rep.utilisation) > (
            best.startup_s <= startup_limit, best.utilisation) else best
        if best.utilisation < 0.85 or best.startup_s > 2 * startup_limit:
            break
    if best.startup_s > startup_limit:
        raise Fail(f"the first element took {best.startup_s * 1e3:.0f} ms to arrive, but one element needs only "
                   f"load + augment = {(profiling.LOAD_S + profiling.AUGMENT_S) * 1e3:.0f} ms (allowed: "
                   f"{startup_limit * 1e3:.0f} ms). Holding elements back (for example batch then unbatch) only "
                   "hides a slow pipeline from the steady-state measure; make the stages themselves keep up.")
    if best.utilisation < UTILISATION_TARGET:
        seq = profiling.predicted_utilisation()
        pre = profiling.predicted_utilisation(prefetch=True)
        raise Fail(f"measured steady-state utilisation {best.utilisation:.0%} over {best.steps} steps of "
                   f"{profiling.STEP_S * 1e3:.0f} ms (load {profiling.LOAD_S * 1e3:.0f} ms, augment "
                   f"{profiling.AUGMENT_S * 1e3:.0f} ms per element); needs >= {UTILISATION_TARGET:.0%}. "
                   f"Bounds: sequential maps {seq:.0%}, prefetch alone {pre:.0%}; the slowest stage must keep up.")
