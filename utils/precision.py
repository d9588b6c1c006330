"""Topic 05: mixed precision and loss scaling with Keras 3.

Five jobs:

* **Number formats.** :func:`float_format` and :func:`format_table` describe
  float32, float16 and bfloat16 (range, smallest values, precision);
  :func:`cast_table` shows what casting concrete numbers does to them
  (exact, rounded, subnormal, underflow to 0, overflow to inf), and
  :func:`flush_fractions` measures how much of a gradient distribution a
  loss scale saves from underflow or pushes into overflow.
* **Policies.** :func:`policy_scope` sets the process-wide Keras dtype policy
  and always restores the previous one; :func:`dtype_report` lists, for every
  layer, the compute, variable and output dtypes, and warns about the classic
  mistakes (a float16 softmax output, for one).
* **Memory.** :func:`memory_by_policy` builds the same model under several
  policies and estimates the bytes of parameters and activations;
  :func:`measure_peak_bytes` measures a peak with TensorFlow's allocator stats.
* **Loss scaling.** :func:`simulate_loss_scale` is a pure-Python model of
  Keras 3's dynamic loss scaling, and :func:`loss_scale_trace` drives a real
  ``keras.optimizers.LossScaleOptimizer`` with finite and non-finite gradients,
  so the two can be compared step by step.
* **Speed and hardware.** :func:`compare_policies` times one training step
  per policy side by side (via :mod:`gpucourse.timing`);
  :func:`tensor_core_support` and :func:`recommend_policy` turn a GPU's compute
  capability into advice.

Importing this module never imports TensorFlow or Keras: they are imported
inside the functions that need them. Remember that the global dtype policy is
process-wide state: every helper here that changes it restores it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

__all__ = [
    "POLICIES",
    "CastResult",
    "DTypeReport",
    "FloatFormat",
    "LayerDTypes",
    "LossScaleStep",
    "MemoryRow",
    "MemoryTable",
    "PolicyAdvice",
    "cast_table",
    "classify_cast",
    "compare_policies",
    "dtype_report",
    "flush_fractions",
    "float_format",
    "format_table",
    "gpu_compute_capability",
    "loss_scale_trace",
    "measure_peak_bytes",
    "memory_by_policy",
    "policy_scope",
    "recommend_policy",
    "simulate_loss_scale",
    "tensor_core_support",
]

#: The dtype policies Keras 3 accepts by name that this course uses.
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16", "float64")
#: The floating-point formats :func:`float_format` knows.
FORMATS = ("float64", "float32", "float16", "bfloat16")
#: Compute capability from which NVIDIA GPUs have Tensor Cores for each dtype.
TENSOR_CORE_MIN_CC = {"float16": (7, 0), "bfloat16": (8, 0)}


# --------------------------------------------------------------------------- number formats


def _np_dtype(name: str):
    """numpy dtype for a format name (bfloat16 comes from ml_dtypes, a TensorFlow dependency)."""
    import numpy as np

    if not isinstance(name, str):
        raise TypeError(f"dtype must be a name like 'float16', got {type(name).__name__}")
    if name not in FORMATS:
        raise ValueError(f"unknown floating-point format {name!r}; expected one of {', '.join(FORMATS)}")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _finfo(name: str):
    import numpy as np

    dt = _np_dtype(name)
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


@dataclass(frozen=True)
class FloatFormat:
    """What one floating-point format can represent."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (precision is one more)
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float  # gap between 1.0 and the next representable number

    @property
    def decimal_digits(self) -> float:
        """Roughly how many significant decimal digits survive a cast."""
        return (self.mantissa_bits + 1) * math.log10(2)

    def __str__(self) -> str:
        return (f"{self.name}: {self.bits} bits (exponent {self.exponent_bits}, mantissa {self.mantissa_bits}), "
                f"max {self.max:.4g}, smallest normal {self.smallest_normal:.4g}, "
                f"smallest subnormal {self.smallest_subnormal:.4g}, eps {self.eps:.4g}")


