"""Lab 05 (mixed precision and loss scaling): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (sizes, weights, batches, flag
sequences, gradients), ``observe`` runs the learner's function in the
learner's kernel and returns plain data (dtypes, values, weights before and
after), and ``judge`` computes the expected answer on the grader's side: with
a real ``keras.optimizers.LossScaleOptimizer`` (q2), a float32 reference model
(q3), or private reference functions here (q4). Graded on dtypes and
loss-scale behaviour, never on speed. Every observation that touches Keras's
global dtype policy restores whatever policy was set before.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import contextlib
import math

from gpucourse.grading.items import Fail, expect_raised, item, outcome, tr

FP16_MAX = 65504.0  # (2 - 2**-10) * 2**15: float16's largest finite value


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


def _number(value):
    """A float from a plain observation, or None if it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# --------------------------------------------------------------------------- q1

_COMPUTE = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


@item("q1", points=3, title="build_mixed_classifier: 16-bit compute, float32 variables and output")
class q1:
    def cases(rng):
        out = []
        for policy, before in (("mixed_float16", "float32"), ("mixed_bfloat16", "mixed_float16")):
            in_dim, n_classes = rng.randint(3, 19), rng.randint(2, 8)
            x = [[rng.uniform(-2, 2) for _ in range(in_dim)] for _ in range(5)]
            out.append({"policy": policy, "before": before, "in_dim": in_dim, "n_classes": n_classes, "x": x})
        return out

    def observe(ns, case):
        import keras
        import numpy as np

        fn = ns.function("build_mixed_classifier")
        with _policy_guard():
            keras.mixed_precision.set_global_policy(case["before"])
            model = fn(case["in_dim"], case["n_classes"], case["policy"])
            after = keras.mixed_precision.global_policy().name
        seen = {"after": after, "type": type(model).__name__, "is_model": isinstance(model, keras.Model)}
        if not seen["is_model"]:
            return seen
        seen["dense"] = [[layer.name, layer.compute_dtype] for layer in model.layers
                         if isinstance(layer, keras.layers.Dense)]
        seen["weights"] = sorted({w.dtype for w in model.weights})
        out = model(np.asarray(case["x"], np.float32))
        seen["out_dtype"] = getattr(out.dtype, "name", str(out.dtype))
        seen["out"] = np.asarray(out, np.float64).tolist()
        return seen

    def judge(case, seen):
        policy, before = case["policy"], case["before"]
        call = tr("{fn} with the global policy {before}",
                  fn=f"build_mixed_classifier({case['in_dim']}, {case['n_classes']}, {policy!r})", before=repr(before))
        if seen["after"] != before:
            raise Fail(tr("{call} left the global policy at {after}; it must restore {before}. Use "
                          "try/finally (or precision.policy_scope), or pass dtype=policy to the layers instead",
                          call=call, after=repr(seen["after"]), before=repr(before)))
        if not seen["is_model"]:
            raise Fail(tr("{call} should return a keras.Model (keras.Model(inputs, outputs)), got a {kind}",
                          call=call, kind=seen["type"]))
        dense = seen["dense"]
        if len(dense) < 2:
            raise Fail(tr("{call}: expected two Dense layers (the hidden Dense(32) and the output Dense(n_classes)), "
                          "found {n}", call=call, n=len(dense)))
        wrong = [(name, dtype) for name, dtype in dense if dtype != _COMPUTE[policy]]
        if wrong:
            raise Fail(tr("{call}: every Dense layer (hidden and output) should compute in {dtype}, got {wrong}. "
                          "Pass dtype=policy to each Dense; only the final softmax needs float32: a separate "
                          "Activation('softmax', dtype='float32')", call=call, dtype=_COMPUTE[policy], wrong=wrong))
        stored = [d for d in seen["weights"] if d != "float32"]
        if stored:
            raise Fail(tr("{call}: every weight should be stored in float32, found {stored}. Use the 'mixed_...' "
                          "policy (float32 variables, 16-bit compute), not plain 'float16'/'bfloat16'", call=call,
                          stored=stored))
        if seen["out_dtype"] != "float32":
            raise Fail(tr("{call}: the model's output should be float32, got {dtype}. Give the last "
                          "layer dtype='float32', e.g. keras.layers.Activation('softmax', dtype='float32')", call=call,
                          dtype=seen["out_dtype"]))
        out = seen["out"]
        shape = (len(out), len(out[0]) if out and isinstance(out[0], list) else 0)
        if shape != (5, case["n_classes"]):
            raise Fail(tr("{call}: for 5 examples expected output shape (5, {n_classes}), got {shape}. "
                          "The output Dense needs n_classes units", call=call, n_classes=case["n_classes"],
                          shape=shape))
        sums = [sum(row) for row in out]
        if any(abs(s - 1) > 1e-3 for s in sums) or any(v < 0 for row in out for v in row):
            raise Fail(tr("{call}: each output row should be softmax probabilities summing to 1, got row sums "
                          "{sums}. End with a softmax", call=call, sums=[round(s, 4) for s in sums]))


