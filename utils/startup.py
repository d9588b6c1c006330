"""Topic 01: what the first calls of a TensorFlow program start, asked of fresh processes.

Some start-up facts cannot be shown in a running kernel: its runtime has
started, CUDA has read its environment, its thread pools exist. This module
asks fresh processes instead (through :mod:`gpucourse._probe`, several at once):

* :func:`probe_first_calls`: does ``list_physical_devices()`` freeze
  ``CUDA_VISIBLE_DEVICES``? Does ``device_lib.list_local_devices()`` start
  the runtime, and how much GPU memory does the process hold after it, and
  after its first op?
* :func:`measure_threading`: what ``tf.config.threading`` settings (which must
  be set before the runtime starts) change on this machine, as ratios to one
  thread with the theoretical limit beside them.

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass

from . import _probe, _validate
from .devices import nvml_gpus

__all__ = ["ThreadRow", "ThreadingResult", "benchmark", "core_counts", "measure_threading", "probe_first_calls"]


# Each probe runs in its own fresh process (gpucourse._probe), several at once.
_FIRST_CALLS = {
    "CUDA_VISIBLE_DEVICES=-1 before the first call": """
import os
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
import tensorflow as tf
emit({"physical_gpus": len(tf.config.list_physical_devices("GPU")),
      "logical_gpus": len(tf.config.list_logical_devices("GPU"))})
""",
    # BaseGPUDeviceFactory::ListPhysicalDevices -> se::ValidateGPUMachineManager() runs cuInit, which reads
    # CUDA_VISIBLE_DEVICES once; the device ids are cached (CacheDeviceIds). The eager runtime is not started.
    "CUDA_VISIBLE_DEVICES=-1 after list_physical_devices()": """
import os, tensorflow as tf
from gpucourse import devices
gpus = tf.config.list_physical_devices("GPU")
started = devices.runtime_initialized()
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
emit({"physical_gpus": len(gpus), "runtime_started": started,
      "logical_gpus": len(tf.config.list_logical_devices("GPU"))})
""",
    # device_lib.list_local_devices -> _pywrap_device_lib.list_devices -> DeviceFactory::AddDevices with a default
    # ConfigProto: its own devices, outside the eager context. On a GPU that creates the process-wide allocator of
    # every GPU (GPUProcessState::GetGPUAllocator, created once) without growth, unless TF_FORCE_GPU_ALLOW_GROWTH=true
    # or session_config's gpu_options.allow_growth. Creating it reserves nothing: the BFC allocator takes its region,
    # nearly all free memory, at the first allocation on that GPU, so only GPUs that later allocate fill up (here the
    # op runs on GPU:0 alone). A set_memory_growth after the listing cannot change the allocator any more.
    "device_lib.list_local_devices()": """
import os, tensorflow as tf
from tensorflow.python.client import device_lib
from gpucourse import devices
used = lambda: [g.memory_used_mib for g in devices.nvml_gpus()]
before = used()
listed = [d.name for d in device_lib.list_local_devices()]
after_listing = used()
started = devices.runtime_initialized()
cpu = tf.config.list_physical_devices("CPU")[0]
try:
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    split = True
except RuntimeError:
    split = False
for gpu in tf.config.list_physical_devices("GPU"):
    tf.config.experimental.set_memory_growth(gpu, True)
