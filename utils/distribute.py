"""Topic 04: MirroredStrategy on one machine, MultiWorkerMirroredStrategy across processes.

Four jobs:

* **Batch arithmetic.** :func:`global_batch_size` and :func:`per_replica_batch_size`
  convert between what one replica sees and what one step consumes, with
  errors that say what went wrong.
* **Which devices, which all-reduce.** :func:`strategy_devices` picks the
  devices a ``MirroredStrategy`` should mirror over (GPUs, else logical CPUs),
  :func:`expected_cross_device_ops` states the rule TensorFlow 2.21 applies to
  choose the cross-device ops, and :func:`cross_device_ops_of` reads what a
  live strategy actually chose.
* **Scaling measurements.** :func:`make_step_runner` builds a fixed amount of
  training work for a strategy, so :func:`gpucourse.timing.compare` can time
  several replica counts side by side; :func:`scaling_rows` turns the timings
  into throughput, speedup and the ideal linear speedup next to it.
* **Real multi-worker training.** :func:`free_ports`, :func:`tf_config`,
  :func:`gpu_assignments` and :func:`launch_workers` start N worker processes on
  127.0.0.1, each running ``python -m gpucourse.distribute worker`` (a custom
  training loop under ``MultiWorkerMirroredStrategy``), and collect each
  worker's JSON result. Every launch has a timeout: a worker whose peer never
  comes up waits forever, so on timeout or error every worker is killed and a
  :class:`WorkerError` names the worker that failed or hung.

Importing this module never imports TensorFlow: the TensorFlow parts are
imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

__all__ = [
    "CrossDeviceChoice",
    "LOOPBACK",
    "WorkerError",
    "WorkerResult",
    "WorkerTimeout",
    "cross_device_ops_of",
    "expected_cross_device_ops",
    "free_ports",
    "global_batch_size",
    "gpu_assignments",
    "launch_workers",
    "main",
    "make_step_runner",
    "mirrored_strategy",
    "per_replica_batch_size",
    "scaling_rows",
    "scaling_table",
    "strategy_devices",
    "tf_config",
    "visible_gpu_ids",
]

#: The only address the course binds to or connects to.
LOOPBACK = "127.0.0.1"
#: Marker in a worker's stdout in front of its JSON result.
RESULT_MARK = "GPUCOURSE_RESULT "
#: Default seconds :func:`launch_workers` waits for all workers to finish.
DEFAULT_TIMEOUT_S = 90.0


def _tf():
    import tensorflow as tf  # imported lazily: importing gpucourse must stay cheap

    return tf


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


# --------------------------------------------------------------------------- batch arithmetic


def _replicas_of(strategy_or_n) -> int:
    """Replica count from an int or from anything with ``num_replicas_in_sync``."""
    if hasattr(strategy_or_n, "num_replicas_in_sync"):
        return int(strategy_or_n.num_replicas_in_sync)
    if isinstance(strategy_or_n, bool) or not isinstance(strategy_or_n, int):
        raise TypeError("expected a tf.distribute strategy or a whole number of replicas, "
                        f"got {type(strategy_or_n).__name__}")
    return _positive_int("num_replicas", strategy_or_n)


def global_batch_size(per_replica: int, strategy_or_replicas) -> int:
    """Examples one synchronous step consumes: ``per_replica * num_replicas_in_sync``.

    Args:
        per_replica: examples each replica processes per step.
        strategy_or_replicas: a strategy (its ``num_replicas_in_sync`` is used)
            or the number of replicas.
    """
    _positive_int("per_replica", per_replica)
    return per_replica * _replicas_of(strategy_or_replicas)


def per_replica_batch_size(global_batch: int, strategy_or_replicas) -> int:
    """Examples each replica gets when a step consumes ``global_batch``.

    Raises ``ValueError`` when the global batch does not split evenly: the last
    replicas would get smaller batches, and a loss averaged per replica would
    then weight examples unequally.
    """
    _positive_int("global_batch", global_batch)
    n = _replicas_of(strategy_or_replicas)
    if global_batch % n:
        lower, upper = (global_batch // n) * n, (global_batch // n + 1) * n
        raise ValueError(f"global batch {global_batch} does not split evenly over {n} replicas; "
                         f"use a multiple of {n} such as {lower or upper} or {upper}")
    return global_batch // n


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
        _positive_int("n", n)
    if device_type not in (None, "CPU", "GPU"):
        raise ValueError(f"device_type must be 'CPU', 'GPU' or None, got {device_type!r}")
    tf = _tf()
    kind = device_type or ("GPU" if tf.config.list_logical_devices("GPU") else "CPU")
    names = [d.name for d in tf.config.list_logical_devices(kind)]
    if n is not None and n > len(names):
        raise ValueError(f"asked for {n} {kind} devices but only {len(names)} exist ({', '.join(names) or 'none'}); "
                         "split the device first with gpucourse.devices.setup_logical_devices(n)")
    return names[:n] if n is not None else names


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
    if devices is not None and (isinstance(devices, str) or not isinstance(devices, Sequence) or not devices
                                or not all(isinstance(d, str) for d in devices)):
        raise TypeError(f"devices must be a non-empty list of device names, got {devices!r}")
    tf = _tf()
    devices = list(devices) if devices is not None else strategy_devices()
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

    The rule, from ``mirrored_strategy.py``:

    * a mix of CPUs and GPUs: ``ReductionToOneDevice`` (copy to one device, add, copy back);
    * CPUs only: ``CollectiveAllReduce`` with the ``RING`` implementation;
    * GPUs, but split into more virtual GPUs than physical ones: ``RING``;
    * real GPUs only: ``CollectiveAllReduce`` with ``NCCL``. NCCL has GPU kernels only.

    Args:
        devices: device names as given to the strategy (e.g. ``'/device:GPU:0'``).
        physical_gpus: GPUs in ``tf.config.list_physical_devices('GPU')``.
        logical_gpus: GPUs in ``tf.config.list_logical_devices('GPU')``
            (default: same as physical, i.e. not split).
    """
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices:
        raise TypeError("devices must be a non-empty list of device names like ['/device:CPU:0', '/device:CPU:1']")
    if not all(isinstance(d, str) for d in devices):
        raise TypeError(f"devices must be device-name strings, got {[type(d).__name__ for d in devices]}")
    for name, v in (("physical_gpus", physical_gpus), ("logical_gpus", logical_gpus)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be a whole number >= 0, got {v!r}")
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

    Falls back to the class name alone if a future TensorFlow renames the
    private attributes.
    """
    ext = getattr(strategy, "extended", None)
    if ext is None:
        raise TypeError(f"expected a tf.distribute strategy, got {type(strategy).__name__}")
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


# --------------------------------------------------------------------------- scaling


def _mse_replica_step(model, optimizer, global_batch: int):
    """One replica's SGD step on mean squared error, averaged over the *global* batch.

    ``tf.nn.compute_average_loss`` divides by the global batch, so summing the
    replicas' losses (and their gradients, which the strategy all-reduces) gives
    the same update as one device training on the whole batch.
    """
    tf = _tf()

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(yb - model(xb, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return replica_step


def make_step_runner(strategy, per_replica_batch: int = 64, steps: int = 5, features: int = 64,
                     units: int = 256, seed: int = 0):
    """A zero-argument callable that runs ``steps`` training steps of a small MLP under ``strategy``.

    The batch per replica is fixed (weak scaling): with N replicas one step
    trains on ``N * per_replica_batch`` examples. The model, optimizer and a
    distributed dataset are built once; each call runs ``steps`` steps inside
    one ``tf.function`` and returns the last loss (a tensor, so
    :mod:`gpucourse.timing` can wait for it). The callable has ``.items``, the
    examples per call, for throughput.
    """
    for name, v in (("per_replica_batch", per_replica_batch), ("steps", steps), ("features", features),
                    ("units", units)):
        _positive_int(name, v)
    if not hasattr(strategy, "run") or not hasattr(strategy, "num_replicas_in_sync"):
        raise TypeError(f"strategy must be a tf.distribute strategy, got {type(strategy).__name__}")
    tf = _tf()
    import keras

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

    run.items = gbs * steps
    run.strategy = strategy
    return run


def scaling_rows(throughputs: Mapping[int, float]) -> list[dict]:
    """Throughput per replica count -> rows with speedup over the smallest count and the ideal next to it.

    Args:
        throughputs: ``{replicas: examples per second}``.

    Returns:
        One dict per replica count, ascending: ``replicas``, ``throughput``,
        ``speedup`` (vs the smallest count), ``ideal`` (linear scaling) and
        ``efficiency`` (speedup / ideal).
    """
    if not isinstance(throughputs, Mapping) or not throughputs:
        raise ValueError("throughputs must be a non-empty {replicas: examples_per_second} dict")
    for k, v in throughputs.items():
        _positive_int("replica count", k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
            raise ValueError(f"throughput for {k} replicas must be a positive number, got {v!r}")
    base_n = min(throughputs)
    base = throughputs[base_n]
    rows = []
    for n in sorted(throughputs):
        speedup = throughputs[n] / base
        ideal = n / base_n
        rows.append({"replicas": n, "throughput": throughputs[n], "speedup": speedup, "ideal": ideal,
                     "efficiency": speedup / ideal})
    return rows


def scaling_table(rows: Sequence[dict]) -> str:
    """Plain-text table of :func:`scaling_rows`: measured speedup with the ideal right next to it."""
    if not rows or not all(isinstance(r, dict) and {"replicas", "throughput", "speedup", "ideal", "efficiency"} <= set(r)
                           for r in rows):
        raise ValueError("rows must be the non-empty list that scaling_rows() returns")
    lines = [("replicas", "examples/s", "speedup", "ideal", "efficiency")]
    lines += [(str(r["replicas"]), f"{r['throughput']:,.0f}", f"{r['speedup']:.2f}x", f"{r['ideal']:.2f}x",
               f"{r['efficiency']:.0%}") for r in rows]
    widths = [max(len(row[i]) for row in lines) for i in range(5)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in lines)


# --------------------------------------------------------------------------- cluster plumbing


def free_ports(n: int = 1, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports that are free right now on ``host`` (the OS picks them: bind to port 0).

    All sockets stay open until every port is chosen, so the ports differ.
    Another program could still take one before a worker binds it; on a
    shared machine that is rare, and :func:`launch_workers` then fails with a
    clear error instead of hanging.
    """
    _positive_int("n", n)
    if host not in (LOOPBACK, "localhost"):
        raise ValueError(f"the course only uses loopback addresses; got host={host!r}, use {LOOPBACK!r}")
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: Sequence[int], index: int, host: str = LOOPBACK) -> str:
    """The ``TF_CONFIG`` JSON for worker ``index`` of a cluster of workers on ``host``.

    ``{"cluster": {"worker": ["127.0.0.1:p0", "127.0.0.1:p1", ...]},
    "task": {"type": "worker", "index": index}}``. Every worker gets the same
    cluster and its own index; worker 0 is the chief (it writes checkpoints).
    """
    if isinstance(ports, (str, bytes)) or not isinstance(ports, Sequence) or not ports:
        raise TypeError(f"ports must be a non-empty list of port numbers, got {ports!r}")
    for p in ports:
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise ValueError(f"every port must be a whole number in 1..65535, got {p!r}")
    if len(set(ports)) != len(ports):
        raise ValueError(f"ports must be distinct (each worker listens on its own), got {list(ports)}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(ports):
        raise ValueError(f"index must be a whole number in 0..{len(ports) - 1}, got {index!r}")
    if host not in (LOOPBACK, "localhost"):
        raise ValueError(f"the course only uses loopback addresses; got host={host!r}, use {LOOPBACK!r}")
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def visible_gpu_ids(cuda_visible_devices: str | None, physical: int) -> list[int]:
    """The physical GPU ids this process may hand out, reading ``CUDA_VISIBLE_DEVICES`` like CUDA does.

    ``None`` means all ``physical`` GPUs; otherwise indices are read in order
    up to the first invalid one. (UUID forms like ``GPU-...`` are treated as
    invalid here: they cannot be split by index.)
    """
    if isinstance(physical, bool) or not isinstance(physical, int) or physical < 0:
        raise ValueError(f"physical must be a whole number >= 0, got {physical!r}")
    if cuda_visible_devices is None:
        return list(range(physical))
    if not isinstance(cuda_visible_devices, str):
        raise TypeError(f"cuda_visible_devices must be a string or None, got {type(cuda_visible_devices).__name__}")
    ids: list[int] = []
    for token in cuda_visible_devices.split(","):
        token = token.strip()
        if not token.isdigit() or int(token) >= physical or int(token) in ids:
            break
        ids.append(int(token))
    return ids


def gpu_assignments(num_workers: int, gpu_ids: Sequence[int]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``num_workers`` processes, so that no GPU is seen twice.

    With at least one GPU per worker each worker gets an equal, disjoint,
    contiguous slice (``MultiWorkerMirroredStrategy`` wants the same number of
    devices on every worker; leftover GPUs stay unused). With fewer GPUs than
    workers every worker gets ``"-1"`` and runs on its CPU: two processes that
    share one GPU would each try to reserve most of its memory.
    """
    _positive_int("num_workers", num_workers)
    if isinstance(gpu_ids, (str, bytes)) or not isinstance(gpu_ids, Sequence):
        raise TypeError(f"gpu_ids must be a list of GPU indices, got {gpu_ids!r}")
    if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpu_ids) or len(set(gpu_ids)) != len(gpu_ids):
        raise ValueError(f"gpu_ids must be distinct whole numbers >= 0, got {list(gpu_ids)}")
    per = len(gpu_ids) // num_workers
    if per == 0:
        return ["-1"] * num_workers
    return [",".join(str(g) for g in gpu_ids[i * per:(i + 1) * per]) for i in range(num_workers)]


# --------------------------------------------------------------------------- launching workers


class WorkerError(RuntimeError):
    """A worker process failed or hung; ``worker`` is its index and ``log`` the end of its output."""

    def __init__(self, message: str, worker: int | None = None, log: str = ""):
        super().__init__(message)
        self.worker = worker
        self.log = log


class WorkerTimeout(WorkerError):
    """Workers were still running when the timeout expired and were killed."""


@dataclass
class WorkerResult:
    """What one worker reported: its index, replica count, per-step losses and a weight checksum."""

    index: int
    num_replicas: int
    losses: list[float]
    weights_checksum: float
    devices: list[str] = field(default_factory=list)
    cuda_visible_devices: str | None = None
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerResult":
        keys = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in keys})


def _worker_command(steps: int, batch: int, seed: int, mode: str) -> list[str]:
    return [sys.executable, "-m", "gpucourse.distribute", "worker", "--steps", str(steps),
            "--per-replica-batch", str(batch), "--seed", str(seed), "--mode", mode]


_TF_LOG = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages|To enable the following instructions)")
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)\b:?")


def _tail(path: Path, lines: int = 8) -> str:
    """The end of a worker's log without TensorFlow's C++ log lines, its error line first if any."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip() and not _TF_LOG.match(ln)]
    errors = [ln for ln in keep if _ERROR_LINE.match(ln)]
    head = [errors[-1][:200] + (" ..." if len(errors[-1]) > 200 else "")] if errors else []
    return "\n".join(head + [ln[:200] for ln in keep[-lines:] if not head or ln != errors[-1]])


def _kill(procs: Mapping[int, subprocess.Popen]) -> None:
    """Kill every still-running worker we started (by its own Popen handle) and reap it."""
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for p in procs.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def launch_workers(num_workers: int = 2, *, steps: int = 5, per_replica_batch: int = 16, seed: int = 0,
                   timeout: float = DEFAULT_TIMEOUT_S, only: Sequence[int] | None = None, mode: str = "loop",
                   gpu_ids: Sequence[int] | None = None, extra_env: Mapping[str, str] | None = None,
                   poll_s: float = 0.1) -> list[WorkerResult]:
    """Run a ``MultiWorkerMirroredStrategy`` job as ``num_workers`` processes on 127.0.0.1.

    Each worker runs ``python -m gpucourse.distribute worker`` with its own
    ``TF_CONFIG`` (free ports chosen here) and its own ``CUDA_VISIBLE_DEVICES``
    (see :func:`gpu_assignments`), trains with a custom loop and prints a JSON
    result, which is returned as a :class:`WorkerResult` per worker, in index order.

    Args:
        num_workers: size of the cluster written into ``TF_CONFIG``.
        steps, per_replica_batch, seed: passed to every worker.
        timeout: seconds for the whole job. Workers still running then are
            killed and :class:`WorkerTimeout` is raised.
        only: start just these worker indices (the others never come up).
            Used to show what a missing peer does: the started ones wait
            for it until the timeout.
        mode: ``"loop"`` (custom training loop) or ``"fit"`` (``model.fit``, which
            fails under this strategy with Keras 3).
        gpu_ids: physical GPUs to share out; default: what this process may see.
        extra_env: more environment variables for every worker.

    Raises:
        WorkerError: a worker exited with an error (the others are killed);
            the message names it and quotes the end of its output.
        WorkerTimeout: the timeout expired; the message names the workers killed.
    """
    _positive_int("num_workers", num_workers)
    for name, v in (("steps", steps), ("per_replica_batch", per_replica_batch)):
        _positive_int(name, v)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if mode not in ("loop", "fit"):
        raise ValueError(f"mode must be 'loop' or 'fit', got {mode!r}")
    indices = list(range(num_workers)) if only is None else list(only)
    if not indices or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_workers
                          for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"only must list distinct worker indices in 0..{num_workers - 1}, got {only!r}")
    if extra_env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()):
        raise TypeError("extra_env must be a dict of str -> str")
    if gpu_ids is None:
        from .devices import nvml_gpus

        gpu_ids = visible_gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), len(nvml_gpus()))
    cuda = gpu_assignments(num_workers, list(gpu_ids))

    ports = free_ports(num_workers)
    logdir = Path(tempfile.mkdtemp(prefix="gpucourse-workers-"))
    procs: dict[int, subprocess.Popen] = {}
    files = []
    try:
        for i in indices:
            env = {**os.environ, "TF_CONFIG": tf_config(ports, i), "CUDA_VISIBLE_DEVICES": cuda[i],
                   "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                   "TF_FORCE_GPU_ALLOW_GROWTH": "true", **(extra_env or {})}
            out = open(logdir / f"worker{i}.log", "w")
            files.append(out)
            procs[i] = subprocess.Popen(_worker_command(steps, per_replica_batch, seed, mode), env=env,
                                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            failed = [i for i, p in procs.items() if p.poll() not in (None, 0)]
            if failed:
                i = failed[0]
                log = _tail(logdir / f"worker{i}.log")
                _kill(procs)
                raise WorkerError(f"worker {i} failed with exit code {procs[i].returncode}; the other workers "
                                  f"were stopped. End of its output:\n{log}", worker=i, log=log)
            if all(p.poll() == 0 for p in procs.values()):
                break
            if time.monotonic() > deadline:
                hung = [i for i, p in procs.items() if p.poll() is None]
                _kill(procs)
                missing = sorted(set(range(num_workers)) - set(indices))
                why = (f" worker(s) {missing} were never started, and a worker waits for every peer in "
                       "TF_CONFIG" if missing else " a worker waits for every peer in TF_CONFIG")
                raise WorkerTimeout(f"worker(s) {hung} still running after {timeout:g} s and were killed:{why}. "
                                    "Check that every worker started and can reach the others' ports.",
                                    worker=hung[0], log=_tail(logdir / f"worker{hung[0]}.log"))
            time.sleep(poll_s)
        results = []
        for i in indices:
            text = (logdir / f"worker{i}.log").read_text(errors="replace")
            lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARK)]
            if not lines:
                raise WorkerError(f"worker {i} exited without printing a result. End of its output:\n"
                                  f"{_tail(logdir / f'worker{i}.log')}", worker=i)
            results.append(WorkerResult.from_dict(json.loads(lines[-1][len(RESULT_MARK):])))
        return results
    finally:
        _kill(procs)
        for f in files:
            f.close()
        for p in logdir.glob("*"):
            p.unlink()
        logdir.rmdir()


