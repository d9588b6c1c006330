"""Lab 07 (tf.data tuning): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases`` draws fresh inputs on the
grader's side, ``observe`` runs the learner's pipeline on simulated workloads and returns plain data,
and ``judge`` computes every expected answer and bound from the case, with private reference functions
(never with a course helper).

The simulated work is the check's own (:mod:`gpucourse.grading.timeline`): the kernel wires
``simulate.Stage(0.0, callback)`` objects into the learner's pipeline, and each callback runs on the
trusted side (in the grader's observer), where it sleeps the stage's cost, maps the element and stamps
the observer's clock. The training step is a callback too. So what an element cost, when it arrived,
which stages it passed through and how many ran at once are all the check's records: the learner's
code can change what its kernel says, not what the observer saw. The kernel reports only what the
observer cannot see (the returned dataset's type and the chain of transformations it was built from).

This file is what each item draws and runs, and the code the graded kernel gets (the ``@in_kernel``
functions and what they use). Each item's verdict is in :mod:`gpucourse.labtests._lab07_judges`; the bounds, the
expected deliveries and the bars it applies (shared with the observations here) are in
:mod:`gpucourse.labtests._lab07_reference`: both run only on the grader's side (the kernel's copy of the course
has no ``labtests``). Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

from gpucourse.grading.items import in_kernel, item, outcome
from gpucourse.grading.timeline import observe_run
from gpucourse.labtests._lab07_judges import judge_q1, judge_q2, judge_q3, judge_q4, judge_q5
from gpucourse.labtests._lab07_reference import (NOISE, Q3_DEADLINE_S, Q3_STARTUP, Q3_UTILISATION, Q4_DEADLINE_S,
                                                 q3_summary)


def _reshuffles(ds) -> list:
    """``reshuffle_each_iteration`` of every shuffle in the dataset's chain (True unless turned off)."""
    out = []
    while ds is not None:
        if hasattr(ds, "_reshuffle_each_iteration"):
            out.append(ds._reshuffle_each_iteration is not False)
        inputs = ds._inputs() if hasattr(ds, "_inputs") else []
        ds = inputs[0] if inputs else None
    return out


def _structure(ds) -> list:
    """The dataset's chain from the output back to the source: [[class name, buffer size or None], ...]."""
    out = []
    while ds is not None:
        size = getattr(ds, "_buffer_size", None)
        try:
            size = None if size is None else int(size)
        except (TypeError, ValueError):
            size = None
        out.append([type(ds).__name__, size])
        inputs = ds._inputs() if hasattr(ds, "_inputs") else []
        ds = inputs[0] if inputs else None
    return out


# --------------------------------------------------------------------------- q1


@item("q1", points=2, title="pipeline_bound: fill plus the slowest stage")
class q1:
    def cases(rng):
        fixed = [(1, 0.05, 0.02, 1), (10, 0.03, 0.01, 1), (10, 0.03, 0.01, 3), (10, 0.03, 0.01, 6), (7, 0.01, 0.04, 2)]
        drawn = [(rng.randint(2, 500), round(rng.uniform(0.001, 0.2), 4), round(rng.uniform(0.001, 0.1), 4),
                  rng.randint(2, 16)) for _ in range(12)]
        out = [{"n": n, "p": p, "c": c, "k": k} for n, p, c, k in fixed + drawn]
        out.append({"n": rng.randint(2, 50), "p": 0.02, "c": 0.01, "default": True})
        out += [{"bad": args, "what": what} for args, what in [
            ([0, 0.01, 0.01, 1], "n=0"), ([5, 0.01, 0.01, 0], "parallelism=0"),
            ([5, -0.01, 0.01, 1], "produce_s=-0.01"), ([5, 0.01, -0.02, 2], "step_s=-0.02")]]
        return out

    def observe(ns, case):
        fn = ns.function("pipeline_bound")
        if "bad" in case:
            return outcome(lambda: fn(*case["bad"]))
        if case.get("default"):
            return outcome(lambda: fn(case["n"], case["p"], case["c"]))
        return outcome(lambda: fn(case["n"], case["p"], case["c"], case["k"]))

    judge = judge_q1


# --------------------------------------------------------------------------- q2

#: The pipelines q2 builds, as lists of steps: one always maps right before it batches (TensorFlow fuses
#: the two into one op that maps ahead in a thread of its own), the other is drawn from the rest.
Q2_SHAPES = [["batch", "decode"], ["decode", "scale", "batch"], ["decode", "scale"],
             ["decode", "batch", "unbatch", "scale", "batch"]]
Q2_COSTS = {"decode": 0.008, "scale": 0.004, "step": 0.015}