def float_format(dtype: str) -> FloatFormat:
    """Describe ``dtype`` ('float64', 'float32', 'float16' or 'bfloat16')."""
    fi = _finfo(dtype)
    bits = _np_dtype(dtype).itemsize * 8
    return FloatFormat(dtype, bits, int(fi.nexp), int(fi.nmant), float(fi.max), float(fi.smallest_normal),
                       float(fi.smallest_subnormal), float(fi.eps))


def format_table(dtypes: Sequence[str] = ("float32", "float16", "bfloat16")) -> str:
    """Aligned text table of :func:`float_format` for each of ``dtypes``."""
    if isinstance(dtypes, str) or not isinstance(dtypes, Sequence) or not dtypes:
        raise ValueError("dtypes must be a non-empty list of names like ['float32', 'float16']")
    head = ["format", "bits", "exp", "mant", "max", "min normal", "min subnormal", "eps", "digits"]
    rows = [head]
    for d in dtypes:
        f = float_format(d)
        rows.append([f.name, str(f.bits), str(f.exponent_bits), str(f.mantissa_bits), f"{f.max:.4g}",
                     f"{f.smallest_normal:.4g}", f"{f.smallest_subnormal:.4g}", f"{f.eps:.4g}",
                     f"{f.decimal_digits:.1f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


@dataclass(frozen=True)
class CastResult:
    """One value cast to one format: what came back and what happened."""

    value: float
    dtype: str
    result: float
    outcome: str  # "exact", "rounded", "subnormal", "underflow" or "overflow"

    @property
    def relative_error(self) -> float:
        """|result - value| / |value| (inf on overflow, 1.0 on underflow, 0 for value 0)."""
        if self.value == 0:
            return 0.0 if self.result == 0 else math.inf
        return abs(self.result - self.value) / abs(self.value)


def _check_number(value, what="value") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{what} must not be NaN")
    return value


def classify_cast(value: float, dtype: str) -> CastResult:
    """Cast one finite number to ``dtype`` (round to nearest even) and classify what happened.

    ``overflow``: it became +-inf. ``underflow``: a non-zero value became 0.
    ``subnormal``: non-zero but below the smallest normal number, so precision
    is lost gradually. ``rounded``: a normal number that changed. ``exact``:
    unchanged.
    """
    import numpy as np

    value = _check_number(value)
    if math.isinf(value):
        raise ValueError("value must be finite: casting inf is not an overflow")
    dt = _np_dtype(dtype)
    with np.errstate(over="ignore", under="ignore"):
        result = float(np.asarray(value, dtype=np.float64).astype(dt).astype(np.float64))
    fmt = float_format(dtype)
    if math.isinf(result):
        outcome = "overflow"
    elif value != 0 and result == 0:
        outcome = "underflow"
    elif result != 0 and abs(result) < fmt.smallest_normal:
        outcome = "subnormal"
    elif result == value:
        outcome = "exact"
    else:
        outcome = "rounded"
    return CastResult(value, dtype, result, outcome)


def cast_table(values: Iterable[float], dtypes: Sequence[str] = ("float32", "float16", "bfloat16")) -> str:
    """Text table: each value cast to each dtype, with the outcome in brackets."""
    values = list(values)
    if not values:
        raise ValueError("values is empty: give a few numbers to cast, e.g. [1e-8, 1.001, 70000]")
    if isinstance(dtypes, str) or not dtypes:
        raise ValueError("dtypes must be a non-empty list of names like ['float16', 'bfloat16']")
    rows = [["value"] + list(dtypes)]
    for v in values:
        cells = [f"{_check_number(v):.6g}"]
        for d in dtypes:
            r = classify_cast(v, d)
            cells.append(f"{r.result:.6g} ({r.outcome})")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def flush_fractions(values, scale: float = 1.0, dtype: str = "float16") -> dict:
    """What fraction of ``values * scale`` is lost when cast to ``dtype``.

    Returns ``{"underflow": f0, "overflow": f_inf}``: the fraction of the
    non-zero values that become 0, and of all values that become +-inf. This
    is the question loss scaling answers: pick ``scale`` so both stay near 0.
    """
    import numpy as np

    scale = _check_number(scale, "scale")
    if not scale > 0 or math.isinf(scale):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("values is empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must all be finite")
    with np.errstate(over="ignore", under="ignore"):
        cast = (arr * scale).astype(_np_dtype(dtype)).astype(np.float64)
    nonzero = arr != 0
    under = float(np.mean(cast[nonzero] == 0)) if nonzero.any() else 0.0
    over = float(np.mean(np.isinf(cast)))
    return {"underflow": under, "overflow": over}


# --------------------------------------------------------------------------- policies


def _check_policy(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"policy must be a name like 'mixed_float16', got {type(name).__name__}")
    if name not in POLICIES:
        raise ValueError(f"unknown dtype policy {name!r}; expected one of {', '.join(POLICIES)}")
    return name


@contextlib.contextmanager
def policy_scope(name: str):
    """Set Keras's global dtype policy to ``name`` inside a ``with`` block, then restore the old one.

    The global policy is process-wide: layers created while it is set keep it
    for life, and anything created later, in any cell, gets it too. Always
    restoring it (even when the block raises) keeps that contained::

        with precision.policy_scope("mixed_float16"):
            model = build_model()
    """
    _check_policy(name)
    import keras

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield keras.mixed_precision.global_policy()
    finally:
        keras.mixed_precision.set_global_policy(before)


@dataclass(frozen=True)
class LayerDTypes:
    """The dtypes of one layer."""

    name: str
    kind: str  # class name
    policy: str
    compute_dtype: str
    variable_dtype: str
    output_dtype: str  # "?" when the layer has no symbolic output (subclassed models)
    weights: tuple = ()  # dtypes of the layer's own weights, e.g. ("float32", "float32")


@dataclass
class DTypeReport:
    """Per-layer dtypes of a model plus warnings about common mixed-precision mistakes."""

    model_name: str
    global_policy: str
    layers: list[LayerDTypes]
    output_dtypes: list[str]
    warnings: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        head = ["layer", "type", "policy", "compute", "variables", "output"]
        rows = [head] + [[r.name, r.kind, r.policy, r.compute_dtype,
                          ",".join(sorted(set(r.weights))) if r.weights else "-", r.output_dtype]
                         for r in self.layers]
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        lines.append(f"model output dtype(s): {', '.join(self.output_dtypes) or '?'}")
        lines += [f"[WARN] {w}" for w in self.warnings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.to_text())


def _dtype_name(d) -> str:
    if d is None:
        return "?"
    return getattr(d, "name", None) or str(d)


def _outputs(layer) -> list:
    outs = getattr(layer, "outputs", None)  # models (Sequential has .outputs but no .output)
    if isinstance(outs, (list, tuple)) and outs:
        return list(outs)
    try:
        out = layer.output
    except (AttributeError, ValueError):
        return []
    return out if isinstance(out, (list, tuple)) else ([out] if out is not None else [])


def dtype_report(model) -> DTypeReport:
    """Every top-level layer's policy, compute/variable/output dtypes, plus warnings.

    Output dtypes are read from the symbolic graph, so they are known for
    functional models and Sequential models started with ``keras.Input``.
    Warnings flag a model that computes in float16/bfloat16 but returns
    low-precision outputs (put ``dtype="float32"`` on the last layer), and
    weights that are stored in float16 (a ``"float16"`` policy rather than
    ``"mixed_float16"``: updates smaller than eps get lost).
    """
    import keras

    if not isinstance(model, keras.layers.Layer):
        raise TypeError(f"model must be a Keras model or layer, got {type(model).__name__}")
    layers = list(getattr(model, "layers", [model])) or [model]
    rows = []
    for layer in layers:
        outs = _outputs(layer)
        rows.append(LayerDTypes(
            name=layer.name, kind=type(layer).__name__, policy=layer.dtype_policy.name,
            compute_dtype=_dtype_name(layer.compute_dtype), variable_dtype=_dtype_name(layer.variable_dtype),
            output_dtype=",".join(_dtype_name(o.dtype) for o in outs) or "?",
            weights=tuple(_dtype_name(w.dtype) for w in layer.weights)))
    model_outs = [_dtype_name(o.dtype) for o in _outputs(model)]
    warnings = []
    low = {"float16", "bfloat16"}
    if any(r.compute_dtype in low for r in rows) and any(d in low for d in model_outs):
        warnings.append(f"the model returns {', '.join(sorted(set(model_outs) & low))}: give the last layer "
                        "dtype='float32' (e.g. keras.layers.Activation('softmax', dtype='float32')) so the "
                        "softmax and the loss are computed in float32")
    stored_low = sorted({w for r in rows for w in r.weights} & low)
    if stored_low:
        warnings.append(f"weights are stored in {', '.join(stored_low)}: use a 'mixed_*' policy to keep "
                        "float32 master weights, or small updates are rounded away")
    return DTypeReport(model.name, keras.mixed_precision.global_policy().name, rows, model_outs, warnings)


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryRow:
    """Estimated bytes of one model under one policy."""

    policy: str
    param_bytes: int  # trainable and non-trainable weights, in their variable dtype
    activation_bytes: int  # every layer's output for one batch, in its output dtype
    cast_copy_bytes: int  # compute-dtype copies of the weights made during the forward pass

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.activation_bytes + self.cast_copy_bytes


@dataclass
class MemoryTable:
    """One :class:`MemoryRow` per policy, printable with ratios to the first row."""

    batch_size: int
    rows: list[MemoryRow]

    def __getitem__(self, policy: str) -> MemoryRow:
        for r in self.rows:
            if r.policy == policy:
                return r
        raise KeyError(f"no row for policy {policy!r}; have {[r.policy for r in self.rows]}")

    def to_text(self) -> str:
        base = self.rows[0]

        def mib(n):
            return f"{n / 2**20:.2f} MiB"

        head = ["policy", "params", "activations", "weight casts", "total", f"total / {base.policy}"]
        rows = [head] + [[r.policy, mib(r.param_bytes), mib(r.activation_bytes), mib(r.cast_copy_bytes),
                          mib(r.total_bytes), f"{r.total_bytes / base.total_bytes:.2f}"] for r in self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        text = "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                         for row in rows)
        return f"estimated memory for a batch of {self.batch_size}\n{text}"

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.to_text())


def _itemsize(dtype) -> int:
    import numpy as np

    name = _dtype_name(dtype)
    return 2 if name == "bfloat16" else np.dtype(name).itemsize


def _estimate(model, batch_size: int, policy: str) -> MemoryRow:
    import keras

    params = sum(math.prod(w.shape) * _itemsize(w.dtype) for w in model.weights)
    acts = casts = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        outs = _outputs(layer)
        if not outs:
            raise ValueError(f"layer {layer.name!r} has no symbolic output: build the model from keras.Input "
                             "(functional or Sequential) so activation sizes are known")
        for o in outs:
            acts += batch_size * math.prod(d for d in o.shape[1:]) * _itemsize(o.dtype)
        if _dtype_name(layer.compute_dtype) != _dtype_name(layer.variable_dtype):
            casts += sum(math.prod(w.shape) * _itemsize(layer.compute_dtype) for w in layer.trainable_weights)
    return MemoryRow(policy, int(params), int(acts), int(casts))


def memory_by_policy(build_fn: Callable, batch_size: int,
                     policies: Sequence[str] = ("float32", "mixed_float16", "mixed_bfloat16")) -> MemoryTable:
    """Build ``build_fn()`` under each policy and estimate its memory for one batch.

    Activations are the outputs of every layer (what a training step keeps for
    the backward pass, roughly); parameters are counted in their variable
    dtype; "weight casts" are the float16/bfloat16 copies of the weights that
    mixed layers make on every call. Optimizer slots (e.g. Adam's two per
    weight) stay float32 under every mixed policy and are not counted. The
    global policy is restored afterwards.
    """
    if not callable(build_fn):
        raise TypeError(f"build_fn must be a function returning a Keras model, got {type(build_fn).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if isinstance(policies, str) or not policies:
        raise ValueError("policies must be a non-empty list of policy names")
    rows = []
    for p in policies:
        with policy_scope(p):
            model = build_fn()
        rows.append(_estimate(model, batch_size, p))
    return MemoryTable(batch_size, rows)


def measure_peak_bytes(fn: Callable, device: str = "CPU:0") -> int:
    """Run ``fn()`` once and return the allocator's peak bytes on ``device`` during the call.

    Uses ``tf.config.experimental.reset_memory_stats`` and ``get_memory_info``,
    which work for ``'CPU:0'`` and ``'GPU:0'``. Results are synced before the
    peak is read.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(device, str) or ":" not in device:
        raise ValueError(f"device must be like 'CPU:0' or 'GPU:0', got {device!r}")
    import tensorflow as tf

    from .timing import sync

    tf.config.experimental.reset_memory_stats(device)
    sync(fn())
    return int(tf.config.experimental.get_memory_info(device)["peak"])


# --------------------------------------------------------------------------- loss scaling


@dataclass(frozen=True)
class LossScaleStep:
    """One optimizer step under dynamic loss scaling."""

    step: int
    finite: bool  # were the (scaled) gradients finite?
    applied: bool  # did the weights change? (non-finite steps are skipped)
    scale_after: float  # the loss scale for the next step
    good_steps: int  # consecutive finite steps since the scale last changed


def _check_flags(finite) -> list[bool]:
    if isinstance(finite, (str, bytes)) or not isinstance(finite, Iterable):
        raise TypeError("finite must be a list of booleans, one per step (True = gradients were finite)")
    flags = list(finite)
    bad = [f for f in flags if not isinstance(f, bool)]
    if bad:
        raise TypeError(f"finite must contain only True/False, got {bad[0]!r}")
    return flags


def _check_scale_args(initial_scale, growth_steps):
    initial_scale = _check_number(initial_scale, "initial_scale")
    if not initial_scale > 0 or math.isinf(initial_scale):
        raise ValueError(f"initial_scale must be a positive finite number, got {initial_scale!r}")
    if isinstance(growth_steps, bool) or not isinstance(growth_steps, int) or growth_steps < 1:
        raise ValueError(f"growth_steps must be a whole number >= 1, got {growth_steps!r}")
    return initial_scale


def simulate_loss_scale(finite: Iterable[bool], initial_scale: float = 2.0 ** 15,
                        growth_steps: int = 2000) -> list[LossScaleStep]:
    """Pure-Python model of Keras 3's dynamic loss scale.

    For each step: if the gradients are not finite the update is skipped, the
    scale is halved and the good-step counter resets; otherwise the update is
    applied and, once ``growth_steps`` finite steps in a row have happened,
    the scale doubles and the counter resets.
    """
    scale = _check_scale_args(initial_scale, growth_steps)
    good, out = 0, []
    for i, ok in enumerate(_check_flags(finite), 1):
        if not ok:
            scale, good = scale / 2, 0
        elif good == growth_steps - 1:
            scale, good = scale * 2, 0
        else:
            good += 1
        out.append(LossScaleStep(i, ok, ok, scale, good))
    return out


def loss_scale_trace(finite: Iterable[bool], initial_scale: float = 2.0 ** 15,
                     growth_steps: int = 2000) -> list[LossScaleStep]:
    """Drive a real ``keras.optimizers.LossScaleOptimizer`` and record what it does.

    One float32 weight, SGD(learning_rate=1). Each step feeds the gradient
    ``scale`` (which the optimizer unscales to 1) or ``inf``, per ``finite``.
    ``applied`` is read from whether the weight changed.
    """
    flags = _check_flags(finite)
    initial_scale = _check_scale_args(initial_scale, growth_steps)
    import keras
    import numpy as np

    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                              initial_scale=initial_scale, dynamic_growth_steps=growth_steps)
    w = keras.Variable(np.zeros((1,), np.float32), name="w")
    opt.build([w])
    out = []
    for i, ok in enumerate(flags, 1):
        before = float(w.numpy()[0])
        scale = float(opt.dynamic_scale.numpy())
        grad = np.array([scale if ok else np.inf], np.float32)
        opt.apply_gradients([(grad, w)])
        out.append(LossScaleStep(i, ok, float(w.numpy()[0]) != before, float(opt.dynamic_scale.numpy()),
                                 int(opt.step_counter.numpy())))
    return out


# --------------------------------------------------------------------------- speed and hardware


def compare_policies(build_fn: Callable, x, y, loss: str | Callable = "sparse_categorical_crossentropy",
                     policies: Sequence[str] = ("float32", "mixed_float16", "mixed_bfloat16"),
                     *, warmup: int = 2, repeats: int = 5, optimizer: str = "sgd"):
    """Time one ``train_on_batch`` per policy, side by side, with float32 as the baseline.

    Each policy gets its own model (``build_fn()`` inside :func:`policy_scope`),
    compiled with ``optimizer`` and ``loss``; under ``mixed_float16`` compile
    wraps the optimizer in a ``LossScaleOptimizer`` by itself. The returned
    :class:`gpucourse.timing.Comparison` has a bound: half the float32 time,
    what halving every byte moved would give a purely memory-bound step.
    Tensor Cores can beat it on large matmuls; a CPU without float16 units
    does not reach it.
    """
    from . import timing

    if not callable(build_fn):
        raise TypeError(f"build_fn must be a function returning a Keras model, got {type(build_fn).__name__}")
    if isinstance(policies, str) or not policies:
        raise ValueError("policies must be a non-empty list of policy names")
    for p in policies:
        _check_policy(p)
    candidates = {}
    for p in policies:
        with policy_scope(p):
            model = build_fn()
            model.compile(optimizer=optimizer, loss=loss)
        candidates[p] = (lambda m: (lambda: m.train_on_batch(x, y)))(model)
    cmp = timing.compare(candidates, warmup=warmup, repeats=repeats, baseline=policies[0])
    return dataclasses.replace(cmp, bound_s=cmp[policies[0]].median_s / 2, bound_label="half-bytes bound")


def _check_cc(cc) -> tuple[int, int]:
    if isinstance(cc, str):
        try:
            major, minor = (int(p) for p in cc.split("."))
        except ValueError:
            raise ValueError(f"compute capability must look like '8.6' or (8, 6), got {cc!r}") from None
        return major, minor
    if (isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(p, int) and not isinstance(p, bool)
                                                       for p in cc)):
        return cc
    raise TypeError(f"compute capability must be a string like '8.6' or a tuple like (8, 6), got {cc!r}")


def tensor_core_support(cc) -> dict[str, bool]:
    """Which low-precision dtypes get Tensor Cores on a GPU of compute capability ``cc``.

    float16 needs >= 7.0 (Volta), bfloat16 needs >= 8.0 (Ampere).
    """
    cc = _check_cc(cc)
    return {dtype: cc >= need for dtype, need in TENSOR_CORE_MIN_CC.items()}


@dataclass(frozen=True)
class PolicyAdvice:
    """The policy to use on a device, and why."""

    policy: str
    reason: str

    def __str__(self) -> str:
        return f"{self.policy}: {self.reason}"


def recommend_policy(cc=None) -> PolicyAdvice:
    """Advice for a GPU of compute capability ``cc`` (e.g. '8.6'), or for a CPU when ``cc`` is None."""
    if cc is None:
        return PolicyAdvice("float32", "a CPU without float16/bfloat16 matrix units gains nothing from mixed "
                                       "precision and usually runs slower: keep float32")
    support = tensor_core_support(cc)
    name = ".".join(map(str, _check_cc(cc)))
    if support["bfloat16"]:
        return PolicyAdvice("mixed_bfloat16", f"compute capability {name} has bfloat16 Tensor Cores: same speed "
                                              "as float16 with float32's range, so no loss scaling is needed "
                                              "(mixed_float16 works too)")
    if support["float16"]:
        return PolicyAdvice("mixed_float16", f"compute capability {name} has float16 Tensor Cores (no bfloat16 "
                                             "ones): use mixed_float16 with loss scaling")
    return PolicyAdvice("float32", f"compute capability {name} is below 7.0: no Tensor Cores, mixed precision "
                                   "only saves memory and may be slower")


def gpu_compute_capability(index: int = 0) -> tuple[int, int] | None:
    """Compute capability of physical GPU ``index`` as TensorFlow reports it, or None without a GPU."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a whole number >= 0, got {index!r}")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if index >= len(gpus):
        return None
    cc = tf.config.experimental.get_device_details(gpus[index]).get("compute_capability")
    return tuple(cc) if cc else None
