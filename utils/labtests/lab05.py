"""Lab 05 (mixed precision and loss scaling): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (sizes, weights, batches, flag
sequences, gradients), ``observe`` runs the learner's function in the
learner's kernel and returns plain data (dtypes, values, weights before and
after), and ``judge`` computes the expected answer on the grader's side: with
a real ``keras.optimizers.LossScaleOptimizer`` (q2), a float64 NumPy reference of
the model (q1: a float32 model to convert, whose UnitNormalization overflows or
flushes in float16 on the check's inputs; q3: the clipped SGD step and the
classic mistakes' steps), or private reference functions (q4). Graded on
dtypes and loss-scale behaviour, never on speed. Every observation that touches Keras's
global dtype policy restores whatever policy was set before.

This file is what each item draws and runs, and the code the graded kernel gets (the ``@in_kernel``
functions and what they use). Each item's verdict is in :mod:`gpucourse.labtests._lab05_judges`, and the
references it compares with in :mod:`gpucourse.labtests._lab05_reference`: both run only on the grader's side
(the kernel's copy of the course has no ``labtests``).
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import contextlib
import math

from gpucourse.grading.items import in_kernel, item, outcome
from gpucourse.labtests._lab05_judges import judge_q1, judge_q2, judge_q3, judge_q4, judge_q5
from gpucourse.labtests._lab05_reference import FP16_MAX, as_vector, q1_forward, reference_grads


@contextlib.contextmanager
def _policy_guard():
    """Remember Keras's global policy and restore it afterwards, whatever happens."""
    import keras

    before = keras.mixed_precision.global_policy()
    try:
        yield before
    finally:
        keras.mixed_precision.set_global_policy(before)


def _type_name(value) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


# --------------------------------------------------------------------------- q1


def _q1_rows(rng, case):
    """Inputs whose activations at the normalisation reach about 3000 (their sum of squares overflows float16),
    about 1.5e-4 (their squares flush to 0 in float16) and about 1. The hidden layers have no bias, so scaling
    an input row scales every activation: the rows are scaled to exactly those peaks."""
    rows = []
    for target in (3000.0, 3000.0, 1.5e-4, 1.5e-4, 1.0):
        while True:
            row = [rng.uniform(-1, 1) for _ in range(case["in_dim"])]
            _, peak = q1_forward(case, [row])
            if peak[0] > 0:
                break
        rows.append([v * target / float(peak[0]) for v in row])
    return rows


def _q1_model(case):
    """The check's float32 model, in the learner's kernel: Dense(relu) layers, UnitNormalization, Dense, softmax."""
    import keras
    import numpy as np

    with _policy_guard():
        keras.mixed_precision.set_global_policy("float32")
        widths = [len(bias) for _, bias in case["dense"]]
        layers = [keras.layers.Dense(w, activation="relu") for w in widths[:-1]]
        layers += [keras.layers.UnitNormalization(), keras.layers.Dense(widths[-1]), keras.layers.Activation("softmax")]
        if case["sequential"]:
            model = keras.Sequential([keras.Input((case["in_dim"],))] + layers)
        else:
            inputs = keras.Input((case["in_dim"],))
            out = inputs
            for layer in layers:
                out = layer(out)
            model = keras.Model(inputs, out)
    model.set_weights([np.array(w, "float32") for pair in case["dense"] for w in pair])
    return model


def _q1_layers(model) -> list:
    return [[type(layer).__name__, layer.compute_dtype, layer.variable_dtype] for layer in model.layers
            if type(layer).__name__ != "InputLayer"]


