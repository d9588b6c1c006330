"""Lab 04 (MirroredStrategy and multi-worker): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (random sizes, random data, random
initial weights, random ports), ``observe`` runs the learner's function in the
learner's kernel under strategies over different device subsets and returns
plain data (batches, losses, weights, strings), and ``judge`` computes the
expected answer on the grader's side: batch arithmetic, sharding, and the
reference training (one device, in NumPy) of q3 and q5, including the wrong
answers the classic mistakes would give, so the message can name the mistake.

q2 feeds global batches that do not divide by the replica count, through several input pipelines, and
compares each step with the global batch one device would train on. q3's model has two heads, an auxiliary
loss averaged over the labelled examples only and L2 penalties, on batches split unevenly (one replica
empty), so only divisors summed over the replicas pass. q5 announces a preemption after one step, kills the
training run a step or more later, restarts it on fresh weights and other data, and compares the final
weights and the whole loss history with an uninterrupted run. Under the grader the first run is a
real process (``ns.fresh_process()``: the submission's cells run again in a
second kernel) killed with SIGKILL from ``on_step``, which runs in the grader, as does ``preempted``,
so only what it saved on disk survives; ``check()`` simulates the kill with an
exception from ``on_step`` that ``except Exception`` cannot catch.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import json

from gpucourse.grading.items import Fail, ItemTimeout, expect_raised, in_kernel, item, outcome, tr

# --------------------------------------------------------------------------- shared


def _type_name(value) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


def _strategies():
    """Strategies over 1 device, 2 devices and every device of the preferred type (fresh key ranges)."""
    from gpucourse import distribute

    names = distribute.strategy_devices()
    subsets = [names[:1]] + ([names[:2]] if len(names) > 2 else []) + ([names] if len(names) > 1 else [])
    return [distribute.mirrored_strategy(s) for s in subsets]


def _all_devices_strategy():
    from gpucourse import distribute

    return distribute.mirrored_strategy(distribute.strategy_devices())


def _split(batch: int, replicas: int) -> list[int]:
    """TensorFlow's split of a batch over replicas: ceil(batch / replicas) each, in order, until it runs out."""
    per = -(-batch // replicas)
    return [max(0, min(per, batch - i * per)) for i in range(replicas)]


def _matrix(rng, rows: int, cols: int, scale: float = 1.0) -> list[list[float]]:
    return [[round(rng.gauss(0.0, scale), 4) for _ in range(cols)] for _ in range(rows)]


def _linear_model(strategy, kernel, bias):
    """A Dense layer under ``strategy.scope()`` with the given weights (built in the learner's kernel)."""
    import keras
    import numpy as np

    kernel, bias = np.array(kernel, "float32"), np.array(bias, "float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((kernel.shape[0],)), keras.layers.Dense(kernel.shape[1])])
    model.set_weights([kernel, bias])
    return model


# --------------------------------------------------------------------------- q1


@in_kernel
def _q1_observe(ns, case):
    from gpucourse import distribute

    fn = ns.function("global_batch")
    machine = len(distribute.strategy_devices())
    if "bad" in case:
        return outcome(lambda: fn(_all_devices_strategy(), case["bad"]))
    out = []
    for strategy in _strategies():
        got = fn(strategy, case["per"])
        out.append({"replicas": int(strategy.num_replicas_in_sync), "got": got, "type": _type_name(got)})
    return {"runs": out, "machine": machine}


@item("q1", points=2, title="global_batch(strategy, per_replica) uses the strategy's replica count")
class q1:
    def cases(rng):
        return [{"per": rng.randint(3, 70)} for _ in range(3)] + [{"bad": b} for b in (0, -rng.randint(1, 9))]

    def observe(ns, case):
        return ns.kernel(_q1_observe, case)

    def judge(case, seen):
        if "bad" in case:
            return expect_raised(seen, f"global_batch(strategy, {case['bad']})", "a batch needs >= 1 example")
        per = case["per"]
        for run in seen["runs"]:
            n, got = run["replicas"], run["got"]
            if run["type"] not in ("int", "int64", "int32"):
                raise Fail(tr("global_batch should return a whole number of examples (an int), got {got} ({kind})",
                              got=repr(got), kind=run["type"]))
            if got != per * n:
                hint = (tr(" Use strategy.num_replicas_in_sync, not the number of devices on the machine.")
                        if got == per * seen["machine"] else "")
                raise Fail(tr("for a MirroredStrategy over {n} device(s) and per_replica={per}, expected {want}, "
                              "got {got}.{hint}", n=n, per=per, want=per * n, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q2


def _array_split(total: int, parts: int) -> list[int]:
    """``np.array_split``'s sizes: ``total`` examples over ``parts`` replicas, the first ``total % parts`` one more."""
    return [total // parts + (1 if j < total % parts else 0) for j in range(parts)]


def _raised(exc) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


@in_kernel
def _q2_observe(ns, case):
    import numpy as np
    import tensorflow as tf

    make = ns.function("make_dataset_fn")
    if case.get("through_strategy"):
        strategy = _all_devices_strategy()
        reps = int(strategy.num_replicas_in_sync)
        gbs = case["per"] * reps + 1  # not a multiple of the replica count (unless there is one replica)
        x = np.arange(gbs * case["rows"], dtype="float32").reshape(-1, 1)
        try:
            first = next(iter(strategy.distribute_datasets_from_function(make(x, 3.0 * x, gbs))))
        except NotImplementedError:
            raise
        except Exception as exc:  # the judge names the classic one: get_per_replica_batch_size
            return {"raised": _raised(exc), "replicas": reps, "gbs": gbs, "pipelines": 1}
        return {"replicas": reps, "gbs": gbs, "parts": [p.numpy().ravel().tolist()
                                                        for p in strategy.experimental_local_results(first[0])]}
    n, pipelines, replicas, gbs = case["n"], case["pipelines"], case["replicas"], case["gbs"]
    x = np.arange(n, dtype="float32").reshape(n, 1) + np.float32(case["offset"])
    fn = make(x, 3.0 * x, gbs)
    limit = (replicas // pipelines) * (-(-n // gbs) + 2) + n  # batches of a finite answer, with room to spare
    pipes = []
    for pid in range(pipelines):
        ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pid,
                                         num_replicas_in_sync=replicas)
        try:
            ds = fn(ctx)
            if not isinstance(ds, tf.data.Dataset):
                return {"type": type(ds).__name__}
            batches, endless = [], False
            for i, (xb, yb) in enumerate(ds):
                if i >= limit:
                    endless = True
                    break
                batches.append({"x": xb.numpy().ravel().tolist(), "y": yb.numpy().ravel().tolist()})
        except NotImplementedError:
            raise
        except Exception as exc:
            return {"raised": _raised(exc), "replicas": replicas, "gbs": gbs, "pipelines": pipelines}
        pipes.append({"batches": [] if endless else batches, "endless": endless})
        if endless:
            break
    return {"type": "Dataset", "pipelines": pipes}


def _q2_steps(case, pipes) -> list[list[list[float]]]:
    """What each replica gets at each step: pipeline p's batches go to its replicas p*r ... p*r + r - 1 in turn
    (r = replicas / pipelines), as ``distribute_datasets_from_function`` deals them; a pipeline that ends first
    leaves its replicas empty."""
    replicas, pipelines = case["replicas"], case["pipelines"]
    r = replicas // pipelines
    count = max([-(-len(p["batches"]) // r) for p in pipes] + [0])
    steps = [[[] for _ in range(replicas)] for _ in range(count)]
    for p, pipe in enumerate(pipes):
        for j, batch in enumerate(pipe["batches"]):
            steps[j // r][p * r + j % r] = batch["x"]
    return steps


def _q2_raised(case, seen):
    reps, gbs = seen["replicas"], seen["gbs"]
    hint = ""
    if "divisible" in seen["raised"] or "multiple" in seen["raised"]:
        hint = " " + tr("ctx.get_per_replica_batch_size(global_batch_size) refuses a global batch that is not a "
                        "multiple of the replica count: no single per-replica size exists. Split each global "
                        "batch yourself, {sizes} here.", sizes=_array_split(gbs, reps))
    raise Fail(tr("with {pipelines} input pipeline(s), {reps} replicas and global batch {gbs}, your dataset_fn "
                  "raised {raised}.{hint}", pipelines=seen["pipelines"], reps=reps, gbs=gbs, raised=seen["raised"],
                  hint=hint))


def _q2_uneven(setup, step, sizes, gbs, replicas):
    raise Fail(tr("{setup}: step {step} holds the right examples, but split {sizes} over the replicas; split it as "
                  "evenly as possible, as np.array_split does: {want} (the first {extra} replica(s) get one example "
                  "more).", setup=setup, step=step, sizes=sizes, want=_array_split(gbs, replicas),
                  extra=gbs % replicas))


@item("q2", points=3, title="make_dataset_fn: each step gets one device's global batch, split over the replicas")
class q2:
    def cases(rng):
        out = []
        # (pipelines, replicas, remainder of the global batch over the replicas): 0 is the tutorial's even case
        for pipelines, replicas, uneven in ((2, 4, True), (1, 2, True), (3, 3, False)):
            per = rng.randint(2, 4)
            # 1 or 2 more than a multiple: TensorFlow's own split (ceil(B / R) each until it runs out) differs
            gbs = per * replicas + (rng.randint(1, max(1, replicas - 2)) if uneven else 0)
            n = gbs * rng.randint(1, 2) + rng.randint(1, gbs - 1)  # a last, partial global batch
            out.append({"pipelines": pipelines, "replicas": replicas, "gbs": gbs, "n": n,
                        "offset": rng.randint(0, 1000)})
        return out + [{"through_strategy": True, "per": 2, "rows": 3}]

    def observe(ns, case):
        return ns.kernel(_q2_observe, case)

    def judge(case, seen):
        if "type" in seen and seen["type"] != "Dataset":
            raise Fail(tr("dataset_fn(ctx) should return a tf.data.Dataset, got {kind}", kind=seen["type"]))
        if "raised" in seen:
            _q2_raised(case, seen)
        if case.get("through_strategy"):
            reps, gbs = seen["replicas"], seen["gbs"]
            sizes = [len(p) for p in seen["parts"]]
            setup = tr("through strategy.distribute_datasets_from_function with {reps} replicas and global batch "
                       "{gbs}", reps=reps, gbs=gbs)
            if sorted(v for p in seen["parts"] for v in p) != list(range(gbs)):
                raise Fail(tr("{setup}, the first step should hold examples 0 to {last}, split {want}; the replicas "
                              "got {sizes} examples", setup=setup, last=gbs - 1, want=_array_split(gbs, reps),
                              sizes=sizes))
            if sizes != _array_split(gbs, reps):
                _q2_uneven(setup, 1, sizes, gbs, reps)
            return
        pipelines, replicas, gbs, n, offset = (case["pipelines"], case["replicas"], case["gbs"], case["n"],
                                               case["offset"])
        setup = tr("with {pipelines} input pipeline(s), {replicas} replicas, global batch {gbs} and {n} examples",
                   pipelines=pipelines, replicas=replicas, gbs=gbs, n=n)
        pipes = seen["pipelines"]
        if any(pipe["endless"] for pipe in pipes):
            raise Fail(tr("the dataset seems endless: do not .repeat() it, the training loop decides how long "
                          "to run"))
        for pipe in pipes:
            for b in pipe["batches"]:
                if len(b["x"]) != len(b["y"]) or any(abs(yv - 3.0 * xv) > 1e-3 * max(1.0, abs(xv))
                                                     for xv, yv in zip(b["x"], b["y"])):
                    raise Fail(tr("the x and y of a batch no longer belong together (y = 3x in this test); "
                                  "shuffle, shard or split (x, y) pairs, not x and y separately"))
        every = sorted(v for pipe in pipes for b in pipe["batches"] for v in b["x"])
        want_all = [offset + i for i in range(n)]
        full = (n // gbs) * gbs  # the examples of the full global batches
        if every != want_all:
            missing = sorted(set(want_all) - set(every))
            if len(set(every)) == len(every) and set(every) < set(want_all) and min(missing) >= offset + full:
                raise Fail(tr("{setup}: the last, partial step should hold the last {rest} examples; {dropped} of "
                              "them were dropped. That is what batch(..., drop_remainder=True) does. Keep them "
                              "(leave drop_remainder at False): every example must be seen exactly once.",
                              setup=setup, rest=n - full, dropped=len(missing)))
            raise Fail(tr("{setup}: the pipelines together should yield each example exactly once; they yielded "
                          "{count} examples, {distinct} distinct. Each pipeline must yield only the parts of its "
                          "own replicas (ctx.num_input_pipelines, ctx.input_pipeline_id).", setup=setup,
                          count=len(every), distinct=len(set(every))))
        steps = _q2_steps(case, pipes)
        for s, parts in enumerate(steps):
            first, last = s * gbs, min((s + 1) * gbs, n) - 1
            held = sorted(v for part in parts for v in part)
            sizes = [len(part) for part in parts]
            if held != [offset + i for i in range(first, last + 1)]:
                raise Fail(tr("{setup}: step {step} should hold examples {first} to {last} (the global batch one "
                              "device would train on at that step), split over the replicas as {want}; the "
                              "replicas got {sizes} examples, from {low} to {high}. The strategy gives pipeline p's "
                              "batches to its replicas in turn, so each pipeline yields, per step, one batch per "
                              "replica of its own.", setup=setup, step=s + 1, first=first, last=last,
                              want=_array_split(last - first + 1, replicas), sizes=sizes,
                              low=(min(held) - offset) if held else "-", high=(max(held) - offset) if held else "-"))
            if last - first + 1 == gbs and sizes != _array_split(gbs, replicas):
                _q2_uneven(setup, s + 1, sizes, gbs, replicas)


# --------------------------------------------------------------------------- q3


def _sgd_linear(kernel, bias, batches, lr, momentum=0.0, velocity=None):
    """Reference: SGD (Keras' momentum rule) on mean-over-outputs squared error, loss summed / batch size.

    Returns (losses, kernel, bias, velocity). Plain Python, float64.
    """
    import numpy as np

    w, b = np.array(kernel, float), np.array(bias, float)
    vw, vb = velocity if velocity is not None else (np.zeros_like(w), np.zeros_like(b))
    losses = []
    for x, y in batches:
        x, y = np.array(x, float), np.array(y, float)
        pred = x @ w + b
        losses.append(float(np.mean(np.mean((y - pred) ** 2, axis=1))))
        d = -2.0 * (y - pred) / (y.shape[1] * x.shape[0])
        gw, gb = x.T @ d, d.sum(axis=0)
        vw, vb = momentum * vw - lr * gw, momentum * vb - lr * gb
        w, b = w + vw, b + vb
    return losses, w, b, (vw, vb)


#: How each head's per-example errors are weighted, right and in the classic mistakes. ``n``/``labelled``: examples
#: and labelled examples in the whole step; ``n_r``/``labelled_r``: on the example's own replica; R: replicas.
_MAIN = {"right": "1 / n", "local": "1 / (n_r R)"}
_AUX = {"right": "aux has / labelled", "examples": "aux has / n", "local": "aux has / (labelled_r R)",
        "local_examples": "aux has / (n_r R)"}
_L2 = {"right": 1, "per_replica": "R", "missing": 0}


def _q3_reference(case, weights, rows, replicas, main="right", aux="right", l2="right"):
    """One SGD step of the two-head model on ``rows`` of the case, with each head's errors weighted as named
    (see ``_MAIN``, ``_AUX``, ``_L2``); a zero denominator gives 0, as tf.math.divide_no_nan and
    tf.nn.compute_average_loss do. Returns (loss summed over the replicas, weights after). NumPy, float64."""
    import numpy as np

    x = np.array([case["x"][i] for i in rows], float)
    targets = [np.array([case[key][i] for i in rows], float) for key in ("y_main", "y_aux")]
    has = np.array([case["has_aux"][i] for i in rows], float)
    n, sizes = len(rows), _split(len(rows), replicas)
    replica = np.repeat(np.arange(replicas), sizes)
    n_r = np.array(sizes, float)[replica]
    labelled_r = np.array([has[replica == r].sum() for r in range(replicas)])[replica]

    def ratio(num, den):
        den = np.broadcast_to(np.asarray(den, float), np.shape(num))
        return np.divide(num, den, out=np.zeros(np.shape(num)), where=den != 0)

    coef = [{"right": ratio(np.ones(n), n), "local": ratio(np.ones(n), n_r * replicas)}[main],
            {"right": ratio(case["aux"] * has, has.sum()), "examples": ratio(case["aux"] * has, n),
             "local": ratio(case["aux"] * has, labelled_r * replicas),
             "local_examples": ratio(case["aux"] * has, n_r * replicas)}[aux]]
    factor = {"right": 1, "per_replica": replicas, "missing": 0}[l2]
    loss, after = 0.0, []
    for head, (c, y) in enumerate(zip(coef, targets)):
        w, b = np.array(weights[2 * head], float), np.array(weights[2 * head + 1], float)
        err = y - (x @ w + b)
        loss += float(np.sum(c * np.mean(err ** 2, axis=1))) + factor * case["l2"] * float(np.sum(w ** 2))
        d = -2.0 * err * c[:, None] / y.shape[1]
        after += [w - case["lr"] * (x.T @ d + 2 * factor * case["l2"] * w), b - case["lr"] * d.sum(axis=0)]
    return loss, after


def _two_head_model(strategy, case):
    """The check's model, under the strategy: two Dense heads on the input ("main", "aux"), each kernel with an
    L2 penalty, so that ``model.losses`` holds two regularisation losses."""
    import keras
    import numpy as np

    with strategy.scope():
        inputs = keras.Input((len(case["x"][0]),))
        heads = [keras.layers.Dense(len(case[key][0]), kernel_regularizer=keras.regularizers.L2(case["l2"]),
                                    name=name)(inputs) for key, name in (("y_main", "main"), ("y_aux", "aux"))]
        model = keras.Model(inputs, heads)
    model.set_weights([np.array(w, "float32") for w in case["weights"]])
    return model


@in_kernel
def _q3_observe(ns, case):
    import keras
    import numpy as np
    import tensorflow as tf

    make = ns.function("make_train_step")
    strategy = _all_devices_strategy()
    n = int(strategy.num_replicas_in_sync)
    if n < 2:
        raise Fail(tr("this check needs at least 2 devices: run the setup cell at the top of the lab first"))
    model = _two_head_model(strategy, case)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(case["lr"])
    step = make(strategy, model, optimizer, case["aux"])
    data = tf.data.Dataset.from_tensor_slices(tuple(np.array(case[k], "float32")
                                                    for k in ("x", "y_main", "y_aux", "has_aux")))
    batches = iter(strategy.experimental_distribute_dataset(data.batch(case["gbs"])))
    steps = []
    for batch in batches:
        got = step(batch)
        try:
            loss = float(got)
        except (TypeError, ValueError):
            return {"replicas": n, "steps": steps, "unreduced": f"{type(got).__name__}: {str(got)[:120]}"}
        steps.append({"loss": loss, "weights": [w.tolist() for w in model.get_weights()]})
    return {"replicas": n, "steps": steps}


def _q3_hints(case, weights, rows, replicas, got) -> list[str]:
    """Name the classic mistake(s) whose update the learner's weights match, head by head."""
    import numpy as np

    def close(a, b):
        return all(np.allclose(np.array(x, float), y, rtol=1e-3, atol=1e-4, equal_nan=True) for x, y in zip(a, b))

    for main in _MAIN:
        for aux in _AUX:
            for l2 in _L2:
                _, want = _q3_reference(case, weights, rows, replicas, main, aux, l2)
                if close(got, want):
                    hints = []
                    if main != "right":
                        hints.append(tr("The main loss was divided per replica by its own share of the examples: on "
                                        "an uneven split (or an empty replica) that weights examples unequally. "
                                        "Divide by the number of examples in the whole step."))
                    if aux == "examples":
                        hints.append(tr("The auxiliary loss was averaged over all examples; average it over the "
                                        "labelled ones only (has_aux == 1) in the whole step."))
                    elif aux != "right":
                        hints.append(tr("The auxiliary loss was averaged per replica; its divisor is the number of "
                                        "labelled examples in the whole step, which no replica knows alone: sum it "
                                        "over the replicas (tf.distribute.get_replica_context().all_reduce)."))
                    if l2 == "per_replica":
                        hints.append(tr("The regularisation loss was added on every replica, and the replicas' "
                                        "gradients are summed: it counted {n} times. Scale it with "
                                        "tf.nn.scale_regularization_loss.", n=replicas))
                    elif l2 == "missing":
                        hints.append(tr("The model's regularisation losses (model.losses) are missing from the "
                                        "loss."))
                    return hints
    return []


@item("q3", points=3, title="make_train_step: two heads, a partly labelled auxiliary loss and L2, as on one device")
class q3:
    def cases(rng):
        # 5 examples per step: split unevenly over 2, 3, 4 or 8 replicas, and 4 or more leave one with nothing
        # (TensorFlow fills replicas in order: 2, 2, 1, 0 over 4). Two steps of the same size: one trace.
        gbs, steps = 5, 2
        feats, outs_main, outs_aux = rng.randint(3, 5), rng.randint(1, 2), rng.randint(1, 2)
        has = [1.0 if rng.random() < 0.6 else 0.0 for _ in range(gbs * steps)]
        for s in range(steps):
            has[s * gbs] = 1.0  # every step has a labelled example
            has[s * gbs + 4] = 0.0  # the replica that holds the step's fifth example alone (4 replicas) has none
        weights = [_matrix(rng, feats, outs_main, 0.5), [round(rng.gauss(0, 0.1), 4) for _ in range(outs_main)],
                   _matrix(rng, feats, outs_aux, 0.5), [round(rng.gauss(0, 0.1), 4) for _ in range(outs_aux)]]
        return [{"gbs": gbs, "lr": 0.2, "l2": round(rng.uniform(0.05, 0.2), 3), "aux": round(rng.uniform(0.3, 3), 2),
                 "x": _matrix(rng, gbs * steps, feats), "y_main": _matrix(rng, gbs * steps, outs_main),
                 "y_aux": _matrix(rng, gbs * steps, outs_aux), "has_aux": has, "weights": weights}]

    def observe(ns, case):
        return ns.kernel(_q3_observe, case)

    def judge(case, seen):
        import numpy as np

        if "unreduced" in seen:
            raise Fail(tr("step(batch) should return the loss as a scalar (reduce the per-replica losses with "
                          "strategy.reduce), got {got}", got=seen["unreduced"]))
        replicas, gbs, weights = seen["replicas"], case["gbs"], case["weights"]
        for k, got in enumerate(seen["steps"]):
            rows = list(range(k * gbs, (k + 1) * gbs))
            want_loss, want = _q3_reference(case, weights, rows, replicas)
            labelled = int(sum(case["has_aux"][i] for i in rows))
            where = tr("{n} replicas, step {k}: a global batch of {size} (split {split}), {labelled} labelled for "
                       "the auxiliary head", n=replicas, k=k + 1, size=len(rows), split=_split(len(rows), replicas),
                       labelled=labelled)
            diff = max(float(np.abs(np.array(a, float) - c).max()) for a, c in zip(got["weights"], want))
            if not np.isfinite(got["loss"]) or not np.isfinite(diff):
                raise Fail(tr("{where}: the loss or the weights became NaN. A replica that holds no labelled example "
                              "(or no example at all) divided 0 by 0: the divisors are counts over the whole step, "
                              "summed over the replicas.", where=where))
            if np.isclose(got["loss"], want_loss / replicas, rtol=1e-3) and diff <= 1e-3:
                raise Fail(tr("{where}: the loss should be {want:.6f}, got {got:.6f}, {n} times less: the replicas' "
                              "losses are parts of the step's loss, so reduce them with SUM, not MEAN.", where=where,
                              want=want_loss, got=got["loss"], n=replicas))
            if not np.isclose(got["loss"], want_loss, rtol=1e-3, atol=1e-6) or diff > 1e-3:
                hints = _q3_hints(case, weights, rows, replicas, got["weights"])
                what = (tr("the loss is right but the weights after the update differ by up to {diff:.2g}",
                           diff=diff) if np.isclose(got["loss"], want_loss, rtol=1e-3, atol=1e-6)
                        else tr("the loss should be {want:.6f}, got {got:.6f}", want=want_loss, got=got["loss"]))
                raise Fail(tr("{where}: {what}. {hints}", where=where, what=what, hints=" ".join(hints) or tr(
                    "The step's loss is the main head's squared error averaged over every example of the step, plus "
                    "aux_weight times the auxiliary head's averaged over the labelled examples of the step, plus "
                    "the model's regularisation losses once; its gradient must be the gradient of that loss.")))
            weights = want


# --------------------------------------------------------------------------- q4


@in_kernel
def _q4_observe(ns, case):
    import os

    import tensorflow as tf

    fn = ns.function("make_tf_config")
    ports, index = case["ports"], case["index"]
    before = os.environ.get("TF_CONFIG")
    try:
        result = outcome(lambda: fn(ports, index))
    finally:
        after = os.environ.get("TF_CONFIG")
        if after != before:  # undo it, so this kernel does not believe it is a cluster worker
            os.environ.pop("TF_CONFIG", None) if before is None else os.environ.__setitem__("TF_CONFIG", before)
    seen = {"result": result, "changed_env": after != before}
    text = result.get("value")
    if not case.get("bad") and isinstance(text, str):
        os.environ["TF_CONFIG"] = text
        try:
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            seen["tf_read"] = {"cluster": resolver.cluster_spec().as_dict(),
                               "task": [resolver.task_type, resolver.task_id]}
        except Exception as exc:  # the judge says what TensorFlow could not read
            seen["tf_read"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            os.environ.pop("TF_CONFIG", None) if before is None else os.environ.__setitem__("TF_CONFIG", before)
    return seen


@item("q4", points=2, title="make_tf_config builds a TF_CONFIG that TensorFlow reads correctly")
class q4:
    def cases(rng):
        n = rng.randint(2, 4)
        ports = rng.sample(range(20000, 60000), n)
        good = [{"ports": ports, "index": i} for i in range(n)]
        bad = [{"ports": ports, "index": n, "bad": True}, {"ports": ports, "index": -1, "bad": True},
               {"ports": [ports[0], ports[0]], "index": 0, "bad": True}]
        return good + bad

    def observe(ns, case):
        return ns.kernel(_q4_observe, case)

    def judge(case, seen):
        ports, index = case["ports"], case["index"]
        call = f"make_tf_config({ports}, {index})"
        if seen["changed_env"]:
            raise Fail(tr("{call} changed os.environ['TF_CONFIG']: it should only return the string. Setting it in "
                          "this notebook makes the kernel itself a cluster worker for every strategy created "
                          "afterwards (the check has put it back).", call=call))
        if case.get("bad"):
            return expect_raised(seen["result"], call, "index out of range or repeated port")
        result = seen["result"]
        if "raised" in result:
            raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=result["raised"],
                          message=result.get("message", "")))
        text = result["value"]
        if not isinstance(text, str):
            raise Fail(tr("{call} should return a JSON string (environment variables are strings), got {got}",
                          call=call, got=repr(text)))
        try:
            parsed = json.loads(text)
        except ValueError as err:
            raise Fail(tr("{call} is not valid JSON ({err}): {text}", call=call, err=err, text=text[:120]))
        want_cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        if not isinstance(parsed, dict) or parsed.get("cluster") != want_cluster:
            got = parsed.get("cluster") if isinstance(parsed, dict) else parsed
            raise Fail(tr("for ports {ports} the cluster should be {want}, got {got}", ports=ports, want=want_cluster,
                          got=got))
        task = parsed.get("task")
        if task != {"type": "worker", "index": index}:
            raise Fail(tr("for index {index} the task should be {want} (index an int), got {task}", index=index,
                          want=f"{{'type': 'worker', 'index': {index}}}", task=task))
        read = seen.get("tf_read", {})
        if read.get("cluster") != want_cluster or read.get("task") != ["worker", index]:
            raise Fail(tr("TensorFlow's TFConfigClusterResolver read {read} from {text}", read=read, text=text[:120]))


# --------------------------------------------------------------------------- q5


class _WorkerKilled(BaseException):
    """The simulated failure q5 raises from ``on_step``: a BaseException, so ``except Exception`` won't swallow it."""


def _train_step(strategy, model, optimizer, global_batch):
    """A correct distributed step (so q5 grades checkpointing only, not q3 again)."""
    import tensorflow as tf

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(y - model(x, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # No AutoGraph: it would read this file's source, which the grader reports as the learner's code
    # reading the checks (and nothing here needs converting).
    @tf.function(autograph=False)
    def step(batch):
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    return step


def _fresh_run(strategy, case, kernel, bias, targets="y"):
    """Model, built momentum optimizer, step function and dataset for one launch of q5's training."""
    import keras
    import numpy as np
    import tensorflow as tf

    model = _linear_model(strategy, kernel, bias)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(case["lr"], momentum=case["momentum"])
        optimizer.build(model.trainable_variables)  # momentum slots now, under the scope
    data = tf.data.Dataset.from_tensor_slices((np.array(case["x"], "float32"), np.array(case[targets], "float32")))
    return model, optimizer, _train_step(strategy, model, optimizer, case["gbs"]), data.batch(case["gbs"])


def _folder_state(folder) -> str:
    """What the checkpoint folder holds right now, as a short digest of its files' names and contents (files
    over 16 MiB by size and time): it changes whenever a checkpoint is written, whatever the learner names it."""
    import hashlib
    import os

    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
                digest.update(os.path.relpath(path, folder).encode() + b"\0")
                if info.st_size <= 16 * 2**20:
                    with open(path, "rb") as f:
                        digest.update(f.read())
                else:
                    digest.update(f"{info.st_size}:{info.st_mtime_ns}".encode())
            except OSError:  # a file renamed or removed while we look: the folder is changing anyway
                digest.update(b"?")
    return digest.hexdigest()[:16]


@in_kernel
def _q5_folder(ns):
    """A new checkpoint folder that the graded kernel, its fresh process and the check all see: under the
    grader, the kernel's working folder (its scratch folder, shared like a job's disk); in check(), a
    temporary folder."""
    import os
    import tempfile

    return tempfile.mkdtemp(prefix="gpucourse-lab04-", dir=os.getcwd() if os.environ.get("GPUCOURSE_GRADING") else None)


@in_kernel
def _q5_launch(ns, case, folder, preempted, on_step, restart):
    """One launch of q5's training: the first (on the case's weights and targets) or the restart (other initial
    weights, other targets after the checkpoint). Returns the losses and the final weights."""
    from gpucourse import distribute

    fn = ns.function("train_resumable")
    strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])
    model, optimizer, step_fn, data = (_fresh_run(strategy, case, case["fresh_kernel"], case["bias"], "y_restart")
                                       if restart else _fresh_run(strategy, case, case["kernel"], case["bias"]))
    losses = fn(strategy, model, optimizer, step_fn, data, case["steps"], folder, case["save_every"], preempted,
                on_step)
    return {"losses": losses, "weights": [w.tolist() for w in model.get_weights()]}


def _first_run_killed(ns, case, folder, note, preempted) -> dict:
    """The grader's first run: a fresh process that runs the submission's cells again, killed with SIGKILL from
    ``on_step`` (which runs here, in the grader) the moment the run reports step ``crash_at``."""
    from gpucourse.grading.items import KernelLost, ProcessKilled, RaisedInKernel

    try:
        with ns.fresh_process() as first:
            def on_step(k):
                note(k)
                if k == case["crash_at"]:
                    first.kill()

            first.kernel(_q5_launch, case, folder, preempted, on_step, False)
            return {"first": "finished", "first_error": ""}
    except ProcessKilled:
        return {"first": "killed", "first_error": ""}
    except RaisedInKernel as exc:
        if exc.type_name == "NotDefined":
            return {"first": "missing", "first_error": ""}
        return {"first": "raised", "first_error": f"{exc.type_name}: {exc}"[:300]}
    except KernelLost as exc:
        return {"first": "died", "first_error": str(exc)[:300]}


@in_kernel
def _first_run_simulated(ns, case, folder, note, preempted) -> dict:
    """check()'s first run, in this kernel: on_step raises after ``crash_at`` (a BaseException). ``note(k)`` tells
    the check each step."""
    import numpy as np

    from gpucourse import distribute

    fn = ns.function("train_resumable")
    strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])  # 2 replicas are enough here
    model, optimizer, step_fn, data = _fresh_run(strategy, case, case["kernel"], case["bias"])
    at_kill = []

    def fail_after(k):
        note(k)
        if k == case["crash_at"]:
            at_kill.extend(v.numpy().copy() for v in model.variables + optimizer.variables)
            raise _WorkerKilled(f"simulated failure after step {k}")

    try:
        fn(strategy, model, optimizer, step_fn, data, case["steps"], folder, case["save_every"], preempted,
           fail_after)
        first = "finished"
    except _WorkerKilled:
        first = "killed"
    if first == "killed" and at_kill and any(not np.array_equal(a, v.numpy()) for a, v in
                                             zip(at_kill, model.variables + optimizer.variables)):
        first = "went on"  # a dead worker trains no further
    return {"first": first, "first_error": ""}


def _progress_text(case, progress) -> str:
    """How far q5's runs got when the item's time ran out, and what that suggests (busy machine or a loop)."""
    import time

    first, second, steps = progress.get("first", []), progress.get("second"), case["steps"]
    if any(isinstance(k, int) and k > steps for k in (second or []) + first):
        return tr("Your training went on past step {steps} (on_step saw step {k}): it does not stop. Train "
                  "exactly until step `steps`, and do not .repeat() the dataset.", steps=steps,
                  k=max(k for k in (second or []) + first if isinstance(k, int)))
    where = tr("The first run had reached step {k} (the check stops it after step {crash}).",
               k=first[-1] if first else 0, crash=case["crash_at"])
    if second is not None:
        where = tr("The restart had reached step {k} of {steps}.", k=second[-1] if second else "-", steps=steps)
    if "at" not in progress:
        return where + " " + tr("on_step was never called: look for an endless loop before the first step, or an "
                                "iterator that never ends.")
    idle = time.monotonic() - progress["at"]
    if idle < 15:
        return where + " " + tr("Your code was still making progress ({idle:.0f} s since the last on_step), so "
                                "the machine is probably busy, or slow experiments ran before: run the check "
                                "again.", idle=idle)
    return where + " " + tr("Nothing happened for the last {idle:.0f} s (no on_step): look for an endless loop, or "
                            "an iterator that never ends (e.g. a dataset with .repeat()).", idle=idle)


#: What the restart's launch reads of the case (``_q5_launch`` with ``restart=True``, ``_fresh_run``).
_RESTART_KEYS = ("steps", "save_every", "gbs", "lr", "momentum", "x", "y_restart", "fresh_kernel", "bias")


@item("q5", points=3, title="train_resumable: checkpoint when due or preempted, resume with the whole loss history")
class q5:
    def cases(rng):
        every, steps = rng.choice([3, 4]), rng.randint(9, 10)
        # The platform's notice comes after a step that is not due (at least one periodic checkpoint before it),
        # and the kill a step or more later, before the next due step: so the notice's checkpoint is the latest,
        # and the steps between it and the kill are trained twice.
        options = [(notice, kill) for notice in range(every + 1, steps) if notice % every
                   for kill in range(notice + 1, steps) if all(k % every for k in range(notice, kill + 1))]
        notice, kill = rng.choice(options)
        feats, outs, gbs = rng.randint(2, 4), rng.randint(1, 2), rng.choice([8, 12])
        return [{"steps": steps, "save_every": every, "notice_at": notice, "crash_at": kill, "gbs": gbs, "lr": 0.05,
                 "momentum": 0.9, "x": _matrix(rng, steps * gbs, feats), "y": _matrix(rng, steps * gbs, outs),
                 "kernel": _matrix(rng, feats, outs, 0.5), "bias": [0.0] * outs,
                 "fresh_kernel": _matrix(rng, feats, outs, 0.5),
                 # the restart's data: other targets, so only a restart that trains (from what was saved on
                 # disk) ends at the right weights, not one that replays a run kept in memory
                 "y_restart": _matrix(rng, steps * gbs, outs)}]

    def observe(ns, case):
        import shutil
        import time

        ns.function("train_resumable")  # not defined yet: not attempted
        folder = ns.kernel(_q5_folder)
        progress: dict = {"first": [], "folders": [], "asked": []}

        def note_first(k):  # runs here, where the check runs: what is on disk when on_step(k) is called
            progress["first"].append(k)
            progress["at"] = time.monotonic()
            progress["folders"].append(_folder_state(folder))

        def preempted(k):  # the platform's notice, after step notice_at of the first run only
            progress["asked"].append(k)
            return k == case["notice_at"]

        def never(k):
            return False

        def note_second(k):
            progress["second"].append(k)
            progress["at"] = time.monotonic()

        try:
            if ns.fresh_process is not None:  # the grader: a real process, killed with SIGKILL
                first = _first_run_killed(ns, case, folder, note_first, preempted)
            else:  # check(): the kill simulated in this kernel
                first = ns.kernel(_first_run_simulated, case, folder, note_first, preempted)
            # The restart: a new process would build everything again, from *other* initial weights, and here
            # the data after the checkpoint differs too. It gets only what it needs: not the first run's initial
            # weights or targets, which a restart that replays instead of restoring would use.
            progress["second"] = []
            end = ns.kernel(_q5_launch, {k: case[k] for k in _RESTART_KEYS}, folder, never, note_second, True)
            return {**first, "first_steps": progress["first"], "first_folders": progress["folders"],
                    "asked": progress["asked"], "second_steps": progress["second"], "losses": end["losses"],
                    "weights": end["weights"]}
        except ItemTimeout:  # say how far the runs got: a busy machine is not an endless loop
            raise ItemTimeout(_progress_text(case, progress)) from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def judge(case, seen):
        import numpy as np

        steps, every, notice, crash = case["steps"], case["save_every"], case["notice_at"], case["crash_at"]
        gbs = case["gbs"]
        batches = [(case["x"][k * gbs:(k + 1) * gbs], case["y"][k * gbs:(k + 1) * gbs]) for k in range(steps)]
        where = tr("(steps={steps}, save_every={every}, preempted({notice}) True, killed after step {crash})",
                   steps=steps, every=every, notice=notice, crash=crash)
        if seen["first"] == "went on":
            raise Fail(tr("the check killed the first run after step {crash}, yet its model and optimizer changed "
                          "afterwards: a killed worker trains no further. Let what on_step raises propagate; after "
                          "the restart only what was saved on disk is left.", crash=crash))
        if seen["first"] == "missing":
            raise Fail(tr("the grader runs your notebook's cells again in a fresh process, as a restarted worker "
                          "runs its program again, and `train_resumable` was not defined there. Define it in a "
                          "code cell that runs without errors from a fresh start."))
        error = seen.get("first_error") or "-"
        if seen["first"] == "raised":
            raise Fail(tr("the first run should train until the check kills its process after step {crash}, but "
                          "train_resumable raised {error}", crash=crash, error=error))
        if seen["first"] == "died":
            raise Fail(tr("the first run's process ended before the check killed it after step {crash} ({error})",
                          crash=crash, error=error))
        if seen["first"] != "killed" or seen["first_steps"] != list(range(1, crash + 1)):
            raise Fail(tr("the first run should call on_step(k) after each step k = 1, 2, ... and let what on_step "
                          "raises propagate; the check kills the run after step {crash}. on_step saw {saw} and the "
                          "run {ended}.", crash=crash, saw=seen["first_steps"][:12],
                          ended=tr("ended normally") if seen["first"] == "finished" else tr("was killed")))
        folders = seen.get("first_folders") or []

        def saved_at(k):  # the checkpoint folder changed between on_step(k - 1) and on_step(k)
            return len(folders) >= k and folders[k - 1] != folders[k - 2]

        for k in sorted(set(range(every, crash + 1, every)) | {notice}):  # due: its checkpoint is already on disk
            if len(folders) > k and not saved_at(k) and saved_at(k + 1):
                raise Fail(tr("when on_step({k}) was called, the checkpoint of step {k} was not on disk yet (the "
                              "checkpoint folder had not changed since on_step({prev})). Save first, then call "
                              "on_step(k): a worker killed right after on_step(k) would otherwise lose that "
                              "checkpoint.", k=k, prev=k - 1))
        want_steps = list(range(notice + 1, steps + 1))
        got_steps = seen["second_steps"]
        if got_steps != want_steps:
            start = got_steps[0] - 1 if got_steps and isinstance(got_steps[0], int) else None
            if start == (notice // every) * every and not saved_at(notice):
                hint = tr("preempted({notice}) was True, but no checkpoint was written after step {notice}: the "
                          "platform's notice is the last chance to save what the steps since step {start} "
                          "learned.", notice=notice, start=start)
                if notice not in seen.get("asked", []):
                    hint += " " + tr("preempted(k) was never called for step {notice}: ask after every step.",
                                     notice=notice)
            elif start is not None and notice < start <= crash:
                hint = tr("A checkpoint was written after step {start}, which was not due: save every save_every "
                          "steps and after a step k for which preempted(k) is True, no more.", start=start)
            elif start == 0:
                hint = tr("Restore the latest checkpoint (model, optimizer, the step counter and the loss history) "
                          "before training.")
            else:
                hint = tr("Restore the LATEST checkpoint, and keep the step counter in it.")
            raise Fail(tr("after the restart {where} training should continue at step {step} (the latest "
                          "checkpoint is the one written after step {notice}, on the platform's notice) and call "
                          "on_step for steps {want}; it called it for {got}. {hint}", where=where, step=notice + 1,
                          notice=notice, want=want_steps, got=got_steps[:12], hint=hint))
        later = [(case["x"][k * gbs:(k + 1) * gbs], case["y_restart"][k * gbs:(k + 1) * gbs]) for k in range(steps)]
        trained = batches[:notice] + later[notice:]  # the restart trains on its own data
        ref_losses, w, b, _ = _sgd_linear(case["kernel"], case["bias"], trained, case["lr"], case["momentum"])
        got_w = [np.array(a) for a in seen["weights"]]

        def close(pair):
            return max(float(np.abs(g - r).max()) for g, r in zip(got_w, pair)) <= 1e-3

        if close((w, b)):
            _q5_judge_losses(case, seen["losses"], ref_losses)
            return
        # Diagnose with the wrong answers the classic mistakes give.
        _, w0, b0, vel = _sgd_linear(case["kernel"], case["bias"], batches[:notice], case["lr"], case["momentum"])
        _, nw, nb, _ = _sgd_linear(w0, b0, later[notice:], case["lr"], case["momentum"])  # momentum lost
        _, dw, db, _ = _sgd_linear(w0, b0, later[:steps - notice], case["lr"], case["momentum"], vel)  # no skip
        if close((nw, nb)):
            hint = tr("The optimizer's momentum was not restored: put the optimizer in the checkpoint "
                      "(tf.train.Checkpoint(model=model, optimizer=optimizer, ...)).")
        elif close((dw, db)):
            hint = tr("After resuming at step {step} the run trained on the first batches again: skip the "
                      "{resume} batches already trained on (dataset.skip(...)).", step=notice + 1, resume=notice)
        else:
            hint = tr("Checkpoint model, optimizer and step counter together, restore all three, and skip the "
                      "batches already seen.")
        raise Fail(tr("after the restart {where} the final weights differ from an uninterrupted run of {steps} "
                      "steps (on the restart's own data after step {resume}) by up to {diff:.2g}. {hint}",
                      where=where, steps=steps, resume=notice,
                      diff=max(float(np.abs(g - r).max()) for g, r in zip(got_w, (w, b))), hint=hint))


def _q5_judge_losses(case, got, want) -> None:
    """The returned history: the loss of every step whose update the final weights hold (steps 1..notice_at from
    the killed run, the rest from the restart), not the killed run's losses of the steps it trained in vain."""
    import numpy as np

    steps, notice, crash, gbs = case["steps"], case["notice_at"], case["crash_at"], case["gbs"]
    numbers = isinstance(got, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in got)
    if numbers and len(got) == steps and np.allclose(got, want, rtol=1e-3, atol=1e-6):
        return
    if numbers and len(got) == steps - notice and np.allclose(got, want[notice:], rtol=1e-3, atol=1e-6):
        raise Fail(tr("the final weights are right, but train_resumable returned only the losses of the steps this "
                      "call trained ({n} of them). Return the losses of all {steps} steps: the first {notice} were "
                      "trained by the killed run, and only what it saved on disk survived, so keep them with the "
                      "checkpoint.", n=len(got), steps=steps, notice=notice))
    if numbers and len(got) == steps and np.allclose(got[:notice], want[:notice], rtol=1e-3, atol=1e-6):
        batches = [(case["x"][k * gbs:(k + 1) * gbs], case["y"][k * gbs:(k + 1) * gbs]) for k in range(crash)]
        _, w0, b0, vel = _sgd_linear(case["kernel"], case["bias"], batches[:notice], case["lr"], case["momentum"])
        stale, *_ = _sgd_linear(w0, b0, batches[notice:], case["lr"], case["momentum"], vel)
        if np.allclose(got[notice:crash], stale, rtol=1e-3, atol=1e-6):
            raise Fail(tr("the final weights are right, but the losses you returned after step {notice}, up to step "
                          "{crash}, are those of the killed run, whose updates were lost with it (the restart trained those "
                          "steps again, from the checkpoint of step {notice}). Save the history together with the "
                          "checkpoint, so that both describe the same steps.", crash=crash, notice=notice))
    raise Fail(tr("the final weights are right, but train_resumable should return the losses of all {steps} steps "
                  "(a list of floats, step 1 first), as the run that produced these weights computed them; got "
                  "{got}", steps=steps, got=str(got)[:160]))
