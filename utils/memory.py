"""Topic 03: how much memory a step needs, and making a training run fit.

Four jobs:

* :func:`measure_peak` runs a function on a device and reports the peak
  memory TensorFlow's allocator reached, using
  ``tf.config.experimental.reset_memory_stats`` and ``get_memory_info``.
  On a GPU that is the number that decides out-of-memory errors. On a CPU the
  same counters work, but they count only tensors TensorFlow allocates (not
  Python objects, NumPy arrays or oneDNN scratch space).
* :func:`largest_fitting` finds the largest batch size whose measured peak
  fits a memory budget, doubling then bisecting, and treats an out-of-memory
  error (``tf.errors.ResourceExhaustedError``) as "does not fit".
* :func:`training_memory` estimates, before anything runs, the memory of the
  weights, gradients, optimizer slots and gradient accumulators of a Keras
  model; :func:`accumulation_plan` picks a micro-batch and a number of
  ``gradient_accumulation_steps`` that reach a large effective batch.
* :func:`fresh_process_probe` starts a fresh Python, applies settings that
  only work before TensorFlow initialises (``TF_FORCE_GPU_ALLOW_GROWTH``,
  memory growth, virtual devices), and reports what happened and how much GPU
  memory the process holds.

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = [
    "AccumulationPlan",
    "FitSearch",
    "MemoryEstimate",
    "PeakMemory",
    "ProbeResult",
    "SLOTS",
    "accumulation_plan",
    "default_device",
    "format_bytes",
    "fresh_process_probe",
    "is_oom_error",
    "largest_fitting",
    "linear_fit",
    "measure_peak",
    "memory_info",
    "normalize_device",
    "slots_per_param",
    "training_memory",
]

#: Optimizer state per trainable parameter (in parameter-sized slots), Keras 3 optimizers.
#: Options that add a slot are handled in :func:`slots_per_param`.
SLOTS = {
    "sgd": 0,  # +1 with momentum > 0
    "adam": 2,  # m and v; +1 with amsgrad
    "adamw": 2,
    "adamax": 2,
    "nadam": 2,
    "ftrl": 2,
    "adadelta": 2,
    "rmsprop": 1,  # +1 with momentum > 0, +1 when centered
    "adagrad": 1,
    "lion": 1,
}

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
                "int16": 2, "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16}


def _tf():
    import tensorflow as tf  # imported lazily: importing gpucourse must stay cheap

    return tf


def _whole(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def format_bytes(n) -> str:
    """Human-readable binary size: 512 -> '512 B', 3145728 -> '3.00 MiB'."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or math.isnan(n):
        raise TypeError(f"n must be a number of bytes, got {n!r}")
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- devices and counters



def normalize_device(device) -> str:
    """'/device:GPU:0', '/GPU:0', 'gpu:0' or a LogicalDevice -> 'GPU:0' (what get_memory_info wants)."""
    from .placement import short_device

    name = getattr(device, "name", device)
    if not isinstance(name, str):
        raise TypeError(f"device must be a name like 'GPU:0' or a tf.config device, got {type(device).__name__}")
    try:
        short = short_device(name)
    except ValueError:
        short = ""
    if short.split(":")[0] not in ("CPU", "GPU"):
        raise ValueError(f"device must look like 'GPU:0', 'CPU:0' or '/device:GPU:1', got {name!r}")
    return short


def default_device() -> str:
    """'GPU:0' when TensorFlow sees a GPU, else 'CPU:0'. Does not start the runtime."""
    return "GPU:0" if _tf().config.list_physical_devices("GPU") else "CPU:0"


def memory_info(device=None) -> dict:
    """``{'current': bytes, 'peak': bytes}`` of TensorFlow's allocator on ``device`` (default: GPU:0 or CPU:0)."""
    dev = normalize_device(device or default_device())
    info = _tf().config.experimental.get_memory_info(dev)
    return {"current": int(info["current"]), "peak": int(info["peak"])}


