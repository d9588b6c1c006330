"""09 The roofline of a device: achievable matmul FLOP/s per dtype and memory bandwidth, measured, beside the data sheet.

A data sheet's peak is what the chip could do if every unit worked every cycle; no real kernel
gets there. What a program can hope for is the *achievable* peak: the best matmul rate the
device reaches for some shape, found by sweeping shapes and keeping the best, as Stas Bekman's
MAMF finder ("maximum achievable matmul FLOPS") does for PyTorch::

    from gpucourse import roofline
    rows = roofline.measure_matmul_peaks()          # every dtype this device computes in
    print(roofline.format_matmul_table(rows, roofline.datasheet_gpu("NVIDIA H100 80GB HBM3")))

A matmul of shapes ``(m, k) @ (k, n)`` does ``m * n * k`` multiply-adds, that is
``2 * m * n * k`` floating-point operations (:func:`matmul_flops`). ``"tfloat32"`` means float32
inputs with TensorFlow's TF32 switch on (Ampere and later GPUs use TF32 Tensor Cores for them, the
default); ``"float32"`` means the same inputs with the switch off, on the ordinary float32 units.
On a CPU the switch changes nothing and only float32 is measured by default.

The other roof is memory: :func:`measure_bandwidth` times a large copy and a large reduction,
STREAM-style. A :class:`Roof` holds both (measured by :func:`measure_roof`, or from the data sheet
by :func:`datasheet_roof`); an op of arithmetic intensity ``I`` FLOP/byte can reach at most
``min(peak, I * bandwidth)`` (:meth:`Roof.attainable`). :data:`GPU_BANDWIDTH` has one row per
variant (an A100 40GB has 1,555 GB/s, the 80GB SXM 2,039), picked by the driver's name.
:func:`cpu_facts` reads the CPU's physical cores, clock and vector width; a CPU's vendor publishes
FLOP per cycle per core, but ``/proc/cpuinfo`` names neither the core's FMA units nor its all-core
vector clock, so a CPU's roof is the measured one only.
``python -m gpucourse.benchmark`` prints :func:`benchmark`'s rows.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from . import _validate
from ._tf import tf as _tf
# the data-sheet lookup lives with the data sheets (topic 05); here under the roofline's name for it
from .precision_hardware import GPU_PEAKS, pick_variant
from .precision_hardware import find_gpu as datasheet_gpu

__all__ = ["MatmulResult", "MATMUL_DTYPES", "WARMUP_S", "matmul_flops", "default_shapes", "device_dtypes",
           "warm_up", "measure_matmul", "measure_matmul_peaks", "datasheet_gpu", "format_matmul_table",
           "GPU_BANDWIDTH", "BandwidthResult", "Roof", "CACHE_MULTIPLE", "MIN_CPU_MIB", "read_cache_size",
           "bandwidth_mib", "measure_bandwidth", "measure_roof", "datasheet_roof", "measured_roof", "cpu_facts",
           "format_roof", "benchmark"]

#: The dtypes a matmul can be measured in; ``"tfloat32"`` is float32 with the TF32 switch on.
MATMUL_DTYPES = ("float32", "tfloat32", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class MatmulResult:
    """The best matmul rate of one dtype over a sweep of shapes."""

    dtype: str
    device: str
    best_tflops: float
    best_shape: tuple[int, int, int]
    tflops_by_shape: dict  # {(m, n, k): TFLOP/s}


def matmul_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an ``(m, k) @ (k, n)`` matmul: ``2 * m * n * k`` (a multiply-add is 2)."""
    m, n, k = (_validate.whole(name, v, 1) for name, v in (("m", m), ("n", n), ("k", k)))
    return 2 * m * n * k


def default_shapes(device_type: str) -> list[tuple[int, int, int]]:
    """Shapes to sweep: squares and the long-and-thin shapes of real layers, sized for the device.

    Small matmuls are launch- and memory-bound, so a sweep must reach sizes where the arithmetic
    dominates: up to 8192 on a GPU (a 256 MiB float32 operand), up to 1024 on a CPU (where one
    8192-cube would take seconds).
    """
    _validate.one_of("device_type", device_type, ("CPU", "GPU"))
    if device_type == "GPU":
        return [(s, s, s) for s in (1024, 2048, 4096, 8192)] + [(8192, 8192, 1024), (16384, 4096, 4096)]
    return [(s, s, s) for s in (256, 512, 1024)] + [(2048, 512, 512)]


