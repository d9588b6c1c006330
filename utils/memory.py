"""Topic 03: how much memory training needs, and how TensorFlow takes it from a GPU.

Four jobs:

* **Measure.** :func:`measure_peak` runs a function and reports the peak of
  TensorFlow's allocator on one device (``reset_memory_stats`` then
  ``get_memory_info``), the numbers that decide out-of-memory errors on a GPU.
  On a CPU the same counters exist (with oneDNN on), but they leave out
  allocations under 256 KiB, Python objects and NumPy arrays.
* **Know the GPU allocator's rules without a GPU.** :func:`resolve_growth`
  and :func:`default_gpu_limit` restate, as small pure functions, what
  TensorFlow's GPU code does with ``TF_FORCE_GPU_ALLOW_GROWTH`` and how much
  of a GPU it takes by default (``GetAllowGrowthValue`` in
  ``gpu_bfc_allocator.cc``, ``MinSystemMemory`` and
  ``SingleVirtualDeviceMemoryLimit`` in ``gpu_device.cc``).
  :func:`allocator_messages` reads TensorFlow's own log messages about them
  out of the installed library, so the rules can be checked on any machine.
* **Ask a fresh process.** :func:`fresh_process_probe` starts TensorFlow in a
  fresh Python (through :mod:`gpucourse._probe`, without the variables the
  setup cell set on your behalf), applies settings that only work before the
  runtime starts, and reports what happened and, on a GPU, how much memory
  the process took. :func:`provoke_oom` runs out of memory for real in a
  capped fresh process; :func:`split_log_records` reads its log as whole messages.
* **Estimate.** :func:`estimate_state` does the arithmetic of the training
  state (weights, gradients, optimizer slots, gradient accumulators) from
  counts, and :func:`linear_fit` splits measured peaks into a fixed part and
  a part per example.

TensorFlow's own words (:func:`allocator_messages`, :func:`split_log_records`
and :class:`LogRecord`) live in :mod:`gpucourse._memory_log` and are
re-exported here. The interactive memory explorer lives in
:mod:`gpucourse.memory_explorer`.
Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from . import _probe, _validate
from ._memory_log import LogRecord, allocator_messages, split_log_records
from ._tf import tf as _tf
from ._labrules import answers

__all__ = [
    "LogRecord",
    "MemoryEstimate",
    "OomResult",
    "PeakMemory",
    "ProbeResult",
    "allocator_messages",
    "default_device",
    "default_gpu_limit",
    "estimate_state",
    "format_bytes",
    "fresh_process_probe",
    "is_oom_error",
    "linear_fit",
    "measure_peak",
    "memory_info",
    "normalize_device",
    "provoke_oom",
    "resolve_growth",
    "split_log_records",
]

MiB = 2**20
#: With oneDNN on, TensorFlow's CPU allocator hands allocations below this size to a small-object
#: allocator whose bytes ``get_memory_info("CPU:0")`` does not count (measured on TF 2.21).
CPU_UNCOUNTED_BELOW = 256 * 1024


def format_bytes(n) -> str:
    """Human-readable binary size: 512 -> '512 B', 3145728 -> '3.00 MiB'."""
    n = _validate.real("n", n, what="a number of bytes")
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- devices and counters


def normalize_device(device) -> str:
    """Check that ``device`` names one CPU or GPU; return a name ``get_memory_info`` accepts.

    A tf.config device (``LogicalDevice``, ``PhysicalDevice``) gives ``'TYPE:index'`` (``'GPU:0'``).
    A string is read by TensorFlow's own parser (``tf.DeviceSpec``): ``'GPU:0'`` comes back as given,
    any other spelling in TensorFlow's canonical form, job and task kept (``'gpu:1'`` ->
    ``'/device:GPU:1'``), because ``get_memory_info`` refuses lower-case types. It never shortens a
    full name to ``'TYPE:index'``: writing that is lab 02's first exercise.
    """
    name = getattr(device, "name", device)
    if not isinstance(name, str):
        raise TypeError(f"device must be a name like 'GPU:0' or a tf.config device, got {device!r} of type "
                        f"{type(device).__name__}")
    text = name.replace("/physical_device:", "/device:", 1) if hasattr(device, "device_type") else name
    try:
        spec = _tf().DeviceSpec.from_string(text)
    except ValueError:
        spec = None
    if spec is None or spec.device_type not in ("CPU", "GPU") or spec.device_index is None:
        raise ValueError(f"device must name one CPU or GPU, like 'GPU:0', 'CPU:0' or '/device:GPU:1', got {name!r}")
    if hasattr(device, "device_type"):
        return f"{spec.device_type}:{spec.device_index}"
    canonical = spec.to_string()
    return name if canonical == "/device:" + name else canonical


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


@answers('03', 'q6')
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
    _validate.callable_("fn", fn)
    _validate.whole("warmup", warmup, 0, what="calls before measuring")
    _validate.whole("repeats", repeats, 1, what="measured calls")
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


def is_oom_error(exc: BaseException) -> bool:
    """True for out-of-memory errors: ``tf.errors.ResourceExhaustedError`` or Python's ``MemoryError``."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception, got {exc!r} of type {type(exc).__name__}")
    return any(c.__name__ in ("ResourceExhaustedError", "MemoryError") for c in type(exc).__mro__)


