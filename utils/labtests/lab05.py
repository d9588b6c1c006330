"""Lab 05 (mixed precision and loss scaling): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (sizes, weights, batches, flag
sequences, gradients), ``observe`` runs the learner's function in the
learner's kernel and returns plain data (dtypes, values, weights before and
after), and ``judge`` computes the expected answer on the grader's side: with
a real ``keras.optimizers.LossScaleOptimizer`` (q2), a float64 NumPy reference of
the model (q1: a float32 model to convert, whose UnitNormalization overflows or
flushes in float16 on the check's inputs; q3: the clipped SGD step and the
classic mistakes' steps), or private reference functions here (q4). Graded on
dtypes and loss-scale behaviour, never on speed. Every observation that touches Keras's
global dtype policy restores whatever policy was set before.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import contextlib
import math

from gpucourse.grading.items import Fail, expect_raised, in_kernel, item, outcome, tr

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


def _q1_forward(case, x):
    """Reference (NumPy, float64): the case's model on rows ``x``; also the largest hidden activation of each row
    (where the model normalises). Keras' UnitNormalization: ``h * min(1 / sqrt(sum h**2), 1e12)``."""
    import numpy as np

    h, dense = np.array(x, float), case["dense"]
    for kernel, bias in dense[:-1]:
        h = np.maximum(h @ np.array(kernel, float) + np.array(bias, float), 0.0)
    peak = np.abs(h).max(axis=1)
    with np.errstate(divide="ignore"):
        u = h * np.minimum(1.0 / np.sqrt((h ** 2).sum(axis=1, keepdims=True)), 1e12)
    logits = u @ np.array(dense[-1][0], float) + np.array(dense[-1][1], float)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), peak


def _q1_rows(rng, case):
    """Inputs whose activations at the normalisation reach about 3000 (their sum of squares overflows float16),
    about 1.5e-4 (their squares flush to 0 in float16) and about 1. The hidden layers have no bias, so scaling
    an input row scales every activation: the rows are scaled to exactly those peaks."""
    rows = []
    for target in (3000.0, 3000.0, 1.5e-4, 1.5e-4, 1.0):
        while True:
            row = [rng.uniform(-1, 1) for _ in range(case["in_dim"])]
            _, peak = _q1_forward(case, [row])
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


