"""Public tests for lab 05: mixed precision and loss scaling.

Graded on dtypes and loss-scale behaviour, never on speed. Every check that
touches Keras's global dtype policy restores whatever policy was set before.
"""

from gpucourse.grading.items import Fail, expect_raises, item

FP16_MAX = 65504.0


def _policy_guard():
    """Context manager: remember the global policy and restore it afterwards, whatever happens."""
    import contextlib

    import keras

    @contextlib.contextmanager
    def guard():
        before = keras.mixed_precision.global_policy()
        try:
            yield before
        finally:
            keras.mixed_precision.set_global_policy(before)

    return guard()


# --------------------------------------------------------------------------- q1


@item("q1", points=3, title="build_mixed_classifier: 16-bit compute, float32 variables and output")
def q1(ns):
    import keras
    import numpy as np

    fn = ns.function("build_mixed_classifier")
    rng = np.random.default_rng()
    # (policy asked for, global policy set before the call)
    cases = [("mixed_float16", "float32"), ("mixed_bfloat16", "mixed_float16")]
    compute = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
    with _policy_guard():
        for policy, before in cases:
            in_dim, n_classes = int(rng.integers(3, 20)), int(rng.integers(2, 9))
            call = f"build_mixed_classifier({in_dim}, {n_classes}, {policy!r}) with the global policy {before!r}"
            keras.mixed_precision.set_global_policy(before)
            model = fn(in_dim, n_classes, policy)
            after = keras.mixed_precision.global_policy().name
            if after != before:
                raise Fail(f"{call} left the global policy at {after!r}; it must restore {before!r} "
                           "(use try/finally, or pass dtype= to the layers instead)")
            if not isinstance(model, keras.Model):
                raise Fail(f"{call} should return a keras.Model, got {type(model).__name__}")
            dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
            if len(dense) < 2:
                raise Fail(f"{call}: expected at least two Dense layers (hidden and output), found {len(dense)}")
            wrong = [(layer.name, layer.compute_dtype) for layer in dense if layer.compute_dtype != compute[policy]]
            if wrong:
                raise Fail(f"{call}: every Dense layer (hidden and output) should compute in {compute[policy]}, "
                           f"got {wrong}. Only the final softmax needs float32: a separate "
                           "Activation('softmax', dtype='float32')")
            stored = sorted({w.dtype for w in model.weights} - {"float32"})
            if stored:
                raise Fail(f"{call}: every weight should be stored in float32 (mixed precision), found {stored}")
            x = rng.random((5, in_dim), dtype=np.float32)
            out = model(x)
            dtype = getattr(out.dtype, "name", str(out.dtype))
            if dtype != "float32":
                raise Fail(f"{call}: the model's output should be float32 (give the last layer "
                           f"dtype='float32'), got {dtype}")
            out = np.asarray(out)
            if out.shape != (5, n_classes):
                raise Fail(f"{call}: for 5 examples expected output shape (5, {n_classes}), got {out.shape}")
            if not np.allclose(out.sum(axis=1), 1.0, atol=1e-3) or (out < 0).any():
                raise Fail(f"{call}: each output row should be softmax probabilities summing to 1, "
                           f"got row sums {np.round(out.sum(axis=1), 4).tolist()}")


# --------------------------------------------------------------------------- q2


def _real_optimizer_trace(flags, initial_scale, growth_steps):
    """(scale after, applied) per step, from a real keras LossScaleOptimizer."""
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