# --------------------------------------------------------------------------- q2


def _real_optimizer_trace(flags, initial_scale, growth_steps):
    """(scale after, applied) per step, from a real keras LossScaleOptimizer (grader side)."""
    import keras
    import numpy as np

    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                              initial_scale=initial_scale, dynamic_growth_steps=growth_steps)
    w = keras.Variable(np.zeros((1,), np.float32))
    opt.build([w])
    out = []
    for ok in flags:
        before = float(w.numpy()[0])
        grad = np.array([float(opt.dynamic_scale.numpy()) if ok else np.inf], np.float32)
        opt.apply_gradients([(grad, w)])
        out.append((float(opt.dynamic_scale.numpy()), float(w.numpy()[0]) != before))
    return out


def _mistaken_rule(kind):
    """One classic wrong version of the rule: (scale, good, finite, growth) -> (scale, good, applied)."""
    def rule(scale, good, finite, growth):
        if not finite:
            if kind == "applies_on_overflow":
                return scale / 2, 0, True
            if kind == "no_reset_on_overflow":
                return scale / 2, good, False
            if kind == "no_halving":
                return scale, 0, False
            return scale / 2, 0, False
        if kind == "one_step_late":
            return (scale * 2, 0, True) if good + 1 > growth else (scale, good + 1, True)
        if kind == "no_reset_on_growth":
            return (scale * 2, good + 1, True) if good + 1 >= growth else (scale, good + 1, True)
        return (scale * 2, 0, True) if good + 1 >= growth else (scale, good + 1, True)
    return rule


_HINTS = {  # each a function, so that the hint is in the learner's language when it is shown
    "applies_on_overflow": lambda: tr("a step with non-finite gradients must be skipped: return apply_update=False "
                                      "for it"),
    "no_reset_on_overflow": lambda: tr("an overflow must also reset good_steps to 0 (the growth count starts again)"),
    "no_halving": lambda: tr("an overflow must halve the scale (scale / 2), not keep it"),
    "one_step_late": lambda: tr("the scale doubles ON the growth_steps-th finite step in a row, i.e. when "
                                "good_steps + 1 == growth_steps, not one step later"),
    "no_reset_on_growth": lambda: tr("when the scale doubles, reset good_steps to 0"),
}