_DELICATE = {"UnitNormalization": "float32", "Activation": "float32"}


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

    def judge(case, seen):
        import numpy as np

        policy, before = case["policy"], case["before"]
        call = tr("{fn} with the global policy {before}", fn=f"to_mixed_precision(model, {policy!r})",
                  before=repr(before))
        want, peak = _q1_forward(case, case["x"])
        given = [["Dense", "float32", "float32"]] * (len(case["dense"]) - 1) + [
            ["UnitNormalization", "float32", "float32"], ["Dense", "float32", "float32"],
            ["Activation", "float32", "float32"]]
        if seen["same"]:
            raise Fail(tr("{call} returned the model it was given: its layers still compute in float32, since a "
                          "layer keeps the policy it was created with. Return a new model with new layers.",
                          call=call))
        if seen["after"] != before:
            raise Fail(tr("{call} left the global policy at {after}; it must restore {before}, or leave it alone "
                          "and give each new layer its dtype", call=call, after=repr(seen["after"]),
                          before=repr(before)))
        if not seen["is_model"]:
            raise Fail(tr("{call} should return a keras.Model, got a {kind}", call=call, kind=seen["type"]))
        changed = seen["given_layers"] != given or not np.allclose(seen["given_out"], want, atol=1e-4)
        if changed:
            raise Fail(tr("{call} changed the model it was given (its layers now: {layers}). Leave it as it is: "
                          "the float32 model stays in use (for evaluation, as a reference); build a new one.",
                          call=call, layers=seen["given_layers"]))
        layers = seen["layers"]
        if [kind for kind, _, _ in layers] != [kind for kind, _, _ in given]:
            raise Fail(tr("{call}: the new model should have the given model's layers, in order, {want}; it has "
                          "{got}", call=call, want=[k for k, _, _ in given], got=[k for k, _, _ in layers]))
        stored = [d for d in seen["weight_dtypes"] if d != "float32"]
        if stored:
            raise Fail(tr("{call}: every weight should be stored in float32, found {stored}. Use the 'mixed_...' "
                          "policy (float32 variables, 16-bit compute), not plain 'float16'/'bfloat16'", call=call,
                          stored=stored))
        got_w = seen["weights"]
        ref_w = [w for pair in case["dense"] for w in pair]
        if len(got_w) != len(ref_w) or any(np.shape(g) != np.shape(r) or not np.allclose(g, r, atol=1e-6)
                                           for g, r in zip(got_w, ref_w)):
            raise Fail(tr("{call}: the new model's weights differ from the given model's. A rebuilt layer starts "
                          "with new, random weights: copy the trained ones over (get_weights / set_weights).",
                          call=call))
        sixteen = _COMPUTE[policy]
        for (kind, compute, _), i in zip(layers, range(len(layers))):
            need = _DELICATE.get(kind, sixteen)
            if compute == need:
                continue
            if kind == "Dense":
                raise Fail(tr("{call}: the Dense layers should compute in {dtype}; layer {i} ({kind}) computes in "
                              "{got}. A layer's config carries its dtype, so a copy of a float32 layer computes in "
                              "float32 whatever the global policy says: give each new Dense layer the policy.",
                              call=call, dtype=sixteen, i=i + 1, kind=kind, got=compute))
            if kind == "UnitNormalization":
                raise Fail(tr("{call}: the UnitNormalization layer computes in {got}; keep it in float32. It sums "
                              "the squares of the activations: in float16 that sum overflows (above 65504) for "
                              "activations of a few hundred, and squares below about 6e-8 flush to zero, so an "
                              "example's vector becomes 0, inf or NaN; bfloat16 keeps the range but only 2 to 3 "
                              "digits.", call=call, got=compute))
            raise Fail(tr("{call}: the final softmax computes in {got}; the model's output must be float32: keep "
                          "that layer in float32", call=call, got=compute))
        if seen["out_dtype"] != "float32":
            raise Fail(tr("{call}: the model's output should be float32, got {dtype}", call=call,
                          dtype=seen["out_dtype"]))
        out = np.array(seen["out"], float)
        # 16-bit Dense layers round each input and weight (float16: 2**-11 relative, bfloat16: 2**-8), so the
        # probabilities move by about 1e-3 (float16) or 1e-2 (bfloat16); 0.05 leaves room, and a normalisation
        # that overflowed or flushed gives NaN (float16) or probabilities of the wrong vector
        bad = [i for i in range(len(want)) if not np.all(np.isfinite(out[i])) or np.abs(out[i] - want[i]).max() > 0.05]
        if bad:
            raise Fail(tr("{call}: for inputs whose activations at the normalisation peak at {peaks}, the output "
                          "should be {want}, got {got}", call=call, peaks=[float(f"{peak[i]:.2g}") for i in bad],
                          want=np.round(want[bad[0]], 3).tolist(), got=np.round(out[bad[0]], 3).tolist()))


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


def _reference_grads(weights, x, y):
    """The float64 loss (mean sparse categorical cross-entropy) and gradients of ``_mlp`` (NumPy, either side)."""
    import numpy as np

    w1, b1, w2, b2 = (np.array(w, float) for w in weights)
    x, y = np.array(x, float), np.array(y, int)
    a1 = np.tanh(x @ w1 + b1)
    z2 = a1 @ w2 + b2
    p = np.exp(z2 - z2.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.mean(np.log(p[np.arange(len(y)), y])))
    dz2 = (p - np.eye(p.shape[1])[y]) / len(y)
    dz1 = (dz2 @ w2.T) * (1 - a1 ** 2)
    return loss, [x.T @ dz1, dz1.sum(axis=0), a1.T @ dz2, dz2.sum(axis=0)]


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
                  "pass the gradients to `optimizer.apply_gradients`, which divides them by the scale itself.")
    if mistake == "dynamic_scale":
        return tr("A LossScaleOptimizer creates `dynamic_scale` only when it is built, at its first apply_gradients, "
                  "so it does not exist yet. `optimizer.scale_loss(1.0)` gives the current scale either way (the "
                  "initial scale before the first step).")
    if mistake == "swapped":
        return tr("A Keras loss takes (y_true, y_pred) in that order: call `loss_fn(y, model(x, training=True))`. "
                  "With the two swapped, the labels are read as predictions (the rank error above).")
    return ""


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