@in_kernel
def _q2_observe(ns, case, decode, scale, step, built):
    """Kernel side: the case's pipeline over the check's stages, through the learner's serial_baseline, fed to
    the check's step one element at a time (the step holds this thread, as simulate.feed does)."""
    import tensorflow as tf

    from gpucourse import simulate

    stages = {"decode": simulate.Stage(0.0, decode, "decode"), "scale": simulate.Stage(0.0, scale, "scale")}
    ds = tf.data.Dataset.range(case["n"])
    for op in case["ops"]:
        ds = ds.map(stages[op]) if op in stages else ds.batch(case["batch"]) if op == "batch" else ds.unbatch()
    out = ns.function("serial_baseline")(ds)
    built()
    if not isinstance(out, tf.data.Dataset):
        return {"type": type(out).__name__}
    try:  # for the message only (the learner's word): which of TensorFlow's own rewrites were left on
        opt = out.options()
        said = {"inject_prefetch": opt.experimental_optimization.inject_prefetch,
                "map_and_batch_fusion": opt.experimental_optimization.map_and_batch_fusion,
                "apply_default_optimizations": opt.experimental_optimization.apply_default_optimizations,
                "autotune": opt.autotune.enabled}
    except Exception:
        said = {}
    for element in out:
        if step(element.numpy().tolist()):  # the check's time for this run is up
            break
    return {"type": "Dataset", "options": said}


@item("q2", points=2, title="serial_baseline: nothing runs while the step runs, whatever the pipeline")
class q2:
    def cases(rng):
        out = []
        for ops in (["decode", "batch"], rng.choice(Q2_SHAPES)):
            out.append({"ops": ops, "n": rng.randint(10, 13), "batch": rng.choice([3, 4]), "a": rng.randint(2, 9),
                        "b": rng.randint(-50, 50), "k": rng.randint(2, 9)})
        return out

    def observe(ns, case):
        a, b, k = case["a"], case["b"], case["k"]
        seen, run = observe_run(ns, _q2_observe, 10.0, lambda line: [
            case, line.stage("decode", Q2_COSTS["decode"], lambda v: a * v + b),
            line.stage("scale", Q2_COSTS["scale"], lambda v: k * v), line.device(Q2_COSTS["step"], queued=0),
            line.mark("built")])
        return {**seen, "run": run}

    judge = judge_q2


# --------------------------------------------------------------------------- q3


@in_kernel
def _q3_observe(ns, costs, read, decode, step):
    """Kernel side: shards of records whose reads, a decode and a step that are all the check's callbacks. The
    learner's pipeline gets TensorFlow's defaults: every thread and every overlap in it is the learner's own."""
    import tensorflow as tf

    from gpucourse import simulate

    records, shards = costs["records"], costs["shards"]
    read_record = simulate.Stage(0.0, read, "read")

    def read_file(shard):
        """The records of one shard (file), read one after another."""
        return tf.data.Dataset.range(tf.cast(shard, tf.int64), records, shards).map(read_record)

    out = ns.function("tuned_pipeline")(tf.data.Dataset.range(shards), read_file,
                                        simulate.Stage(0.0, decode, "decode"), dict(costs))
    if not isinstance(out, tf.data.Dataset):
        return {"type": type(out).__name__}
    structure = _structure(out)
    for i, element in enumerate(out):
        if i > records:  # one too many is enough to say so
            break
        if step(element.numpy().tolist()):  # the check's time for this run is up
            break
    return {"type": "Dataset", "structure": structure}


def _q3_costs(case) -> dict:
    return {k: case[k] for k in ("read_s", "decode_s", "step_s", "shards", "records")}


@item("q3", points=4, title="tuned_pipeline keeps a fast step fed from slow storage")
class q3:
    def cases(rng):
        # Reads and decodes wait (remote storage, a remote decoder): about 14-18 reads and 10-14 decodes must be
        # in flight, over 24 threads in all. tf.data's default pool has one thread per core, so it falls short on
        # a 2-core machine by far, and on a 16-core GPU machine too (about 2/3 of the pace the step needs).
        return [{"read_s": round(rng.uniform(0.28, 0.36), 3), "decode_s": round(rng.uniform(0.20, 0.28), 3),
                 "step_s": 0.02, "shards": 48, "records": 48, "a": rng.randint(2, 9), "b": rng.randint(-50, 50),
                 "c": rng.randint(2, 9), "attempts": 2}]

    def observe(ns, case):
        a, b, c = case["a"], case["b"], case["c"]
        runs = []
        for _ in range(case["attempts"]):  # a second run only when the first fell a little short (a noisy machine)
            seen, run = observe_run(ns, _q3_observe, Q3_DEADLINE_S, lambda line: [
                _q3_costs(case), line.stage("read", case["read_s"], lambda v: a * v + b),
                line.stage("decode", case["decode_s"], lambda v: c * v), line.device(case["step_s"], queued=1)])
            if seen["type"] != "Dataset":
                return {"type": seen["type"]}
            runs.append(dict(run, structure=seen.get("structure")))
            startup, util = q3_summary(run, case)
            limit = Q3_STARTUP * (case["read_s"] + case["decode_s"])
            if (startup <= limit and util >= Q3_UTILISATION) or startup > 2 * limit or util < 0.45:
                break  # passed, or so far off that no noise explains it (the tutorial's sizes: 0.3)
        return {"type": "Dataset", "runs": runs}

    judge = judge_q3