def _trajectory(rule, flags, initial, growth):
    scale, good, out = initial, 0, []
    for ok in flags:
        scale, good, applied = rule(scale, good, ok, growth)
        out.append([scale, good, applied])
    return out


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

    def judge(case, seen):
        flags, initial, growth = case["flags"], case["initial"], case["growth"]
        want = _real_optimizer_trace(flags, initial, growth)
        got_traj = []
        scale, good = initial, 0
        for i, (ok, step, (want_scale, want_applied)) in enumerate(zip(flags, seen["steps"], want), 1):
            if "bad" in step:
                raise Fail(tr("next_loss_scale should return a tuple (new_scale, new_good_steps, apply_update), got "
                              "{bad} (a {kind})", bad=step["bad"], kind=step["type"]))
            new_scale, new_good, applied = step["got"]
            got_traj.append([new_scale, new_good, applied])
            if _number(new_scale) != want_scale or bool(applied) != want_applied:
                hints = [text() for kind, text in _HINTS.items()
                         if _trajectory(_mistaken_rule(kind), flags[:i], initial, growth) == got_traj]
                hint = tr(" Hint: {hints}.", hints=tr(" Or: ").join(hints)) if hints else ""
                raise Fail(tr("with initial scale {initial:g}, growth_steps={growth} and finite flags {flags}: at "
                              "step {i} (scale {scale:g}, good_steps {good}, finite={ok}) the real LossScaleOptimizer "
                              "gives scale {want_scale:g} and {action} the update; "
                              "you returned scale {new_scale} and apply_update={applied}.{hint}", initial=initial,
                              growth=growth, flags=flags[:i], i=i, scale=scale, good=good, ok=ok,
                              want_scale=want_scale, action=tr("applies") if want_applied else tr("skips"),
                              new_scale=repr(new_scale), applied=repr(applied), hint=hint))
            scale, good = new_scale, new_good


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


def _reference_step(case):
    """Grader side: the float32 loss and SGD update of the case's weights on its batch."""
    import keras
    import numpy as np
    import tensorflow as tf

    ref = _mlp(case["in_dim"], case["hidden"], case["n_classes"], "float32")
    ref.set_weights([np.asarray(w, np.float32) for w in case["weights"]])
    x, y = np.asarray(case["x"], np.float32), np.asarray(case["y"], np.int32)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy()(y, ref(x))
    grads = tape.gradient(loss, ref.trainable_variables)
    return float(loss), np.concatenate([case["lr"] * g.numpy().ravel() for g in grads])


def _flat(weights):
    import numpy as np

    return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights])


def _scale_state(opt):
    """(scale, good-step counter) of a LossScaleOptimizer; it only has them once something applied through it."""
    if not opt.built:
        return float(opt.initial_scale), 0
    return float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy())


def _bypass() -> str:
    """The advice for a train_step that went around the LossScaleOptimizer (in the learner's language)."""
    return tr("Call `optimizer.apply_gradients(zip(grads, model.trainable_variables))` on the LossScaleOptimizer "
              "you were given, with the gradients of `optimizer.scale_loss(loss)`: it divides them by the scale, "
              "skips the step if any is inf/NaN, and moves the scale. Do not go through `optimizer.inner_optimizer` "
              "(or an optimizer of your own): that bypasses all three")


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


def _api_advice(mistake: str) -> str:
    """What to use instead, per known API mistake (in the learner's language)."""
    if mistake == "keras2":
        return tr("get_scaled_loss and get_unscaled_gradients were Keras 2's (tf.keras.mixed_precision); Keras 3's "
                  "LossScaleOptimizer has neither. Scale with `optimizer.scale_loss(loss)`, differentiate that, and "
                  "pass the gradients unchanged to `optimizer.apply_gradients`, which divides them by the scale "
                  "itself.")
    if mistake == "dynamic_scale":
        return tr("A LossScaleOptimizer creates `dynamic_scale` only when it is built, at its first "
                  "apply_gradients, so it does not exist yet. You need not divide at all: pass the gradients of "
                  "`optimizer.scale_loss(loss)` unchanged to `optimizer.apply_gradients`, which divides them by "
                  "the scale itself.")
    if mistake == "swapped":
        return tr("A Keras loss takes (y_true, y_pred) in that order: call `loss_fn(y, model(x, training=True))`. "
                  "With the two swapped, the labels are read as predictions (the rank error above).")
    return ""


