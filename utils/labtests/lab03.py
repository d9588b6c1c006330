"""Lab 03 (memory): public tests.

Every test builds fresh inputs: random Keras models and optimizers (q1, the
expected bytes are read from the optimizer Keras really builds), random fake
memory models that may raise an out-of-memory error (q2), random batch sizes
(q3), and random data whose reference training is done in NumPy (q4).
"""

from __future__ import annotations

import math
import random

from gpucourse.grading.items import Fail, expect_raises, item


# --------------------------------------------------------------------------- q1


def _random_model(rng: random.Random, dtype: str = "float32", force_bn: bool = False):
    import keras

    d_in = rng.randint(3, 12)
    layers = [keras.Input((d_in,))]
    n_hidden = rng.randint(1, 3)
    bn_at = rng.randrange(n_hidden) if force_bn else -1
    for i in range(n_hidden):
        layers.append(keras.layers.Dense(rng.randint(2, 16), use_bias=rng.random() < 0.8, dtype=dtype))
        if i == bn_at or rng.random() < 0.6:
            layers.append(keras.layers.BatchNormalization(dtype=dtype))  # non-trainable moving statistics
    layers.append(keras.layers.Dense(rng.randint(1, 4), dtype=dtype))
    return keras.Sequential(layers), d_in


def _optimizers(rng: random.Random):
    import keras

    O = keras.optimizers
    acc = rng.randint(2, 6)
    return [
        ("SGD()", O.SGD()),
        ("SGD(momentum=0.9)", O.SGD(momentum=0.9)),
        ("Adam()", O.Adam()),
        ("Adam(amsgrad=True)", O.Adam(amsgrad=True)),
        ("RMSprop(centered=True)", O.RMSprop(centered=True)),
        ("Adagrad()", O.Adagrad()),
        (f"Adam(gradient_accumulation_steps={acc})", O.Adam(gradient_accumulation_steps=acc)),
        (f"SGD(gradient_accumulation_steps={acc})", O.SGD(gradient_accumulation_steps=acc)),
    ]


def _truth(model, optimizer) -> int:
    """Weights + gradients + the per-parameter state this optimizer really allocates (scalars excluded)."""
    import numpy as np

    size = lambda vs: sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in vs)  # noqa: E731
    optimizer.build(model.trainable_variables)
    state = size([v for v in optimizer.variables if len(v.shape)])
    return size(model.weights) + size(model.trainable_weights) + state


@item("q1", points=2, title="training_state_bytes counts weights, gradients and optimizer state")
def q1(ns):
    import keras

    fn = ns.function("training_state_bytes")
    rng = random.Random()
    # One float32 model with BatchNormalization (non-trainable weights), one in another dtype (bytes per value).
    for dtype, force_bn in (("float32", True), (rng.choice(["float64", "float16"]), False)):
        model, d_in = _random_model(rng, dtype, force_bn)
        for label, opt in _optimizers(rng):
            fresh = keras.optimizers.deserialize(keras.optimizers.serialize(opt))  # unbuilt copy for the learner
            got = fn(model, fresh)
            want = _truth(model, opt)
            if isinstance(got, bool) or not isinstance(got, int):
                raise Fail(f"training_state_bytes should return an int number of bytes, got {got!r}")
            if got != want:
                shapes = [tuple(w.shape) for w in model.weights]
                raise Fail(f"for a {dtype} model with weights {shapes} ({model.count_params()} parameters, "
                           f"{sum(math.prod(w.shape) for w in model.trainable_weights)} trainable) and "
                           f"keras.optimizers.{label}, expected {want} bytes, got {got}")


# --------------------------------------------------------------------------- q2


def _fake_memory(rng: random.Random):
    """A fresh memory model batch -> bytes, with an OOM error far above the budget; plus its parameters."""
    import tensorflow as tf

    fixed = rng.randint(10, 500) * 2**20
    per = rng.randint(20, 4000) * 2**10
    quad = rng.choice([0, 0, rng.randint(1, 64)])  # attention-like term in some models
    capacity = None
    calls: list[int] = []

    def peak_bytes(n):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise Fail(f"peak_bytes must be called with a whole batch size >= 1, it was called with {n!r}")
        calls.append(n)
        used = fixed + per * n + quad * n * n
        if capacity is not None and used > capacity:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor for batch {n}")
        return used

    def set_capacity(c):
        nonlocal capacity
        capacity = c

    return peak_bytes, calls, (fixed, per, quad), set_capacity


