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

This file is what each item draws and runs, and the code the graded kernel gets (the ``@in_kernel``
functions and what they use). Each item's verdict is in :mod:`gpucourse.labtests._lab03_judges`, and the right
answers it compares with in :mod:`gpucourse.labtests._lab03_reference`: both run only on the grader's side
(the kernel's copy of the course has no ``labtests``). Every message goes through ``tr`` (the zh_CN catalogue,
``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import contextlib

from gpucourse.grading.items import in_kernel, item, outcome
from gpucourse.labtests._lab03_judges import judge_q1, judge_q2, judge_q3, judge_q4, judge_q5, judge_q6
from gpucourse.labtests._lab03_reference import MiB, largest, need, q6_weights, stop_cost


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

    def judge(case, seen):  # the judge builds the case's model and optimizers as the kernel does
        judge_q1(case, seen, _build_model, _build_optimizer)


# --------------------------------------------------------------------------- q2


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
            budget = need(p, target) + (0 if k == 3 else rng.randint(0, per - 1))
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
        stop = stop_cost(largest(case))

        def peak_bytes(n):
            # Runs here, where the check runs (under the grader: its observer process): the learner's code gets a
            # stand-in that calls back, so the memory model, the calls and their cost stay out of its reach.
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= case["max_batch"]:
                bad.append(repr(n))
                raise TypeError(f"a batch size must be a whole number from 1 to max_batch, got {n!r}")
            if sum(c for c, _ in calls) + n > stop or len(calls) >= 300:
                stopped.append(n)
                raise RuntimeError("the check stopped the search: it spent far more examples than allowed")
            used = need(case, n)
            if case["capacity"] is not None and used > case["capacity"]:
                calls.append((n, None))
                raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor for batch {n}")
            calls.append((n, used))
            return used

        result = outcome(lambda: fn(peak_bytes, case["budget"], case["max_batch"]))
        return {"result": result, "calls": [n for n, _ in calls], "bad": bad[:3], "stopped": bool(stopped),
                "type": _type_name(result.get("value"))}

    judge = judge_q2


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

    judge = judge_q3


# --------------------------------------------------------------------------- q4


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

    judge = judge_q4


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

    judge = judge_q5


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
        n_mid, w = (sizes[1] + sizes[2]) // 2, q6_weights(mlp)
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

    judge = judge_q6