@dataclass
class PeakMemory:
    """What one call did to an allocator: bytes in use before, at the peak and after."""

    device: str
    before_bytes: int
    peak_bytes: int
    after_bytes: int

    @property
    def extra_bytes(self) -> int:
        """Peak above what was already allocated: the memory this call needed on top."""
        return max(0, self.peak_bytes - self.before_bytes)

    def __str__(self) -> str:
        return (f"{self.device}: {format_bytes(self.before_bytes)} in use before, peak "
                f"{format_bytes(self.peak_bytes)} (+{format_bytes(self.extra_bytes)}), "
                f"{format_bytes(self.after_bytes)} after")


def measure_peak(fn: Callable, *args, device=None, warmup: int = 1, repeats: int = 1, **kwargs) -> PeakMemory:
    """Run ``fn(*args, **kwargs)`` and report the allocator's peak on ``device``.

    ``warmup`` calls run first, so that one-off allocations (tracing a
    ``tf.function``, creating optimizer slots) are not counted as the step's
    own. Then, ``repeats`` times, the peak counter is reset, the function runs
    once and its result is waited for before the counters are read. The run
    with the highest peak is returned: when independent ops run in parallel,
    the order they run in changes which tensors are alive together, and what
    must fit is the worst case.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _whole("warmup", warmup, 0)
    _whole("repeats", repeats)
    from .timing import sync

    tf = _tf()
    dev = normalize_device(device or default_device())
    for _ in range(warmup):
        sync(fn(*args, **kwargs))
    worst = None
    for _ in range(repeats):
        tf.config.experimental.reset_memory_stats(dev)
        before = int(tf.config.experimental.get_memory_info(dev)["current"])
        result = sync(fn(*args, **kwargs))
        info = tf.config.experimental.get_memory_info(dev)
        del result
        run = PeakMemory(dev, before, int(info["peak"]), int(info["current"]))
        if worst is None or run.extra_bytes > worst.extra_bytes:
            worst = run
    return worst


# --------------------------------------------------------------------------- the largest batch that fits


def is_oom_error(exc: BaseException) -> bool:
    """True for out-of-memory errors: ``tf.errors.ResourceExhaustedError`` or Python's ``MemoryError``."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception, got {type(exc).__name__}")
    return any(c.__name__ in ("ResourceExhaustedError", "MemoryError") for c in type(exc).__mro__)


@dataclass
class FitSearch:
    """Result of :func:`largest_fitting`: the answer and every measurement taken to find it."""

    budget_bytes: int
    best: int | None
    tried: list[tuple[int, int | None]] = field(default_factory=list)  # (batch, bytes); None = out of memory

    @property
    def calls(self) -> int:
        return len(self.tried)

    def table(self) -> str:
        lines = [f"budget {format_bytes(self.budget_bytes)}; {self.calls} measurements"]
        for n, b in self.tried:
            verdict = "out of memory" if b is None else ("fits" if b <= self.budget_bytes else "too big")
            lines.append(f"  batch {n:>6}: {'-' if b is None else format_bytes(b):>12}  {verdict}")
        lines.append(f"largest batch that fits: {self.best if self.best is not None else 'none'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def largest_fitting(measure: Callable[[int], float], budget_bytes, lo: int = 1, hi: int = 4096) -> FitSearch:
    """Largest ``n`` in ``[lo, hi]`` with ``measure(n) <= budget_bytes``.

    ``measure(n)`` returns the peak bytes for batch size ``n`` and must not
    decrease as ``n`` grows. It may also raise an out-of-memory error (what a
    real GPU does when a batch is far too big), which counts as "does not fit".
    The search doubles from ``lo`` until a batch does not fit, then bisects, so
    it needs about ``2 * log2(hi / lo)`` measurements instead of ``hi - lo``.
    ``best`` is None when not even ``lo`` fits.
    """
    if not callable(measure):
        raise TypeError(f"measure must be a function batch_size -> bytes, got {type(measure).__name__}")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) or not budget_bytes > 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, got {budget_bytes!r}")
    _whole("lo", lo)
    _whole("hi", hi)
    if hi < lo:
        raise ValueError(f"hi must be >= lo, got lo={lo}, hi={hi}")
    search = FitSearch(int(budget_bytes), None)
    seen: dict[int, bool] = {}

    def fits(n: int) -> bool:
        if n in seen:
            return seen[n]
        try:
            used = measure(n)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            search.tried.append((n, None))
            seen[n] = False
            return False
        if isinstance(used, bool) or not isinstance(used, (int, float)) or used < 0:
            raise TypeError(f"measure({n}) must return a number of bytes >= 0, got {used!r}")
        search.tried.append((n, int(used)))
        seen[n] = used <= budget_bytes
        return seen[n]

    if not fits(lo):
        return search
    good, bad = lo, None
    while good < hi:  # doubling phase
        nxt = min(2 * good, hi)
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
            break
    if bad is not None:  # bisect: good fits, bad does not
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
    search.best = good
    return search