@in_kernel
def _q1_observe(ns, case):
    import keras
    import numpy as np

    fn = ns.function("to_mixed_precision")
    given = _q1_model(case)
    x = np.asarray(case["x"], np.float32)
    with _policy_guard():
        keras.mixed_precision.set_global_policy(case["before"])
        model = fn(given, case["policy"])
        after = keras.mixed_precision.global_policy().name
    seen = {"after": after, "type": type(model).__name__, "is_model": isinstance(model, keras.Model),
            "same": model is given, "given_layers": _q1_layers(given),
            "given_out": np.asarray(given(x), np.float64).tolist()}
    if not seen["is_model"] or seen["same"]:
        return seen
    seen["layers"] = _q1_layers(model)
    seen["weights"] = [w.tolist() for w in model.get_weights()]
    seen["weight_dtypes"] = sorted({w.dtype for w in model.weights})
    out = model(x)
    seen["out_dtype"] = getattr(out.dtype, "name", str(out.dtype))
    seen["out"] = np.asarray(out, np.float64).tolist()
    return seen


@item("q1", points=3, title="to_mixed_precision: Dense layers in 16 bits, the normalisation and softmax in float32")
class q1:
    def cases(rng):
        out = []
        for policy, before, hidden, sequential in (("mixed_float16", "float32", [rng.randint(12, 24)], False),
                                                   ("mixed_bfloat16", "mixed_float16",
                                                    [rng.randint(8, 16), rng.randint(8, 16)], True)):
            in_dim, n_classes = rng.randint(3, 12), rng.randint(2, 6)
            widths, dense = [in_dim] + hidden + [n_classes], []
            for i, (a, b) in enumerate(zip(widths, widths[1:])):
                last = i == len(widths) - 2
                dense.append([[[rng.gauss(0, 2.0 if last else 0.5) for _ in range(b)] for _ in range(a)],
                              [rng.gauss(0, 0.5) if last else 0.0 for _ in range(b)]])
            case = {"policy": policy, "before": before, "in_dim": in_dim, "dense": dense, "sequential": sequential}
            case["x"] = _q1_rows(rng, case)
            out.append(case)
        return out

    def observe(ns, case):
        return ns.kernel(_q1_observe, case)

    judge = judge_q1


# --------------------------------------------------------------------------- q2


@item("q2", points=3, title="next_loss_scale follows Keras's dynamic loss-scaling rule")
class q2:
    def cases(rng):
        return [
            {"flags": [True, True, True, False, True, True, True, True, False, False, True], "initial": 1024.0,
             "growth": 3},
            {"flags": [True] * 6, "initial": 2.0 ** rng.randint(0, 19), "growth": 1},
            {"flags": [True, True, False, True, True, True], "initial": 2.0 ** rng.randint(4, 15), "growth": 3},
            {"flags": [False, False, True, True, True, True, True, False], "initial": 2.0 ** rng.randint(10, 20),
             "growth": 2},
            {"flags": [rng.random() < 0.8 for _ in range(25)], "initial": 2.0 ** rng.randint(5, 19),
             "growth": rng.randint(2, 4)},
        ]

    def observe(ns, case):
        fn = ns.function("next_loss_scale")
        scale, good, steps = case["initial"], 0, []
        for ok in case["flags"]:
            got = fn(scale, good, ok, case["growth"])
            if not (isinstance(got, tuple) and len(got) == 3):
                steps.append({"bad": repr(got)[:200], "type": type(got).__name__})
                break
            new_scale, new_good, applied = got
            steps.append({"got": [new_scale, new_good, applied], "applied_type": _type_name(applied)})
            scale, good = new_scale, new_good
        return {"steps": steps}

    judge = judge_q2


# --------------------------------------------------------------------------- q3


def _initial_weights(rng, in_dim, hidden, n_classes):
    def mat(rows, cols, s):
        return [[rng.gauss(0, s) for _ in range(cols)] for _ in range(rows)]

    return [mat(in_dim, hidden, 0.5), [rng.gauss(0, 0.1) for _ in range(hidden)], mat(hidden, n_classes, 0.5),
            [rng.gauss(0, 0.1) for _ in range(n_classes)]]


def _mlp(in_dim, hidden, n_classes, policy):
    """Dense(hidden, tanh) -> Dense(n_classes) -> float32 softmax, built under ``policy``."""
    import keras

    with _policy_guard():
        keras.mixed_precision.set_global_policy(policy)
        inputs = keras.Input((in_dim,))
        x = keras.layers.Dense(hidden, activation="tanh")(inputs)
        x = keras.layers.Dense(n_classes)(x)
        outputs = keras.layers.Activation("softmax", dtype="float32")(x)
        return keras.Model(inputs, outputs)