@item("q3", points=3, title="train_step scales the loss, applies with the LossScaleOptimizer, skips overflows")
class q3:
    def cases(rng):
        in_dim, hidden, n_classes = rng.randint(4, 11), 16, rng.randint(2, 5)
        return [{"in_dim": in_dim, "hidden": hidden, "n_classes": n_classes, "lr": 0.5,
                 "initial": 2.0 ** rng.randint(8, 12),
                 "weights": _initial_weights(rng, in_dim, hidden, n_classes),
                 "x": [[rng.random() for _ in range(in_dim)] for _ in range(8)],
                 "y": [rng.randrange(n_classes) for _ in range(8)]}]

    def observe(ns, case):
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
            got = fn(model, opt, loss_fn, tf.constant(x), tf.constant(y))
        except (AttributeError, ValueError) as exc:
            mistake = _api_mistake(exc)
            if mistake is None:
                raise  # reported as your code's error, with its line
            return {"api_mistake": mistake, "raised": f"{type(exc).__name__}: {str(exc)[:200]}"}
        try:
            loss = float(np.asarray(got))
        except (TypeError, ValueError):
            loss = {"not_scalar": repr(got)[:200]}
        after1 = [w.numpy().tolist() for w in model.trainable_variables]
        scale1, counter1 = _scale_state(opt)
        fn(model, opt, loss_fn, tf.constant(x * 1e6), tf.constant(y))  # inf in float16's forward pass
        after2 = [w.numpy().tolist() for w in model.trainable_variables]
        return {"loss": loss, "after1": after1, "scale1": scale1, "counter1": counter1, "after2": after2,
                "scale2": _scale_state(opt)[0]}

    def judge(case, seen):
        import numpy as np

        if "api_mistake" in seen:
            raise Fail(tr("train_step raised {raised}. {advice}", raised=seen["raised"],
                          advice=_api_advice(seen["api_mistake"])))
        initial = case["initial"]
        setup = tr("a mixed_float16 model ({in_dim} inputs, {n_classes} classes), "
                   "LossScaleOptimizer(SGD({lr}), initial_scale={initial:g}) and a batch of 8", in_dim=case["in_dim"],
                   n_classes=case["n_classes"], lr=case["lr"], initial=initial)
        ref_loss, want = _reference_step(case)
        loss = seen["loss"]
        if _number(loss) is None:
            got = loss.get("not_scalar") if isinstance(loss, dict) else repr(loss)
            raise Fail(tr("train_step should return the loss alone, as a scalar (a 0-d tensor or a number), got "
                          "{got}", got=got))
        if not np.isclose(loss, ref_loss, rtol=2e-2, atol=1e-3):
            hint = (tr(" (that is the scaled loss: return the loss from before optimizer.scale_loss)")
                    if np.isclose(loss, ref_loss * initial, rtol=2e-2) else "")
            raise Fail(tr("with {setup}: train_step returned loss {loss:.5g}, expected the unscaled loss "
                          "{ref_loss:.5g}{hint}", setup=setup, loss=loss, ref_loss=ref_loss, hint=hint))
        delta = _flat(case["weights"]) - _flat(seen["after1"])
        ratio = float(np.dot(delta, want) / np.dot(want, want)) if np.all(np.isfinite(delta)) else math.nan
        if not (0.9 < ratio < 1.1) or np.linalg.norm(delta - want) > 0.1 * np.linalg.norm(want):
            if math.isclose(ratio, initial, rel_tol=0.1):
                raise Fail(tr("with {setup}: the weight update is {initial:g} times (the loss scale) the correct "
                              "SGD step: the scaled gradients reached the weights without being divided. {bypass}",
                              setup=setup, initial=initial, bypass=_bypass()))
            if math.isclose(ratio, 1 / initial, rel_tol=0.1):
                raise Fail(tr("with {setup}: the weight update is 1/{initial:g} of the correct SGD step: the "
                              "gradients were divided by the scale without having been multiplied by it (or were "
                              "divided twice). Differentiate "
                              "optimizer.scale_loss(loss) and pass those gradients, unchanged, to the "
                              "LossScaleOptimizer's apply_gradients (it divides by the scale itself)", setup=setup,
                              initial=initial))
            raise Fail(tr("with {setup}: the weight update is {ratio:.3g} times the correct SGD step. Differentiate "
                          "optimizer.scale_loss(loss) and pass those gradients, unchanged, to the LossScaleOptimizer's "
                          "apply_gradients", setup=setup, ratio=ratio))
        if seen["counter1"] != 1 or seen["scale1"] != initial:
            raise Fail(tr("with {setup}: the weights moved correctly, but the LossScaleOptimizer did not count the "
                          "step (its step counter is {counter}, its scale {scale:g}). {bypass}", setup=setup,
                          counter=seen["counter1"], scale=seen["scale1"], bypass=_bypass()))
        changed = not np.array_equal(_flat(seen["after1"]), _flat(seen["after2"]), equal_nan=True)
        if changed:
            raise Fail(tr("with {setup}: a batch of inputs around 1e6 (inf in float16) must not change the weights, "
                          "but they changed. {bypass}", setup=setup, bypass=_bypass()))
        if seen["scale2"] != initial / 2:
            raise Fail(tr("with {setup}: after the overflowing batch the scale should halve to {half:g}, got "
                          "{got:g}. Pass the gradients to apply_gradients as they are, inf and NaN "
                          "included (no tf.where, clipping or zeroing): the LossScaleOptimizer needs to see them to "
                          "skip the step and lower the scale", setup=setup, half=initial / 2, got=seen["scale2"]))