def linear_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``bytes = fixed + per_item * n`` through ``(n, bytes)`` points; returns (fixed, per_item)."""
    pts = list(points)
    if len(pts) < 2:
        raise ValueError(f"points must hold at least 2 (n, bytes) pairs, got {len(pts)}")
    try:
        xs, ys = [float(p[0]) for p in pts], [float(p[1]) for p in pts]
    except (TypeError, ValueError, IndexError):
        raise TypeError(f"points must be (n, bytes) pairs of numbers, got {pts[:3]!r}...") from None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError(f"points need at least two different n values, got only n={xs[0]:g}")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


# --------------------------------------------------------------------------- the GPU allocator's rules


def resolve_growth(env_value: str | None, configured: bool | None = None) -> bool:
    """Whether TensorFlow's GPU allocator grows, given ``TF_FORCE_GPU_ALLOW_GROWTH`` and the configured flag.

    ``configured`` is what ``tf.config.experimental.set_memory_growth`` asked
    for (``None``: never called). The rule, from ``GetAllowGrowthValue`` in
    TensorFlow's ``gpu_bfc_allocator.cc``, is applied when the allocator of
    each GPU is created, that is when the runtime creates its GPU devices:

    * unset: the configured flag decides (default: no growth);
    * exactly ``"true"`` or ``"false"``: the variable wins over the configured
      flag, in both directions (TensorFlow logs a warning when it overrides);
    * anything else (``"1"``, ``"True"``, ``"yes"``): TensorFlow logs an error
      and keeps the configured flag, so ``TF_FORCE_GPU_ALLOW_GROWTH=1`` does nothing.
    """
    if env_value is not None and not isinstance(env_value, str):
        raise TypeError(f"env_value must be the variable's text or None, got {env_value!r} of type "
                        f"{type(env_value).__name__}")
    if configured is not None and not isinstance(configured, bool):
        raise TypeError(f"configured must be True, False or None (never set), got {configured!r}")
    if env_value == "true":
        return True
    if env_value == "false":
        return False
    return bool(configured)


#: GPU memory TensorFlow leaves to the driver and other processes when it takes a GPU without a
#: memory limit, by compute capability major version (``MinSystemMemory`` in ``gpu_device.cc``),
#: when at least 2 GiB are free; 225 MiB below that.
RESERVE_MIB = {6: 500, 7: 1050, 8: 1536, 9: 1800}


def default_gpu_limit(free_bytes: int, compute_capability_major: int, reserve_mib: int | None = None) -> int:
    """Bytes TensorFlow's allocator may use on one GPU when no ``memory_limit`` is set.

    TensorFlow asks the driver how much memory is **free** when it creates the
    device, and keeps a reserve for the driver and other processes: 225 MiB
    when less than 2 GiB are free, else 500 MiB (compute capability 6.x and
    older), 1050 MiB (7.x: V100, T4), 1536 MiB (8.x: A100) or 1800 MiB
    (9.x and newer: H100). ``reserve_mib`` is the variable
    ``TF_DEVICE_MIN_SYS_MEMORY_IN_MB``, which replaces the reserve when it is
    not larger than the free memory. Without growth the allocator reserves this
    whole amount at its first allocation; with growth it is the ceiling the
    pool may grow to. So a second process on a busy GPU does not fail at start:
    it gets a limit computed from what is left, and fails when it needs more.
    """
    free = _validate.whole("free_bytes", free_bytes, 0, what="free GPU memory in bytes")
    cc = _validate.whole("compute_capability_major", compute_capability_major, 1, what="e.g. 7 for a T4")
    if free < 2**31:
        reserve = 225 * MiB
    else:
        reserve = RESERVE_MIB[min(max(cc, 6), 9)] * MiB
    limit = free - reserve if reserve < free else free
    if reserve_mib is not None:
        forced = _validate.whole("reserve_mib", reserve_mib, 0, what="TF_DEVICE_MIN_SYS_MEMORY_IN_MB")
        if forced * MiB <= free:
            limit = free - forced * MiB
    return limit


# --------------------------------------------------------------------------- fresh processes

_WATCHED_ENV = ("TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "CUDA_VISIBLE_DEVICES")

_PROBE_CODE = r"""
import os, sys