def linear_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``bytes = fixed + per_item * n`` through ``(n, bytes)`` points; returns (fixed, per_item)."""
    pts = list(points)
    if len(pts) < 2:
        raise ValueError(f"need at least 2 (n, bytes) points, got {len(pts)}")
    try:
        xs, ys = [float(p[0]) for p in pts], [float(p[1]) for p in pts]
    except (TypeError, ValueError, IndexError):
        raise TypeError("points must be (n, bytes) pairs of numbers") from None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("points need at least two different n values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


# --------------------------------------------------------------------------- estimates before running


def _optimizer_name(optimizer) -> str:
    if isinstance(optimizer, str):
        return optimizer.lower()
    return type(optimizer).__name__.lower()


def slots_per_param(optimizer) -> int:
    """Optimizer state per trainable parameter, in parameter-sized slots (Keras 3).

    ``optimizer`` is a Keras optimizer instance (its options are read: SGD
    momentum, Adam ``amsgrad``, RMSprop ``momentum``/``centered``) or a name
    like ``"adam"`` (default options). Gradient accumulators are not included:
    :func:`training_memory` adds them. Adafactor's factored state depends on
    the shapes and is refused: build it and count ``optimizer.variables``.
    """
    name = _optimizer_name(optimizer)
    if name == "adafactor":
        raise ValueError("Adafactor stores factored row/column statistics, not whole slots: build it on the "
                         "model (optimizer.build(model.trainable_variables)) and sum optimizer.variables")
    if name not in SLOTS:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(sorted(SLOTS))}")
    slots = SLOTS[name]
    if isinstance(optimizer, str):
        return slots
    if name == "sgd" and float(getattr(optimizer, "momentum", 0) or 0) > 0:
        slots += 1
    if name in ("adam", "adamw") and getattr(optimizer, "amsgrad", False):
        slots += 1
    if name == "rmsprop":
        slots += int(float(getattr(optimizer, "momentum", 0) or 0) > 0) + int(bool(getattr(optimizer, "centered", False)))
    return slots


@dataclass
class MemoryEstimate:
    """Training-state memory, split by what holds it. Activations are not included: measure them."""

    params_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    accumulator_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.gradient_bytes + self.optimizer_bytes + self.accumulator_bytes

    def rows(self) -> list[tuple[str, int]]:
        return [("weights", self.params_bytes), ("gradients", self.gradient_bytes),
                ("optimizer slots", self.optimizer_bytes), ("gradient accumulators", self.accumulator_bytes),
                ("total", self.total_bytes)]

    def table(self) -> str:
        return "\n".join(f"{name:<22}{format_bytes(b):>12}" for name, b in self.rows())

    def __str__(self) -> str:
        return self.table()


def _weight_bytes(weights) -> int:
    total = 0
    for w in weights:
        dtype = str(getattr(w.dtype, "name", w.dtype))
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"weight {getattr(w, 'path', w)} has dtype {dtype}, which this estimate does not know")
        total += math.prod(int(d) for d in w.shape) * _DTYPE_BYTES[dtype]
    return total


def training_memory(model, optimizer="adam", *, bytes_per_param: int = 4,
                    accumulate: bool | None = None) -> MemoryEstimate:
    """Estimate the memory training holds besides activations.

    Args:
        model: a built Keras model (its weights are read, trainable and not;
            only trainable weights get gradients and optimizer state), or a
            parameter count (all trainable, ``bytes_per_param`` each).
        optimizer: a Keras optimizer instance or a name (see :data:`SLOTS`).
        bytes_per_param: bytes per parameter when ``model`` is a count.
        accumulate: whether gradient accumulators are held (one slot per
            trainable parameter); default: read the optimizer's
            ``gradient_accumulation_steps`` (False for a name).
    """
    _whole("bytes_per_param", bytes_per_param)
    if accumulate is None:
        accumulate = bool(getattr(optimizer, "gradient_accumulation_steps", None)) if not isinstance(optimizer, str) \
            else False
    if not isinstance(accumulate, bool):
        raise TypeError(f"accumulate must be True, False or None, got {accumulate!r}")
    slots = slots_per_param(optimizer)
    if isinstance(model, int) and not isinstance(model, bool):
        if model < 0:
            raise ValueError(f"a parameter count must be >= 0, got {model}")
        params = trainable = model * bytes_per_param
    elif hasattr(model, "weights") and hasattr(model, "trainable_weights"):
        if not model.weights:
            raise ValueError("the model has no weights yet: give it a keras.Input or call it on a batch first")
        params, trainable = _weight_bytes(model.weights), _weight_bytes(model.trainable_weights)
    else:
        raise TypeError(f"model must be a Keras model or a parameter count, got {type(model).__name__}")
    return MemoryEstimate(params, trainable, slots * trainable, trainable if accumulate else 0)


@dataclass
class AccumulationPlan:
    """How to reach an effective batch: ``steps`` micro-batches of ``micro_batch`` per update."""

    effective_batch: int
    micro_batch: int
    steps: int

    @property
    def optimizer_kwargs(self) -> dict:
        """Keyword arguments for a Keras 3 optimizer (Keras refuses ``gradient_accumulation_steps=1``)."""
        return {"gradient_accumulation_steps": self.steps} if self.steps > 1 else {}

    def __str__(self) -> str:
        return (f"effective batch {self.effective_batch} = {self.steps} x {self.micro_batch}"
                f" -> optimizer(..., {', '.join(f'{k}={v}' for k, v in self.optimizer_kwargs.items()) or 'no accumulation'})")


def accumulation_plan(effective_batch: int, max_batch: int) -> AccumulationPlan:
    """Fewest accumulation steps whose micro-batch divides ``effective_batch`` and is at most ``max_batch``.

    The micro-batch must divide the effective batch exactly: with a remainder
    the last micro-batch would be smaller, and the average of the gradients
    would no longer equal the gradient of the whole batch.
    """
    _whole("effective_batch", effective_batch)
    _whole("max_batch", max_batch)
    for steps in range(1, effective_batch + 1):
        if effective_batch % steps == 0 and effective_batch // steps <= max_batch:
            return AccumulationPlan(effective_batch, effective_batch // steps, steps)
    raise AssertionError("unreachable: steps == effective_batch always works")


# --------------------------------------------------------------------------- fresh processes

_PROBE = r"""
import json, os, sys

