"""Lab 03 (memory): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side, ``observe`` calls the learner's
function in the learner's kernel and returns plain data, and ``judge``
computes the expected answer on the grader's side:

* q1: random Keras models (with BatchNormalization, in float32 and in float16
  or float64) and every Keras 3 optimizer that keeps per-parameter state; the
  judge rebuilds the model and the optimizer with Keras and counts what Keras
  really allocates.
* q2: random memory models (batch -> bytes) as an allocator reports them:
  rounded, flat at small batches on a CPU, sometimes bending up, raising an
  out-of-memory error past the device. The check counts what the search spends
  (the batch sizes it measures) and the judge knows the formula.
* q6: a real training step of a random MLP, and a step whose one tensor has a
  secret width, measured by the learner with the allocator's statistics; the
  check reads the allocator around each call of the step (in the kernel) and the
  judge bounds what the step's shapes can need.
* q3: random (effective batch, largest micro-batch) pairs.
* q4: random data and initial weights; the judge trains the same linear model
  with plain SGD in NumPy.
* q5: random GPU sizes, splits and reserves; the judge does the arithmetic in MiB.

Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import contextlib
import math

from gpucourse.grading.items import Fail, expect_raised, in_kernel, item, outcome, tr

MiB = 2**20


def _type_name(value) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


# --------------------------------------------------------------------------- q1

#: (label, optimizer class, keyword arguments); every Keras 3 optimizer that keeps per-parameter state,
#: with the options that add state. Classes missing from an older Keras are skipped.
_OPTIMIZERS = [
    ("SGD()", "SGD", {}),
    ("SGD(momentum=0.9)", "SGD", {"momentum": 0.9}),
    ("SGD(momentum=0.9, nesterov=True)", "SGD", {"momentum": 0.9, "nesterov": True}),
    ("Adam()", "Adam", {}),
    ("Adam(amsgrad=True)", "Adam", {"amsgrad": True}),
    ("AdamW()", "AdamW", {}),
    ("AdamW(amsgrad=True)", "AdamW", {"amsgrad": True}),
    ("RMSprop()", "RMSprop", {}),
    ("RMSprop(momentum=0.9)", "RMSprop", {"momentum": 0.9}),
    ("RMSprop(centered=True)", "RMSprop", {"centered": True}),
    ("RMSprop(momentum=0.5, centered=True)", "RMSprop", {"momentum": 0.5, "centered": True}),
    ("Adagrad()", "Adagrad", {}),
    ("Adadelta()", "Adadelta", {}),
    ("Adamax()", "Adamax", {}),
    ("Nadam()", "Nadam", {}),
    ("Ftrl()", "Ftrl", {}),
    ("Lion()", "Lion", {}),
    ("Lamb()", "Lamb", {}),
    ("Adafactor()", "Adafactor", {}),
    ("Muon()", "Muon", {}),
]


def _model_spec(rng, dtype: str) -> dict:
    n_hidden = rng.randint(1, 3)
    bn_at = rng.randrange(n_hidden)  # at least one BatchNormalization: non-trainable moving statistics
    hidden = [{"units": rng.randint(2, 16), "bias": rng.random() < 0.8, "bn": i == bn_at or rng.random() < 0.4}
              for i in range(n_hidden)]
    return {"d_in": rng.randint(3, 12), "hidden": hidden, "out": rng.randint(1, 4), "dtype": dtype}


def _build_model(spec: dict):
    import keras

    dtype = spec["dtype"]
    layers = [keras.Input((spec["d_in"],))]
    for h in spec["hidden"]:
        layers.append(keras.layers.Dense(h["units"], use_bias=h["bias"], dtype=dtype))
        if h["bn"]:
            layers.append(keras.layers.BatchNormalization(dtype=dtype))
    layers.append(keras.layers.Dense(spec["out"], dtype=dtype))
    return keras.Sequential(layers)


def _build_optimizer(opt: dict):
    import keras

    return getattr(keras.optimizers, opt["cls"])(**opt["kwargs"])


def _nbytes(variables, itemsize: int | None = None) -> int:
    import numpy as np

    return sum(int(np.prod(v.shape)) * (itemsize or np.dtype(v.dtype).itemsize) for v in variables)


@in_kernel
def _q1_observe(ns, case):
    fn = ns.function("training_state_bytes")
    model = _build_model(case["model"])
    got = []
    for opt in case["optimizers"]:
        value = fn(model, _build_optimizer(opt))  # a fresh, unbuilt optimizer each time
        got.append({"got": value, "type": _type_name(value)})
    return {"results": got}


@item("q1", points=2, title="training_state_bytes counts weights, gradients and optimizer state")
class q1:
    def cases(rng):
        import keras

        acc = rng.randint(2, 6)
        opts = [(label, cls, kw) for label, cls, kw in _OPTIMIZERS if hasattr(keras.optimizers, cls)]
        opts += [(f"Adam(gradient_accumulation_steps={acc})", "Adam", {"gradient_accumulation_steps": acc}),
                 (f"SGD(gradient_accumulation_steps={acc})", "SGD", {"gradient_accumulation_steps": acc}),
                 (f"RMSprop(momentum=0.9, gradient_accumulation_steps={acc})", "RMSprop",
                  {"momentum": 0.9, "gradient_accumulation_steps": acc})]
        opts = [{"label": label, "cls": cls, "kwargs": kw} for label, cls, kw in opts]
        rng.shuffle(opts)
        # Every optimizer once, split between a float32 model and a float16 or float64 one (bytes per value).
        half = len(opts) // 2
        return [{"model": _model_spec(rng, "float32"), "optimizers": opts[:half]},
                {"model": _model_spec(rng, rng.choice(["float16", "float64"])), "optimizers": opts[half:]}]

    def observe(ns, case):
        return ns.kernel(_q1_observe, case)

    def judge(case, seen):
        model = _build_model(case["model"])
        weights, grads = _nbytes(model.weights), _nbytes(model.trainable_weights)
        frozen = weights - grads
        dtype = case["model"]["dtype"]
        shapes = [tuple(w.shape) for w in model.weights]
        for opt, res in zip(case["optimizers"], seen["results"]):
            got, label = res["got"], opt["label"]
            if res["type"] not in ("int", "int64", "int32"):
                raise Fail(tr("training_state_bytes should return a whole number of bytes (int), got {got} "
                              "({kind}) for keras.optimizers.{label}", got=repr(got), kind=res["type"], label=label))
            optimizer = _build_optimizer(opt)
            optimizer.build(model.trainable_variables)
            state = [v for v in optimizer.variables if len(v.shape)]
            scalars = [v for v in optimizer.variables if not len(v.shape)]
            accumulators = [v for v in state if "gradient_accumulator" in v.path]
            slots = _nbytes(state)
            want = weights + grads + slots
            if got == want:
                continue
            where = tr("for a {dtype} model with weights {shapes} ({weights} bytes, {grads} of them trainable) and "
                       "keras.optimizers.{label}", dtype=dtype, shapes=shapes, weights=weights, grads=grads,
                       label=label)
            if got == want - grads and accumulators:  # an accumulator has exactly the gradients' size
                hint = tr("You left out the gradients (one per trainable weight) or the gradient accumulator (with "
                          "gradient_accumulation_steps the optimizer keeps one more parameter-sized variable per "
                          "trainable weight): they take the same bytes.")
            elif got == want - grads:
                hint = tr("You left out the gradients: every trainable weight gets one, of the same size.")
            elif frozen and got == want - frozen:
                hint = tr("You left out the non-trainable weights (BatchNormalization's moving mean and variance): "
                          "count all of model.weights, and gradients for model.trainable_weights only.")
            elif frozen and got == want + frozen:
                hint = tr("Only trainable weights get gradients: count them over model.trainable_weights, not "
                          "model.weights.")
            elif scalars and got == want + _nbytes(scalars):
                hint = tr("You counted the optimizer's scalar variables (iteration counter, learning rate): count "
                          "only its per-parameter state, the variables with a shape.")
            elif dtype != "float32" and got == _nbytes(model.weights, 4) + _nbytes(model.trainable_weights, 4) \
                    + _nbytes(state, 4):
                hint = tr("You assumed 4 bytes per value; these weights are {dtype}: use each variable's dtype "
                          "(np.dtype(v.dtype).itemsize).", dtype=dtype)
            else:
                hint = tr("Expected {weights} (weights) + {grads} (gradients) + {slots} (optimizer state) bytes; "
                          "build a copy of the optimizer on the trainable weights and look at its variables.",
                          weights=weights, grads=grads, slots=slots)
            raise Fail(tr("{where}: expected {want} bytes, got {got}. {hint}", where=where, want=want, got=got,
                          hint=hint))


# --------------------------------------------------------------------------- q2


def _need(params: dict, n: int) -> int:
    """The peak of one step at batch ``n`` as an allocator reports it: the state, plus activations that grow a
    little faster than a line (``quad``), counted only from 256 KiB on when ``hidden`` (a CPU with oneDNN leaves
    smaller tensors out), rounded up to 256 bytes (the allocators' granularity)."""
    act = params["per"] * n + params["quad"] * n * n
    if act < params["hidden"]:
        act = 0
    return -(-(params["fixed"] + act) // 256) * 256


def _largest(case: dict) -> int | None:
    """The answer, by bisection on the (never decreasing) memory model; None if not even a batch of 1 fits."""
    if _need(case, 1) > case["budget"]:
        return None
    lo, hi = 1, case["max_batch"]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _need(case, mid) <= case["budget"] else (lo, mid - 1)
    return lo


def _allowed_cost(answer: int | None) -> int:
    """Examples the search may spend: 8 x the answer + 64.

    Why 8: a search that predicts the next size from the bytes it measured (a line through its two nearest
    measurements, checked against the budget) spends 2 to 6 x the answer on these models (measured on 48,000
    random cases: the answer itself, the size above it, and one or two predictions that overshoot when the
    model bends upwards). Doubling then bisecting spends the doubling (2 to 4 x the answer) plus about
    log2(answer) bisection steps of about the answer each: more than 10 x on every case here with an answer of
    300 or more. The + 64 leaves room for a few cheap small measurements.
    """
    return 8 * (answer or 1) + 64


#: The check stops a search that spends this much (a search one size at a time would run for minutes).
def _stop_cost(answer: int | None) -> int:
    return 40 * (answer or 1) + 4096


@item("q2", points=3, title="largest_batch finds the biggest batch within budget, spending few examples")
class q2:
    def cases(rng):
        out = []
        for k in range(8):
            hidden = k in (4, 6) or (k > 6 and rng.random() < 0.5)
            # Activation bytes per example; with hidden, under 128 KiB: batches 1 and 2 measure the same.
            per = rng.randint(16, 100) * 1024 if hidden else rng.randint(20, 4000) * 1024
            target = rng.choice([rng.randint(300, 3000), rng.randint(3000, 60000)])
            cap = {0: "at", 1: "none", 2: "above", 3: "none"}.get(k, rng.choice(["none", "at", "above"]))
            # An upward bend of at most 5% at the answer, never where batches over the budget have no number.
            quad = 0 if cap == "at" else rng.choice([0, rng.randint(0, per // (20 * target))])
            p = {"fixed": rng.randint(10, 500) * MiB, "per": per, "quad": quad,
                 "hidden": 256 * 1024 if hidden else 0}
            max_batch = rng.choice([2 * target, 100_000, 1_000_000])
            if k == 1:  # everything up to max_batch fits
                max_batch = rng.randint(max(2, target // 4), target - 1)
            # k == 3: the budget is exactly the peak of the answer (it fits: <=).
            budget = _need(p, target) + (0 if k == 3 else rng.randint(0, per - 1))
            # "at": every batch over the budget raises ResourceExhaustedError instead of returning a number.
            capacity = {"none": None, "at": budget,
                        "above": budget + rng.randint(1, 3) * per * max(1, target // 4)}[cap]
            out.append({**p, "max_batch": max_batch, "budget": budget, "capacity": capacity})
        p = {"fixed": rng.randint(10, 500) * MiB, "per": rng.randint(20, 4000) * 1024, "quad": 0, "hidden": 0}
        out.append({**p, "max_batch": rng.randint(100, 5000), "budget": p["fixed"] // 2, "capacity": None})
        return out

    def observe(ns, case):
        import tensorflow as tf

        fn = ns.function("largest_batch")
        calls, bad, stopped = [], [], []
        stop = _stop_cost(_largest(case))

        def peak_bytes(n):
            # Runs here, where the check runs (under the grader: its observer process): the learner's code gets a
            # stand-in that calls back, so the memory model, the calls and their cost stay out of its reach.
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= case["max_batch"]:
                bad.append(repr(n))
                raise TypeError(f"a batch size must be a whole number from 1 to max_batch, got {n!r}")
            if sum(c for c, _ in calls) + n > stop or len(calls) >= 300:
                stopped.append(n)
                raise RuntimeError("the check stopped the search: it spent far more examples than allowed")
            used = _need(case, n)
            if case["capacity"] is not None and used > case["capacity"]:
                calls.append((n, None))
                raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor for batch {n}")
            calls.append((n, used))
            return used

        result = outcome(lambda: fn(peak_bytes, case["budget"], case["max_batch"]))
        return {"result": result, "calls": [n for n, _ in calls], "bad": bad[:3], "stopped": bool(stopped),
                "type": _type_name(result.get("value"))}

    def judge(case, seen):
        mx, budget, calls = case["max_batch"], case["budget"], seen["calls"]
        formula = (f"peak_bytes(n) = {case['fixed']} + {case['per']}*n"
                   + (f" + {case['quad']}*n^2" if case["quad"] else "")
                   + (" (activations counted from 256 KiB on)" if case["hidden"] else "")
                   + ", rounded up to 256 bytes")
        desc = tr("{formula}, budget {budget}, max_batch {max_batch}", formula=formula, budget=budget, max_batch=mx)
        res, want = seen["result"], _largest(case)
        spent, allowed = sum(calls), _allowed_cost(want)
        no_number = tr(" Here every batch over the budget runs out of memory, so no measurement above the budget "
                       "has a number to interpolate with: aim from below, along the line through the two largest "
                       "batches you measured to fit.") if case["capacity"] == budget else ""
        if seen["bad"]:
            raise Fail(tr("for {desc}: you called peak_bytes({arg}); a batch size is a whole number from 1 to "
                          "max_batch (with //, not /)", desc=desc, arg=seen["bad"][0]))
        if seen["stopped"]:
            raise Fail(tr("for {desc}: the check stopped your search after {count} measurements of {spent} "
                          "examples in all; at most {allowed} (8 x the answer + 64) are allowed. Each measurement "
                          "tells you how many bytes a batch needs: use them to aim at the budget.", desc=desc,
                          count=len(calls), spent=spent, allowed=allowed) + no_number)
        if res.get("raised") == "ResourceExhaustedError":
            raise Fail(tr("for {desc}: peak_bytes raised ResourceExhaustedError ({message}) and your "
                          "function let it escape: catch tf.errors.ResourceExhaustedError and treat that batch as "
                          "'does not fit'", desc=desc, message=res["message"][:80]))
        if want is None:
            return expect_raised(res, tr("for {desc}, largest_batch", desc=desc),
                                 "not even a batch of 1 fits the budget")
        if "raised" in res:
            values = [_need(case, n) for n in calls]
            flat = tr(" peak_bytes gave {value} bytes for every batch you measured ({sizes}): at small batches the "
                      "counters may not grow at all (a CPU leaves out tensors under 256 KiB), so try a larger batch "
                      "before you take a slope.", value=values[0], sizes=calls) \
                if len(calls) > 1 and len(set(values)) == 1 else ""
            raise Fail(tr("for {desc}: your function raised {raised}: {message}", desc=desc, raised=res["raised"],
                          message=res["message"]) + flat)
        got = res["value"]
        if seen["type"] not in ("int", "int64", "int32"):
            raise Fail(tr("for {desc}: largest_batch should return a whole number (int), got {got}", desc=desc,
                          got=repr(got)))
        if got > mx:
            raise Fail(tr("for {desc}: returned {got}, more than max_batch={max_batch}; the answer is at most "
                          "max_batch", desc=desc, got=got, max_batch=mx))
        unmeasured = [n for n in ([got] if got == mx else [got, got + 1]) if n not in calls]
        if unmeasured:
            raise Fail(tr("for {desc}: you returned {got} without measuring peak_bytes({n}). A prediction is not a "
                          "measurement (the bytes are not exactly on a line): return a batch you measured to fit, "
                          "and measure the next size up too (unless it is max_batch) to know it does not.",
                          desc=desc, got=got, n=unmeasured[0]))
        if got != want:
            hint = ""
            if got == want - 1 and _need(case, want) == budget:
                hint = tr(" peak_bytes({want}) is exactly the budget, and a peak equal to the budget fits: "
                          "compare with <=, not <.", want=want)
            raise Fail(tr("for {desc}: expected {want}, got {got}.{hint}", desc=desc, want=want, got=got, hint=hint))
        if spent > allowed:
            raise Fail(tr("for {desc}: found {got}, but your {count} measurements cost {spent} examples (a step on n "
                          "examples costs n); at most {allowed} (8 x the answer + 64) are allowed. Bisection spends "
                          "about the answer on each of about log2(answer) steps: use the bytes each measurement "
                          "returned to aim at the budget.", desc=desc, got=got, count=len(calls), spent=spent,
                          allowed=allowed) + no_number)


# --------------------------------------------------------------------------- q3


@item("q3", points=2, title="accumulation_plan reaches the effective batch in the fewest steps")
class q3:
    def cases(rng):
        pairs = [(256, 256), (256, 100), (96, 40), (7, 3), (1, 1), (12, 5)]
        pairs += [(rng.randint(2, 1024), rng.randint(1, 300)) for _ in range(30)]
        return [{"effective": e, "max": m} for e, m in pairs] + [{"effective": e, "max": m, "bad": True}
                                                                for e, m in [(0, 8), (8, 0), (-4, 2)]]

    def observe(ns, case):
        fn = ns.function("accumulation_plan")
        res = outcome(lambda: fn(case["effective"], case["max"]))
        value = res.get("value")
        kinds = [_type_name(v) for v in value] if isinstance(value, (list, tuple)) else None
        return {"result": res, "kinds": kinds}

    def judge(case, seen):
        eff, mx, res = case["effective"], case["max"], seen["result"]
        call = f"accumulation_plan({eff}, {mx})"
        if case.get("bad"):
            return expect_raised(res, call, "batch sizes must be >= 1")
        if "raised" in res:
            raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=res["raised"], message=res["message"]))
        got, kinds = res["value"], seen["kinds"]
        if kinds is None or len(kinds) != 2 or any(k not in ("int", "int64", "int32") for k in kinds):
            raise Fail(tr("accumulation_plan should return a tuple (micro_batch, steps) of two ints, got {got}",
                          got=repr(got)))
        micro, steps = got
        want_steps = next(s for s in range(1, eff + 1) if eff % s == 0 and eff // s <= mx)
        want = [eff // want_steps, want_steps]
        if got == want:
            return
        if [steps, micro] == want:  # either swapped, or a valid plan with too many steps: say both
            raise Fail(tr("{call} returned {got}. If you meant (steps, micro_batch), return (micro_batch, "
                          "steps) instead. Read as (micro_batch, steps), it takes {steps} steps where {want_steps} "
                          "step(s) of {want_micro} also add up and fit: fewer steps means fewer, larger micro-batches.",
                          call=call, got=tuple(got), steps=steps, want_steps=want[1], want_micro=want[0]))
        if micro * steps != eff:
            raise Fail(tr("{call} returned micro_batch={micro}, steps={steps}: {micro} x {steps} = {product}, "
                          "not the effective batch {eff}; the micro-batch must divide it exactly", call=call,
                          micro=micro, steps=steps, product=micro * steps, eff=eff))
        if micro > mx:
            raise Fail(tr("{call} returned micro_batch={micro}, more than max_batch={max_batch}: accumulate over "
                          "several smaller micro-batches", call=call, micro=micro, max_batch=mx))
        raise Fail(tr("{call} returned {steps} steps; {want_steps} step(s) of {want_micro} also add up and fit, "
                      "and fewer steps means fewer, larger micro-batches", call=call, steps=steps,
                      want_steps=want_steps, want_micro=eff // want_steps))


# --------------------------------------------------------------------------- q4


def _reference_sgd(w, b, x, y, lr, batch):
    """Plain mini-batch SGD on a linear model with mean-squared-error loss, in NumPy (float64)."""
    import numpy as np

    w, b = np.array(w, "float64"), np.array(b, "float64")
    x, y = np.array(x, "float64"), np.array(y, "float64")
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        err = xb @ w + b - yb
        w -= lr * 2 * xb.T @ err / err.size
        b -= lr * 2 * err.sum(axis=0) / err.size
    return w, b


def _TrainingPasses():
    """A pass-through Keras layer that counts training passes and their smallest and largest batch (in variables
    of the model: its compiled training step updates them, whichever way the learner runs it)."""
    import keras
    import tensorflow as tf

    class TrainingPasses(keras.layers.Layer):
        def build(self, shape):
            self.stats = self.add_weight(shape=(3,), initializer="zeros", trainable=False, dtype="int64",
                                         name="passes")
            self.stats.assign([0, 0, 2**62])
            # the first feature of the first row of the first training pass: x[0][0] when trained in order
            self.head = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype=self.compute_dtype,
                                        name="head")

        def call(self, x, training=None):
            if training:
                rows = tf.cast(tf.shape(x)[0], "int64")
                s = self.stats
                self.head.assign(tf.where(s[0] == 0, tf.cast(x[0, 0], self.head.dtype), self.head))
                s.assign(tf.stack([s[0] + 1, tf.maximum(s[1], rows), tf.minimum(s[2], rows)]))
            return x

        def seen(self):
            n, hi, lo = (int(v) for v in self.stats.numpy())
            return [n, hi, lo if n else 0]

        def first_value(self):
            return float(self.head.numpy())

    return TrainingPasses()


def _why_weights_differ(case, seen) -> str:
    """The mistake behind wrong weights, from what the model and its optimizer say about the training."""
    import numpy as np

    optimizer, lr, momentum = seen.get("optimizer"), seen.get("lr"), seen.get("momentum")
    if optimizer != "SGD":
        return tr("Your model.optimizer is {optimizer}: the check compares with plain SGD, whose update is the "
                  "learning rate times the averaged gradient. Compile with keras.optimizers.SGD(learning_rate, "
                  "gradient_accumulation_steps=...).", optimizer=optimizer)
    if momentum:
        return tr("The SGD has momentum={momentum:g}: plain SGD has none (leave momentum at 0).", momentum=momentum)
    if lr is not None and not math.isclose(lr, case["lr"], rel_tol=1e-5):
        return tr("The optimizer's learning rate is {got:g}, not the learning_rate={lr} you were given. Keras "
                  "averages the accumulated gradients (it does not add them up), so the learning rate needs no "
                  "scaling.", got=lr, lr=case["lr"])
    if seen.get("loss") not in _MSE:
        return tr("The model is compiled with the loss {loss}: use loss='mse' (mean squared error, averaged over "
                  "the batch).", loss=seen.get("loss"))
    if seen.get("first") is not None and not np.isclose(seen["first"], case["x"][0][0], atol=1e-6):
        return tr("The first training batch did not start with the first example: model.fit shuffles by default. "
                  "Pass shuffle=False, so that the batches come in order.")
    return tr("Train in order (shuffle=False) with plain SGD and loss 'mse'.")


@contextlib.contextmanager
def _quiet_tensorflow():
    """TensorFlow's own warnings off (its "triggered tf.function retracing" after a few checks: every check
    builds a fresh model), so that a check prints only its verdict."""
    import logging

    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _loss_name(loss) -> str:
    """What ``model.loss`` is, in words: a string as given, a loss object's or function's name."""
    if isinstance(loss, str):
        return loss
    reduction = getattr(loss, "reduction", None)
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
    return f"{name} (reduction={reduction!r})" if reduction not in (None, "sum_over_batch_size") else str(name)


_MSE = ("mse", "mean_squared_error", "meansquarederror", "MSE", "MeanSquaredError")


@in_kernel
def _q4_observe(ns, case):
    import keras
    import numpy as np
    import tensorflow as tf

    fn = ns.function("train_with_accumulation")
    x, y = np.array(case["x"], "float32"), np.array(case["y"], "float32")
    # The process, not only the end state: a layer in front counts the training passes and the rows they
    # held, and the optimizer says how many (micro-)steps it applied.
    dense, tally = keras.layers.Dense(1), _TrainingPasses()
    model = keras.Sequential([keras.Input((x.shape[1],)), tally, dense])
    dense.set_weights([np.array(case["w0"], "float32"), np.array(case["b0"], "float32")])
    if case.get("bad"):
        box = []
        with _quiet_tensorflow():
            result = outcome(lambda: box.append(fn(model, x, y, case["micro"], case["effective"], case["lr"]))
                             or box[0])
        return {"result": result, "returned_model": bool(box) and box[0] is model}
    # On Ampere and newer GPUs float32 matmuls default to TF32 (10 mantissa bits), which misses the
    # float64 reference by more than 1e-4 about one time in five: grade full float32 arithmetic.
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        with _quiet_tensorflow():
            out = fn(model, x, y, case["micro"], case["effective"], case["lr"])
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    opt = getattr(model, "optimizer", None)
    w, b = dense.get_weights()
    iterations = getattr(opt, "iterations", None)
    try:
        lr = float(np.asarray(opt.learning_rate)) if opt is not None else None
    except (TypeError, ValueError, AttributeError):
        lr = None  # a schedule
    return {"returned_model": out is model, "optimizer": type(opt).__name__ if opt is not None else None,
            "accumulation": getattr(opt, "gradient_accumulation_steps", None), "w": w, "b": b,
            "iterations": int(iterations.numpy()) if hasattr(iterations, "numpy") else None,
            "passes": tally.seen(), "first": tally.first_value(), "lr": lr,
            "momentum": float(getattr(opt, "momentum", 0.0) or 0.0) if opt is not None else None,
            "loss": _loss_name(getattr(model, "loss", None))}


@item("q4", points=3, title="train_with_accumulation matches one big-batch step per effective batch")
class q4:
    def cases(rng):
        out = []
        for micro, steps in [(rng.randint(2, 8), rng.randint(2, 4)), (rng.randint(4, 12), 1)]:
            d, eff = rng.randint(3, 8), micro * steps
            n = eff * rng.randint(2, 3)
            true_w = [rng.gauss(0, 1) for _ in range(d)]
            x = [[round(rng.gauss(0, 1), 4) for _ in range(d)] for _ in range(n)]
            y = [[round(sum(a * t for a, t in zip(row, true_w)) + rng.gauss(0, 1), 4)] for row in x]
            out.append({"micro": micro, "effective": eff, "lr": 0.05, "x": x, "y": y,
                        "w0": [[round(rng.uniform(-0.5, 0.5), 4)] for _ in range(d)], "b0": [0.0]})
        out.append({"micro": 5, "effective": 12, "lr": 0.1, "bad": True,
                    "x": [[0.0, 0.0]] * 12, "y": [[0.0]] * 12, "w0": [[0.1], [0.2]], "b0": [0.0]})
        return out

    def observe(ns, case):
        return ns.kernel(_q4_observe, case)

    def judge(case, seen):
        import numpy as np

        micro, eff, lr = case["micro"], case["effective"], case["lr"]
        if case.get("bad"):
            call = f"train_with_accumulation(..., micro_batch={micro}, effective_batch={eff}, ...)"
            why = tr("{micro} does not divide {eff}", micro=micro, eff=eff)
            if "raised" not in seen["result"] and seen.get("returned_model"):
                raise Fail(tr("{call} should raise ValueError ({why}), but it trained the model and returned it. "
                              "Check the batch sizes before you compile or train.", call=call, why=why))
            return expect_raised(seen["result"], call, why)
        if not seen["returned_model"]:
            raise Fail(tr("train_with_accumulation should return the model it was given, trained"))
        steps, n = eff // micro, len(case["x"])
        w, b = np.array(seen["w"], "float64"), np.array(seen["b"], "float64")
        want_w, want_b = _reference_sgd(case["w0"], case["b0"], case["x"], case["y"], lr, eff)
        err = float(max(np.abs(w - want_w).max(), np.abs(b - want_b).max()))
        if err > 1e-4:
            per_micro, _ = _reference_sgd(case["w0"], case["b0"], case["x"], case["y"], lr, micro)
            if steps > 1 and np.abs(w - per_micro).max() < 1e-4:
                raise Fail(tr("with micro_batch={micro} and effective_batch={eff}, your weights match one SGD "
                              "update per micro-batch: the gradients were not accumulated. Give the optimizer "
                              "gradient_accumulation_steps={steps}.", micro=micro, eff=eff, steps=steps))
            where = tr("on {n} random examples with micro_batch={micro}, effective_batch={eff}, learning_rate={lr}: "
                       "the weights differ from {updates} SGD steps with batch {eff} by {err:.3g} (allowed 1e-4).",
                       n=n, micro=micro, eff=eff, lr=lr, updates=n // eff, err=err)
            raise Fail(where + " " + _why_weights_differ(case, seen))
        passes, biggest, smallest = seen.get("passes") or [0, 0, 0]
        if passes != n // micro or biggest != micro or smallest != micro or seen.get("iterations") != n // eff:
            raise Fail(tr("the weights are right, but the training was not {want_passes} passes on micro-batches of "
                          "{micro} and {updates} optimizer updates: the model saw {passes} training pass(es) of "
                          "{smallest} to {biggest} rows and its optimizer made {iterations} update(s). "
                          "Compile the model with keras.optimizers.SGD(learning_rate, gradient_accumulation_steps="
                          "{acc}) and train it on batches of {micro} (not on big batches, nor with another optimizer "
                          "that you replace afterwards).", want_passes=n // micro, micro=micro, updates=n // eff,
                          passes=passes, smallest=smallest, biggest=biggest, iterations=seen.get("iterations"),
                          acc=steps if steps > 1 else None))
        want_acc = steps if steps > 1 else None
        if seen["optimizer"] != "SGD" or seen["accumulation"] != want_acc:
            raise Fail(tr("the weights are right, but with micro_batch={micro} and effective_batch={eff} the model "
                          "should be compiled with keras.optimizers.SGD(learning_rate, gradient_accumulation_steps="
                          "{want_acc}) and trained on batches of {micro}; model.optimizer is {optimizer} with "
                          "gradient_accumulation_steps={accumulation}", micro=micro, eff=eff, want_acc=want_acc,
                          optimizer=seen["optimizer"], accumulation=seen["accumulation"]))


# --------------------------------------------------------------------------- q5


@in_kernel
def _q5_observe(ns, case):
    import tensorflow as tf

    fn = ns.function("virtual_gpus")

    def describe():
        value = fn(case["total"], case["n"], case["reserve"])
        items = None
        if isinstance(value, (list, tuple)):
            items = [{"config": isinstance(c, tf.config.LogicalDeviceConfiguration), "type": _type_name(c),
                      "limit": getattr(c, "memory_limit", None),
                      "limit_type": _type_name(getattr(c, "memory_limit", None))} for c in value]
        return {"type": _type_name(value), "items": items}

    return {"result": outcome(describe)}


@item("q5", points=2, title="virtual_gpus splits a GPU into whole-MiB memory limits")
class q5:
    def cases(rng):
        sizes = [16 * 2**30 - rng.randint(0, 600) * MiB, 15_843_721_216, 40 * 2**30 - rng.randint(0, 900) * MiB,
                 rng.randint(4_000, 81_000) * MiB + rng.randint(0, MiB - 1)]
        out = [{"total": t, "n": rng.randint(2, 8), "reserve": rng.choice([0, 512, 1024, rng.randint(100, 2000)])}
               for t in sizes]
        out.append({"total": 8 * 2**30 + 12345, "n": 3, "reserve": 1000})
        bad = [{"total": 2 * 2**30, "n": 2, "reserve": 2048}, {"total": 16 * 2**30, "n": 0, "reserve": 512},
               {"total": 3 * MiB, "n": 4, "reserve": 0}]
        return out + [{**b, "bad": True} for b in bad]

    def observe(ns, case):
        return ns.kernel(_q5_observe, case)

    def judge(case, seen):
        total, n, reserve = case["total"], case["n"], case["reserve"]
        call = f"virtual_gpus({total}, {n}, reserve_mib={reserve})"
        if case.get("bad"):
            return expect_raised(seen["result"], call, tr("there is not at least 1 MiB for each virtual GPU")
                                 if n >= 1 else tr("n must be >= 1"))
        if "raised" in seen["result"]:
            raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=seen["result"]["raised"],
                          message=seen["result"]["message"]))
        value = seen["result"]["value"]
        items = value["items"]
        if items is None or not all(it["config"] for it in items):
            what = value["type"] if items is None else [it["type"] for it in items][:3]
            raise Fail(tr("{call} should return a list of tf.config.LogicalDeviceConfiguration (what "
                          "set_logical_device_configuration takes), got {what}", call=call, what=what))
        if len(items) != n:
            raise Fail(tr("{call} returned {count} configurations; it should return {n}, one per virtual GPU",
                          call=call, count=len(items), n=n))
        want = (total // MiB - reserve) // n
        limits = [it["limit"] for it in items]
        if all(it["limit_type"] in ("int", "int64") for it in items) and limits == [want] * n:
            return
        got = limits[0]
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise Fail(tr("{call}: memory_limit should be a whole number of MiB, got {got}", call=call, got=repr(got)))
        if got >= 100 * want * 1024:
            hint = tr("{got} is in bytes, but memory_limit takes MiB: TensorFlow would read it as {got} MiB, "
                      "which is no limit at all. Divide bytes by 2**20.", got=got)
        elif got <= 1:
            hint = tr("that is a fraction, but memory_limit is an absolute size in MiB: TensorFlow keeps whole MiB, "
                      "so this virtual GPU could hold nothing.")
        elif reserve and got == total // MiB // n:
            hint = tr("leave reserve_mib={reserve} MiB for the CUDA context and other processes before splitting.",
                      reserve=reserve)
        elif 1.04 < got / want < 1.06:
            hint = tr("that counts MB (10**6 bytes); memory_limit is in MiB (2**20 bytes).")
        elif not all(it["limit_type"] in ("int", "int64") for it in items) or got > want:
            hint = tr("round down to a whole number of MiB (//): the limits must add up to no more than the GPU "
                      "minus the reserve, and TensorFlow truncates a fraction of a MiB anyway.")
        else:
            hint = tr("every virtual GPU gets the same share: (total MiB - reserve_mib) // n.")
        raise Fail(tr("{call}: expected memory_limit={want} (MiB) for each of the {n} virtual GPUs, got {limits}. "
                      "{hint}", call=call, want=want, n=n, limits=limits, hint=hint))


# --------------------------------------------------------------------------- q6


def _q6_device(tf) -> str:
    """The device ``step`` runs on: TensorFlow places it on the first GPU when there is one, else on the CPU."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def _q6_build(case: dict, tf):
    """``run(n)``: one call of the case's step at batch size n (live TensorFlow objects, in the kernel)."""
    m = case["model"]
    if m["kind"] == "activations":
        # A batch of n examples, `width` values each, materialised by one op and reduced: the step's one large
        # tensor is n * width * 4 bytes (the width is the check's secret: only a measurement finds it).
        return lambda n: tf.reduce_sum(tf.random.uniform((n, m["width"])))
    import keras

    keras.utils.set_random_seed(case["seed"])
    model = keras.Sequential([keras.Input((m["d"],))] + [keras.layers.Dense(h, activation="relu") for h in m["hidden"]]
                             + [keras.layers.Dense(m["classes"])])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec((None, m["d"])), tf.TensorSpec((None,), tf.int32)])
    def train(x, y):  # one trace for every batch size
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def run(n):
        x = tf.random.normal((n, m["d"]))
        return train(x, tf.random.uniform((n,), maxval=m["classes"], dtype=tf.int32))

    return run


@in_kernel
def _q6_observe(ns, case):
    import numbers

    import tensorflow as tf

    device = _q6_device(tf)
    try:  # allocator statistics: with oneDNN (the setup cell turns it on) or TensorFlow's BFC allocator
        tf.config.experimental.reset_memory_stats(device)
        tf.config.experimental.get_memory_info(device)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        return {"device": device, "unavailable": f"{type(exc).__name__}: {exc}"}
    with tf.device(device):
        run = _q6_build(case, tf)
        ballast = tf.random.uniform((case["ballast"] // 4,))  # the notebook's other tensors, in use all along
    log = []  # per call of step: n, then current and peak when it started, then when it ended

    def step(n):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise TypeError(f"step takes a batch size, a whole number >= 1, got {n!r}")
        start = tf.config.experimental.get_memory_info(device)
        with tf.device(device):
            loss = run(int(n))
        # On a GPU the kernels may still run, but every tensor of the step was allocated when its op was launched,
        # before the call returned: the allocator's counters are complete here, on a GPU as on a CPU.
        end = tf.config.experimental.get_memory_info(device)
        log.append([int(n), start["current"], start["peak"], end["current"], end["peak"]])
        return loss

    fn = ns.function("batch_that_fits")
    result = outcome(lambda: fn(step, list(case["batches"]), case["budget"], device))
    del ballast
    return {"device": device, "result": result, "log": log}


#: A call of step that started within this of a reset counts as measured from a reset (the learner's code may
#: allocate a little between the reset and the call; on a CPU tensors under 256 KiB are not counted anyway).
_RESET_SLACK = 256 * 1024


def _q6_candidates(log: list, n: int, warmup: bool) -> list[int]:
    """What a right measurement of step(n) reads: for each call of step(n) that started right after a reset (and,
    with ``warmup``, was not the step's first call ever, which traces it and creates the optimizer's state), the
    allocator's peak after it (or after the calls of step(n) that follow it at once: a worst of several) minus what
    was in use when it started."""
    out = []
    for i, (k, current, peak, _, _) in enumerate(log):
        if k != n or (warmup and i == 0) or peak - current > _RESET_SLACK:
            continue
        top = 0
        for j in range(i, len(log)):
            if log[j][0] != n:
                break
            top = max(top, log[j][4])
            out.append(top - current)
    return out


def _q6_close(value: float, target: float) -> bool:
    """Equal up to what the learner's own code may allocate between reading the counters and calling step."""
    return abs(value - target) <= 64 * 1024 + 0.01 * abs(target)


def _q6_window(case: dict, n: int, device: str) -> tuple[int, int]:
    """The least and the most one call of step(n) can need above what was in use, from the step's shapes alone.

    ``activations``: one tensor of n * width * 4 bytes. A BFC allocator (oneDNN's on a CPU, TensorFlow's on a GPU)
    may hand out a free chunk of up to twice the size asked for without splitting it, and counts the whole chunk:
    so from 1x to under 2x the tensor (measured here: 1.0x to 1.94x), plus 1 MiB for the scalar and rounding.

    ``mlp`` (a training step of Dense layers with Adam): at the start of the backward pass the batch and every hidden
    layer's output are alive together (each layer's weight gradient needs its input), so at least 4n(d + sum of
    the hidden widths) bytes; the cases make each of them at least 256 KiB, the size from which a CPU with oneDNN
    counts a tensor. At most twice (chunks, as above) every activation, its gradient, the inputs and the labels,
    4n(2d + 2 x sum(hidden) + 3 classes + 1), plus 4 x the weights (their gradients, Adam's temporaries) and 8 MiB
    (small tensors and rounding); on a GPU 64 MiB more (cuBLAS may take its workspace from TensorFlow's allocator).
    Measured here with oneDNN and with TF_CPU_ALLOCATOR_USE_BFC=true (batches 256 to 2048, widths 256 to 768):
    1.5x to 4.8x the floor, and under half the ceiling.
    """
    m = case["model"]
    if m["kind"] == "activations":
        size = 4 * n * m["width"]
        return size, 2 * size + MiB
    hidden, d, c, weights = sum(m["hidden"]), m["d"], m["classes"], _q6_weights(m)
    core = 4 * n * (2 * d + 2 * hidden + 3 * c + 1)
    return 4 * n * (d + hidden), 2 * core + 4 * weights + 8 * MiB + (64 * MiB if device.startswith("GPU") else 0)


def _q6_weights(m: dict) -> int:
    """Bytes of the MLP's weights and biases (float32)."""
    widths = [m["d"]] + m["hidden"] + [m["classes"]]
    return 4 * sum(a * b + b for a, b in zip(widths, widths[1:]))


@item("q6", points=3, title="batch_that_fits measures each step's peak and picks the largest batch within budget")
class q6:
    def cases(rng):
        d, hidden = rng.choice([256, 384, 512]), [rng.choice([256, 384, 512, 768]) for _ in range(2)]
        sizes = sorted(rng.sample(range(320, 2049, 32), 3))
        batches = [sizes[-1], sizes[0], sizes[1]]  # the largest first: a measurement must not inherit its peak
        mlp = {"kind": "mlp", "d": d, "hidden": hidden, "classes": rng.choice([10, 16, 100])}
        # Near what the step needs between the middle and the largest batch (activations kept for the backward
        # pass and their gradients, plus the weights' gradients and Adam's temporaries): which batches fit is up
        # to the measurement; the check only asks that the decision follows from it.
        n_mid, w = (sizes[1] + sizes[2]) // 2, _q6_weights(mlp)
        budget = 4 * n_mid * (2 * d + 2 * sum(hidden)) + 2 * w
        # The step whose sizes are the check's secret: batches 3x apart, so that each one's window (1x to 2x its
        # tensor, plus 1 MiB) lies below the next one's; a budget between the middle and the largest batch.
        width = rng.randint(256, 4096)
        small = -(-2 * MiB // (4 * width))  # its tensor is at least 2 MiB
        acts = {"kind": "activations", "width": width}
        budget_b = 5 * (4 * small * width * 3) // 2  # 2.5 x the middle tensor: over its 2x + 1 MiB, under 3x
        return [{"model": mlp, "seed": rng.randint(0, 2**31), "batches": batches, "budget": budget,
                 "ballast": rng.randint(16, 48) * MiB},
                {"model": acts, "seed": 0, "batches": [9 * small, small, 3 * small], "budget": budget_b,
                 "ballast": rng.randint(16, 48) * MiB}]

    def observe(ns, case):
        return ns.kernel(_q6_observe, case)

    def judge(case, seen):
        device, batches, budget = seen["device"], case["batches"], case["budget"]
        call = f"batch_that_fits(step, {batches}, {budget}, {device!r})"
        if "unavailable" in seen:
            raise Fail(tr("TensorFlow keeps no memory statistics for {device} in this kernel ({error}), so nothing "
                          "can be measured: restart the kernel and run the setup cell first (before TensorFlow "
                          "starts, it turns on what keeps them).", device=device, error=seen["unavailable"]))
        res = seen["result"]
        if "raised" in res:
            raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=res["raised"],
                          message=res["message"]))
        value = res["value"]
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)):
            raise Fail(tr("{call} should return a tuple (peaks, best), peaks a list with one number per batch size; "
                          "got {got}", call=call, got=repr(value)[:200]))
        peaks, best = value
        if len(peaks) != len(batches) or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                                 for p in peaks):
            raise Fail(tr("{call}: peaks should hold one number of bytes per batch size ({count}), in their order; "
                          "got {peaks}", call=call, count=len(batches), peaks=peaks))
        log = seen["log"]
        for n, got in zip(batches, peaks):
            _q6_judge_peak(case, device, log, n, got, call)
        fitting = [n for n, p in zip(batches, peaks) if p <= budget]
        want = max(fitting) if fitting else None
        if best != want:
            raise Fail(tr("{call}: with your peaks {peaks} the batch sizes that fit {budget} bytes are {fitting}, so "
                          "best should be {want}, got {got}. The largest that fits, whatever the order of "
                          "batch_sizes (None if none fits).", call=call, peaks=peaks, budget=budget,
                          fitting=fitting, want=want, got=best))


def _q6_judge_peak(case: dict, device: str, log: list, n: int, got, call: str) -> None:
    """Fail unless ``got`` is what the allocator saw during a measured call of step(n), and a peak this step can
    have; say which classic mistake it matches otherwise."""
    calls = [i for i, row in enumerate(log) if row[0] == n]
    lo, hi = _q6_window(case, n, device)
    where = tr("{call}, batch size {n}", call=call, n=n)
    if not calls:
        raise Fail(tr("{where}: you never called step({n}), so {got} is not a measurement of it.", where=where, n=n,
                      got=got))
    candidates = _q6_candidates(log, n, warmup=case["model"]["kind"] == "mlp")
    if any(_q6_close(got, c) for c in candidates):
        if not lo <= got <= hi:  # the allocator's own numbers, outside what this step can need: not believable
            raise Fail(tr("{where}: {got} bytes is outside what this step can need ({lo} to {hi} bytes from its "
                          "shapes): the allocator's counters in this kernel do not look real.", where=where, got=got,
                          lo=lo, hi=hi))
        return
    measured = [log[i][4] - log[i][1] for i in calls]
    if not any(log[i][2] - log[i][1] <= _RESET_SLACK for i in calls):
        hint = tr("the allocator's peak was not reset before any call of step({n}): get_memory_info's 'peak' is the "
                  "highest since the last reset, so it still held an earlier, larger step's peak. Call "
                  "reset_memory_stats before each measurement.", n=n)
    elif 0 in calls and case["model"]["kind"] == "mlp" and _q6_close(got, log[0][4] - log[0][1]):
        hint = tr("you measured the step's first call, which also traces it and creates the optimizer's state. Call "
                  "step once before you measure.")
    elif any(_q6_close(got, log[i][4]) for i in calls):
        hint = tr("that is the allocator's whole peak, with what was already in use before the call (the notebook's "
                  "other tensors, the model's weights): subtract get_memory_info's 'current' read just before the "
                  "call.")
    elif any(_q6_close(got * 2**20, m) or _q6_close(got * 10**6, m) or _q6_close(got * 1024, m) for m in measured):
        hint = tr("peaks are in bytes: do not convert them to KiB, MiB or MB.")
    elif got < lo:
        hint = tr("that is less than this step needs: read 'peak' (the highest since the reset), not 'current' (what "
                  "is still allocated once the step is over)")
        if device != "CPU:0":
            hint += tr(", on the device the step runs on ({device})", device=device)
        hint += "."
    else:
        hint = tr("the allocator's peak during your calls of step({n}) rose by {measured} bytes.", n=n,
                  measured=measured)
    raise Fail(tr("{where}: got {got} bytes; {hint}", where=where, got=got, hint=hint))