@item("q2", points=3, title="largest_batch finds the biggest batch within budget in few measurements")
def q2(ns):
    import tensorflow as tf

    fn = ns.function("largest_batch")
    rng = random.Random()
    for case in range(6):
        peak_bytes, calls, (fixed, per, quad), set_capacity = _fake_memory(rng)
        max_batch = rng.choice([rng.randint(2, 64), rng.randint(500, 20000)])
        target = rng.randint(1, max_batch) if case != 1 else max_batch + rng.randint(0, 50)
        # case 3: the budget is exactly peak_bytes(target) (it fits: <=); case 0: every batch over the
        # budget raises ResourceExhaustedError instead of returning a number.
        budget = fixed + per * target + quad * target * target + (0 if case == 3 else rng.randint(0, per - 1))
        capacity = budget if case == 0 else budget + rng.randint(1, 3) * per * max(1, target // 4)
        set_capacity(capacity if case % 2 == 0 else None)
        need = lambda n: fixed + per * n + quad * n * n  # noqa: E731
        want = max(n for n in range(1, max_batch + 1) if need(n) <= budget)
        desc = (f"peak_bytes(n) = {fixed} + {per}*n" + (f" + {quad}*n^2" if quad else "")
                + f", budget {budget}, max_batch {max_batch}")
        try:
            got = fn(peak_bytes, budget, max_batch)
        except tf.errors.ResourceExhaustedError as exc:
            raise Fail(f"for {desc}: peak_bytes raised ResourceExhaustedError ({exc.message}) and your function "
                       "let it escape: catch it and treat that batch as 'does not fit'")
        if got != want:
            raise Fail(f"for {desc}: expected {want}, got {got!r}")
        allowed = 2 * math.ceil(math.log2(max_batch)) + 2
        if len(calls) > allowed:
            raise Fail(f"for {desc}: found {got} but called peak_bytes {len(calls)} times; each call is a real "
                       f"training step, so at most {allowed} (about 2*log2(max_batch)) are allowed")
    # Nothing fits: not even a batch of 1.
    peak_bytes, calls, (fixed, per, quad), _ = _fake_memory(rng)
    try:
        got = fn(peak_bytes, fixed // 2, 1000)
    except ValueError:
        pass
    except Exception as exc:
        raise Fail(f"when even batch 1 needs more than the budget, raise ValueError; you raised "
                   f"{type(exc).__name__}: {exc}")
    else:
        raise Fail(f"with budget {fixed // 2} bytes even batch 1 ({fixed + per + quad} bytes) does not fit: raise "
                   f"ValueError instead of returning {got!r}")


# --------------------------------------------------------------------------- q3


@item("q3", points=2, title="accumulation_plan reaches the effective batch in the fewest steps")
def q3(ns):
    fn = ns.function("accumulation_plan")
    rng = random.Random()
    cases = [(256, 256), (256, 100), (96, 40), (7, 3), (1, 1)]
    cases += [(rng.randint(2, 1024), rng.randint(1, 300)) for _ in range(40)]
    for eff, mx in cases:
        want_steps = next(s for s in range(1, eff + 1) if eff % s == 0 and eff // s <= mx)
        got = fn(eff, mx)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) for v in got)):
            raise Fail(f"accumulation_plan should return a tuple (micro_batch, steps) of ints, got {got!r}")
        micro, steps = got
        if micro * steps != eff:
            raise Fail(f"accumulation_plan({eff}, {mx}) returned micro_batch={micro}, steps={steps}: "
                       f"{micro} x {steps} = {micro * steps}, not the effective batch {eff}")
        if micro > mx:
            raise Fail(f"accumulation_plan({eff}, {mx}) returned micro_batch={micro}, more than max_batch={mx}")
        if steps != want_steps:
            raise Fail(f"accumulation_plan({eff}, {mx}) returned {steps} steps; {want_steps} step(s) of "
                       f"{eff // want_steps} also add up and fit, and fewer steps means fewer, larger micro-batches")
    for bad in [(0, 8), (8, 0), (-4, 2)]:
        expect_raises(lambda: fn(*bad), f"accumulation_plan{bad}", "batch sizes must be >= 1")