# --------------------------------------------------------------------------- q4


def _safe_scale(grads, limit=FP16_MAX, absolute=True):
    """Reference: the largest power of two 2**k with max|g| * 2**k <= limit (grader side)."""
    flat = [v for g in grads for v in _flatten(g)]
    peak = max(abs(v) for v in flat) if absolute else max(flat)
    if peak <= 0:
        return None
    k = math.floor(math.log2(limit / peak))
    while peak * 2.0 ** (k + 1) <= limit:
        k += 1
    while peak * 2.0 ** k > limit:
        k -= 1
    return 2.0 ** k


def _flatten(g):
    if isinstance(g, list):
        for v in g:
            yield from _flatten(v)
    else:
        yield float(g)


def _rand_matrix(rng, rows, cols, sigma):
    return [[rng.gauss(0, sigma) for _ in range(cols)] for _ in range(rows)]


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
        import numpy as np

        fn = ns.function("max_safe_scale")
        grads = [np.asarray(g, dtype=case.get("dtype", "float64")) for g in case["grads"]]
        return outcome(lambda: fn(grads))

    def judge(case, seen):
        shown = [g if len(list(_flatten(g))) <= 4 else tr("array with max|g|={peak:.4g}",
                                                          peak=max(abs(v) for v in _flatten(g)))
                 for g in case["grads"]]
        if case.get("zeros"):
            return expect_raised(seen, tr("max_safe_scale of all-zero gradients"), "every scale is safe")
        if "raised" in seen:
            raise Fail(tr("max_safe_scale({shown}) raised {raised}: {message}", shown=shown, raised=seen["raised"],
                          message=seen.get("message", "")))
        got = seen["value"]
        want = _safe_scale(case["grads"])
        if _number(got) is None:
            raise Fail(tr("max_safe_scale({shown}) should return a number (a power of two), got {got}", shown=shown,
                          got=repr(got)))
        got = float(got)
        if got == want:
            return
        hints = []  # every classic mistake that explains this answer (a random case can fit two)
        if got in (_safe_scale(case["grads"], 65535.0), _safe_scale(case["grads"], 65536.0)):
            hints.append(tr("float16's largest finite value is 65504 = (2 - 2**-10) * 2**15, not 65535 (the "
                            "largest 16-bit integer) or 2**16: use 65504 (np.finfo(np.float16).max)"))
        elif got == 2 * want:
            hints.append(tr("that scale makes max|g| * scale exceed 65504 (round log2 down, not up)"))
        if got == _safe_scale(case["grads"], absolute=False):
            hints.append(tr("use the largest *absolute* value: a gradient of -1e6 overflows as surely as +1e6"))
        if got <= 0 or not math.log2(got).is_integer():
            hints.append(tr("return a power of two, 2**k (k may be negative)"))
        if got == want / 2:
            hints.append(tr("a scale twice as large still fits: max|g| * scale may equal 65504 exactly"))
        hint = tr(" Hint: {hints}.", hints=tr(" Or: ").join(hints)) if hints else ""
        raise Fail(tr("max_safe_scale({shown}) should be {want:g} (the largest power of two with max|g| * scale <= "
                      "{limit:g}), got {got:g}.{hint}", shown=shown, want=want, limit=FP16_MAX, got=got, hint=hint))


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


