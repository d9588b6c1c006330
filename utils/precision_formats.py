"""Number formats and rounding: what float32, TF32, float16, bfloat16 and float8 can represent.

One job: describe floating-point formats and show, in NumPy on any machine,
what rounding to them does to concrete numbers and to a matrix product.

* :func:`float_format` and :func:`format_table` list each format's bits,
  range, smallest values and precision.
* :func:`classify_cast` and :func:`cast_table` cast concrete numbers and say
  what happened (exact, rounded, subnormal, underflow to 0, overflow to inf).
* :func:`round_to_tf32` emulates TensorFloat-32 (TF32), the format in which
  Ampere and later GPUs read float32 matmul and convolution inputs: 8 exponent
  bits like float32, 10 mantissa bits like float16. It works on float32 bit
  patterns, so it is exact and unit-tested against them.
* :func:`emulated_matmul`, :func:`matmul_errors` and :func:`matmul_error_table`
  multiply matrices whose inputs were rounded to a format and accumulate in
  float32, which is what Tensor Cores do, so the precision effect of TF32 (or
  float16, bfloat16) can be seen on a CPU.
* :func:`power_of_ten` rounds a measured error to its nearest power of ten and
  refuses when the value sits near the boundary between two, so that a
  statement printed from it is the same on every machine.

NumPy only: importing this module never imports TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from . import _validate

__all__ = [
    "FORMATS",
    "CastResult",
    "FloatFormat",
    "cast_table",
    "classify_cast",
    "emulated_matmul",
    "float_format",
    "format_table",
    "matmul_error_table",
    "matmul_errors",
    "power_of_ten",
    "round_to",
    "round_to_tf32",
]

#: The formats :func:`float_format` knows. ``tfloat32`` is NVIDIA's TF32, a Tensor Core input format.
FORMATS = ("float64", "float32", "tfloat32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
#: Formats with a NumPy dtype (bfloat16 and the float8 formats come from ml_dtypes, a TensorFlow dependency).
_NUMPY_FORMATS = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
#: TF32 keeps the top 10 of float32's 23 stored mantissa bits: the low 13 bits are dropped.
_TF32_DROPPED_BITS = 13
_TF32_MASK = (0xFFFFFFFF << _TF32_DROPPED_BITS) & 0xFFFFFFFF  # 0xFFFFE000
#: How a float32 becomes TF32: round to nearest (ties to even) or keep the top bits (truncate).
TF32_MODES = ("nearest", "truncate")


def _format_name(name, allowed=FORMATS) -> str:
    _validate.text("dtype", name, "a format name like 'float16'")
    if name not in allowed:
        raise ValueError(f"unknown floating-point format {name!r}; expected one of {', '.join(allowed)}")
    return name


def _np_dtype(name: str):
    """NumPy dtype of a format (TF32 has none: it lives in float32 registers)."""
    import numpy as np

    name = _format_name(name, _NUMPY_FORMATS + ("tfloat32",))
    if name == "tfloat32":
        raise ValueError("tfloat32 has no NumPy dtype: it is float32 with 13 mantissa bits dropped; "
                         "use round_to_tf32(x) or round_to(x, 'tfloat32')")
    if name in ("float64", "float32", "float16"):
        return np.dtype(name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


# --------------------------------------------------------------------------- formats


@dataclass(frozen=True)
class FloatFormat:
    """What one floating-point format can represent."""

    name: str
    bits: int  # bits that carry information (TF32: 19, although it sits in a 32-bit register)
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
    """Describe ``dtype``: one of :data:`FORMATS` ('float32', 'tfloat32', 'float16', 'bfloat16', ...)."""
    _format_name(dtype)
    if dtype == "tfloat32":  # float32's exponent, 10 mantissa bits
        return FloatFormat("tfloat32", 19, 8, 10, (2 - 2.0 ** -10) * 2.0 ** 127, 2.0 ** -126, 2.0 ** -136,
                           2.0 ** -10)
    import ml_dtypes
    import numpy as np

    dt = _np_dtype(dtype)
    fi = np.finfo(dt) if dtype in ("float64", "float32", "float16") else ml_dtypes.finfo(dt)
    return FloatFormat(dtype, dt.itemsize * 8, int(fi.nexp), int(fi.nmant), float(fi.max),
                       float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.eps))


def _names(dtypes, what="dtypes") -> list[str]:
    if isinstance(dtypes, str) or not isinstance(dtypes, Sequence) or not dtypes:
        raise TypeError(f"{what} must be a non-empty list of format names like ['float32', 'float16'], "
                        f"got {dtypes!r}")
    return [_format_name(d) for d in dtypes]


def _aligned(rows: list[list[str]], left: int = 1) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip() for r in rows)


def format_table(dtypes: Sequence[str] = ("float32", "tfloat32", "float16", "bfloat16")) -> str:
    """Aligned text table of :func:`float_format` for each of ``dtypes``."""
    rows = [["format", "bits", "exp", "mant", "max", "min normal", "min subnormal", "eps", "digits"]]
    for d in _names(dtypes):
        f = float_format(d)
        rows.append([f.name, str(f.bits), str(f.exponent_bits), str(f.mantissa_bits), f"{f.max:.5g}",
                     f"{f.smallest_normal:.4g}", f"{f.smallest_subnormal:.4g}", f"{f.eps:.4g}",
                     f"{f.decimal_digits:.1f}"])
    return _aligned(rows)


# --------------------------------------------------------------------------- rounding


def round_to_tf32(x, mode: str = "nearest"):
    """``x`` as float32 with its mantissa rounded to TF32's 10 bits (a float32 array or scalar).

    ``mode="nearest"`` rounds to nearest, ties to even (what TensorFlow's
    documentation describes: inputs "rounded from 23 bits of precision to 10
    bits"); ``mode="truncate"`` keeps the top 10 bits, which is what a Tensor
    Core does with raw float32 bits it is handed. Either way the relative
    error of one input is at most 2**-11 (nearest) or 2**-10 (truncate).
    ``inf`` and ``NaN`` pass through; a value that rounds beyond TF32's
    largest number becomes ``inf``, as a float32 overflow would.
    """
    import numpy as np

    _validate.one_of("mode", mode, TF32_MODES)
    arr = np.array(x, dtype=np.float32)  # a copy: the caller's array is never changed
    bits = arr.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    if mode == "nearest":
        lsb = (bits >> _TF32_DROPPED_BITS) & 1  # ties go to the even neighbour
        rounded = (bits + np.uint32(0x0FFF) + lsb) & np.uint32(_TF32_MASK)
    else:
        rounded = bits & np.uint32(_TF32_MASK)
    out = np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)
    return out if out.ndim else np.float32(out)


def round_to(x, dtype: str):
    """``x`` rounded to ``dtype`` (round to nearest even) and returned as float64 values.

    TF32 is reached through float32 (the path a GPU takes: float32 in memory,
    TF32 inside the Tensor Core); the other formats are direct NumPy casts.
    """
    import numpy as np

    dtype = _format_name(dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if dtype == "tfloat32":
            return round_to_tf32(np.asarray(x, dtype=np.float64)).astype(np.float64)
        return np.asarray(x, dtype=np.float64).astype(_np_dtype(dtype)).astype(np.float64)


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


def classify_cast(value: float, dtype: str) -> CastResult:
    """Cast one finite number to ``dtype`` (round to nearest even) and classify what happened.

    ``overflow``: it became +-inf (float8_e4m3fn has no inf: it overflows to
    NaN, reported as overflow too). ``underflow``: a non-zero value became 0.
    ``subnormal``: non-zero but below the smallest normal number, so precision
    is lost gradually. ``rounded``: a normal number that changed. ``exact``:
    unchanged.
    """
    value = _validate.real("value", value, what="a finite number to cast")
    result = float(round_to(value, dtype))
    fmt = float_format(dtype)
    if math.isinf(result) or math.isnan(result):
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
    names = _names(dtypes)
    rows = [["value"] + names]
    for v in values:
        cells = [f"{_validate.real('value', v):.6g}"]
        for d in names:
            r = classify_cast(v, d)
            cells.append(f"{r.result:.6g} ({r.outcome})")
        rows.append(cells)
    return _aligned(rows, left=0)


# --------------------------------------------------------------------------- matrix products


def _matrix(name: str, value):
    import numpy as np

    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"{name} must be a non-empty 2-D matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite numbers")
    return arr


def emulated_matmul(a, b, inputs: str = "tfloat32"):
    """``a @ b`` with both inputs rounded to ``inputs`` and the products summed in float32.

    That is a Tensor Core's contract: low-precision inputs, float32
    accumulation. ``inputs="float32"`` is the plain float32 product; with
    ``"tfloat32"`` it is what an Ampere-or-later GPU computes for a float32
    matmul while TF32 is enabled (TensorFlow's default). The summation order
    differs from a GPU's, so expect the same error size, not the same bits.
    """
    import numpy as np

    a, b = _matrix("a", a), _matrix("b", b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply a {a.shape} matrix by a {b.shape} matrix: a's columns must equal "
                         "b's rows")
    ra = round_to(a, _format_name(inputs)).astype(np.float32)
    rb = round_to(b, inputs).astype(np.float32)
    return ra @ rb


def matmul_errors(a, b, inputs: Sequence[str] = ("float32", "tfloat32", "float16", "bfloat16")) -> dict:
    """``{format: (median, max)}``: relative error of :func:`emulated_matmul` per input format.

    Measured against the float64 product ``a @ b``; entries near 0 are
    measured against the matrix's typical size, so a cancellation does not
    blow the ratio up. The float32 row depends on the order in which the
    BLAS library sums (it picks kernels by CPU), so it differs in its second
    digit between machines; the rows of formats with fewer mantissa bits are
    dominated by the rounding of the inputs, which is the same everywhere.
    """
    import numpy as np

    a, b = _matrix("a", a), _matrix("b", b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply a {a.shape} matrix by a {b.shape} matrix: a's columns must equal "
                         "b's rows")
    exact = a @ b
    scale = np.maximum(np.abs(exact), np.median(np.abs(exact)))
    errors = {}
    for name in _names(inputs, "inputs"):
        with np.errstate(over="ignore", invalid="ignore"):
            err = np.abs(emulated_matmul(a, b, name).astype(np.float64) - exact) / scale
        errors[name] = (float(np.median(err)), float(np.max(err)))
    return errors


def matmul_error_table(a, b, inputs: Sequence[str] = ("float32", "tfloat32", "float16", "bfloat16")) -> str:
    """:func:`matmul_errors` as a table: the median and the largest relative error per input format."""
    rows = [["inputs", "median rel. error", "max rel. error"]]
    rows += [[name, f"{median:.1e}", f"{largest:.1e}"] for name, (median, largest) in matmul_errors(a, b, inputs).items()]
    return _aligned(rows)


def power_of_ten(value, margin: float = 0.1) -> int:
    """The exponent of the power of ten nearest to ``value`` on a log scale (``2.2e-4`` -> ``-4``).

    A measured error varies a little between machines (another CPU sums in
    another order). Its nearest power of ten does not, unless the value lies
    near the boundary between two (``10**(k + 0.5)``): then this raises
    ``ValueError`` rather than return an exponent that another machine would
    round the other way. ``margin`` is the distance kept from the boundary, in
    decades (0.1 = a factor of 1.26).
    """
    value = _validate.real("value", value, 0.0, strict_min=True, what="a positive measurement, e.g. an error")
    margin = _validate.real("margin", margin, 0.0, 0.49, what="decades kept from a rounding boundary")
    log = math.log10(value)
    exponent = round(log)
    if abs(log - exponent) > 0.5 - margin:
        raise ValueError(f"value {value:.2g} lies within {margin:g} decades of the boundary between 1e{math.floor(log)} "
                         f"and 1e{math.floor(log) + 1}: its nearest power of ten is not the same on every machine. "
                         "Print the value itself in an unchecked cell, or state a coarser fact about it")
    return exponent
