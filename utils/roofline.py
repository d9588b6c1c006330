"""09 The roofline's compute roof: achievable matmul FLOP/s per dtype, measured, beside the data sheet.

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
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from . import _validate
from ._tf import tf as _tf

__all__ = ["MatmulResult", "MATMUL_DTYPES", "matmul_flops", "default_shapes", "device_dtypes",
           "measure_matmul", "measure_matmul_peaks", "datasheet_gpu", "format_matmul_table"]

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


def measure_matmul(dtype: str, shapes: Sequence | None = None, device: str | None = None,
                   repeats: int = 5, iters: int | None = None) -> MatmulResult:
    """The best TFLOP/s of ``dtype`` matmuls over ``shapes`` on ``device`` (default: GPU:0 if any, else CPU:0).

    Each shape is timed with :func:`gpucourse.timing.time_fn` (a warm-up, then the median of
    ``repeats``), each timed call launching ``iters`` matmuls back to back and waiting once
    at the end (without copying), so that per-launch overhead is spread thin as in a real
    model. The TF32 switch is set for the measurement and restored afterwards.
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
    tf_dtype = "float32" if dtype == "tfloat32" else dtype
    was_on = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(dtype == "tfloat32")
    rates = {}
    try:
        with tf.device(device):
            for m, n, k in shapes:
                a = tf.cast(tf.random.uniform((m, k), -1, 1, seed=1), tf_dtype)
                b = tf.cast(tf.random.uniform((k, n), -1, 1, seed=2), tf_dtype)
                t = timing.time_fn(lambda: [tf.linalg.matmul(a, b) for _ in range(iters)],
                                   warmup=1, repeats=repeats, name=f"{m}x{n}x{k}")
                rates[(m, n, k)] = matmul_flops(m, n, k) * iters / t.median_s / 1e12
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(was_on)
    best = max(rates, key=rates.get)
    return MatmulResult(dtype, device, rates[best], best, rates)


def measure_matmul_peaks(dtypes: Sequence[str] | None = None, device: str | None = None,
                         shapes: Sequence | None = None, repeats: int = 5) -> list[MatmulResult]:
    """:func:`measure_matmul` for each of ``dtypes`` (default: :func:`device_dtypes` of the device)."""
    tf = _tf()
    if device is None:
        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    kind = _device_type(device)
    if dtypes is None:
        cc = None
        if kind == "GPU":
            from .precision_hardware import gpu_compute_capability

            cc = gpu_compute_capability(int(device.rsplit(":", 1)[-1]))
        dtypes = device_dtypes(kind, cc)
    dtypes = [_validate.one_of("dtypes", d, MATMUL_DTYPES) for d in _validate.sequence("dtypes", dtypes, "dtype names")]
    return [measure_matmul(d, shapes, device, repeats) for d in dtypes]


def datasheet_gpu(name: str):
    """The data-sheet entry (:class:`gpucourse.precision_hardware.GpuPeaks`) for a GPU as the driver names it.

    ``"Tesla T4"`` -> T4, ``"NVIDIA A100-SXM4-80GB"`` -> A100, ``"NVIDIA H100 80GB HBM3"`` -> H100;
    None when the course has no data sheet for it (the report then shows the measured rates only).
    """
    from .precision_hardware import GPU_PEAKS

    _validate.text("name", name, "the GPU's name as nvidia-smi prints it, e.g. 'Tesla T4'")
    words = re.split(r"[\s\-_/]+", name.upper())
    for key, peaks in GPU_PEAKS.items():
        if key.upper() in words:
            return peaks
    return None


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