def nvml():  # [[used MiB, free MiB] per GPU] from the driver (NVML, behind nvidia-smi), or None
    try:
        import pynvml
        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append([m.used // 2**20, m.free // 2**20])
        return out
    except Exception:
        return None

before = nvml()
import tensorflow as tf
out = {"setup_error": None}
try:
    exec(compile(sys.argv[1], "<setup>", "exec"), {"tf": tf})
except Exception as exc:
    out["setup_error"] = [type(exc).__name__, str(exc)]
out["env"] = {k: os.environ.get(k) for k in %(watched)r}  # after setup: what TensorFlow reads at device creation
gpus = tf.config.list_physical_devices("GPU")
out["memory_growth"] = [tf.config.experimental.get_memory_growth(g) for g in gpus]
out["compute_capability"] = [list(tf.config.experimental.get_device_details(g).get("compute_capability") or [])
                             for g in gpus]
x = tf.ones((256, 256))
float(tf.reduce_sum(x @ x))  # start the runtime and run one op
out["logical"] = [d.name for d in tf.config.list_logical_devices()]
out["gpu_tf_bytes"] = [int(tf.config.experimental.get_memory_info(d.name)["current"])
                       for d in tf.config.list_logical_devices("GPU")]
out["gpu_limit_bytes"] = []
if gpus:  # the devices exist already: device_lib reuses their allocators and reports their limits
    from tensorflow.python.client import device_lib
    out["gpu_limit_bytes"] = [int(d.memory_limit) for d in device_lib.list_local_devices()
                              if d.device_type == "GPU"]
after = nvml()
out["gpu_free_mib_before"] = [f for _, f in before] if before else None
out["gpu_process_mib"] = [int(a[0] - b[0]) for a, b in zip(after, before)] if before and after else None
emit(out)
""" % {"watched": _WATCHED_ENV}


@dataclass
class ProbeResult:
    """What a fresh TensorFlow process did with some settings (see :func:`fresh_process_probe`)."""

    env: dict  # the probe's own TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR, CUDA_VISIBLE_DEVICES (None: unset)
    setup_error: tuple[str, str] | None
    memory_growth: list[bool | None]  # per GPU, as set from Python (None: never set; the variable does not show)
    logical: list[str]
    gpu_tf_bytes: list[int]  # per logical GPU: bytes of tensors TensorFlow holds
    gpu_limit_bytes: list[int]  # per logical GPU: the allocator's limit
    gpu_free_mib_before: list[int] | None  # per GPU: free MiB (NVML) before the probe imported TensorFlow
    gpu_process_mib: list[int] | None  # per GPU: rise of the driver's "used" MiB while this process ran
    compute_capability: list[list[int]]  # per physical GPU: [major, minor]

    @property
    def growth(self) -> bool | None:
        """Whether the probe's GPU allocators grew (:func:`resolve_growth`); None without a GPU."""
        if not self.memory_growth:
            return None
        flags = {g for g in self.memory_growth if g is not None}
        return resolve_growth(self.env.get("TF_FORCE_GPU_ALLOW_GROWTH"), flags.pop() if len(flags) == 1 else None)

    def __str__(self) -> str:
        env = ", ".join(f"{k}={v!r}" for k, v in self.env.items() if v is not None) or "none of them set"
        err = "none" if self.setup_error is None else f"{self.setup_error[0]}: {self.setup_error[1]}"
        if not self.memory_growth:
            gpu = "none visible"
        else:
            gpu = (f"growth {'on' if self.growth else 'off'} (flags set from Python: {self.memory_growth}); "
                   f"limit {[format_bytes(b) for b in self.gpu_limit_bytes]}; "
                   f"tensors {[format_bytes(b) for b in self.gpu_tf_bytes]}; "
                   f"the process took {self.gpu_process_mib} MiB per GPU (NVML)")
        return (f"environment of the probe: {env}\nsetup error: {err}\n"
                f"logical devices: {len(self.logical)}\nGPU: {gpu}")


def fresh_process_probe(env: Mapping[str, str] | None = None, setup: str = "", timeout: float = 180) -> ProbeResult:
    """Start a fresh Python, run ``setup`` before TensorFlow initialises, then one op, and report.

    ``setup`` is Python code with ``tf`` in scope, e.g.
    ``"for g in tf.config.list_physical_devices('GPU'): tf.config.experimental.set_memory_growth(g, True)"``.
    An exception it raises is reported, not re-raised. The probe inherits this
    kernel's environment **without** the variables the course's setup cell set
    on your behalf (``TF_FORCE_GPU_ALLOW_GROWTH``), so with ``env=None`` it
    shows TensorFlow's own default; ``env`` adds variables, which TensorFlow
    reads only when a process creates its devices. On a GPU the result says
    how much the driver's (NVML's) "used" memory rose while the process
    started TensorFlow and ran one op, and each GPU allocator's limit. Another
    process allocating on the same GPU at the same moment would disturb the rise.
    """
    env = _validate.env_vars("env", env)
    if not isinstance(setup, str):
        raise TypeError(f"setup must be Python source code as a string, got {setup!r} of type "
                        f"{type(setup).__name__}")
    _validate.seconds("timeout", timeout, allow_zero=False)
    d = _probe.run(_PROBE_CODE, setup, env=env, timeout=timeout, label="memory probe")
    err = tuple(d["setup_error"]) if d["setup_error"] else None
    return ProbeResult(d["env"], err, d["memory_growth"], d["logical"], d["gpu_tf_bytes"], d["gpu_limit_bytes"],
                       d["gpu_free_mib_before"], d["gpu_process_mib"], d["compute_capability"])


_OOM_CODE = r"""
import json, os, sys, tempfile
log = tempfile.TemporaryFile(mode="w+")
os.dup2(log.fileno(), 2)  # TensorFlow's C++ log goes to fd 2: keep it to read back
import tensorflow as tf
cap_mib, sizes = int(sys.argv[1]), json.loads(sys.argv[2])
gpus = tf.config.list_physical_devices("GPU")
if gpus:  # TensorFlow's own cap: a virtual GPU with a memory_limit
    tf.config.set_visible_devices(gpus[0], "GPU")
    tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=cap_mib)])
float(tf.reduce_sum(tf.ones((256, 256))))  # start the runtime and its threads before any cap
if gpus:
    device, mechanism = "GPU:0", "LogicalDeviceConfiguration(memory_limit=%d) on GPU 0" % cap_mib
else:  # the operating system's cap: the process may map only cap_mib MiB more data (Linux)
    import resource
    data = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmData:")][0]
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    resource.setrlimit(resource.RLIMIT_DATA, (data + cap_mib * 2**20, hard))
    device, mechanism = "CPU:0", "RLIMIT_DATA: %d MiB more than the process had mapped" % cap_mib
attempts = []
for mib in sizes:
    try:
        with tf.device(device):
            t = tf.zeros((mib * 2**18,))  # mib MiB of float32
            float(t[-1])
        del t
        attempts.append([mib, None, None])
    except Exception as exc:
        attempts.append([mib, type(exc).__name__, str(exc).strip()])
log.seek(0)
emit({"device": device, "mechanism": mechanism, "attempts": attempts, "log": log.read()})
"""


@dataclass
class OomResult:
    """What :func:`provoke_oom` saw: one attempt per tensor, and the allocator's log."""

    device: str  # "GPU:0" or "CPU:0"
    mechanism: str  # how the memory was capped
    cap_mib: int
    attempts: list[tuple[int, str | None, str | None]]  # (MiB, exception class or None, its message)
    log: list[LogRecord]  # the process's warnings and errors, whole

    @property
    def allocator_warning(self) -> str | None:
        """The allocator's own "ran out of memory" warning, whole (None if it wrote none)."""
        found = [r.message for r in self.log if "ran out of memory" in r.message]
        return found[0] if found else None

    def __str__(self) -> str:
        rows = [f"a {mib} MiB tensor on {self.device}: " + (f"{err}: {msg.splitlines()[0]}" if err else "fits")
                for mib, err, msg in self.attempts]
        return f"cap: {self.mechanism}\n" + "\n".join(rows)


def provoke_oom(cap_mib: int = 512, sizes_mib: Sequence[int] = (256, 1024, 256), timeout: float = 180) -> OomResult:
    """Run out of memory for real, in a fresh process whose memory is capped at ``cap_mib`` MiB.

    The process caps its memory, then allocates one float32 tensor of each size
    in ``sizes_mib`` in turn (freeing it again) and reports, per tensor,
    ``None`` or the exception TensorFlow raised, plus its own log. On a GPU the
    cap is TensorFlow's: GPU 0 becomes one virtual GPU with
    ``memory_limit=cap_mib``, and the allocator refuses a tensor that does not
    fit. On a CPU a logical device takes no limit, so the cap is the operating
    system's: after TensorFlow has started, ``RLIMIT_DATA`` lets the process
    map only ``cap_mib`` MiB more (Linux), and the operating system refuses the
    allocator's request. Either way the failure is real and TensorFlow raises
    the same ``ResourceExhaustedError``; only the cap is set up for the demonstration.
    """
    cap = _validate.whole("cap_mib", cap_mib, 64, what="MiB the process may still take, e.g. 512")
    if isinstance(sizes_mib, (str, bytes)) or not isinstance(sizes_mib, Sequence):
        raise TypeError(f"sizes_mib must be a list of tensor sizes in MiB, got {sizes_mib!r}")
    sizes = [_validate.whole("sizes_mib", n, 1, 8192, what="a tensor size in MiB") for n in sizes_mib]
    if not sizes:
        raise ValueError("sizes_mib must name at least one tensor size in MiB, got an empty list")
    _validate.seconds("timeout", timeout, allow_zero=False)
    d = _probe.run(_OOM_CODE, str(cap), json.dumps(sizes), env={"TF_CPP_MIN_LOG_LEVEL": "1"}, timeout=timeout,
                   label="out-of-memory probe")
    return OomResult(d["device"], d["mechanism"], cap, [tuple(a) for a in d["attempts"]], split_log_records(d["log"]))


# --------------------------------------------------------------------------- estimates from counts


@dataclass
class MemoryEstimate:
    """Memory split by what holds it, as ``{part: bytes}`` in a fixed order."""

    parts: dict

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    def __getitem__(self, part: str) -> int:
        return self.parts[part]

    def rows(self) -> list[tuple[str, int]]:
        return list(self.parts.items()) + [("total", self.total_bytes)]

    def table(self) -> str:
        return "\n".join(f"{name:<26}{format_bytes(b):>12}" for name, b in self.rows())

    def __str__(self) -> str:
        return self.table()


@answers('03', 'q1')
def estimate_state(params: int, slots: int, *, trainable: int | None = None, bytes_per_value: int = 4,
                   accumulate: bool = False) -> MemoryEstimate:
    """The training state of ``params`` parameters, before a single activation.

    Args:
        params: number of parameters (all weights, trainable or not).
        slots: parameter-sized variables the optimizer keeps per trainable
            parameter, e.g. 0 for plain SGD, 1 for SGD with momentum, 2 for Adam.
        trainable: how many of the parameters are trainable (default: all);
            only those get a gradient, optimizer slots and an accumulator.
        bytes_per_value: 4 for float32 weights (also under mixed precision, whose
            variables stay float32), 2 for float16/bfloat16 weights.
        accumulate: whether gradient accumulators are held
            (``gradient_accumulation_steps`` > 1: one more slot).
    """
    params = _validate.whole("params", params, 0, what="a number of parameters")
    slots = _validate.whole("slots", slots, 0, what="parameter-sized optimizer variables, e.g. 2 for Adam")
    trainable = params if trainable is None else _validate.whole("trainable", trainable, 0, params)
    nbytes = _validate.whole("bytes_per_value", bytes_per_value, 1, 8, what="4 for float32")
    if not isinstance(accumulate, bool):
        raise TypeError(f"accumulate must be True or False, got {accumulate!r}")
    return MemoryEstimate({
        "weights": params * nbytes,
        "gradients": trainable * nbytes,
        "optimizer slots": slots * trainable * nbytes,
        "gradient accumulators": trainable * nbytes if accumulate else 0,
    })