def _q3_candidates(case, grads, norm):
    """The weight update (flat) of the right step and of each classic mistake, by name."""
    import numpy as np

    lr, clip, scale = case["lr"], case["clip"], case["initial"]
    g = _flat(grads)

    def clipped(limit, n):
        return min(1.0, limit / n)

    per_tensor = np.concatenate([np.ravel(t) * clipped(clip, float(np.linalg.norm(t))) for t in grads])
    return {"right": lr * clipped(clip, norm) * g,
            "no_clip": lr * g,
            "clipped_scaled": lr * clipped(clip, norm * scale) * g,
            "divided_twice": lr * clipped(clip, norm) * g / scale,
            "not_divided": lr * clipped(clip, norm) * g * scale,
            "per_tensor": lr * per_tensor}


def _q3_hint(kind, case) -> str:
    scale = case["initial"]
    return {
        "no_clip": tr("That is the update of the gradients before clipping: clip their global norm to clip_norm."),
        "clipped_scaled": tr("The gradients were clipped while still scaled: they are {scale:g} times (the loss scale) "
                             "the true ones, so a limit of clip_norm on them is a limit of clip_norm / {scale:g} on "
                             "the true gradients. Clip the scaled gradients to clip_norm times the scale (or clip "
                             "after unscaling).", scale=scale),
        "divided_twice": tr("The update is 1/{scale:g} (one over the loss scale) of the right one: the gradients "
                            "passed to apply_gradients had already been divided by the scale (or clipped as if "
                            "they had), and the LossScaleOptimizer divides them again.", scale=scale),
        "not_divided": tr("The update is {scale:g} times (the loss scale) the right one: the scaled gradients reached "
                          "the weights without being divided. {bypass}", scale=scale, bypass=_bypass()),
        "per_tensor": tr("Each weight's gradient was clipped on its own: clip the global norm, over all the "
                         "gradients together (tf.clip_by_global_norm)."),
    }.get(kind, "")


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
            _, grads = _reference_grads(weights, x, y)
            norm = float(_flat(grads) @ _flat(grads)) ** 0.5
            out.append({"in_dim": in_dim, "hidden": hidden, "n_classes": n_classes, "lr": 0.5,
                        "initial": 2.0 ** rng.randint(8, 12), "weights": weights, "x": x, "y": y,
                        "clip": round(norm * rng.uniform(low, high), 4), "overflow": overflow})
        return out

    def observe(ns, case):
        return ns.kernel(_q3_observe, case)

    def judge(case, seen):
        import numpy as np

        if "api_mistake" in seen:
            raise Fail(tr("train_step raised {raised}. {advice}", raised=seen["raised"],
                          advice=_api_advice(seen["api_mistake"])))
        initial, clip = case["initial"], case["clip"]
        ref_loss, grads = _reference_grads(case["weights"], case["x"], case["y"])
        norm = float(np.linalg.norm(_flat(grads)))
        setup = tr("a mixed_float16 model ({in_dim} inputs, {n_classes} classes), "
                   "LossScaleOptimizer(SGD({lr}), initial_scale={initial:g}), a batch of 8 whose gradients have a "
                   "global norm of {norm:.4g}, and clip_norm={clip:g}", in_dim=case["in_dim"],
                   n_classes=case["n_classes"], lr=case["lr"], initial=initial, norm=norm, clip=clip)
        loss, got_norm = seen["loss"], seen["norm"]
        if _number(loss) is None or _number(got_norm) is None:
            got = loss.get("not_triple") if isinstance(loss, dict) else repr((loss, got_norm))
            raise Fail(tr("train_step should return (loss, grad_norm, skipped): two scalars (0-d tensors or "
                          "numbers) and a bool, got {got}", got=got))
        if not np.isclose(loss, ref_loss, rtol=2e-2, atol=1e-3):
            hint = (tr(" (that is the scaled loss: return the loss from before optimizer.scale_loss)")
                    if np.isclose(loss, ref_loss * initial, rtol=2e-2) else "")
            raise Fail(tr("with {setup}: train_step returned loss {loss:.5g}, expected the unscaled loss "
                          "{ref_loss:.5g}{hint}", setup=setup, loss=loss, ref_loss=ref_loss, hint=hint))
        # float16 forward and backward passes: the gradients are within about 1% of the float64 ones
        if not np.isclose(got_norm, norm, rtol=3e-2):
            hint = ""
            if np.isclose(got_norm, norm * initial, rtol=3e-2):
                hint = tr(" That is the norm of the scaled gradients: divide it by the loss scale.")
            elif np.isclose(got_norm, min(norm, clip), rtol=3e-2):
                hint = tr(" That is the norm after clipping: report it from before.")
            elif np.isclose(got_norm, norm / initial, rtol=3e-2):
                hint = tr(" That is the true norm divided by the loss scale once more: the gradients you measured "
                          "were not scaled (differentiate optimizer.scale_loss(loss)), or already divided.")
            raise Fail(tr("with {setup}: grad_norm should be the global norm of the true (unscaled) gradients before "
                          "clipping, {norm:.4g}; got {got:.4g}.{hint}", setup=setup, norm=norm, got=got_norm,
                          hint=hint))
        delta = _flat(case["weights"]) - _flat(seen["after1"])
        candidates = _q3_candidates(case, grads, norm)
        want = candidates["right"]
        if not np.all(np.isfinite(delta)) or np.linalg.norm(delta - want) > 0.1 * np.linalg.norm(want):
            errors = {k: np.linalg.norm(delta - c) / np.linalg.norm(c) for k, c in candidates.items()
                      if k != "right" and np.all(np.isfinite(delta))}
            near = sorted((e, k) for k, e in errors.items() if e < 0.1)
            hint = " ".join(_q3_hint(k, case) for _, k in near) or tr(
                "Differentiate optimizer.scale_loss(loss), clip those gradients so that the true gradients' global "
                "norm is at most clip_norm, and pass them to the LossScaleOptimizer's apply_gradients, which "
                "divides them by the scale.")
            ratio = float(np.dot(delta, want) / np.dot(want, want)) if np.all(np.isfinite(delta)) else math.nan
            raise Fail(tr("with {setup}: the weight update is {ratio:.3g} times the right one (SGD on the true "
                          "gradients, clipped to a global norm of clip_norm). {hint}", setup=setup, ratio=ratio,
                          hint=hint))
        if seen["skipped"] is not False:
            raise Fail(tr("with {setup}: the optimizer applied this step, so skipped should be False (a bool), got "
                          "{got}", setup=setup, got=seen["skipped"]))
        if seen["counter1"] != 1 or seen["scale1"] != initial:
            raise Fail(tr("with {setup}: the weights moved correctly, but the LossScaleOptimizer did not count the "
                          "step (its step counter is {counter}, its scale {scale:g}). {bypass}", setup=setup,
                          counter=seen["counter1"], scale=seen["scale1"], bypass=_bypass()))
        if not case["overflow"]:
            return
        changed = not np.array_equal(_flat(seen["after1"]), _flat(seen["after2"]), equal_nan=True)
        if changed:
            raise Fail(tr("with {setup}: a batch of inputs around 1e6 (inf in float16) must not change the weights, "
                          "but they changed: the LossScaleOptimizer did not see the overflow. Pass it the gradients "
                          "with their inf and NaN (tf.clip_by_global_norm turns them into NaN, which is fine; "
                          "tf.clip_by_value or zeroing makes them finite), and apply through it, not its "
                          "inner_optimizer.", setup=setup))
        if seen["scale2"] != initial / 2:
            raise Fail(tr("with {setup}: after the overflowing batch the scale should halve to {half:g}, got "
                          "{got:g}. Clipping must keep inf and NaN as they are (tf.clip_by_global_norm turns them "
                          "into NaN, which is fine; tf.clip_by_value or zeroing makes them finite): the "
                          "LossScaleOptimizer needs to see them to skip the step and lower the scale", setup=setup,
                          half=initial / 2, got=seen["scale2"]))
        if seen["skipped2"] is not True:
            raise Fail(tr("with {setup}: the LossScaleOptimizer skipped the overflowing step (the weights did not "
                          "move and its iterations did not advance), so skipped should be True, got {got}",
                          setup=setup, got=seen["skipped2"]))


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
