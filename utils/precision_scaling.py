"""Loss scaling: what a scale does to float16 gradients, and how Keras 3 moves it.

One job: make loss scaling visible and checkable.

* :func:`flush_fractions` measures which fraction of a gradient sample a
  scale saves from underflow or pushes into overflow; :func:`flatten_gradients`
  turns a model's real gradients into such a sample.
* :func:`simulate_loss_scale` is a pure-Python model of Keras 3's dynamic
  rule and :func:`loss_scale_trace` drives a real
  ``keras.optimizers.LossScaleOptimizer``, so the two can be compared step by
  step; :func:`scale_trajectory` runs the rule against a gradient sample with
  injected overflow spikes.
* :func:`scale_view` / :func:`loss_scale_explorer` (a scale slider over a real
  gradient sample) and :func:`trajectory_view` / :func:`dynamic_scale_explorer`
  (the dynamic scale's trajectory) are the topic's explorers: pure update
  functions plus :mod:`gpucourse.explore`.
* :func:`share_overflow_verdict` and :func:`replica_overflow_probe` deal with
  a distribution strategy: Keras 3.15's optimizer checks each replica's local
  gradients and acts on replica 0's verdict, so an overflow on another replica
  alone reaches the weights.

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from . import _probe, _tf, _validate
from .precision_formats import float_format, round_to
from ._labrules import answers

__all__ = [
    "LossScaleStep",
    "dynamic_scale_explorer",
    "flatten_gradients",
    "flush_fractions",
    "loss_scale_explorer",
    "loss_scale_trace",
    "replica_overflow_probe",
    "scale_trajectory",
    "scale_view",
    "share_overflow_verdict",
    "simulate_loss_scale",
    "trajectory_view",
]


# --------------------------------------------------------------------------- gradient samples


def flatten_gradients(grads) -> "np.ndarray":  # noqa: F821
    """All entries of a list of gradients (tensors, variables' gradients, arrays; ``None`` skipped) as float64."""
    import numpy as np

    if isinstance(grads, (str, bytes)) or not isinstance(grads, Iterable):
        raise TypeError(f"grads must be a list of gradient tensors or arrays, got {type(grads).__name__}")
    parts = []
    for g in grads:
        if g is None:
            continue
        if hasattr(g, "values") and hasattr(g, "indices"):  # tf.IndexedSlices
            g = g.values
        parts.append(np.asarray(g, dtype=np.float64).ravel())
    if not parts or sum(p.size for p in parts) == 0:
        raise ValueError("grads holds no gradient entries (an empty list, or only None)")
    out = np.concatenate(parts)
    if not np.all(np.isfinite(out)):
        raise ValueError("grads must all be finite: take the sample from a step that did not overflow")
    return out


def _sample(values):
    import numpy as np

    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("values is empty: pass a gradient sample, e.g. flatten_gradients(grads)")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must all be finite")
    return arr


def _scale(scale, name="scale") -> float:
    return _validate.real(name, scale, 0.0, strict_min=True, what="a positive loss scale, e.g. 2.0**15")


def flush_fractions(values, scale: float = 1.0, dtype: str = "float16") -> dict:
    """What fraction of ``values * scale`` is lost when cast to ``dtype``.

    Returns ``{"underflow": f0, "overflow": f_inf}``: the fraction of the
    non-zero values that become 0, and of all values that become +-inf. This
    is the question loss scaling answers: pick ``scale`` so both stay near 0.
    """
    import numpy as np

    scale = _scale(scale)
    arr = _sample(values)
    cast = round_to(arr * scale, dtype)
    nonzero = arr != 0
    under = float(np.mean(cast[nonzero] == 0)) if nonzero.any() else 0.0
    over = float(np.mean(~np.isfinite(cast)))
    return {"underflow": under, "overflow": over}


# --------------------------------------------------------------------------- the dynamic rule


@dataclass(frozen=True)
class LossScaleStep:
    """One optimizer step under dynamic loss scaling."""

    step: int
    finite: bool  # were the (scaled) gradients finite?
    applied: bool  # did the weights change? (non-finite steps are skipped)
    scale_after: float  # the loss scale for the next step
    good_steps: int  # consecutive finite steps since the scale last changed


@answers('05', 'q2')
def _next(scale: float, good: int, finite: bool, growth_steps: int) -> tuple[float, int]:
    """Keras 3's rule: halve and reset on overflow; double and reset on the growth_steps-th good step."""
    if not finite:
        return scale / 2, 0
    if good == growth_steps - 1:
        return scale * 2, 0
    return scale, good + 1


def _flags(finite) -> list[bool]:
    if isinstance(finite, (str, bytes)) or not isinstance(finite, Iterable):
        raise TypeError("finite must be a list of booleans, one per step (True = gradients were finite)")
    flags = list(finite)
    bad = [f for f in flags if not isinstance(f, bool)]
    if bad:
        raise TypeError(f"finite must contain only True/False, got {bad[0]!r}")
    return flags


def _rule_args(initial_scale, growth_steps) -> tuple[float, int]:
    return (_scale(initial_scale, "initial_scale"),
            _validate.whole("growth_steps", growth_steps, 1, what="finite steps in a row before the scale doubles"))


@answers('05', 'q2')
def simulate_loss_scale(finite: Iterable[bool], initial_scale: float = 2.0 ** 15,
                        growth_steps: int = 2000) -> list[LossScaleStep]:
    """Pure-Python model of Keras 3's dynamic loss scale.

    For each step: if the gradients are not finite the update is skipped, the
    scale is halved and the good-step counter resets; otherwise the update is
    applied and, once ``growth_steps`` finite steps in a row have happened,
    the scale doubles and the counter resets.
    """
    scale, growth_steps = _rule_args(initial_scale, growth_steps)
    good, out = 0, []
    for i, ok in enumerate(_flags(finite), 1):
        scale, good = _next(scale, good, ok, growth_steps)
        out.append(LossScaleStep(i, ok, ok, scale, good))
    return out


@answers('05', 'q2')
def loss_scale_trace(finite: Iterable[bool], initial_scale: float = 2.0 ** 15,
                     growth_steps: int = 2000) -> list[LossScaleStep]:
    """Drive a real ``keras.optimizers.LossScaleOptimizer`` and record what it does.

    One float32 weight, SGD(learning_rate=1). Each step feeds the gradient
    ``scale`` (which the optimizer unscales to 1) or ``inf``, per ``finite``.
    ``applied`` is read from whether the weight changed.
    """
    flags = _flags(finite)
    initial_scale, growth_steps = _rule_args(initial_scale, growth_steps)
    import numpy as np

    keras = _tf.keras()
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                              initial_scale=initial_scale, dynamic_growth_steps=growth_steps)
    w = keras.Variable(np.zeros((1,), np.float32), name="w")
    opt.build([w])
    out = []
    for i, ok in enumerate(flags, 1):
        before = float(w.numpy()[0])
        grad = np.array([float(opt.dynamic_scale.numpy()) if ok else np.inf], np.float32)
        opt.apply_gradients([(grad, w)])
        out.append(LossScaleStep(i, ok, float(w.numpy()[0]) != before, float(opt.dynamic_scale.numpy()),
                                 int(opt.step_counter.numpy())))
    return out