# --------------------------------------------------------------------------- q4


@in_kernel
def _q4_observe(ns, case, decode, take):
    """Kernel side: the learner's stream over the check's decode (a callback that counts), read batch by batch."""
    import tensorflow as tf

    from gpucourse import simulate

    n, batch = case["n"], case["batch"]
    ds = ns.function("epoch_stream")(tf.data.Dataset.range(n), simulate.Stage(0.0, decode, "decode"), batch)
    if not isinstance(ds, tf.data.Dataset):
        return {"type": type(ds).__name__}
    limit = -(-3 * n // batch) + 1  # 3 epochs of full batches, and one more
    for i, element in enumerate(ds):
        if i >= limit:
            break
        if take(element.numpy().tolist()):
            break
    return {"type": "Dataset", "structure": _structure(ds), "reshuffles": _reshuffles(ds)}


@item("q4", points=3, title="epoch_stream: an endless stream of full batches, a fresh order every epoch")
class q4:
    def cases(rng):
        n = rng.randint(320, 400)  # records: a shuffle buffer of 240 or fewer (< MIX n) mixes them too little
        batch = rng.choice([b for b in range(5, 17) if n % b])  # so an epoch does not end on a batch boundary
        return [{"n": n, "batch": batch, "a": rng.randint(2, 9), "b": rng.randint(-50, 50)}]

    def observe(ns, case):
        a, b = case["a"], case["b"]
        seen, run = observe_run(ns, _q4_observe, Q4_DEADLINE_S, lambda line: [
            case, line.stage("decode", 0.0, lambda v: a * v + b), line.device(0.0, queued=0)])
        return {**seen, "run": run}

    judge = judge_q4


# --------------------------------------------------------------------------- q5


@in_kernel
def _q5_observe(ns, case, read, decode, augment, take, epoch_marks):
    """Kernel side: the learner's pipeline over the check's read, decode and augment, read for 3 epochs."""
    import tensorflow as tf

    from gpucourse import simulate

    n, batch = case["n"], case["batch"]
    ds = ns.function("augmented_pipeline")(tf.data.Dataset.range(n), simulate.Stage(0.0, read, "read"),
                                           simulate.Stage(0.0, decode, "decode"),
                                           simulate.Stage(0.0, augment, "augment"), batch)
    if not isinstance(ds, tf.data.Dataset):
        return {"type": type(ds).__name__}
    stop = False
    for mark in epoch_marks:
        mark()
        for i, element in enumerate(ds):
            if i > n // batch + 1 or stop:  # an epoch that does not end: enough to say so
                break
            stop = take(element.numpy().tolist())
    return {"type": "Dataset", "structure": _structure(ds), "reshuffles": _reshuffles(ds)}


@item("q5", points=2, title="augmented_pipeline caches what fits, decodes and augments afresh every epoch")
class q5:
    def cases(rng):
        n = rng.randint(40, 60)
        batch = rng.choice([b for b in range(4, 10) if n % b])
        return [{"n": n, "batch": batch, "p": rng.randint(2, 9), "q": rng.randint(-50, 50), "a": rng.randint(2, 9),
                 "b": rng.randint(-50, 50)}]

    def observe(ns, case):
        import random

        noise = random.Random()  # the augmentation's own randomness, on the trusted side, fresh at every call
        p, q, a, b = case["p"], case["q"], case["a"], case["b"]
        seen, run = observe_run(ns, _q5_observe, 6.0, lambda line: [
            case, line.stage("read", 0.0, lambda r: p * r + q), line.stage("decode", 0.0, lambda v: a * v + b),
            line.stage("augment", 0.0, lambda v: NOISE * v + noise.randrange(NOISE)), line.device(0.0, queued=0),
            [line.mark(f"epoch {e}") for e in (1, 2, 3)]])
        return {**seen, "run": run}

    judge = judge_q5