# --------------------------------------------------------------------------- q4


def _reference_sgd(w, b, x, y, lr, batch):
    """Plain mini-batch SGD on a linear model with mean-squared-error loss, in NumPy."""
    w, b = w.astype("float64").copy(), b.astype("float64").copy()
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch].astype("float64"), y[i:i + batch].astype("float64")
        err = xb @ w + b - yb
        w -= lr * 2 * xb.T @ err / err.size
        b -= lr * 2 * err.sum(axis=0) / err.size
    return w, b


@item("q4", points=3, title="train_with_accumulation matches one big-batch step per effective batch")
def q4(ns):
    import keras
    import numpy as np
    import tensorflow as tf

    fn = ns.function("train_with_accumulation")
    rng = np.random.default_rng()
    for micro, steps in [(int(rng.integers(2, 9)), int(rng.integers(2, 5))), (int(rng.integers(4, 12)), 1)]:
        eff = micro * steps
        d = int(rng.integers(3, 9))
        n = eff * int(rng.integers(2, 4))
        x = rng.normal(size=(n, d)).astype("float32")
        y = (x @ rng.normal(size=(d, 1)) + rng.normal(size=(n, 1))).astype("float32")
        lr = 0.05
        model = keras.Sequential([keras.Input((d,)), keras.layers.Dense(1)])
        w0, b0 = (v.copy() for v in model.get_weights())
        # On Ampere and newer GPUs float32 matmuls default to TF32 (10 mantissa bits), which misses the
        # float64 reference below by more than 1e-4 about one time in five: grade full float32 arithmetic.
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(False)
        try:
            out = fn(model, x, y, micro, eff, lr)
        finally:
            tf.config.experimental.enable_tensor_float_32_execution(tf32)
        if out is not model:
            raise Fail("train_with_accumulation should return the model it was given, trained")
        opt = getattr(model, "optimizer", None)
        want_acc = steps if steps > 1 else None
        if not isinstance(opt, keras.optimizers.SGD) or opt.gradient_accumulation_steps != want_acc:
            what = (f"{type(opt).__name__} with gradient_accumulation_steps={opt.gradient_accumulation_steps}"
                    if opt is not None and hasattr(opt, "gradient_accumulation_steps") else repr(opt))
            raise Fail(f"with micro_batch={micro} and effective_batch={eff}, the model should be compiled with "
                       f"keras.optimizers.SGD(learning_rate, gradient_accumulation_steps={want_acc}) and trained on "
                       f"batches of {micro}; model.optimizer is {what}")
        w, b = model.get_weights()
        want_w, want_b = _reference_sgd(w0, b0, x, y, lr, eff)
        wrong_w, _ = _reference_sgd(w0, b0, x, y, lr, micro)
        err = float(max(np.abs(w - want_w).max(), np.abs(b - want_b).max()))
        if err > 1e-4:
            hint = ""
            if steps > 1 and np.abs(w - wrong_w).max() < 1e-4:
                hint = " Your weights match one update per micro-batch: the gradients were not accumulated."
            raise Fail(f"on {n} random examples with micro_batch={micro}, effective_batch={eff}, "
                       f"learning_rate={lr}: the weights differ from {n // eff} SGD steps with batch {eff} by "
                       f"{err:.3g} (allowed 1e-4). Train in order (shuffle=False) with plain SGD and loss 'mse'.{hint}")
    try:
        fn(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), np.zeros((12, 2), "float32"),
           np.zeros((12, 1), "float32"), 5, 12, 0.1)
    except ValueError:
        pass
    except Exception as exc:
        raise Fail(f"micro_batch=5 does not divide effective_batch=12: raise ValueError, not "
                   f"{type(exc).__name__}: {exc}")
    else:
        raise Fail("micro_batch=5 does not divide effective_batch=12: raise ValueError")