def _overflows(value: float, dtype: str) -> bool:
    return not math.isfinite(float(round_to(value, dtype)))


@answers('05', 'q2')
def scale_trajectory(max_abs_grad: float, initial_scale: float = 2.0 ** 15, growth_steps: int = 2000,
                     steps: int = 200, spike_every: int = 0, spike_factor: float = 1e4,
                     dtype: str = "float16") -> list[LossScaleStep]:
    """The dynamic scale over ``steps`` steps of a model whose largest gradient is ``max_abs_grad``.

    A step overflows when its largest scaled gradient does not fit in
    ``dtype``. Every ``spike_every``-th step (0: never) the gradients are
    ``spike_factor`` times larger, an injected overflow like a bad batch. The
    scale then follows :func:`simulate_loss_scale`'s rule: it climbs towards
    the ceiling ``max(dtype) / max_abs_grad``, halves when it crosses it or
    meets a spike, and climbs again.
    """
    peak = _validate.real("max_abs_grad", max_abs_grad, 0.0, strict_min=True, what="largest |gradient|")
    scale, growth_steps = _rule_args(initial_scale, growth_steps)
    steps = _validate.whole("steps", steps, 1)
    spike_every = _validate.whole("spike_every", spike_every, 0, what="0 for no injected overflows")
    spike_factor = _validate.real("spike_factor", spike_factor, 1.0)
    good, out = 0, []
    for i in range(1, steps + 1):
        spike = spike_factor if spike_every and i % spike_every == 0 else 1.0
        ok = not _overflows(peak * spike * scale, dtype)
        scale, good = _next(scale, good, ok, growth_steps)
        out.append(LossScaleStep(i, ok, ok, scale, good))
    return out