@item("q2", points=3, title="next_loss_scale follows Keras's dynamic loss-scaling rule")
def q2(ns):
    import numpy as np

    fn = ns.function("next_loss_scale")
    rng = np.random.default_rng()
    cases = [([True, True, True, False, True, True, True, True, False, False, True], 1024.0, 3),
             ([True] * 6, 2.0 ** int(rng.integers(0, 20)), 1),
             ([True, True, False, True, True, True], 2.0 ** int(rng.integers(4, 16)), 3),  # overflow resets count
             ([bool(f) for f in rng.random(25) < 0.8], 2.0 ** int(rng.integers(5, 20)), int(rng.integers(2, 5)))]
    for flags, initial, growth in cases:
        want = _real_optimizer_trace(flags, initial, growth)
        scale, good = initial, 0
        for i, (ok, (want_scale, want_applied)) in enumerate(zip(flags, want), 1):
            got = fn(scale, good, ok, growth)
            if not (isinstance(got, tuple) and len(got) == 3):
                raise Fail(f"next_loss_scale should return a tuple (new_scale, new_good_steps, apply_update), "
                           f"got {got!r}")
            new_scale, new_good, applied = got
            if float(new_scale) != want_scale or bool(applied) != want_applied:
                raise Fail(f"with initial scale {initial:g}, growth_steps={growth} and finite flags {flags[:i]}: "
                           f"at step {i} (scale {scale:g}, good_steps {good}, finite={ok}) the real "
                           f"LossScaleOptimizer gives scale {want_scale:g} and "
                           f"{'applies' if want_applied else 'skips'} the update; you returned scale "
                           f"{float(new_scale):g} and apply_update={bool(applied)}")
            scale, good = float(new_scale), new_good


# --------------------------------------------------------------------------- q3


def _mixed_model(in_dim, n_classes):
    import keras

    with _policy_guard():
        keras.mixed_precision.set_global_policy("mixed_float16")
        inputs = keras.Input((in_dim,))
        x = keras.layers.Dense(16, activation="tanh")(inputs)
        x = keras.layers.Dense(n_classes)(x)
        outputs = keras.layers.Activation("softmax", dtype="float32")(x)
        model = keras.Model(inputs, outputs)
    return model


@item("q3", points=3, title="train_step scales the loss, applies with the LossScaleOptimizer, skips overflows")
def q3(ns):
    import keras
    import numpy as np
    import tensorflow as tf

    fn = ns.function("train_step")
    rng = np.random.default_rng()
    in_dim, n_classes, lr = int(rng.integers(4, 12)), int(rng.integers(2, 6)), 0.5
    model = _mixed_model(in_dim, n_classes)
    initial = 2.0 ** int(rng.integers(8, 13))
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(lr), initial_scale=initial,
                                              dynamic_growth_steps=1000)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x = rng.random((8, in_dim), dtype=np.float32)
    y = rng.integers(0, n_classes, 8).astype("int32")
    setup = (f"a mixed_float16 model ({in_dim} inputs, {n_classes} classes), LossScaleOptimizer(SGD({lr}), "
             f"initial_scale={initial:g}) and a batch of 8")

    # The reference: the float32 gradient of the same weights.
    with _policy_guard():
        keras.mixed_precision.set_global_policy("float32")
        inputs = keras.Input((in_dim,))
        h = keras.layers.Dense(16, activation="tanh")(inputs)
        ref = keras.Model(inputs, keras.layers.Activation("softmax")(keras.layers.Dense(n_classes)(h)))
    ref.set_weights(model.get_weights())
    with tf.GradientTape() as tape:
        ref_loss = loss_fn(y, ref(x))
    ref_grads = tape.gradient(ref_loss, ref.trainable_variables)
    before = [w.numpy().copy() for w in model.trainable_variables]

    got = fn(model, opt, loss_fn, tf.constant(x), tf.constant(y))
    try:
        got_loss = float(np.asarray(got))
    except (TypeError, ValueError):
        raise Fail(f"train_step should return the loss as a scalar, got {got!r}") from None
    if not np.isclose(got_loss, float(ref_loss), rtol=2e-2, atol=1e-3):
        hint = " (that is the scaled loss: return the unscaled one)" if np.isclose(
            got_loss, float(ref_loss) * initial, rtol=2e-2) else ""
        raise Fail(f"with {setup}: train_step returned loss {got_loss:.5g}, expected the unscaled loss "
                   f"{float(ref_loss):.5g}{hint}")
    delta = np.concatenate([(b - w.numpy()).ravel() for b, w in zip(before, model.trainable_variables)])
    want = np.concatenate([(lr * g.numpy()).ravel() for g in ref_grads])
    ratio = float(np.dot(delta, want) / np.dot(want, want))
    if not (0.9 < ratio < 1.1) or np.linalg.norm(delta - want) > 0.1 * np.linalg.norm(want):
        raise Fail(f"with {setup}: the weight update is {ratio:.3g} times the correct SGD step. "
                   "Differentiate optimizer.scale_loss(loss) and pass those gradients, unchanged, to the "
                   "LossScaleOptimizer's apply_gradients (it divides by the scale itself)")
    if float(opt.dynamic_scale.numpy()) != initial:
        raise Fail(f"with {setup}: after one finite step the scale should still be {initial:g}, "
                   f"got {float(opt.dynamic_scale.numpy()):g}")

    # A batch that overflows float16 in the forward pass: the step must be skipped and the scale halved.
    before = [w.numpy().copy() for w in model.trainable_variables]
    bad = tf.constant(x * 1e6)
    fn(model, opt, loss_fn, bad, tf.constant(y))
    changed = [w.name for b, w in zip(before, model.trainable_variables) if not np.array_equal(b, w.numpy())]
    if changed:
        raise Fail(f"with {setup}: a batch of inputs around 1e6 (inf in float16) must not change the weights, "
                   f"but {changed} changed. Let the LossScaleOptimizer apply the gradients: it skips "
                   "non-finite steps")
    if float(opt.dynamic_scale.numpy()) != initial / 2:
        raise Fail(f"with {setup}: after the overflowing batch the scale should halve to {initial / 2:g}, "
                   f"got {float(opt.dynamic_scale.numpy()):g}")