def device_dtypes(device_type: str, compute_capability: tuple[int, int] | None = None) -> list[str]:
    """The dtypes worth measuring on a device: its Tensor Core formats on a GPU, float32 on a CPU.

    A GPU of compute capability 8.0 or later gets ``tfloat32`` and ``bfloat16``; 7.0 and later
    ``float16`` (a T4 is 7.5: float16 only). Any GPU measures ``float32`` (TF32 off) as the base.
    """
    _validate.one_of("device_type", device_type, ("CPU", "GPU"))
    if device_type == "CPU":
        return ["float32"]
    if compute_capability is None:
        raise ValueError("compute_capability is needed for a GPU, e.g. (8, 0); read it with "
                         "gpucourse.precision_hardware.gpu_compute_capability()")
    cc = tuple(compute_capability)
    out = ["float32"]
    if cc >= (8, 0):
        out.append("tfloat32")
    if cc >= (7, 0):
        out.append("float16")
    if cc >= (8, 0):
        out.append("bfloat16")
    return out


def _device_type(device: str) -> str:
    _validate.text("device", device, "a device such as 'GPU:0' or 'CPU:0'")
    kind = device.upper().replace("/DEVICE:", "").split(":")[0]
    if kind not in ("CPU", "GPU"):
        raise ValueError(f"device must be a CPU or GPU device such as 'GPU:0', got {device!r}")
    return kind


#: Seconds of back-to-back matmuls before a sweep, by device type: a GPU raises its clocks and power
#: over a second or so, and a fixed count of calls would be a different time on every GPU.
WARMUP_S = {"GPU": 1.0, "CPU": 0.25}


def warm_up(fn, seconds: float, clock=None) -> int:
    """Call ``fn`` (waiting for each result) until ``seconds`` have passed, at least once; return the calls made.

    A fixed time, not a fixed count: the same warm-up is ten calls on one device and a thousand on
    another. ``clock`` (default ``time.perf_counter``) is for the unit tests.
    """
    import time

    from . import timing

    _validate.callable_("fn", fn)
    seconds = _validate.real("seconds", seconds, 0.0, what="seconds of warm-up")
    clock = clock or time.perf_counter
    start, calls = clock(), 0
    while True:
        timing.sync(fn())
        calls += 1
        if clock() - start >= seconds:
            return calls


def measure_matmul(dtype: str, shapes: Sequence | None = None, device: str | None = None,
                   repeats: int = 5, iters: int | None = None, warmup_s: float | None = None) -> MatmulResult:
    """The best TFLOP/s of ``dtype`` matmuls over ``shapes`` on ``device`` (default: GPU:0 if any, else CPU:0).

    First ``warmup_s`` seconds of the largest shape's matmuls (default :data:`WARMUP_S`: 1 s on a
    GPU, so its clocks settle; :func:`warm_up`). Then each shape is timed with
    :func:`gpucourse.timing.time_fn` (one more warm-up call, then ``repeats`` timed calls), each
    timed call launching ``iters`` matmuls back to back and waiting once at the end (without
    copying), so that per-launch overhead is spread thin as in a real model. A shape's rate is its
    **best** call: a peak is what the device can reach, and other processes and clock dips only ever
    slow a call down, so the best of several holds from run to run better than the median. The TF32
    switch is set for the measurement and restored afterwards.
    """
    from . import timing

    _validate.one_of("dtype", dtype, MATMUL_DTYPES)
    _validate.whole("repeats", repeats, 1, what="timed calls per shape")
    tf = _tf()
    if device is None:
        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    kind = _device_type(device)
    shapes = [tuple(s) for s in _validate.sequence("shapes", shapes or default_shapes(kind), "(m, n, k) tuples")]
    for s in shapes:
        if len(s) != 3:
            raise ValueError(f"shapes must hold (m, n, k) triples, got {s!r}")
    iters = _validate.whole("iters", iters, 1) if iters is not None else (10 if kind == "GPU" else 2)
    warmup_s = WARMUP_S[kind] if warmup_s is None else _validate.real("warmup_s", warmup_s, 0.0, what="seconds")
    tf_dtype = "float32" if dtype == "tfloat32" else dtype
    was_on = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(dtype == "tfloat32")
    rates = {}

    def operands(m, n, k):
        return (tf.cast(tf.random.uniform((m, k), -1, 1, seed=1), tf_dtype),
                tf.cast(tf.random.uniform((k, n), -1, 1, seed=2), tf_dtype))

    try:
        with tf.device(device):
            if warmup_s > 0:
                a, b = operands(*max(shapes, key=lambda s: s[0] * s[1] * s[2]))
                warm_up(lambda: [tf.linalg.matmul(a, b) for _ in range(iters)], warmup_s)
            for m, n, k in shapes:
                a, b = operands(m, n, k)
                t = timing.time_fn(lambda: [tf.linalg.matmul(a, b) for _ in range(iters)],
                                   warmup=1, repeats=repeats, name=f"{m}x{n}x{k}")
                rates[(m, n, k)] = matmul_flops(m, n, k) * iters / t.min_s / 1e12
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(was_on)
    best = max(rates, key=rates.get)
    return MatmulResult(dtype, device, rates[best], best, rates)