def _scale_state(opt):
    """(scale, good-step counter) of a LossScaleOptimizer; it only has them once something applied through it."""
    if not opt.built:
        return float(opt.initial_scale), 0
    return float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy())


def _api_mistake(exc) -> str | None:
    """The known API mistake behind an error of the learner's train_step, or None (learner's side)."""
    text = str(exc)
    if isinstance(exc, AttributeError) and ("get_scaled_loss" in text or "get_unscaled_gradients" in text):
        return "keras2"
    if isinstance(exc, AttributeError) and "dynamic_scale" in text:
        return "dynamic_scale"
    if isinstance(exc, ValueError) and "must have rank" in text and "target" in text:
        return "swapped"
    return None


@in_kernel
def _q3_observe(ns, case):
    import keras
    import numpy as np
    import tensorflow as tf

    fn = ns.function("train_step")
    model = _mlp(case["in_dim"], case["hidden"], case["n_classes"], "mixed_float16")
    model.set_weights([np.asarray(w, np.float32) for w in case["weights"]])
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(case["lr"]), initial_scale=case["initial"],
                                              dynamic_growth_steps=1000)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x, y = np.asarray(case["x"], np.float32), np.asarray(case["y"], np.int32)
    try:
        got = fn(model, opt, loss_fn, tf.constant(x), tf.constant(y), case["clip"])
    except (AttributeError, ValueError) as exc:
        mistake = _api_mistake(exc)
        if mistake is None:
            raise  # reported as your code's error, with its line
        return {"api_mistake": mistake, "raised": f"{type(exc).__name__}: {str(exc)[:200]}"}
    def unpack(got):
        try:
            loss, norm, skipped = got
            return float(np.asarray(loss)), float(np.asarray(norm)), _skipped_flag(skipped)
        except (TypeError, ValueError):
            return {"not_triple": repr(got)[:200]}, None, None

    loss, norm, skipped = unpack(got)
    after1 = [w.numpy().tolist() for w in model.trainable_variables]
    scale1, counter1 = _scale_state(opt)
    seen = {"loss": loss, "norm": norm, "skipped": skipped, "after1": after1, "scale1": scale1, "counter1": counter1}
    if case["overflow"]:  # inputs of 1e6: inf in float16's forward pass
        _, norm2, skipped2 = unpack(fn(model, opt, loss_fn, tf.constant(x * 1e6), tf.constant(y), case["clip"]))
        seen.update(after2=[w.numpy().tolist() for w in model.trainable_variables], scale2=_scale_state(opt)[0],
                    skipped2=skipped2)
    return seen


def _skipped_flag(value):
    """A bool, a 0-d bool tensor or array: True/False; anything else: its repr (the judge says so)."""
    import numpy as np

    array = np.asarray(value)
    if array.shape == () and array.dtype == bool:
        return bool(array)
    return repr(value)[:80]


@item("q3", points=3, title="train_step clips the true gradients under loss scaling and logs norm and skips")
class q3:
    def cases(rng):
        in_dim, hidden, n_classes = rng.randint(4, 11), 16, rng.randint(2, 5)
        weights = _initial_weights(rng, in_dim, hidden, n_classes)
        out = []
        # clipping idle first (clipping the scaled gradients and dividing twice differ only there), then at work
        for low, high, overflow in ((2.0, 4.0, False), (0.2, 0.5, True)):
            x = [[rng.random() for _ in range(in_dim)] for _ in range(8)]
            y = [rng.randrange(n_classes) for _ in range(8)]
            _, grads = reference_grads(weights, x, y)
            norm = float(as_vector(grads) @ as_vector(grads)) ** 0.5
            out.append({"in_dim": in_dim, "hidden": hidden, "n_classes": n_classes, "lr": 0.5,
                        "initial": 2.0 ** rng.randint(8, 12), "weights": weights, "x": x, "y": y,
                        "clip": round(norm * rng.uniform(low, high), 4), "overflow": overflow})
        return out

    def observe(ns, case):
        return ns.kernel(_q3_observe, case)

    judge = judge_q3