@item("q5", points=2, title="make_scaled_optimizer: dynamic or fixed loss scaling, the Keras 3 way")
class q5:
    def cases(rng):
        lr = rng.choice([0.5, 0.25, 0.125])
        return [{"scale": 2.0 ** rng.randint(6, 14), "growth": rng.randint(3, 50), "lr": lr},
                {"scale": 2.0 ** rng.randint(6, 14), "growth": None, "lr": lr}]

    def observe(ns, case):
        import keras

        fn = ns.function("make_scaled_optimizer")
        inner = keras.optimizers.SGD(case["lr"])
        return outcome(lambda: _describe_optimizer(fn(inner, case["scale"], case["growth"]), inner, case))

    def judge(case, seen):
        scale, growth, lr = case["scale"], case["growth"], case["lr"]
        call = f"make_scaled_optimizer(SGD({lr}), {scale:g}, {growth!r})"
        if "raised" in seen:
            msg = seen.get("message", "")
            if "dynamic_growth" in msg:
                raise Fail(tr("{call} raised {raised}: `dynamic_growth=True` is the Keras 2 / TF1 argument. "
                              "Keras 3's LossScaleOptimizer is always dynamic: LossScaleOptimizer(inner, "
                              "initial_scale=scale, dynamic_growth_steps=growth_steps)", call=call,
                              raised=seen["raised"]))
            if "dynamic" in msg:
                raise Fail(tr("{call} raised {raised}: Keras 3's LossScaleOptimizer has no fixed mode "
                              "(dynamic=False). For a fixed scale, set loss_scale_factor=scale on the plain optimizer "
                              "and return it", call=call, raised=seen["raised"]))
            raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=seen["raised"], message=msg))
        got = seen["value"]
        if not got.get("is_optimizer"):
            raise Fail(tr("{call} should return a Keras optimizer, got a {kind}", call=call, kind=got.get("type")))
        if growth is None:
            if got["is_lso"]:
                raise Fail(tr("{call}: growth_steps=None asks for a fixed scale, but a LossScaleOptimizer moves its "
                              "scale. Return the plain optimizer with loss_scale_factor=scale (e.g. "
                              "inner.loss_scale_factor = scale)", call=call))
            if got["scale_loss"] != scale:
                raise Fail(tr("{call}: scale_loss(1.0) should give {scale:g}, got {got:g}. Set "
                              "loss_scale_factor=scale on the optimizer", call=call, scale=scale,
                              got=got["scale_loss"]))
            if got["learning_rate"] != lr or got["weights"][0] != -lr:
                raise Fail(tr("{call}: a scaled gradient of {scale:g} (1 unscaled) should move a weight by -{lr:g} "
                              "(SGD({lr})), it moved it to {moved:g}. Keep the optimizer you were given "
                              "(its learning rate) and only add the loss scale factor", call=call, scale=scale, lr=lr,
                              moved=got["weights"][0]))
            return
        if not got["is_lso"]:
            raise Fail(tr("{call}: with growth_steps={growth} the scale must be dynamic: return "
                          "keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale, "
                          "dynamic_growth_steps=growth_steps), not a {kind}", call=call, growth=growth,
                          kind=got["type"]))
        if not got["wraps_given"]:
            raise Fail(tr("{call}: wrap the optimizer you were given (LossScaleOptimizer(inner, ...)), not a new "
                          "one: its learning rate and settings would be lost", call=call))
        if got["initial_scale"] != scale:
            raise Fail(tr("{call}: the initial scale should be {scale:g}, got {got:g} (pass initial_scale=scale)",
                          call=call, scale=scale, got=got["initial_scale"]))
        if got["growth_steps"] != growth:
            raise Fail(tr("{call}: dynamic_growth_steps should be {growth}, got {got} (pass "
                          "dynamic_growth_steps=growth_steps)", call=call, growth=growth,
                          got=repr(got["growth_steps"])))