# --------------------------------------------------------------------------- q4


def _reference_scale(grads):
    import math

    import numpy as np

    m = max(float(np.max(np.abs(np.asarray(g, np.float64)))) for g in grads)
    k = math.floor(math.log2(FP16_MAX / m))
    while m * 2.0 ** (k + 1) <= FP16_MAX:
        k += 1
    while m * 2.0 ** k > FP16_MAX:
        k -= 1
    return 2.0 ** k


@item("q4", points=2, title="max_safe_scale: the largest power-of-two loss scale float16 can hold")
def q4(ns):
    import numpy as np

    fn = ns.function("max_safe_scale")
    rng = np.random.default_rng()
    cases = [
        [rng.normal(0, 10.0 ** rng.uniform(-6, 2), (3, 4)), rng.normal(0, 1e-3, 5)],
        [np.array([1e-3, -0.5]), np.array([[-(10.0 ** rng.uniform(3, 7))]])],  # largest value is negative
        [np.array([FP16_MAX / 8, 1.0], np.float32)],  # exactly at the limit: scale 8 is still safe
        [np.array([2.0e6]), np.zeros(3)],  # needs a scale below 1
        [rng.uniform(-1e-7, 1e-7, 10).astype(np.float32)],
    ]
    for grads in cases:
        want = _reference_scale(grads)
        shown = [np.round(g, 8).tolist() if np.size(g) <= 4 else f"array{np.shape(g)} max|g|="
                 f"{float(np.max(np.abs(g))):.4g}" for g in grads]
        got = fn(grads)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise Fail(f"max_safe_scale({shown}) should return a number, got {got!r}") from None
        if got != want:
            raise Fail(f"max_safe_scale({shown}) should be {want:g} (the largest power of two with "
                       f"max|g| * scale <= {FP16_MAX:g}), got {got:g}")
    expect_raises(lambda: fn([np.zeros(3), np.zeros((2, 2))]), "max_safe_scale of all-zero gradients",
                  "every scale is safe")
