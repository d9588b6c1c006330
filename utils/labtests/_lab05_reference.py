"""Lab 05's reference answers: what each item's judge compares the learner's answer with (grader side).

q1's model in float64 NumPy, a real ``keras.optimizers.LossScaleOptimizer``'s trace for q2 (and the traces of
the classic wrong rules), q3's float64 gradients and the weight update of the right step and of each classic
mistake, and q4's largest safe power-of-two scale. Used by :mod:`gpucourse.labtests.lab05` (its cases) and
:mod:`gpucourse.labtests._lab05_judges`; never sent to the graded kernel.
"""

from __future__ import annotations

import math

__all__ = ["FP16_MAX", "as_vector", "flatten", "mistaken_rule", "q1_forward", "q3_candidates", "real_optimizer_trace",
           "reference_grads", "safe_scale", "trajectory"]


FP16_MAX = 65504.0  # (2 - 2**-10) * 2**15: float16's largest finite value


# --------------------------------------------------------------------------- q1


def q1_forward(case, x):
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


# --------------------------------------------------------------------------- q2


def real_optimizer_trace(flags, initial_scale, growth_steps):
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


def mistaken_rule(kind):
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


def trajectory(rule, flags, initial, growth):
    scale, good, out = initial, 0, []
    for ok in flags:
        scale, good, applied = rule(scale, good, ok, growth)
        out.append([scale, good, applied])
    return out


# --------------------------------------------------------------------------- q3


def reference_grads(weights, x, y):
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


def as_vector(weights):
    import numpy as np

    return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights])


def q3_candidates(case, grads, norm):
    """The weight update (flat) of the right step and of each classic mistake, by name."""
    import numpy as np

    lr, clip, scale = case["lr"], case["clip"], case["initial"]
    g = as_vector(grads)

    def clipped(limit, n):
        return min(1.0, limit / n)

    per_tensor = np.concatenate([np.ravel(t) * clipped(clip, float(np.linalg.norm(t))) for t in grads])
    return {"right": lr * clipped(clip, norm) * g,
            "no_clip": lr * g,
            "clipped_scaled": lr * clipped(clip, norm * scale) * g,
            "divided_twice": lr * clipped(clip, norm) * g / scale,
            "not_divided": lr * clipped(clip, norm) * g * scale,
            "per_tensor": lr * per_tensor}


# --------------------------------------------------------------------------- q4


def safe_scale(grads, limit=FP16_MAX, absolute=True):
    """Reference: the largest power of two 2**k with max|g| * 2**k <= limit (grader side)."""
    flat = [v for g in grads for v in flatten(g)]
    peak = max(abs(v) for v in flat) if absolute else max(flat)
    if peak <= 0:
        return None
    k = math.floor(math.log2(limit / peak))
    while peak * 2.0 ** (k + 1) <= limit:
        k += 1
    while peak * 2.0 ** k > limit:
        k -= 1
    return 2.0 ** k


def flatten(g):
    if isinstance(g, list):
        for v in g:
            yield from flatten(v)
    else:
        yield float(g)