# --------------------------------------------------------------------------- the worker itself


def _run_worker(steps: int, per_replica_batch: int, seed: int, mode: str) -> dict:
    """Train a tiny regression model under MultiWorkerMirroredStrategy with a custom loop."""
    t0 = time.perf_counter()
    tf = _tf()
    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    gbs = global_batch_size(per_replica_batch, strategy)

    def dataset_fn(ctx: "tf.distribute.InputContext"):
        # Same data on every worker (same seed), then each input pipeline keeps its own shard.
        rng = tf.random.Generator.from_seed(seed)
        x = rng.normal((gbs * steps * ctx.num_input_pipelines, 8))
        y = tf.reduce_sum(x * tf.range(1.0, 9.0), axis=1, keepdims=True) / 8.0
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.batch(ctx.get_per_replica_batch_size(gbs), drop_remainder=True).repeat()

    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)

    if mode == "fit":  # Keras 3 fit under MultiWorkerMirroredStrategy: fails (keras-team/keras#20585)
        model.compile(optimizer=optimizer, loss="mse")
        dist = strategy.distribute_datasets_from_function(dataset_fn)
        hist = model.fit(dist, steps_per_epoch=steps, epochs=1, verbose=0)
        losses = [float(v) for v in hist.history["loss"]]
    else:
        dist = iter(strategy.distribute_datasets_from_function(dataset_fn))

        replica_step = _mse_replica_step(model, optimizer, gbs)

        @tf.function
        def train_step(iterator):
            return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)

        losses = [float(train_step(dist)) for _ in range(steps)]
    checksum = float(sum(tf.reduce_sum(tf.abs(w)) for w in model.trainable_variables))
    return {"index": int(resolver.task_id), "num_replicas": int(strategy.num_replicas_in_sync),
            "losses": losses, "weights_checksum": checksum,
            "devices": list(strategy.extended.worker_devices),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "seconds": time.perf_counter() - t0}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpucourse.distribute worker ...``: run one worker (reads ``TF_CONFIG``)."""
    ap = argparse.ArgumentParser(prog="python -m gpucourse.distribute",
                                 description="Run one MultiWorkerMirroredStrategy worker (needs TF_CONFIG).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="train under MultiWorkerMirroredStrategy and print a JSON result")
    w.add_argument("--steps", type=int, default=5)
    w.add_argument("--per-replica-batch", type=int, default=16)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--mode", choices=("loop", "fit"), default="loop")
    a = ap.parse_args(argv)
    if "TF_CONFIG" not in os.environ:
        print("TF_CONFIG is not set: start workers with gpucourse.distribute.launch_workers()", file=sys.stderr)
        return 2
    try:  # fail fast, before the slow TensorFlow import, on a TF_CONFIG that cannot work
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        if task.get("type") != "worker" or not isinstance(task.get("index"), int):
            raise ValueError(f"task must be {{'type': 'worker', 'index': <int>}}, got {task!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        print(f"ValueError: bad TF_CONFIG ({type(err).__name__}: {err}); build it with "
              "gpucourse.distribute.tf_config()", file=sys.stderr)
        return 2
    result = _run_worker(a.steps, a.per_replica_batch, a.seed, a.mode)
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
