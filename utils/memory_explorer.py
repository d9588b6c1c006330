"""Topic 03's memory explorer: batch size, precision policy and accumulation steps in; peak memory out.

One job: for a small MLP trained with Adam, put the **estimated** peak memory
of one weight update (:func:`estimate_update`, arithmetic only) beside the
**measured** one (:func:`measure_update`, a real training step on this
machine's device) and a memory budget. :func:`update` is the explorer's pure
on-change function (unit-tested without a browser); :func:`memory_explorer`
wraps it in :class:`gpucourse.explore.Explorer`, which keeps its values when
the cell is re-run and prints a static table when widgets cannot render.

The measured step is a ``tf.function`` **without XLA** on every device, so its
numbers mean the same on a CPU and a GPU. (Keras's own ``fit`` and
``train_on_batch`` compile with XLA on a GPU, ``jit_compile="auto"``, and
XLA plans its buffers differently: measure with the setting you will train
with.) Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from . import _validate
from ._tf import keras as _keras
from ._tf import tf as _tf
from .explore import Explorer, View, dropdown, slider
from .memory import CPU_UNCOUNTED_BELOW, MemoryEstimate, estimate_state, format_bytes, measure_peak, memory_info
from .memory import default_device, normalize_device

__all__ = ["LAYERS", "POLICIES", "estimate_update", "measure_update", "memory_explorer", "update"]

#: The explorer's model: 128 input features, two hidden ReLU layers of 512, 10 logits.
LAYERS = (128, 512, 512, 10)
#: Keras dtype policies the explorer offers, with the bytes of one value in the compute dtype.
POLICIES = {"float32": 4, "mixed_float16": 2, "mixed_bfloat16": 2}
ADAM_SLOTS = 2  # Adam keeps two parameter-sized variables per weight: m and v


def _micro(batch, steps) -> tuple[int, int, int]:
    batch = _validate.whole("batch", batch, 1, what="examples per weight update")
    steps = _validate.whole("steps", steps, 1, what="gradient accumulation steps per update")
    if steps > batch:
        raise ValueError(f"steps must be <= batch (each micro-batch needs an example), got steps={steps}, "
                         f"batch={batch}")
    return batch, steps, batch // steps


def _params(layers) -> int:
    return sum(a * b + b for a, b in zip(layers[:-1], layers[1:]))


def estimate_update(batch: int, policy: str = "float32", steps: int = 1, layers=LAYERS) -> MemoryEstimate:
    """Estimated peak memory of one weight update of the explorer's MLP, by part.

    The update is ``steps`` micro-batches of ``batch // steps`` examples. The
    training state is :func:`gpucourse.memory.estimate_state` (float32
    weights, gradients, Adam's 2 slots, plus accumulators when ``steps > 1``).
    A mixed policy adds float16/bfloat16 copies of the weights for the matmuls.
    Activations are what the backward pass needs, for one micro-batch: the
    float32 input (and its low-precision copy), each hidden layer's output
    before and after ReLU, and the logits (cast to float32 for the loss under a
    mixed policy). It leaves out temporaries (gradients of activations,
    optimizer arithmetic), so the measured peak is higher.
    """
    _, steps, micro = _micro(batch, steps)
    nbytes = POLICIES[_validate.one_of("policy", policy, POLICIES)]
    layers = tuple(_validate.whole("layers", w, 1) for w in layers)
    if len(layers) < 2:
        raise ValueError(f"layers must list at least the input and output widths, got {layers}")
    params = _params(layers)
    mixed = policy != "float32"
    parts = dict(estimate_state(params, ADAM_SLOTS, accumulate=steps > 1).parts)
    parts["low-precision weight copies"] = params * nbytes if mixed else 0
    inputs, hidden, logits = layers[0], layers[1:-1], layers[-1]
    per_example = inputs * 4 + (inputs * nbytes if mixed else 0) + sum(2 * h * nbytes for h in hidden) \
        + logits * nbytes + (logits * 4 if mixed else 0)
    parts["activations"] = micro * per_example
    return MemoryEstimate(parts)


@dataclass
class _Rig:
    """One built model, optimizer and compiled step for a (policy, steps, device)."""

    step: object
    state_bytes: int
    model: object
    optimizer: object


_RIGS: dict[tuple, _Rig] = {}


def _rig(policy: str, steps: int, device: str) -> _Rig:
    key = (policy, steps, device)
    if key in _RIGS:
        return _RIGS[key]
    tf, keras = _tf(), _keras()
    features, *hidden, classes = LAYERS
    with tf.device(device):
        before = memory_info(device)["current"]
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((features,))]
                                 + [keras.layers.Dense(h, activation="relu", dtype=policy) for h in hidden]
                                 + [keras.layers.Dense(classes, dtype=policy)])
        optimizer = keras.optimizers.Adam(1e-3, gradient_accumulation_steps=steps if steps > 1 else None)
        optimizer.build(model.trainable_variables)
        state = memory_info(device)["current"] - before
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)], jit_compile=False)
    def step(n):
        x = tf.random.normal((n, features))
        y = tf.random.uniform((n,), maxval=classes, dtype=tf.int32)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    _RIGS[key] = _Rig(step, state, model, optimizer)
    return _RIGS[key]


def _runs_unfused(policy: str, device: str) -> bool:
    """True for a float16 policy on a CPU: the step that :func:`measure_update` runs with remapping off."""
    return policy == "mixed_float16" and "CPU" in device.upper()


@contextlib.contextmanager
def _unfused_on_cpu(policy: str, device: str):
    """Turn grappler's remapper off while a float16 step runs on a CPU, and put the setting back after.

    The remapper fuses MatMul + BiasAdd into one kernel. With oneDNN on (as the course sets it), TensorFlow
    2.21's fused *float16* kernel took 3.5 s where the two ops took 5 ms (a 2048 x 512 by 512 x 512 matmul on
    an Intel Xeon with AVX512-FP16, 2026-11-29), so each float16 measurement took 12 s instead of 0.2 s, with
    the same peak within 0.25 MiB. Measured per call: TensorFlow reads the option when a function runs, so
    the learner's own functions keep the default outside this block.
    """
    if not _runs_unfused(policy, device):
        yield
        return
    tf = _tf()
    before = tf.config.optimizer.get_experimental_options().get("remapping")  # None: TensorFlow's default
    tf.config.optimizer.set_experimental_options({"remapping": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"remapping": before})


def measure_update(batch: int, policy: str = "float32", steps: int = 1, device=None) -> dict:
    """Measured memory of one weight update of the explorer's MLP on ``device`` (default: GPU:0 or CPU:0).

    Returns ``{"state_bytes", "step_bytes", "total_bytes"}``: the training
    state (what building the model and Adam added to the allocator, measured
    once per policy and number of steps), the peak above everything already
    allocated while ``steps`` micro-batch steps run (inputs included), and
    their sum. A model is built and traced once per (policy, steps, device)
    and reused, so changing the batch size only measures. A ``mixed_float16``
    step on a CPU runs with grappler's remapping off (:func:`_unfused_on_cpu`).
    """
    _, steps, micro = _micro(batch, steps)
    _validate.one_of("policy", policy, POLICIES)
    dev = normalize_device(device or default_device())
    rig = _rig(policy, steps, dev)
    n = _tf().constant(micro, dtype="int32")

    def one_update():
        return [rig.step(n) for _ in range(steps)]

    with _tf().device(dev), _unfused_on_cpu(policy, dev):
        peak = measure_peak(one_update, device=dev, warmup=1, repeats=1)
    return {"state_bytes": rig.state_bytes, "step_bytes": peak.extra_bytes,
            "total_bytes": rig.state_bytes + peak.extra_bytes}


def _verdict(nbytes: int, budget: int) -> str:
    return "fits" if nbytes <= budget else "does NOT fit"


def _figure(est: MemoryEstimate, measured: dict, budget: int):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.4), layout="constrained")  # makes room for the axis label and legend
    colors = ["#4c72b0", "#55a868", "#8172b2", "#ccb974", "#64b5cd", "#dd8452"]
    left = 0.0
    for (name, b), color in zip(est.parts.items(), colors):
        if b:
            ax.barh("estimate", b / 2**20, left=left, color=color, label=name)
            left += b / 2**20
    ax.barh("measured", measured["state_bytes"] / 2**20, color="#937860", label="measured state")
    ax.barh("measured", measured["step_bytes"] / 2**20, left=measured["state_bytes"] / 2**20, color="#da8bc3",
            label="measured step")
    ax.axvline(budget / 2**20, color="#c44e52", linestyle="--", label="budget")
    ax.set_xlabel("MiB")
    fig.legend(fontsize=7, loc="outside right center", frameon=False)  # beside the bars, clear of the "MiB" label
    return fig


def update(batch: int = 512, policy: str = "float32", steps: int = 1, budget_mib: int = 16, device=None,
           figure: bool = True) -> View:
    """The explorer's on-change function: estimate and measure one update, compare with the budget.

    ``batch`` examples per weight update, run as ``steps`` micro-batches of
    ``batch // steps`` (a batch that ``steps`` does not divide is rounded down).
    The first line of the text is the verdict the explorer shows as its status.
    """
    batch, steps, micro = _micro(batch, steps)
    budget = _validate.whole("budget_mib", budget_mib, 1, what="memory budget in MiB") * 2**20
    est = estimate_update(batch, policy, steps)  # validates the policy before TensorFlow is imported
    dev = normalize_device(device or default_device())
    got = measure_update(batch, policy, steps, dev)
    lines = [
        f"measured {format_bytes(got['total_bytes'])}: {_verdict(got['total_bytes'], budget)} the "
        f"{budget_mib} MiB budget (estimate {format_bytes(est.total_bytes)}: {_verdict(est.total_bytes, budget)})",
        f"{steps} x micro-batch {micro} = {steps * micro} examples per update"
        + (f" (batch {batch} rounded down to a multiple of {steps})" if steps * micro != batch else "")
        + f"; policy {policy}; Adam; no XLA; on {dev}",
        "estimate: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in est.parts.items() if v),
        f"measured: training state {format_bytes(got['state_bytes'])} + one update's peak "
        f"{format_bytes(got['step_bytes'])}; measured / estimate = {got['total_bytes'] / est.total_bytes:.2f}",
    ]
    layer_out = micro * max(LAYERS[1:-1]) * POLICIES[policy]
    if _runs_unfused(policy, dev):
        lines.append("note: float16 on a CPU is measured with grappler's remapping off: on some CPUs TensorFlow's "
                     "fused float16 MatMul + BiasAdd kernel is hundreds of times slower than the two ops "
                     "(see measure_update)")
    if "CPU" in dev.upper() and layer_out < CPU_UNCOUNTED_BELOW:
        lines.append(f"note: on a CPU, get_memory_info leaves out tensors under 256 KiB; this micro-batch's "
                     f"layer outputs ({format_bytes(layer_out)} each) are not counted")
    return View("\n".join(lines), _figure(est, got, budget) if figure else None)


def memory_explorer(budget_mib: int = 16, device=None) -> Explorer:
    """The explorer: batch size, policy, accumulation steps and budget in; estimated and measured peak out.

    Call ``.show()`` on the result. Each change measures a real training step
    (well under a second once a policy and number of steps have been built).
    """
    _validate.whole("budget_mib", budget_mib, 1, 64, what="memory budget in MiB")
    dev = None if device is None else normalize_device(device)

    def on_change(batch, policy, steps, budget_mib):
        return update(batch, policy, steps, budget_mib, device=dev)

    controls = [slider("batch", 64, 2048, 512, step=64, label="batch size"),
                dropdown("policy", list(POLICIES), "float32", label="policy"),
                slider("steps", 1, 8, 1, label="accumulation steps"),
                slider("budget_mib", 4, 64, budget_mib, label="budget (MiB)")]
    presets = [{"batch": 2048}, {"batch": 2048, "policy": "mixed_float16"}, {"batch": 2048, "steps": 4}]
    return Explorer("memory", on_change, controls, title="Memory explorer", manual=True, presets=presets)
