"""Topic 04, one process: what a data-parallel training step needs under ``MirroredStrategy``.

Four parts of that one job:

* **Batch arithmetic.** :func:`global_batch_size` and :func:`per_replica_batch_size`
  convert between what one replica sees and what one step consumes;
  :func:`replica_split` states how TensorFlow splits a batch that does not
  divide evenly (the last, partial batch of an epoch), which is why a custom
  loop divides by the *global* batch size.
* **Which devices, which all-reduce.** :func:`strategy_devices` picks the
  devices to mirror over (GPUs, else logical CPUs), :func:`mirrored_strategy`
  makes strategies that can live side by side in one process,
  :func:`expected_cross_device_ops` states the rule TensorFlow 2.21 applies to
  choose the all-reduce, and :func:`cross_device_ops_of` reads what a live
  strategy chose.
* **Input sharding across workers.** :func:`auto_shard` applies the very rewrite
  ``MultiWorkerMirroredStrategy`` applies to each worker's dataset (FILE, DATA,
  AUTO or OFF), in this process, so you can see what every worker would read.
* **Work to time.** :func:`make_step_runner` builds a fixed amount of training
  work under a strategy, and :func:`make_allreduce_runner` the all-reduce of one
  step's gradients alone, for :func:`gpucourse.timing.compare` and the scaling
  model in :mod:`gpucourse.scaling`.

Real worker processes (``TF_CONFIG``, launching, checkpoint and restart) live in
:mod:`gpucourse.multiworker`. Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Sequence

from . import _tf, _validate
from ._labrules import answers

#: A line of TensorFlow's C++ log: severity, date, time, thread, file:line].
_TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")

__all__ = [
    "CrossDeviceChoice",
    "SHARD_POLICIES",
    "auto_shard",
    "cross_device_ops_of",
    "expected_cross_device_ops",
    "global_batch_size",
    "make_allreduce_runner",
    "make_step_runner",
    "mirrored_strategy",
    "per_replica_batch_size",
    "replica_split",
    "strategy_devices",
]

#: ``tf.data.experimental.AutoShardPolicy`` names :func:`auto_shard` accepts.
SHARD_POLICIES = ("AUTO", "FILE", "DATA", "OFF")


# --------------------------------------------------------------------------- batch arithmetic


@answers('04', 'q1')
def _replicas_of(strategy_or_n) -> int:
    """Replica count from an int or from anything with ``num_replicas_in_sync``."""
    if hasattr(strategy_or_n, "num_replicas_in_sync"):
        return int(strategy_or_n.num_replicas_in_sync)
    if isinstance(strategy_or_n, bool) or not isinstance(strategy_or_n, int):
        raise TypeError("expected a tf.distribute strategy or a whole number of replicas, "
                        f"got {strategy_or_n!r} of type {type(strategy_or_n).__name__}")
    return _validate.whole("num_replicas", strategy_or_n)


@answers('04', 'q1')
def global_batch_size(per_replica: int, strategy_or_replicas) -> int:
    """Examples one synchronous step consumes: ``per_replica * num_replicas_in_sync``.

    Args:
        per_replica: examples each replica processes per step.
        strategy_or_replicas: a strategy (its ``num_replicas_in_sync`` is used)
            or the number of replicas.
    """
    _validate.whole("per_replica", per_replica, what="examples per replica per step")
    return per_replica * _replicas_of(strategy_or_replicas)


@answers('04', 'q1')
def per_replica_batch_size(global_batch: int, strategy_or_replicas) -> int:
    """Examples each replica gets when a step consumes ``global_batch``.

    Raises ``ValueError`` when the global batch does not split evenly: the last
    replicas would get smaller batches (see :func:`replica_split`), and a loss
    averaged per replica would then weight examples unequally.
    """
    _validate.whole("global_batch", global_batch, what="examples per step")
    n = _replicas_of(strategy_or_replicas)
    if global_batch % n:
        lower, upper = (global_batch // n) * n, (global_batch // n + 1) * n
        raise ValueError(f"global batch {global_batch} does not split evenly over {n} replicas; "
                         f"use a multiple of {n} such as {lower or upper} or {upper}")
    return global_batch // n


def replica_split(batch: int, replicas: int) -> list[int]:
    """How many examples each replica gets when a batch of ``batch`` is split over ``replicas``.

    TensorFlow 2.21's rebatching gives each replica ``ceil(batch / replicas)``
    examples, in replica order, until the batch runs out: 7 over 4 replicas is
    ``[2, 2, 2, 1]`` and a final partial batch of 2 is ``[1, 1, 0, 0]``. A
    replica may get no example at all; its loss must then add nothing, which
    ``tf.nn.compute_average_loss(..., global_batch_size=...)`` guarantees and a
    per-replica ``reduce_mean`` does not (the mean of nothing is NaN).
    """
    _validate.whole("batch", batch, minimum=0, what="examples in the batch")
    _validate.whole("replicas", replicas, what="replicas in sync")
    per = -(-batch // replicas)
    return [max(0, min(per, batch - i * per)) for i in range(replicas)]


# --------------------------------------------------------------------------- devices and cross-device ops


def strategy_devices(n: int | None = None, device_type: str | None = None) -> list[str]:
    """Names of the logical devices a ``MirroredStrategy`` should mirror over.

    GPUs when there are any (or ``device_type="GPU"``), otherwise CPUs, which on
    a CPU-only machine means the logical CPUs made by
    :func:`gpucourse.devices.setup_logical_devices`. This lists logical devices,
    so it starts TensorFlow's runtime: split devices first.

    Args:
        n: how many devices (the first ``n``); default all of that type.
        device_type: ``"GPU"`` or ``"CPU"`` to force one.
    """
    if n is not None:
        _validate.whole("n", n, what="how many devices")
    if device_type is not None:
        _validate.one_of("device_type", device_type, ("CPU", "GPU"))
    tf = _tf.tf()
    kind = device_type or ("GPU" if tf.config.list_logical_devices("GPU") else "CPU")
    names = [d.name for d in tf.config.list_logical_devices(kind)]
    if n is not None and n > len(names):
        raise ValueError(f"asked for n={n} {kind} devices but only {len(names)} exist "
                         f"({', '.join(names) or 'none'}); split the device first with "
                         "gpucourse.devices.setup_logical_devices(n)")
    return names[:n] if n is not None else names


def _device_list(name: str, devices) -> list[str]:
    if (isinstance(devices, str) or not isinstance(devices, Sequence) or not devices
            or not all(isinstance(d, str) for d in devices)):
        raise TypeError(f"{name} must be a non-empty list of device names like ['/device:CPU:0', "
                        f"'/device:CPU:1'], got {devices!r}")
    return list(devices)


_key_base = 0


def mirrored_strategy(devices: Sequence[str] | None = None, cross_device_ops=None):
    """A ``tf.distribute.MirroredStrategy`` that can live next to others in the same process.

    Every ``MirroredStrategy`` numbers its collective all-reduce groups from
    the same start key. Two strategies over *different* device sets in one
    process therefore collide as soon as both have run a step::

        InternalError: ... Device /job:localhost/replica:0/task:0/device:CPU:1 is
        joining a group with size4, but that group has size 2 (group_key=1)

    A real training script creates one strategy and never meets this; a
    notebook that compares 1, 2 and 4 replicas does. This helper gives each
    strategy its own key range, the way TensorFlow's own tests do (a subclass
    with a larger ``_collective_key_base``). The result is still an
    ``isinstance`` of ``tf.distribute.MirroredStrategy``.

    Args:
        devices: device names; default :func:`strategy_devices` (all GPUs, else all CPUs).
        cross_device_ops: passed through (default: TensorFlow's choice, see
            :func:`expected_cross_device_ops`).
    """
    global _key_base
    if devices is not None:
        devices = _device_list("devices", devices)
    tf = _tf.tf()
    devices = devices if devices is not None else strategy_devices()
    _key_base += 100_000
    cls = type("MirroredStrategy", (tf.distribute.MirroredStrategy,), {"_collective_key_base": _key_base})
    return cls(devices, cross_device_ops=cross_device_ops)


@dataclass(frozen=True)
class CrossDeviceChoice:
    """How a strategy combines gradients across devices.

    ``ops`` is the ``tf.distribute`` class (``CollectiveAllReduce``,
    ``ReductionToOneDevice``, ``NcclAllReduce`` ...); ``implementation`` is the
    collective implementation (``RING`` or ``NCCL``) when ``ops`` is
    ``CollectiveAllReduce``, else ``None``.
    """

    ops: str
    implementation: str | None = None
    reason: str = ""

    def __str__(self) -> str:
        impl = f" ({self.implementation})" if self.implementation else ""
        return f"{self.ops}{impl}" + (f": {self.reason}" if self.reason else "")


def expected_cross_device_ops(devices: Sequence[str], physical_gpus: int = 0,
                              logical_gpus: int | None = None) -> CrossDeviceChoice:
    """The default all-reduce ``tf.distribute.MirroredStrategy(devices)`` picks in TF 2.21 (eager).

    The rule, from ``mirrored_strategy.py`` (``_make_collective_ops_with_fallbacks``):

    * a mix of CPUs and GPUs: ``ReductionToOneDevice`` (copy to one device, add, copy back);
    * CPUs only: ``CollectiveAllReduce`` with the ``RING`` implementation;
    * GPUs, but split into more virtual GPUs than physical ones: ``RING``;
    * real GPUs only: ``CollectiveAllReduce`` with ``NCCL``. NCCL has GPU kernels only.

    (``MultiWorkerMirroredStrategy`` is different: its default ``AUTO`` becomes
    ``RING`` unless you ask for ``NCCL``, see :mod:`gpucourse.multiworker`.)

    Args:
        devices: device names as given to the strategy (e.g. ``'/device:GPU:0'``).
        physical_gpus: GPUs in ``tf.config.list_physical_devices('GPU')``.
        logical_gpus: GPUs in ``tf.config.list_logical_devices('GPU')``
            (default: same as physical, i.e. not split).
    """
    devices = _device_list("devices", devices)
    _validate.whole("physical_gpus", physical_gpus, minimum=0)
    if logical_gpus is not None:
        _validate.whole("logical_gpus", logical_gpus, minimum=0)
    logical_gpus = physical_gpus if logical_gpus is None else logical_gpus
    lower = [d.lower() for d in devices]
    has_cpu = any("cpu" in d for d in lower)
    has_gpu = any("gpu" in d for d in lower)
    if has_cpu and has_gpu:
        return CrossDeviceChoice("ReductionToOneDevice", None, "CPUs and GPUs mixed")
    if not has_gpu:
        return CrossDeviceChoice("CollectiveAllReduce", "RING", "all devices are CPUs (NCCL has no CPU kernel)")
    if physical_gpus < logical_gpus:
        return CrossDeviceChoice("CollectiveAllReduce", "RING", "virtual GPUs share a physical GPU")
    return CrossDeviceChoice("CollectiveAllReduce", "NCCL", "one replica per physical GPU")


def cross_device_ops_of(strategy) -> CrossDeviceChoice:
    """What a live ``MirroredStrategy`` actually uses to all-reduce (reads its private state).

    Falls back to ``'unknown'`` if a future TensorFlow renames the private attributes.
    """
    ext = getattr(strategy, "extended", None)
    if ext is None:
        raise TypeError(f"strategy must be a tf.distribute strategy, got {type(strategy).__name__}")
    ops = getattr(ext, "_cross_device_ops", None) or getattr(ext, "_collective_ops", None)
    if ops is None:
        return CrossDeviceChoice("unknown", None, "this TensorFlow version stores it elsewhere")
    impl = None
    if type(ops).__name__ == "CollectiveAllReduce":
        opts = getattr(ext, "_communication_options", None)
        impl = getattr(getattr(opts, "implementation", None), "name", None)
        if impl == "AUTO":
            impl = None
    return CrossDeviceChoice(type(ops).__name__, impl)


# --------------------------------------------------------------------------- input sharding


def auto_shard(dataset, num_workers: int, index: int, policy: str = "AUTO", replicas: int | None = None) -> list:
    """What worker ``index`` of ``num_workers`` would read from ``dataset`` under ``policy``.

    ``MultiWorkerMirroredStrategy.experimental_distribute_dataset`` rewrites
    each worker's copy of the dataset according to
    ``options.experimental_distribute.auto_shard_policy``; this applies the same
    rewrite (TensorFlow's internal ``input_ops.auto_shard_dataset``, which the
    strategy calls) in this process and returns the worker's elements:

    * ``FILE``: each worker reads only its share of the *files* (found by walking
      up to the reader dataset). Fewer files than workers is an error.
    * ``DATA``: every worker reads everything and keeps every ``num_workers``-th
      element: correct for any source, but each worker does all the reading.
    * ``AUTO`` (default): ``FILE`` if there is a file reader, else ``DATA``. With
      a reader but a single file it does **not** fall back: it fails like ``FILE``.
    * ``OFF``: no sharding; every worker sees every element (duplicates).

    Returns the list of elements (as NumPy values). A dataset TensorFlow cannot
    shard this way raises TensorFlow's own error.
    """
    _validate.whole("num_workers", num_workers)
    _validate.whole("index", index, minimum=0, maximum=num_workers - 1, what="this worker's index")
    _validate.one_of("policy", policy, SHARD_POLICIES)
    if replicas is not None:
        _validate.whole("replicas", replicas)
    tf = _tf.tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    from tensorflow.python.distribute import input_ops  # the function the strategy itself calls

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    sharded = input_ops.auto_shard_dataset(dataset.with_options(options), num_workers, index,
                                           replicas or num_workers)
    # Reading also makes TensorFlow's C++ core log to stderr: a W line "Local rendezvous is aborting with status:
    # INVALID_ARGUMENT: Could not apply FILE based sharding ..." that repeats the error raised here, and an I line
    # on TFRecordDataset's default buffer. Those are dropped; any other line is passed on.
    from .logcapture import capture_output

    try:
        with capture_output() as log:
            return list(sharded.as_numpy_iterator())
    finally:
        kept = [ln for ln in log.lines if not _TF_LOG_LINE.match(ln)]
        if kept:
            print("\n".join(kept), file=sys.stderr)


# --------------------------------------------------------------------------- work to time


def _mse_replica_step(model, optimizer, global_batch: int):
    """One replica's SGD step on mean squared error, averaged over the *global* batch.

    ``tf.nn.compute_average_loss`` divides by the global batch, so summing the
    replicas' losses (and their gradients, which the strategy all-reduces) gives
    the same update as one device training on the whole batch.
    """
    tf = _tf.tf()

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(yb - model(xb, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return replica_step


def _check_strategy(strategy) -> None:
    if not hasattr(strategy, "run") or not hasattr(strategy, "num_replicas_in_sync"):
        raise TypeError(f"strategy must be a tf.distribute strategy, got {type(strategy).__name__}")


def make_step_runner(strategy, per_replica_batch: int = 64, steps: int = 5, features: int = 64,
                     units: int = 256, seed: int = 0):
    """A zero-argument callable that runs ``steps`` training steps of a small MLP under ``strategy``.

    The batch per replica is fixed (weak scaling): with N replicas one step
    trains on ``N * per_replica_batch`` examples. The model, optimizer and a
    distributed dataset are built once; each call runs ``steps`` steps inside
    one ``tf.function`` and returns the last loss (a tensor, so
    :mod:`gpucourse.timing` can wait for it).

    The callable carries what the scaling model needs: ``.items`` (examples per
    call), ``.steps``, ``.params`` (trainable parameters) and
    ``.flops_per_replica_step`` (``6 * params * per_replica_batch``: 2 FLOPs per
    parameter and example forward, 4 backward, the usual dense-layer count), and
    ``.step_graph()``, the traced graph of one replica's step on its own (call it
    on a runner made under the default strategy, ``tf.distribute.get_strategy()``).
    """
    for name, v in (("per_replica_batch", per_replica_batch), ("steps", steps), ("features", features),
                    ("units", units)):
        _validate.whole(name, v)
    _validate.whole("seed", seed, minimum=None)
    _check_strategy(strategy)
    tf, keras = _tf.tf(), _tf.keras()

    gbs = global_batch_size(per_replica_batch, strategy)
    rng = tf.random.Generator.from_seed(seed)
    x = rng.normal((gbs, features))
    y = tf.reduce_sum(x[:, :4], axis=1, keepdims=True)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    batches = iter(strategy.experimental_distribute_dataset(ds))
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(units, activation="relu"),
                                  keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)

    replica_step = _mse_replica_step(model, optimizer, gbs)

    @tf.function
    def run_steps(iterator):
        loss = tf.constant(0.0)
        for _ in tf.range(steps):
            loss = strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)
        return loss

    def run():
        return run_steps(batches)

    def step_graph():
        """The traced graph of one replica's step alone (no strategy around it), e.g. to count its kernels."""
        spec = (tf.TensorSpec((per_replica_batch, features)), tf.TensorSpec((per_replica_batch, 1)))
        return tf.function(replica_step).get_concrete_function(*spec).graph

    run.items = gbs * steps
    run.steps = steps
    run.strategy = strategy
    run.step_graph = step_graph
    run.params = int(sum(math.prod(w.shape) for w in model.trainable_weights))
    run.flops_per_replica_step = 6 * run.params * per_replica_batch
    return run


def make_allreduce_runner(strategy, num_floats: int, steps: int = 5):
    """A zero-argument callable that all-reduces ``num_floats`` float32s ``steps`` times, and nothing else.

    That is the communication of ``steps`` training steps of a model with
    ``num_floats`` parameters (its gradients are summed over the replicas once
    per step), without the compute: time it next to :func:`make_step_runner`
    to get the two numbers :mod:`gpucourse.scaling` needs. ``.bytes_per_step``
    is ``4 * num_floats``.
    """
    _check_strategy(strategy)
    _validate.whole("num_floats", num_floats)
    _validate.whole("steps", steps)
    tf = _tf.tf()

    with strategy.scope():
        grads = tf.Variable(tf.ones([num_floats]), trainable=False)  # one copy per replica, like gradients

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads.read_value())[0]

    @tf.function
    def run_steps():
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            total += strategy.experimental_local_results(strategy.run(replica_fn))[0]
        return total

    run_steps.bytes_per_step = 4 * num_floats
    run_steps.steps = steps
    run_steps.strategy = strategy
    return run_steps
