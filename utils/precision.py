"""Topic 05: what a Keras dtype policy does to a model (its dtypes, memory and step time).

This module's own job is **dtype policies**: :func:`policy_scope` sets the
process-wide Keras policy and always restores the previous one;
:func:`dtype_report` lists every layer's compute, variable and output dtypes
and warns about the classic mistakes (a float16 softmax output, float16
weights); :func:`memory_by_policy` and :func:`measure_peak_bytes` estimate and
measure the memory a policy saves; :func:`compare_policies` times one training
step per policy side by side, and :func:`pick_speedup_bound` says the most
that step can gain on a given device (a CPU, or a GPU by name and compute
capability), so a measured speed-up is drawn beside the ceiling that applies.

The rest of topic 05 lives in three modules, one job each, whose names are
re-exported here so that notebooks write ``precision.<name>`` for all of them:

* :mod:`gpucourse.precision_formats`: number formats and rounding (float16,
  bfloat16, float8, TF32 emulated in NumPy);
* :mod:`gpucourse.precision_scaling`: loss scaling (the dynamic rule, a real
  optimizer's trace, the explorers, replicas under a strategy);
* :mod:`gpucourse.precision_hardware`: Tensor Core support per compute
  capability, data-sheet peaks, TF32's switch and policy advice.

Importing this module never imports TensorFlow or Keras. Remember that the
global dtype policy is process-wide state: every helper here that changes it
restores it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from . import _tf, _validate
from ._labrules import answers
from . import precision_formats as _formats
from . import precision_hardware as _hardware
from . import precision_scaling as _scaling
from .precision_formats import *  # noqa: F401,F403  (re-exported: see the module docstring)
from .precision_hardware import *  # noqa: F401,F403
from .precision_scaling import *  # noqa: F401,F403

_OWN = [
    "POLICIES",
    "DTypeReport",
    "LayerDTypes",
    "MemoryRow",
    "MemoryTable",
    "SpeedupBound",
    "compare_policies",
    "describe_device",
    "dtype_report",
    "measure_peak_bytes",
    "memory_by_policy",
    "pick_speedup_bound",
    "policy_scope",
    "CPU_16BIT_FLAGS",
    "MEMORY_BOUND_SPEEDUP",
]
__all__ = _OWN + list(_formats.__all__) + list(_hardware.__all__) + list(_scaling.__all__)

#: The dtype policies Keras 3 accepts by name that this course uses.
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16", "float64")

#: The ceiling of a memory-bound step (elementwise ops, normalisation, optimizer updates): 16-bit
#: activations move half the bytes, so at best the step takes half the time.
MEMORY_BOUND_SPEEDUP = 2.0
#: CPU feature flags (Linux /proc/cpuinfo names) that give a CPU native units for 16-bit matrix
#: products, per dtype. Without them a CPU computes 16-bit matmuls on its float32 units.
CPU_16BIT_FLAGS = {"float16": ("avx512_fp16", "amx_fp16"), "bfloat16": ("avx512_bf16", "amx_bf16")}


# --------------------------------------------------------------------------- policies


def _check_policy(name) -> str:
    _validate.text("policy", name, "a dtype policy name like 'mixed_float16'")
    return _validate.one_of("policy", name, POLICIES)


def _policies(policies) -> list[str]:
    if isinstance(policies, str) or not isinstance(policies, Sequence) or not policies:
        raise TypeError(f"policies must be a non-empty list of policy names like ['float32', 'mixed_float16'], "
                        f"got {policies!r}")
    return [_check_policy(p) for p in policies]


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
    keras = _tf.keras()
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
    keras = _tf.keras()

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
                        "dtype='float32' (e.g. keras.layers.Activation('softmax', dtype='float32')). The loss "
                        "converts y_pred to float32 anyway, but cannot restore what a 16-bit softmax rounded away")
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
    keras = _tf.keras()

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
    _validate.callable_("build_fn", build_fn)
    batch_size = _validate.whole("batch_size", batch_size, 1, what="examples per batch")
    rows = []
    for p in _policies(policies):
        with policy_scope(p):
            model = build_fn()
        rows.append(_estimate(model, batch_size, p))
    return MemoryTable(batch_size, rows)


@answers('03', 'q6')
def measure_peak_bytes(fn: Callable, device: str = "CPU:0") -> int:
    """Run ``fn()`` once and return the allocator's peak bytes on ``device`` during the call.

    Uses ``tf.config.experimental.reset_memory_stats`` and ``get_memory_info``,
    which work for ``'GPU:0'`` and, with oneDNN on, for ``'CPU:0'`` (without it,
    a ValueError that says so). Results are synced before the peak is read.
    """
    _validate.callable_("fn", fn)
    if _validate.text("device", device, "e.g. 'CPU:0' or 'GPU:0'").count(":") != 1:
        raise ValueError(f"device must be like 'CPU:0' or 'GPU:0', got {device!r}")
    tf = _tf.tf()

    from .timing import sync

    try:
        tf.config.experimental.reset_memory_stats(device)
    except ValueError as err:
        raise ValueError(f"TensorFlow keeps no allocator statistics for {device!r} in this process ({err}). On a "
                         "CPU they need oneDNN: start Python with TF_ENABLE_ONEDNN_OPTS=1 (the setup cell sets it "
                         "unless you set it to 0 yourself); on a GPU pass 'GPU:0'") from None
    sync(fn())
    return int(tf.config.experimental.get_memory_info(device)["peak"])


# --------------------------------------------------------------------------- speed


def compare_policies(build_fn: Callable, x, y, loss: str | Callable = "sparse_categorical_crossentropy",
                     policies: Sequence[str] = ("float32", "mixed_float16", "mixed_bfloat16"),
                     *, warmup: int = 2, repeats: int = 5, optimizer: str = "sgd", jit_compile: bool = False,
                     ceiling: float | None = MEMORY_BOUND_SPEEDUP, ceiling_label: str = "half-bytes bound"):
    """Time one ``train_on_batch`` per policy, side by side, with the first policy as the baseline.

    Each policy gets its own model (``build_fn()`` inside :func:`policy_scope`),
    compiled with ``optimizer``, ``loss`` and ``jit_compile``; under
    ``mixed_float16`` compile wraps the optimizer in a ``LossScaleOptimizer``
    by itself. ``jit_compile`` is pinned to False by default: Keras's own
    default, ``"auto"``, means XLA on a GPU but not on a CPU, so the same
    call would compare different things on the two. Pass ``"auto"`` or True to
    time what ``fit`` does on a GPU (topic 06 teaches XLA).

    The returned :class:`gpucourse.timing.Comparison` has a bound: the
    baseline time divided by ``ceiling``. The default, 2, is what halving
    every byte moved gives a purely memory-bound step; a matmul-bound step
    has another ceiling, which depends on the device (Tensor Cores reach 8x
    on a T4, a CPU without 16-bit units 1x): pass
    ``pick_speedup_bound(...).matmul`` for it, or ``ceiling=None`` for no bound.
    """
    from . import timing

    _validate.callable_("build_fn", build_fn)
    policies = _policies(policies)
    if jit_compile not in (True, False, "auto"):
        raise ValueError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}")
    if ceiling is not None:
        ceiling = _validate.real("ceiling", ceiling, 0.0, strict_min=True,
                                 what="the most the step can speed up, e.g. 2.0; None for no bound")
    _validate.text("ceiling_label", ceiling_label, "what the ceiling is, e.g. 'half-bytes bound'")
    candidates = {}
    for p in policies:
        with policy_scope(p):
            model = build_fn()
            model.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
        candidates[p] = (lambda m: (lambda: m.train_on_batch(x, y)))(model)
    cmp = timing.compare(candidates, warmup=warmup, repeats=repeats, baseline=policies[0])
    if ceiling is None:
        return cmp
    return dataclasses.replace(cmp, bound_s=cmp[policies[0]].median_s / ceiling, bound_label=ceiling_label)


# --------------------------------------------------------------------------- speed-up ceilings



@dataclass(frozen=True)
class SpeedupBound:
    """The most a 16-bit policy can speed a training step up on one device, by what limits the step.

    ``matmul`` is the ceiling of a matmul-bound step (``None``: no figure is
    known, and ``reason`` says why); ``memory`` that of a memory-bound step.
    A step that mixes both is bounded by the larger of the two.
    """

    device: str
    policy: str
    matmul: float | None
    memory: float
    reason: str

    def __str__(self) -> str:
        matmul = "unknown" if self.matmul is None else f"{self.matmul:.1f}x"
        return (f"{self.policy} on {self.device}: matmul-bound ceiling {matmul}, memory-bound ceiling "
                f"{self.memory:.1f}x ({self.reason})")


def _cpu_flags() -> frozenset:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo; empty elsewhere (unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def describe_device(index: int = 0) -> dict:
    """What :func:`pick_speedup_bound` needs to know about this machine's device.

    With a GPU: ``{"device_type": "GPU", "device_name": ..., "compute_capability": (major, minor)}``
    (TensorFlow's ``get_device_details`` of physical GPU ``index``). Without:
    ``{"device_type": "CPU", "cpu_flags": (...)}``, the CPU's 16-bit matrix
    flags among :data:`CPU_16BIT_FLAGS` (read from /proc/cpuinfo on Linux).
    """
    index = _validate.whole("index", index, 0, what="a GPU number, 0 for the first")
    tf = _tf.tf()
    gpus = tf.config.list_physical_devices("GPU")
    if index < len(gpus):
        details = tf.config.experimental.get_device_details(gpus[index])
        return {"device_type": "GPU", "device_name": details.get("device_name"),
                "compute_capability": details.get("compute_capability")}
    wanted = {flag for flags in CPU_16BIT_FLAGS.values() for flag in flags}
    return {"device_type": "CPU", "cpu_flags": tuple(sorted(_cpu_flags() & wanted))}


def pick_speedup_bound(device=None, policy: str = "mixed_float16", *, tf32: bool | None = None) -> SpeedupBound:
    """The ceiling of a training step's speed-up under ``policy`` on ``device``, against float32.

    ``device`` describes the machine as :func:`describe_device` does (None: a
    CPU without 16-bit matrix units). On a GPU the matmul-bound ceiling is the
    data sheet's ratio (:data:`GPU_PEAKS`): the 16-bit Tensor Core peak over
    the float32 baseline's, which is TF32 Tensor Cores on compute capability
    8.0 and later while ``tf32`` is on (default: TensorFlow's switch), plain
    float32 otherwise. So about 8x on a T4, 2x on an A100 or H100 (16x with
    TF32 off). On a CPU without native 16-bit units (:data:`CPU_16BIT_FLAGS`)
    the 16-bit matmuls run on the float32 units, so 1x; with them, and for a
    GPU with no data-sheet row or no Tensor Cores for the dtype, no matmul
    figure is known here (``matmul=None``). The memory-bound ceiling is 2x
    everywhere.
    """
    if policy not in POLICIES or policy in ("float32", "float64"):
        _validate.text("policy", policy, "a 16-bit policy like 'mixed_float16'")
        raise ValueError(f"policy must be a 16-bit policy (mixed_float16, mixed_bfloat16, float16 or bfloat16), "
                         f"got {policy!r}: float32 is the baseline the speed-up is measured against")
    dtype = policy.replace("mixed_", "")
    if device is None:
        device = {"device_type": "CPU", "cpu_flags": ()}
    _validate.mapping("device", device, "{'device_type': 'GPU', 'device_name': 'Tesla T4', "
                                        "'compute_capability': (7, 5)} (see describe_device())")
    kind = device.get("device_type", "GPU" if {"device_name", "compute_capability"} & set(device) else "CPU")
    _validate.one_of("device['device_type']", kind, ("CPU", "GPU"))

    def bound(label, matmul, reason):
        return SpeedupBound(label, policy, matmul, MEMORY_BOUND_SPEEDUP, reason)

    if kind == "CPU":
        flags = device.get("cpu_flags", ())
        if isinstance(flags, str):
            raise TypeError(f"device['cpu_flags'] must be a list of flag names like ['avx512_bf16'], got {flags!r}")
        native = sorted(set(flags) & set(CPU_16BIT_FLAGS[dtype]))
        if native:
            return bound("CPU", None, f"this CPU has {', '.join(native)}: oneDNN can run {dtype} matmuls on "
                                      "them, and no data sheet here says how much faster")
        return bound("CPU", 1.0, f"no {dtype} matrix units ({' or '.join(CPU_16BIT_FLAGS[dtype])}): the "
                                 f"{dtype} matmuls run on the float32 units, plus the casts")
    name = device.get("device_name")
    if name is not None:
        _validate.text("device['device_name']", name, "the GPU's name, e.g. 'Tesla T4'")
    label = name or "GPU"
    why_not = _hardware.lacks_tensor_cores(name)
    if why_not:
        return bound(label, None, why_not)
    cc = device.get("compute_capability")
    row = _hardware.find_gpu(name) if name else None
    if not cc and row is None:  # no compute capability and no data sheet: a plug-in GPU (tensorflow-metal)
        from ._vendor import explain_not_nvidia

        return bound(label, None, explain_not_nvidia(name))
    if cc is None and row is not None:
        cc = row.cc
    if cc is not None and not _hardware.tensor_core_support(cc)[dtype]:
        return bound(label, None, "compute capability {}.{} has no {} Tensor Cores: {} runs on ordinary "
                                  "units there".format(*_hardware.parse_compute_capability(cc), dtype, dtype))
    if row is None:
        why = _hardware.pick_variant(name, _hardware.GPU_PEAKS)[1] if name else "no GPU name to look up"
        return bound(label, None, f"no data-sheet row in GPU_PEAKS: {why}")
    if tf32 is None:
        tf32 = _hardware.tf32_enabled()
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32 must be True, False or None (read TensorFlow's switch), got {tf32!r}")
    base_is_tf32 = tf32 and row.tfloat32 is not None
    base = row.tfloat32 if base_is_tf32 else row.float32
    return bound(label, _hardware.peak_speedup(row.name, dtype, tf32),
                 f"{row.name} data sheet: {dtype} Tensor Cores {row.peak(dtype):g} TFLOPS over "
                 f"{'TF32 Tensor Cores' if base_is_tf32 else 'plain float32'} {base:g} TFLOPS")