# --------------------------------------------------------------------------- explorers


def _view(text: str, fig):
    from .explore import View

    return View(text, fig)


def scale_view(sample, log2_scale: float, dtype: str = "float16"):
    """Explorer update: where ``sample * 2**log2_scale`` lands in ``dtype``; a histogram and one line of text."""
    import matplotlib.pyplot as plt
    import numpy as np

    arr = _sample(sample)
    log2_scale = _validate.real("log2_scale", log2_scale, -60, 80)
    fmt = float_format(dtype)
    frac = flush_fractions(arr, 2.0 ** log2_scale, dtype)
    nonzero = arr[arr != 0]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    if nonzero.size:
        ax.hist(np.log2(np.abs(nonzero)) + log2_scale, bins=60, color="tab:blue", alpha=0.8)
    lo, hi = math.log2(fmt.smallest_subnormal), math.log2(fmt.max)
    ax.axvspan(lo - 40, lo, color="tab:red", alpha=0.15, label=f"flushed to 0 in {dtype}")
    ax.axvspan(hi, hi + 40, color="tab:orange", alpha=0.2, label=f"inf in {dtype}")
    span = np.log2(np.abs(nonzero)) + log2_scale if nonzero.size else np.array([lo, hi])
    ax.set_xlim(min(lo, span.min()) - 2, max(hi, span.max()) + 2)
    ax.set_xlabel("log2 |scaled gradient|")
    ax.set_ylabel("entries")
    ax.set_title(f"loss scale 2^{log2_scale:g}")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    text = (f"scale 2^{log2_scale:g}: {frac['underflow']:.1%} of the {nonzero.size:,} non-zero gradient entries "
            f"underflow to 0 in {dtype}, {frac['overflow']:.1%} overflow to inf")
    return _view(text, fig)


def trajectory_view(max_abs_grad: float, initial_log2: int = 15, growth_steps: int = 20, spike_every: int = 0,
                    steps: int = 200, dtype: str = "float16"):
    """Explorer update: the dynamic scale over ``steps`` steps (:func:`scale_trajectory`), plotted as log2."""
    import matplotlib.pyplot as plt

    initial_log2 = _validate.real("initial_log2", initial_log2, -60, 80)
    traj = scale_trajectory(max_abs_grad, 2.0 ** initial_log2, growth_steps, steps, spike_every, dtype=dtype)
    ceiling = math.log2(float_format(dtype).max / max_abs_grad)
    xs = [0] + [s.step for s in traj]
    ys = [initial_log2] + [math.log2(s.scale_after) for s in traj]
    skipped = [s for s in traj if not s.finite]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.step(xs, ys, where="post", label="log2(loss scale)")
    ax.axhline(ceiling, color="tab:orange", ls="--", label=f"overflow ceiling 2^{ceiling:.1f}")
    if skipped:
        ax.plot([s.step for s in skipped], [math.log2(s.scale_after * 2) for s in skipped], "x", color="tab:red",
                label="skipped step (overflow)")
    ax.set_xlabel("step")
    ax.set_ylabel("log2(scale)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    spikes = steps // spike_every if spike_every else 0
    text = (f"{len(skipped)} of {steps} steps skipped ({spikes} injected spikes); final scale "
            f"2^{math.log2(traj[-1].scale_after):g}; ceiling 2^{ceiling:.1f} for max|g| = {max_abs_grad:.3g}")
    return _view(text, fig)


def loss_scale_explorer(sample, dtype: str = "float16"):
    """Explorer: a loss-scale slider over a real gradient sample (see :func:`scale_view`)."""
    from .explore import Explorer, slider

    arr = _sample(flatten_gradients(sample) if isinstance(sample, (list, tuple)) else sample)

    def update(log2_scale=15):
        return scale_view(arr, log2_scale, dtype)

    return Explorer("loss-scale", update, [slider("log2_scale", 0, 40, 15, label="log2(loss scale)")],
                    title="Loss scale on a real gradient sample",
                    presets=[{"log2_scale": 0}, {"log2_scale": 24}, {"log2_scale": 40}])


def dynamic_scale_explorer(sample, dtype: str = "float16", steps: int = 200):
    """Explorer: the dynamic scale's trajectory for a gradient sample, with injected overflow spikes."""
    from .explore import Explorer, slider

    arr = _sample(flatten_gradients(sample) if isinstance(sample, (list, tuple)) else sample)
    peak = float(abs(arr).max())
    if peak == 0:
        raise ValueError("the gradient sample is all zeros: no scale ever overflows")

    def update(initial_log2=15, growth_steps=5, spike_every=0):
        return trajectory_view(peak, initial_log2, growth_steps, spike_every, steps, dtype)

    controls = [slider("initial_log2", 0, 48, 15, label="log2(initial scale)"),
                slider("growth_steps", 1, 50, 5, label="dynamic_growth_steps"),
                slider("spike_every", 0, 100, 0, label="overflow spike every N steps (0: none)")]
    return Explorer("dynamic-scale", update, controls, title="Dynamic loss scale over training steps",
                    presets=[{"initial_log2": 44}, {"spike_every": 25}])


# --------------------------------------------------------------------------- replicas


def share_overflow_verdict(grads):
    """Inside ``strategy.run``: if any replica's gradients are not finite, make every replica's ``inf``.

    Keras 3.15's ``LossScaleOptimizer`` decides on replica 0's local
    gradients. Call this on the scaled gradients before
    ``optimizer.apply_gradients``: one scalar all-reduce per step, after which
    every replica agrees and an overflow anywhere skips the step everywhere.
    """
    tf = _tf.tf()
    grads = list(grads)
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise RuntimeError("share_overflow_verdict must run inside strategy.run (a replica context)")
    dense = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in dense])
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(ok, tf.float32))
    poison = tf.where(bad > 0, float("inf"), 0.0)
    out = []
    for g in grads:
        if g is None:
            out.append(None)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.IndexedSlices(g.values + tf.cast(poison, g.dtype), g.indices, g.dense_shape))
        else:
            out.append(g + tf.cast(poison, g.dtype))
    return out