tf.constant(1.0) + 1.0
emit({"listed": listed, "runtime_started": started, "cpu_split_ok": split,
      "logical_cpus": len(tf.config.list_logical_devices("CPU")),
      "gpu_used_mib": {"before": before, "listed": after_listing, "after": used()},
      "gpu_total_mib": [g.memory_total_mib for g in devices.nvml_gpus()],
      "allow_growth_env": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")})
""",
}


def probe_first_calls(timeout: float = 180) -> dict:
    """Ask fresh processes what the first calls of a program start: the runtime, CUDA, GPU memory.

    Returns ``{label: answer}`` for three probes: ``CUDA_VISIBLE_DEVICES`` set
    before TensorFlow starts; set *after* ``list_physical_devices()`` (on a GPU
    machine CUDA has read it by then, so it hides nothing); and
    ``device_lib.list_local_devices()`` (does the runtime start? can the CPU
    still be split? how much GPU memory does each GPU hold after the listing,
    and after memory growth and one op, which runs on GPU:0?). The probes run
    without the memory-growth variable the setup cell sets, so they show
    TensorFlow's defaults. On a GPU machine the device_lib probe runs after the
    others, because its op makes GPU:0 reserve nearly all its memory.
    """
    labels = list(_FIRST_CALLS)
    growth = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}  # probes that measure no memory share the GPUs politely
    probes = [_probe.Probe(_FIRST_CALLS[k], env=None if k.startswith("device_lib") else growth, label=k)
              for k in labels]
    if nvml_gpus():
        results = _probe.run_many(probes[:-1], timeout=timeout) + _probe.run_many(probes[-1:], timeout=timeout)
    else:
        results = _probe.run_many(probes, timeout=timeout)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return dict(zip(labels, results))


# --------------------------------------------------------------------------- thread pools

# One fresh process per setting: tf.config.threading only takes effect before the runtime starts. All
# processes import TensorFlow at once, wait for each other (so no import competes with a measurement),
# then take turns measuring under a file lock, round by round, so slow phases of a busy machine hit
# every setting alike.
_THREADS_PROBE = """
import fcntl, os, sys, time
intra, inter, rounds, size = (int(v) for v in sys.argv[1:5])
sync_dir, n_procs = sys.argv[5], int(sys.argv[6])
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(intra)
tf.config.threading.set_inter_op_parallelism_threads(inter)
with tf.device("/CPU:0"):
    a = tf.random.uniform((size, size))
    b = tf.random.uniform((size * 2 // 3, size * 2 // 3))

def one_big_op():  # one MatMul: only the intra-op pool can parallelise it
    with tf.device("/CPU:0"):
        return float(tf.reduce_sum(tf.matmul(a, a)))

@tf.function
def four_branches(x):  # four independent MatMuls in one graph: the inter-op pool can overlap them
    return tf.add_n([tf.reduce_sum(tf.matmul(x + float(i), x)) for i in range(4)])

def branches():
    with tf.device("/CPU:0"):
        return float(four_branches(b))

for f in (one_big_op, branches, one_big_op, branches):
    f()
open(os.path.join(sync_dir, f"ready-{os.getpid()}"), "w").close()
deadline = time.monotonic() + 120
while sum(n.startswith("ready-") for n in os.listdir(sync_dir)) < n_procs and time.monotonic() < deadline:
    time.sleep(0.02)
times = {"one_big_op": [], "branches": []}
with open(os.path.join(sync_dir, "lock"), "w") as lock:
    for _ in range(rounds):
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, f in (("one_big_op", one_big_op), ("branches", branches)):
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
        fcntl.flock(lock, fcntl.LOCK_UN)
        time.sleep(0.005)
emit({"intra": intra, "inter": inter, "times": times,
      "pools": [tf.config.threading.get_intra_op_parallelism_threads(),
                tf.config.threading.get_inter_op_parallelism_threads()]})
"""


def core_counts() -> tuple[int, int]:
    """(logical CPUs this process may use, physical cores) of this machine."""
    try:
        logical = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        logical = os.cpu_count() or 1
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or logical
    except ImportError:
        physical = logical
    return logical, min(physical, logical)


@dataclass
class ThreadRow:
    """One thread-pool setting and its best times (seconds) for the two workloads."""

    label: str
    intra: int
    inter: int
    one_big_op_s: float
    branches_s: float
    medians: tuple[float, float] | None = None  # median times of the two workloads, for the benchmark table


@dataclass
class ThreadingResult:
    """Side-by-side timings of thread-pool settings; ratios are to the 1-thread setting."""

    rows: list[ThreadRow]
    logical_cpus: int
    physical_cores: int
    load: float | None = None  # 1-minute load average when the measurement ended (None where unknown)

    def _base(self) -> ThreadRow:
        return next((r for r in self.rows if (r.intra, r.inter) == (1, 1)), self.rows[0])

    def speedups(self) -> dict[str, tuple[float, float]]:
        """label -> (speed-up of one big op, speed-up of four branches) over the 1-thread setting."""
        base = self._base()
        return {r.label: (base.one_big_op_s / r.one_big_op_s, base.branches_s / r.branches_s) for r in self.rows}

    def to_text(self) -> str:
        head = f"{'setting':<34} {'intra':>5} {'inter':>5}  {'one big MatMul':>18}  {'4 branches':>18}"
        load = "" if self.load is None else f", load average {self.load:.1f}"
        lines = [f"this machine: {self.logical_cpus} logical CPUs, {self.physical_cores} physical cores{load}; "
                 "speed-up over intra=1, inter=1, best of each (theoretical limit)", head]
        for r in self.rows:
            big, br = self.speedups()[r.label]
            lim_big, lim_br = self.limits(r)
            lines.append(f"{r.label:<34} {r.intra or 'auto':>5} {r.inter or 'auto':>5}  "
                         f"{big:>9.2f}x ({lim_big:g}x)  {br:>9.2f}x ({lim_br:g}x)")
        return "\n".join(lines)

    def limits(self, row: ThreadRow) -> tuple[int, int]:
        """Best possible speed-ups of ``row`` over one thread: threads it may use, capped by the cores."""
        intra = row.intra or self.logical_cpus
        inter = row.inter or self.logical_cpus
        return min(intra, self.logical_cpus), min(intra * min(inter, 4), self.logical_cpus, 4)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.to_text())


def measure_threading(settings: dict | None = None, rounds: int = 15, size: int = 768,
                      timeout: float = 180) -> ThreadingResult:
    """Time ``tf.config.threading`` settings side by side, each in its own fresh process.

    Args:
        settings: ``{label: (intra_op_threads, inter_op_threads)}``; 0 means
            TensorFlow's default (one thread per core it may use). Default: one
            thread each, the default, and the circulating "intra = physical
            cores, inter = logical cores" recipe.
        rounds: timed runs per workload and setting. The best run is kept: it
            is the one least disturbed by other processes on the same cores
            (``load`` in the result says how busy the machine was).
        size: side of the square float32 matrix of the one-big-op workload.

    The processes compute on ``/CPU:0`` and see no GPU: with a GPU the math
    runs there, and these pools only launch kernels and run CPU-side work.
    """
    logical, physical = core_counts()
    if settings is None:
        settings = {"1 thread each": (1, 1), "TensorFlow's default": (0, 0),
                    "recipe: physical / logical cores": (physical, logical)}
    _validate.mapping("settings", settings, "{label: (intra_op_threads, inter_op_threads)}")
    for label, pair in settings.items():
        _validate.text("settings label", label)
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"settings[{label!r}] must be a pair (intra_op_threads, inter_op_threads), got {pair!r}")
        for name, v in zip(("intra_op_threads", "inter_op_threads"), pair):
            _validate.whole(f"settings[{label!r}] {name}", v, 0, what="0 lets TensorFlow choose")
    rounds = _validate.whole("rounds", rounds, 1, 50, what="timed runs per setting")
    size = _validate.whole("size", size, 16, 8192, what="matrix side")
    with tempfile.TemporaryDirectory(prefix="gpucourse-threads-") as sync_dir:
        probes = [_probe.Probe(_THREADS_PROBE, (intra, inter, rounds, size, sync_dir, len(settings)),
                               env={"CUDA_VISIBLE_DEVICES": "-1"}, label=f"threads {label}")
                  for label, (intra, inter) in settings.items()]
        answers = _probe.run_many(probes, timeout=timeout)
    rows = []
    for label, ans in zip(settings, answers):
        if isinstance(ans, Exception):
            raise ans
        big, branches = ans["times"]["one_big_op"], ans["times"]["branches"]
        rows.append(ThreadRow(label, ans["intra"], ans["inter"], min(big), min(branches),
                              (statistics.median(big), statistics.median(branches))))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return ThreadingResult(rows, logical, physical, load)


def benchmark(quick: bool = False) -> list[dict]:
    """Rows for :mod:`gpucourse.benchmark`: each thread-pool setting and workload, against its bound.

    The bound is the 1-thread time divided by the threads the setting may use on
    this machine (its theoretical limit); ``speedup`` is over one thread per pool.
    """
    if not isinstance(quick, bool):
        raise TypeError(f"quick must be True or False, got {quick!r}")
    res = measure_threading(rounds=3 if quick else 9)
    base = res._base()
    rows = []
    for r in res.rows:
        limits = res.limits(r)
        workloads = (("one big MatMul", base.one_big_op_s), ("4 independent MatMuls", base.branches_s))
        for i, (case, one) in enumerate(workloads):
            median = (r.medians or (r.one_big_op_s, r.branches_s))[i]
            bound = one / limits[i]
            rows.append({"topic": "01 thread pools", "case": f"{case}, {r.label}", "median_s": median,
                         "bound_s": bound, "ratio_to_bound": median / bound,
                         "speedup": res.speedups()[r.label][i],
                         "note": f"intra={r.intra or 'auto'}, inter={r.inter or 'auto'} on {res.logical_cpus} CPUs; "
                                 f"speed-up of the best run over 1 thread each"})
    return rows