def gpu_used_mib():  # what the driver (NVML) says is used on each GPU, or None without a driver
    try:
        import pynvml
        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used // 2**20
                for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return None

before = gpu_used_mib()
import tensorflow as tf
out = {"env": {k: os.environ.get(k) for k in ("TF_FORCE_GPU_ALLOW_GROWTH", "CUDA_VISIBLE_DEVICES")},
       "setup_error": None}
try:
    exec(compile(sys.argv[1], "<setup>", "exec"), {"tf": tf})
except Exception as exc:
    out["setup_error"] = [type(exc).__name__, str(exc)]
gpus = tf.config.list_physical_devices("GPU")
out["memory_growth"] = [tf.config.experimental.get_memory_growth(g) for g in gpus]
x = tf.ones((256, 256))
float(tf.reduce_sum(x @ x))  # start the runtime and run one op
out["logical"] = [d.name for d in tf.config.list_logical_devices()]
out["gpu_tf_bytes"] = [int(tf.config.experimental.get_memory_info(d.name)["current"])
                       for d in tf.config.list_logical_devices("GPU")]
after = gpu_used_mib()
out["gpu_process_mib"] = [int(a - b) for a, b in zip(after, before)] if before and after else None
print("GPUCOURSE_JSON " + json.dumps(out))
"""


@dataclass
class ProbeResult:
    """What a fresh TensorFlow process did with some settings (see :func:`fresh_process_probe`)."""

    env: dict
    setup_error: tuple[str, str] | None
    memory_growth: list[bool | None]  # None: never set from Python (the environment variable does not show here)
    logical: list[str]
    gpu_tf_bytes: list[int]
    gpu_process_mib: list[int] | None  # per GPU: rise of the driver's "used" MiB while this process ran

    def __str__(self) -> str:
        env = ", ".join(f"{k}={v!r}" for k, v in self.env.items() if v is not None) or "(none of ours)"
        err = "none" if self.setup_error is None else f"{self.setup_error[0]}: {self.setup_error[1]}"
        gpu = ("no GPU" if not self.memory_growth else
               f"memory growth {self.memory_growth}, tensors {[format_bytes(b) for b in self.gpu_tf_bytes]}, "
               f"process took {self.gpu_process_mib} MiB per GPU (NVML)")
        return (f"env: {env}\nsetup error: {err}\nlogical devices: {len(self.logical)}\nGPU: {gpu}")


def fresh_process_probe(env: dict | None = None, setup: str = "", timeout: float = 180) -> ProbeResult:
    """Start a fresh Python, run ``setup`` before TensorFlow initialises, then one op, and report.

    ``setup`` is Python code with ``tf`` in scope, e.g.
    ``"for g in tf.config.list_physical_devices('GPU'): tf.config.experimental.set_memory_growth(g, True)"``.
    An exception it raises is reported, not re-raised. ``env`` adds
    environment variables (``TF_FORCE_GPU_ALLOW_GROWTH``, ...), which are read
    only when a process starts TensorFlow. On a GPU the result includes how
    much the driver's (NVML's) "used" memory rose while the process started
    TensorFlow and ran one op: with memory growth, the CUDA context plus what
    the op needed; without, most of the GPU. Another process allocating on the
    same GPU at the same moment would disturb that number.
    """
    if env is not None and (not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                                   for k, v in env.items())):
        raise TypeError("env must be a dict of str -> str, e.g. {'TF_FORCE_GPU_ALLOW_GROWTH': 'true'}")
    if not isinstance(setup, str):
        raise TypeError(f"setup must be Python source code as a string, got {type(setup).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    proc = subprocess.run([sys.executable, "-c", _PROBE, setup], env=full, capture_output=True, text=True,
                          timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("GPUCOURSE_JSON "):
            d = json.loads(line.split(" ", 1)[1])
            err = tuple(d["setup_error"]) if d["setup_error"] else None
            return ProbeResult(d["env"], err, d["memory_growth"], d["logical"], d["gpu_tf_bytes"],
                               d["gpu_process_mib"])
    raise RuntimeError(f"the fresh process failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