_REPLICA_PROBE = r"""
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from gpucourse.precision_scaling import share_overflow_verdict

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    w = keras.Variable(np.ones((3,), np.float32))
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024.0)
    opt.build([w])


@tf.function
def step(bad, share):  # bad: the replica whose gradient is inf (-1: none); share: use share_overflow_verdict
    def replica_fn():
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        g = tf.where(tf.equal(rid, bad), tf.fill([3], np.inf), tf.ones([3])) * opt.dynamic_scale  # scaled
        g = tf.where(share, share_overflow_verdict([g])[0], g)
        opt.apply_gradients(zip([g], [w]))
    strategy.run(replica_fn)


rows = []
for bad, share in ((None, False), (0, False), (1, False), (1, True)):
    w.assign(np.ones((3,), np.float32))
    opt.dynamic_scale.assign(1024.0)
    opt.step_counter.assign(0)
    opt.iterations.assign(0)
    step(tf.constant(-1 if bad is None else bad, tf.int32), tf.constant(share))
    v = w.numpy()
    rows.append({"overflow on": "no replica" if bad is None else f"replica {bad}", "verdict shared": share,
                 "weights finite": bool(np.all(np.isfinite(v))), "weights changed": bool(np.any(v != 1.0)),
                 "scale after": float(opt.dynamic_scale.numpy()), "iterations": int(opt.iterations.numpy())})
emit(rows)
"""


def _run_replica_probe(timeout):
    return _probe.run(_REPLICA_PROBE, env={"CUDA_VISIBLE_DEVICES": "-1"}, timeout=timeout,
                      label="replica overflow probe")


def replica_overflow_probe(timeout: float = 180, background: bool = False):
    """In a fresh process, one loss-scaled step on 2 replicas (logical CPUs) with an overflow on one.

    Four runs, from an initial scale of 1024: no overflow; replica 0
    overflows; replica 1 overflows; replica 1 overflows with
    :func:`share_overflow_verdict`. Each row says whether the weights stayed
    finite and changed, the scale afterwards and the optimizer's iterations.
    The probe hides GPUs, so the answer is the same on every machine. It
    takes a few seconds (a fresh TensorFlow): with ``background=True`` it
    returns at once a ``concurrent.futures.Future`` whose ``result()`` is
    the list of rows, so a notebook can go on meanwhile.
    """
    timeout = _validate.seconds("timeout", timeout, allow_zero=False)
    if not isinstance(background, bool):
        raise TypeError(f"background must be True or False, got {background!r}")
    if not background:
        return _run_replica_probe(timeout)
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replica-overflow-probe")
    future = pool.submit(_run_replica_probe, timeout)
    pool.shutdown(wait=False)
    return future