def measure_matmul_peaks(dtypes: Sequence[str] | None = None, device: str | None = None,
                         shapes: Sequence | None = None, repeats: int = 5,
                         warmup_s: float | None = None) -> list[MatmulResult]:
    """:func:`measure_matmul` for each of ``dtypes`` (default: :func:`device_dtypes` of the device).

    A GPU without a compute capability is not an NVIDIA GPU (tensorflow-metal's): by default it measures float32
    only, and warns why (no Tensor Core formats are known for it).
    """
    tf = _tf()
    if device is None:
        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    kind = _device_type(device)
    if dtypes is None:
        cc = None
        if kind == "GPU":
            from .precision_hardware import gpu_compute_capability

            cc = gpu_compute_capability(int(device.rsplit(":", 1)[-1]))
        if kind == "GPU" and cc is None:
            import warnings

            from ._vendor import explain_not_nvidia

            gpu = tf.config.list_physical_devices("GPU")[int(device.rsplit(":", 1)[-1])]
            warnings.warn(f"{explain_not_nvidia(tf.config.experimental.get_device_details(gpu).get('device_name'))} "
                          "Measuring float32 only.", stacklevel=2)
        dtypes = device_dtypes(kind, cc) if kind == "CPU" or cc is not None else ["float32"]
    dtypes = [_validate.one_of("dtypes", d, MATMUL_DTYPES) for d in _validate.sequence("dtypes", dtypes, "dtype names")]
    return [measure_matmul(d, shapes, device, repeats, warmup_s=warmup_s) for d in dtypes]