# --------------------------------------------------------------------------- q4


def _rand_matrix(rng, rows, cols, sigma):
    return [[rng.gauss(0, sigma) for _ in range(cols)] for _ in range(rows)]


@in_kernel
def _q4_observe(ns, case):
    import numpy as np

    fn = ns.function("max_safe_scale")
    grads = [np.asarray(g, dtype=case.get("dtype", "float64")) for g in case["grads"]]
    return outcome(lambda: fn(grads))


@item("q4", points=2, title="max_safe_scale: the largest power-of-two loss scale float16 can hold")
class q4:
    def cases(rng):
        k = rng.randint(-3, 10)
        return [
            {"grads": [_rand_matrix(rng, 3, 4, 10.0 ** rng.uniform(-6, 2)), [rng.gauss(0, 1e-3) for _ in range(5)]]},
            {"grads": [[1e-3, -0.5], [[-(10.0 ** rng.uniform(3, 7))]]]},  # the largest magnitude is negative
            {"grads": [[FP16_MAX / 8, 1.0]], "dtype": "float32"},  # exactly at the limit: 8 is still safe
            {"grads": [[65520.0 * 2.0 ** -k, 1.0]]},  # between 65504 and 65535: tells the true maximum apart
            {"grads": [[2.0e6], [0.0, 0.0, 0.0]]},  # needs a scale below 1
            {"grads": [[rng.uniform(-1e-7, 1e-7) for _ in range(10)]], "dtype": "float32"},
            {"grads": [[0.0, 0.0, 0.0], [[0.0, 0.0], [0.0, 0.0]]], "zeros": True},
        ]

    def observe(ns, case):
        return ns.kernel(_q4_observe, case)

    judge = judge_q4


# --------------------------------------------------------------------------- q5


def _describe_optimizer(opt, inner, case):
    """Learner's side: what the returned optimizer is and does (plain data only)."""
    import keras
    import numpy as np

    seen = {"type": type(opt).__name__, "is_lso": isinstance(opt, keras.optimizers.LossScaleOptimizer),
            "is_optimizer": isinstance(opt, keras.optimizers.Optimizer)}
    if not seen["is_optimizer"]:
        return seen
    if seen["is_lso"]:
        seen.update(wraps_given=opt.inner_optimizer is inner, initial_scale=float(opt.initial_scale),
                    growth_steps=opt.dynamic_growth_steps)
    seen["scale_loss"] = float(np.asarray(opt.scale_loss(keras.ops.convert_to_tensor(1.0))))
    w = keras.Variable(np.zeros((1,), np.float32))
    weights, scales = [], []
    for grad in (case["scale"], math.inf):  # a scaled gradient of 1, then an overflow
        opt.apply_gradients([(np.array([grad], np.float32), w)])
        weights.append(float(w.numpy()[0]))
        scales.append(float(opt.dynamic_scale.numpy()) if seen["is_lso"] else None)
    seen.update(weights=weights, scales=scales, learning_rate=float(keras.ops.convert_to_numpy(opt.learning_rate)))
    return seen


@in_kernel
def _q5_observe(ns, case):
    import keras

    fn = ns.function("make_scaled_optimizer")
    inner = keras.optimizers.SGD(case["lr"])
    return outcome(lambda: _describe_optimizer(fn(inner, case["scale"], case["growth"]), inner, case))


@item("q5", points=2, title="make_scaled_optimizer: dynamic or fixed loss scaling, the Keras 3 way")
class q5:
    def cases(rng):
        lr = rng.choice([0.5, 0.25, 0.125])
        return [{"scale": 2.0 ** rng.randint(6, 14), "growth": rng.randint(3, 50), "lr": lr},
                {"scale": 2.0 ** rng.randint(6, 14), "growth": None, "lr": lr}]

    def observe(ns, case):
        return ns.kernel(_q5_observe, case)

    judge = judge_q5