def format_matmul_table(results: Sequence[MatmulResult], peaks=None) -> str:
    """A Markdown table: dtype, best TFLOP/s and its shape, the data-sheet peak and the fraction of it reached."""
    results = _validate.sequence("results", results, "MatmulResult rows")
    lines = ["| dtype | achieved TFLOP/s | best shape (m, n, k) | data-sheet peak | achieved / peak |",
             "|---|---|---|---|---|"]
    for r in results:
        if not isinstance(r, MatmulResult):
            raise TypeError(f"results must hold MatmulResult rows, got {type(r).__name__}")
        peak = peaks.peak(r.dtype) if peaks is not None else None
        shape = "x".join(map(str, r.best_shape))
        if peak:
            lines.append(f"| {r.dtype} | {r.best_tflops:.1f} | {shape} | {peak:g} | {r.best_tflops / peak:.0%} |")
        else:
            why = "no data sheet for this device" if peaks is None else f"no {r.dtype} Tensor Cores"
            lines.append(f"| {r.dtype} | {r.best_tflops:.2f} | {shape} | - ({why}) | - |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the memory roof and the data sheets

#: Data-sheet memory bandwidth in GB/s (1e9 bytes/s), with its source, one row per variant (memory size,
#: form factor): a driver's name picks its row with :func:`gpucourse.precision_hardware.pick_variant`,
#: and :func:`datasheet_roof` names the row it used. A name that states no variant gets the row listed
#: first for its chip ("A100" -> the 80GB SXM). No row for the H100 NVL or H200 NVL: their figures
#: (about 835 dense BF16 TFLOPS and 3.9 TB/s for the H100 NVL in third-party tables) could not be
#: checked against NVIDIA's data sheets for the course, and the SXM module's would be wrong.
GPU_BANDWIDTH = {
    # NVIDIA T4 data sheet
    "T4": (320.0, "NVIDIA T4 data sheet: 16 GB GDDR6, 320+ GB/s"),
    # NVIDIA V100 data sheet, SXM2 column
    "V100": (900.0, "NVIDIA V100 data sheet (SXM2): 900 GB/s HBM2"),
    # NVIDIA A100 data sheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), memory table: 40GB PCIe 1,555;
    # 80GB PCIe 1,935; 40GB SXM 1,555; 80GB SXM 2,039 GB/s. The SXM figures are also in glennklockwood.com's A100
    # notes, which cite that data sheet; the 80GB PCIe figure is the data sheet's as the course's source review
    # (2026-11) quotes it.
    "A100 80GB SXM": (2039.0, "NVIDIA A100 data sheet: 2,039 GB/s (80GB SXM)"),
    "A100 80GB PCIe": (1935.0, "NVIDIA A100 data sheet: 1,935 GB/s (80GB PCIe)"),
    "A100 40GB": (1555.0, "NVIDIA A100 data sheet: 1,555 GB/s (40GB, PCIe and SXM)"),
    # NVIDIA L4 data sheet
    "L4": (300.0, "NVIDIA L4 data sheet: 24 GB GDDR6, 300 GB/s"),
    # NVIDIA H100 data sheet, SXM and PCIe columns
    "H100": (3350.0, "NVIDIA H100 data sheet: 3.35 TB/s (SXM)"),
    "H100 PCIe": (2000.0, "NVIDIA H100 data sheet: 2 TB/s (PCIe)"),
    # NVIDIA H200 data sheet, SXM column
    "H200": (4800.0, "NVIDIA H200 data sheet: 141 GB HBM3e, 4.8 TB/s (SXM)"),
}


@dataclasses.dataclass(frozen=True)
class Roof:
    """A device's two roofs: peak TFLOP/s per dtype and memory bandwidth in GB/s (measured or data sheet)."""

    name: str
    peaks: dict  # {dtype: TFLOP/s}
    bandwidth_gbs: float
    source: str

    def peak(self, dtype: str) -> float:
        """Peak TFLOP/s of ``dtype``; a ValueError naming the dtypes this roof has otherwise."""
        _validate.text("dtype", dtype, "e.g. 'float32'")
        if dtype not in self.peaks:
            raise ValueError(f"{self.name} has no {dtype!r} roof; it has {sorted(self.peaks)} "
                             "(a GPU without Tensor Cores for a dtype has no data-sheet peak for it)")
        return self.peaks[dtype]

    def ridge(self, dtype: str) -> float:
        """The ridge point in FLOP/byte: below it an op is memory-bound, above it compute-bound."""
        return self.peak(dtype) * 1e12 / (self.bandwidth_gbs * 1e9)

    def attainable(self, intensity: float, dtype: str) -> float:
        """The most TFLOP/s an op of ``intensity`` FLOP/byte can reach: ``min(peak, intensity * bandwidth)``."""
        intensity = _validate.real("intensity", intensity, 0.0, strict_min=True, what="FLOP per byte")
        return min(self.peak(dtype), intensity * self.bandwidth_gbs * 1e9 / 1e12)

    def bound(self, intensity: float, dtype: str) -> str:
        """``"memory"`` if an op of ``intensity`` FLOP/byte sits left of the ridge, else ``"compute"``."""
        intensity = _validate.real("intensity", intensity, 0.0, strict_min=True, what="FLOP per byte")
        return "memory" if intensity < self.ridge(dtype) else "compute"

    def seconds(self, flops: float, nbytes: float, dtype: str) -> float:
        """The roofline's time for an op: ``max(flops / peak, bytes / bandwidth)``."""
        flops = _validate.real("flops", flops, 0.0)
        nbytes = _validate.real("nbytes", nbytes, 0.0)
        return max(flops / (self.peak(dtype) * 1e12), nbytes / (self.bandwidth_gbs * 1e9))


def datasheet_roof(name: str) -> Roof:
    """The data-sheet roof of a GPU (``"T4"``, ``"A100 40GB"``, ``"H100"``, ... or a driver's name).

    The roof is named after the variant row its bandwidth comes from (:data:`GPU_BANDWIDTH`):
    ``datasheet_roof("NVIDIA A100-SXM4-40GB").name`` is ``"A100 40GB"`` (1,555 GB/s), and a bare
    ``"A100"`` is the 80GB SXM module. A variant the course has no data sheet for (``"NVIDIA H100
    NVL"``) is a ValueError that says so, never another variant's roof.
    """
    _validate.text("name", name, "a GPU such as 'A100 40GB' or 'NVIDIA H100 80GB HBM3'")
    peaks = datasheet_gpu(name)
    key, why = pick_variant(name, GPU_BANDWIDTH)
    if peaks is None or key is None:
        why = why if key is None else pick_variant(name, GPU_PEAKS)[1]
        raise ValueError(f"no data sheet for GPU {name!r}: {why}")
    gbs, bw_source = GPU_BANDWIDTH[key]
    dtypes = ("float32", "tfloat32", "float16", "bfloat16", "float8")
    return Roof(key, {d: peaks.peak(d) for d in dtypes if peaks.peak(d)}, gbs, f"{peaks.source}; {bw_source}")


@dataclasses.dataclass(frozen=True)
class BandwidthResult:
    """Memory bandwidth of a device, STREAM-style: a scale (read + write) and a sum (read only)."""

    device: str
    nbytes: int
    copy_gbs: float
    read_gbs: float

    @property
    def best_gbs(self) -> float:
        return max(self.copy_gbs, self.read_gbs)


def read_cache_size(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest CPU cache the OS reports for ``cpu0``, in bytes (usually the L3), or None where none is reported.

    Linux lists each cache level in ``<sysfs>/index*/size`` (``"48K"``, ``"2048K"``, ``"32M"``);
    ``sysfs`` is for the unit tests (a fake folder). Off Linux the folder does not exist: None.
    """
    import glob
    import os

    _validate.text("sysfs", sysfs, "a folder like /sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for path in glob.glob(os.path.join(sysfs, "index*", "size")):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text, re.I)
        if m:
            sizes.append(int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()])
    return max(sizes) if sizes else None


#: A CPU's bandwidth array is at least this many times its largest cache (STREAM's rule), and at least
#: :data:`MIN_CPU_MIB`, so that every pass over it comes from memory, not from the cache.
CACHE_MULTIPLE = 4
MIN_CPU_MIB = 64


def bandwidth_mib(device_type: str, cache_bytes: int | None = None) -> int:
    """MiB of float32 that :func:`measure_bandwidth` streams: 1024 on a GPU; on a CPU 4x its largest cache.

    On a CPU the array must not fit in the caches, or the "memory" roof is a cache roof: some server
    CPUs report 256 MB and more of L3. So it is :data:`CACHE_MULTIPLE` times ``cache_bytes`` (the
    largest cache, :func:`read_cache_size`), rounded up to a whole MiB, and at least
    :data:`MIN_CPU_MIB`; 64 MiB where the OS reports no cache size.
    """
    _validate.one_of("device_type", device_type, ("CPU", "GPU"))
    if device_type == "GPU":
        return 1024
    if cache_bytes is None:
        return MIN_CPU_MIB
    cache_bytes = _validate.whole("cache_bytes", cache_bytes, 1, what="bytes of the largest cache")
    return max(MIN_CPU_MIB, -(-CACHE_MULTIPLE * cache_bytes // (1 << 20)))


def measure_bandwidth(device: str | None = None, mib: int | None = None, repeats: int = 5,
                      iters: int | None = None) -> BandwidthResult:
    """GB/s of ``y = x * 2`` (reads and writes ``x``'s bytes) and ``reduce_sum(x)`` (reads them) on ``device``.

    ``x`` is ``mib`` MiB of float32 (default :func:`bandwidth_mib`: 1024 on a GPU; on a CPU four
    times the largest cache the OS reports, so the bytes come from memory). Each figure is the best
    of ``repeats`` timed calls of ``iters`` ops each (default 10 on a GPU, 1 on a CPU, where one
    pass over the array already takes milliseconds).
    """
    from . import timing

    tf = _tf()
    if device is None:
        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    kind = _device_type(device)
    mib = _validate.whole("mib", mib if mib is not None else
                          bandwidth_mib(kind, read_cache_size() if kind == "CPU" else None), 1, what="MiB")
    repeats = _validate.whole("repeats", repeats, 1, what="timed calls")
    iters = _validate.whole("iters", iters, 1) if iters is not None else (10 if kind == "GPU" else 1)
    n = mib * (1 << 20) // 4
    with tf.device(device):
        x = tf.fill((n,), 1.5)  # the values do not matter to the bytes; filling is faster than random numbers
        scale = tf.function(lambda v: v * 2.0)
        total = tf.function(lambda v: tf.reduce_sum(v))
        t_copy = timing.time_fn(lambda: [scale(x) for _ in range(iters)], warmup=1, repeats=repeats, name="scale")
        t_read = timing.time_fn(lambda: [total(x) for _ in range(iters)], warmup=1, repeats=repeats, name="sum")
    nbytes = 4 * n
    return BandwidthResult(device, nbytes, 2 * nbytes * iters / t_copy.min_s / 1e9,
                           nbytes * iters / t_read.min_s / 1e9)


def measured_roof(matmuls: Sequence[MatmulResult], bandwidth: BandwidthResult, name: str | None = None) -> Roof:
    """A :class:`Roof` from a matmul sweep and a bandwidth measurement."""
    matmuls = _validate.sequence("matmuls", matmuls, "MatmulResult rows from measure_matmul_peaks")
    if not matmuls or not all(isinstance(r, MatmulResult) for r in matmuls):
        raise TypeError("matmuls must be a non-empty list of MatmulResult (from measure_matmul_peaks)")
    if not isinstance(bandwidth, BandwidthResult):
        raise TypeError(f"bandwidth must be a BandwidthResult (from measure_bandwidth), got {type(bandwidth).__name__}")
    return Roof(name or f"this machine ({bandwidth.device})", {r.dtype: r.best_tflops for r in matmuls},
                bandwidth.best_gbs, "measured: best matmul of a shape sweep; best of a large scale and sum")


def measure_roof(quick: bool = False, device: str | None = None) -> tuple[Roof, list[MatmulResult], BandwidthResult]:
    """Measure this device's roofline: ``(roof, matmul sweep rows, bandwidth)``."""
    repeats = 3 if quick else 5
    matmuls = measure_matmul_peaks(device=device, repeats=repeats)
    bandwidth = measure_bandwidth(device=matmuls[0].device, repeats=repeats)
    return measured_roof(matmuls, bandwidth), matmuls, bandwidth


def cpu_facts(cpuinfo: str | None = None) -> dict:
    """The CPU's model, cores (physical and logical), clock (MHz) and vector width (bits), from ``/proc/cpuinfo``.

    Pass the file's text as ``cpuinfo`` to read another machine's (the unit tests do); off Linux the
    fields are None. Physical cores are the distinct ``(physical id, core id)`` pairs: SMT siblings
    (hyper-threads) share one core's FMA units, so a peak counts physical cores. ``mhz`` is one
    core's clock when the file was read: an upper bound, since all-core clocks under wide vector
    (AVX-512) code are lower. ``"datasheet"`` says what the vendor publishes and why the measured
    matmul peak is the roof to use.
    """
    import os

    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    _validate.text("cpuinfo", cpuinfo or " ", "the text of /proc/cpuinfo")
    fields: dict = {}
    blocks: list[dict] = []
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep:
            continue
        fields.setdefault(key, value.strip())
        if key == "processor":
            blocks.append({})
        if blocks:
            blocks[-1][key] = value.strip()
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    vector = (512 if "avx512f" in flags else 256 if "avx2" in flags or "avx" in flags
              else 128 if flags & {"sse2", "asimd", "neon"} else None)
    mhz = fields.get("cpu mhz")
    cores = len(blocks)
    pairs = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    physical = len(pairs) or None
    return {"model": fields.get("model name") or fields.get("cpu model") or None,
            "logical_cores": cores or (os.cpu_count() if cpuinfo == "" else None),
            "physical_cores": physical,
            "mhz": float(mhz) if mhz else None, "vector_bits": vector, "fma": "fma" in flags or "asimd" in flags,
            "datasheet": "a CPU's peak is physical cores x clock x FLOP per cycle per core; the vendor publishes "
                         "the FLOP per cycle of each core design (vector lanes x 2 for a fused multiply-add x "
                         "FMA units per core: 64 in float32 for two 512-bit units), but cpuinfo names neither "
                         "the FMA units nor the all-core clock under vector code, which is below the MHz it "
                         "shows; the measured matmul peak is this CPU's roof"}


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def format_roof(roof: Roof, reference: Roof | None = None) -> str:
    """A Markdown table of ``roof`` (TFLOP/s per dtype, GB/s, ridge point), beside ``reference`` if given."""
    if not isinstance(roof, Roof) or not (reference is None or isinstance(reference, Roof)):
        raise TypeError("roof and reference must be Roof objects (measure_roof, datasheet_roof)")
    head = f"| roof | {roof.name} |" + (f" {reference.name} (data sheet) | achieved / data sheet |" if reference else "")
    lines = [head, "|---|---|" + ("---|---|" if reference else "")]
    rows = [(f"{d} TFLOP/s", roof.peaks[d], reference.peaks.get(d) if reference else None) for d in roof.peaks]
    rows.append(("memory GB/s", roof.bandwidth_gbs, reference.bandwidth_gbs if reference else None))
    for label, mine, ref in rows:
        cells = f"| {label} | {_num(mine)} |"
        if reference:
            cells += f" {ref:g} | {mine / ref:.0%} |" if ref else " - | - |"
        lines.append(cells)
    lines += [f"| ridge ({d}) FLOP/byte | {roof.ridge(d):.3g} |" + (" | |" if reference else "") for d in roof.peaks]
    return "\n".join(lines)


def benchmark(quick: bool = False) -> list[dict]:
    """``make benchmark``'s rows: the best matmul per dtype and the memory bandwidth of this device."""
    tf = _tf()
    gpus = tf.config.list_physical_devices("GPU")
    peaks, bw_sheet, what = None, None, None
    if gpus:
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
        peaks = datasheet_gpu(name) if name else None
        bw_key = pick_variant(name, GPU_BANDWIDTH)[0] if name else None
        bw_sheet = GPU_BANDWIDTH[bw_key][0] if bw_key and peaks else None
        what = f"{name or 'GPU'}, data-sheet row {bw_key}" if bw_key and peaks else name or "GPU"
    else:
        facts = cpu_facts()
        what = (f"CPU {facts['model'] or '?'}, {facts['physical_cores'] or '?'} physical cores "
                f"({facts['logical_cores']} logical), {facts['vector_bits'] or '?'}-bit vectors: measured roof only")
    roof, matmuls, bw = measure_roof(quick=quick)
    rows = []
    for r in matmuls:
        flops = matmul_flops(*r.best_shape)
        median = flops / (r.best_tflops * 1e12)
        sheet = peaks.peak(r.dtype) if peaks is not None else None
        bound = flops / (sheet * 1e12) if sheet else None
        rows.append({"topic": "09 roofline", "case": f"matmul {r.dtype} {'x'.join(map(str, r.best_shape))}",
                     "median_s": median, "bound_s": bound, "ratio_to_bound": median / bound if bound else None,
                     "speedup": None, "note": f"{r.best_tflops:.3g} TFLOP/s" + (f" of {sheet:g} ({what})" if sheet
                                                                              else f" ({what})")})
    median = 2 * bw.nbytes / (bw.copy_gbs * 1e9)
    bound = 2 * bw.nbytes / (bw_sheet * 1e9) if bw_sheet else None
    rows.append({"topic": "09 roofline", "case": f"memory: x * 2 over {bw.nbytes >> 20} MiB", "median_s": median,
                 "bound_s": bound, "ratio_to_bound": median / bound if bound else None, "speedup": None,
                 "note": f"{bw.copy_gbs:.3g} GB/s (sum: {bw.read_gbs:.3g} GB/s)" + (f" of {bw_sheet:g}" if bw_sheet else "")})
    return rows
