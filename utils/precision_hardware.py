"""Hardware advice: which GPU has which Tensor Cores, their peak rates, and the policy to pick.

One job: turn a GPU's compute capability into facts and advice about low
precision on it, without needing the GPU.

* :func:`tensor_core_support` says which dtypes get Tensor Cores at a compute
  capability: float16 from 7.0 (Volta, Turing's T4 at 7.5), bfloat16 and
  TF32 from 8.0 (Ampere), float8 from 8.9 (Ada, e.g. L4) and 9.0 (Hopper).
  Given the GPU's name it also knows the Turing chips without Tensor Cores:
  compute capability 7.5 includes the GeForce GTX 16xx (TU116/TU117), whose
  float16 runs on ordinary units (:func:`lacks_tensor_cores`).
* :data:`GPU_PEAKS`, :func:`peak_speedup` and :func:`peak_table` hold the
  dense peak TFLOPS of common GPUs from NVIDIA's data sheets, so a speed-up
  can be put beside its theoretical limit: mixed precision on an A100 or H100
  is compared with a float32 baseline that already runs on TF32 Tensor Cores.
  :func:`find_gpu` picks the row for the name a driver reports, by variant
  (memory size; SXM, PCIe or NVL) with :func:`pick_variant`, which topic 09's
  bandwidth table uses too.
* :func:`tf32_enabled` reads TensorFlow's TF32 switch;
  :func:`gpu_compute_capability` reads a real GPU's compute capability;
  :func:`recommend_policy` turns it into a dtype policy and a reason.

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import re

from dataclasses import dataclass

from . import _tf, _validate

__all__ = [
    "GPU_PEAKS",
    "TABLE_GPUS",
    "IMPLIED_FORM",
    "NO_TENSOR_CORE_NAMES",
    "TENSOR_CORE_DTYPES",
    "TENSOR_CORE_MIN_CC",
    "GpuPeaks",
    "PolicyAdvice",
    "gpu_compute_capability",
    "lacks_tensor_cores",
    "parse_compute_capability",
    "find_gpu",
    "peak_speedup",
    "peak_table",
    "pick_variant",
    "recommend_policy",
    "tensor_core_support",
    "tf32_enabled",
]

#: The Tensor Core input dtypes :func:`tensor_core_support` reports on.
TENSOR_CORE_DTYPES = ("float16", "bfloat16", "tfloat32", "float8")
#: Lowest compute capability whose Tensor Cores take each dtype (NVIDIA's architecture documents;
#: float8 per NVIDIA Transformer Engine's support matrix: 8.9 Ada and 9.0 Hopper and later).
TENSOR_CORE_MIN_CC = {"float16": (7, 0), "bfloat16": (8, 0), "tfloat32": (8, 0), "float8": (8, 9)}
#: GPUs whose compute capability promises Tensor Cores but whose chip has none, by name pattern
#: (regular expression, matched case-insensitively against the name the driver reports) -> why.
#: All are Turing (7.5) TU116/TU117 chips, which NVIDIA built without Tensor Cores.
NO_TENSOR_CORE_NAMES = {
    r"\bGTX\s*16\d\d": "a GeForce GTX 16xx (Turing TU116/TU117) has no Tensor Cores, though its compute capability "
                       "is 7.5 like the T4's",
    r"\bMX\s*[45]50\b": "a GeForce MX450/MX550 (Turing TU117) has no Tensor Cores, though its compute capability "
                        "is 7.5",
}


def parse_compute_capability(cc) -> tuple[int, int]:
    """``'8.6'``, ``(8, 6)`` or ``[8, 6]`` -> ``(8, 6)``; anything else is a clear error."""
    if isinstance(cc, str):
        try:
            major, minor = (int(p) for p in cc.strip().split("."))
        except ValueError:
            raise ValueError(f"compute capability must look like '8.6' or (8, 6), got {cc!r}") from None
        cc = (major, minor)
    if not (isinstance(cc, (tuple, list)) and len(cc) == 2):
        raise TypeError(f"compute capability must be a string like '8.6' or a tuple like (8, 6), got {cc!r}")
    major = _validate.whole("compute capability major", cc[0], 1, what="e.g. 8 in (8, 6)")
    minor = _validate.whole("compute capability minor", cc[1], 0, what="e.g. 6 in (8, 6)")
    return major, minor


def lacks_tensor_cores(name) -> str | None:
    """Why the GPU called ``name`` has no Tensor Cores despite its compute capability, or None.

    ``"NVIDIA GeForce GTX 1660 Ti"`` -> a reason (Turing TU116, compute
    capability 7.5, no Tensor Cores); ``"Tesla T4"`` or ``None`` (name
    unknown) -> None. Only the chips in :data:`NO_TENSOR_CORE_NAMES` are known.
    """
    import re

    if name is None:
        return None
    _validate.text("name", name, "the GPU's name, e.g. 'NVIDIA GeForce GTX 1660 Ti', or None")
    return next((why for pattern, why in NO_TENSOR_CORE_NAMES.items() if re.search(pattern, name, re.I)), None)


def tensor_core_support(cc, name: str | None = None) -> dict[str, bool]:
    """Which dtypes get Tensor Cores on a GPU of compute capability ``cc`` (and name ``name``).

    Returns ``{"float16": ..., "bfloat16": ..., "tfloat32": ..., "float8": ...}``:
    a T4 (7.5) has float16 only; an A100 (8.0) adds bfloat16 and TF32; an L4
    (8.9) or H100 (9.0) adds float8. ``False`` does not mean the dtype cannot
    run there, only that it runs without Tensor Cores (no speed-up from them).

    The compute capability alone is not enough: 7.5 also covers the GeForce
    GTX 16xx, which has no Tensor Cores. Pass the GPU's ``name`` (as
    ``get_device_details`` or the driver reports it) and those come out
    all False; without a name the answer is the compute capability's.
    """
    if cc is None:  # TensorFlow reports no compute capability for a GPU that is not NVIDIA's (tensorflow-metal)
        from ._vendor import explain_not_nvidia

        raise ValueError(f"cc is None, so there are no Tensor Cores to look up: {explain_not_nvidia(name)}")
    cc = parse_compute_capability(cc)
    if lacks_tensor_cores(name):
        return {dtype: False for dtype in TENSOR_CORE_MIN_CC}
    return {dtype: cc >= need for dtype, need in TENSOR_CORE_MIN_CC.items()}


# --------------------------------------------------------------------------- data-sheet peaks


@dataclass(frozen=True)
class GpuPeaks:
    """Dense peak TFLOPS of one GPU (``None``: no Tensor Cores for that dtype), from its data sheet."""

    name: str
    cc: tuple[int, int]
    float32: float  # CUDA cores, no Tensor Cores
    tfloat32: float | None
    float16: float | None
    bfloat16: float | None
    float8: float | None
    source: str

    def peak(self, dtype: str) -> float | None:
        _validate.one_of("dtype", dtype, ("float32",) + TENSOR_CORE_DTYPES)
        return getattr(self, dtype)


#: Dense (no 2:4 sparsity) peak TFLOPS. Data sheets that list "with sparsity" figures are halved.
#: One row per variant whose peaks differ; the key names the variant (see :func:`pick_variant`):
#: "A100" is every A100 (the 40GB and 80GB, PCIe and SXM have the same peaks; their memory
#: bandwidths differ, see ``gpucourse.roofline.GPU_BANDWIDTH``), "V100", "H100" and "H200" are the
#: SXM modules (:data:`IMPLIED_FORM`). The H100 NVL and H200 NVL cards have lower peaks than the SXM
#: modules, and their data-sheet figures could not be confirmed for the course: they have no row,
#: so :func:`find_gpu` finds none for them rather than the SXM module's.
GPU_PEAKS = {g.name: g for g in (
    # NVIDIA T4 data sheet
    GpuPeaks("T4", (7, 5), 8.1, None, 65.0, None, None,
             "NVIDIA T4 data sheet: 8.1 TFLOPS FP32, 65 TFLOPS mixed FP16/FP32"),
    # NVIDIA V100 data sheet, the SXM2 column (the PCIe card's clocks, so its peaks, are lower)
    GpuPeaks("V100", (7, 0), 15.7, None, 125.0, None, None,
             "NVIDIA V100 data sheet (SXM2): 15.7 TFLOPS FP32, 125 TFLOPS Tensor"),
    # NVIDIA A100 data sheet: the same peaks in its 40GB/80GB PCIe and SXM columns
    GpuPeaks("A100", (8, 0), 19.5, 156.0, 312.0, 312.0, None,
             "NVIDIA A100 data sheet: 19.5 FP32, 156 TF32, 312 FP16/BF16 TFLOPS (dense; 40GB and 80GB, "
             "PCIe and SXM alike)"),
    # NVIDIA L4 data sheet
    GpuPeaks("L4", (8, 9), 30.3, 60.0, 121.0, 121.0, 242.5,
             "NVIDIA L4 data sheet: 30.3 FP32; 120 TF32, 242 FP16/BF16, 485 FP8 with sparsity, halved"),
    # NVIDIA H100 data sheet, the SXM column
    GpuPeaks("H100", (9, 0), 67.0, 494.5, 989.5, 989.5, 1979.0,
             "NVIDIA H100 data sheet (SXM): 67 FP32; 989 TF32, 1979 FP16/BF16, 3958 FP8 with sparsity, halved"),
    # NVIDIA H100 data sheet, the PCIe column
    GpuPeaks("H100 PCIe", (9, 0), 51.0, 378.0, 756.5, 756.5, 1513.0,
             "NVIDIA H100 data sheet (PCIe): 51 FP32; 756 TF32, 1513 FP16/BF16, 3026 FP8 with sparsity, halved"),
    # NVIDIA H200 data sheet, the SXM column (the H100 SXM's compute with more, faster memory)
    GpuPeaks("H200", (9, 0), 67.0, 494.5, 989.5, 989.5, 1979.0,
             "NVIDIA H200 data sheet (SXM): 67 FP32; 989 TF32, 1979 FP16/BF16, 3958 FP8 with sparsity, halved"),
)}

#: The GPUs :func:`peak_table` shows by default: one per generation, as notebook 05 prints them.
TABLE_GPUS = ("T4", "V100", "A100", "L4", "H100")

#: The form factor a row means when its key names none: these rows are the SXM modules, so a driver
#: name that says PCIe or NVL does not fall onto them. A row without one ("A100") fits every form.
IMPLIED_FORM = {"V100": "SXM", "H100": "SXM", "H200": "SXM"}
#: How a driver's name spells each form factor ("A100-SXM4-40GB", "A100-PCIE-40GB", "H100 NVL", "H100NVL").
_FORMS = {"SXM": r"SXM\d*", "PCIe": r"PCI-?E", "NVL": r"NVL"}


def _row_variant(key: str) -> tuple[str, int | None, str | None]:
    """A row key's chip, memory size (GB) and form factor: ``"A100 80GB PCIe"`` -> ``("A100", 80, "PCIe")``."""
    chip, *rest = key.split()
    memory = next((int(t[:-2]) for t in rest if re.fullmatch(r"\d+GB", t)), None)
    form = next((t for t in rest if t in _FORMS), IMPLIED_FORM.get(chip))
    return chip, memory, form


def _name_variant(name: str, chip: str) -> tuple[int | None, set] | None:
    """The memory size and form factors ``name`` states, or None when ``chip`` is not a whole word of it."""
    word = rf"(?<![A-Za-z0-9]){re.escape(chip)}(?:(?![A-Za-z0-9])|(?=(?:SXM|PCIE|NVL)))"
    if not re.search(word, name, re.I):
        return None
    memory = re.search(r"(?<![A-Za-z0-9.])(\d+)\s*GB(?![A-Za-z0-9])", name, re.I)
    forms = {f for f, pattern in _FORMS.items() if re.search(rf"(?<![A-Za-z]){pattern}(?![A-Za-z])", name, re.I)}
    return (int(memory.group(1)) if memory else None), forms


def pick_variant(name: str, keys) -> tuple[str | None, str]:
    """The data-sheet row of ``keys`` that fits a GPU as its driver names it, and why: ``(key or None, reason)``.

    A key is a chip and optionally its variant, memory size and form factor: ``"A100 40GB"``,
    ``"A100 80GB PCIe"``, ``"H100 PCIe"``; ``"H100"`` is the SXM module (:data:`IMPLIED_FORM`).
    A row fits when its chip is a whole word of ``name`` and nothing in ``name`` contradicts its
    variant: ``"NVIDIA A100-SXM4-40GB"`` fits ``"A100 40GB"`` but not ``"A100 80GB SXM"``, and
    ``"NVIDIA H100 NVL"`` fits neither ``"H100"`` (SXM) nor ``"H100 PCIe"``, so no row. Of the rows
    that fit, the longest match wins: the one with the most of its variant stated in ``name``; a tie
    (a name that states no variant, like ``"A100"``) goes to the row listed first.
    """
    _validate.text("name", name, "the GPU's name as nvidia-smi prints it, e.g. 'NVIDIA A100-SXM4-40GB'")
    best, best_said, seen = None, None, {}
    for key in keys:
        chip, memory, form = _row_variant(key)
        stated = _name_variant(name, chip)
        if stated is None:
            continue
        seen.setdefault(chip, []).append(key)
        memory_said, forms_said = stated
        variant = ([f"{memory_said}GB"] if memory_said else []) + sorted(forms_said)
        if (memory and memory_said and memory != memory_said) or (form and forms_said and form not in forms_said):
            continue
        said = ([f"{memory}GB"] if memory is not None and memory == memory_said else []) + \
               ([form] if form is not None and form in forms_said else [])
        if best_said is None or len(said) > len(best_said):
            best, best_said = key, said
    if best is not None:
        chip, _, form = _row_variant(best)
        why = (f"the name says {' and '.join(best_said)}" if best_said else
               "the only row for it" if len(seen[chip]) == 1 else
               f"no other {chip} row fits: {best!r} is the {form} module" if form not in best.split() and form else
               f"the name states no variant: the first of the {chip} rows")
        return best, f"{name!r} -> data-sheet row {best!r} ({why})"
    if seen:
        rows = ", ".join(repr(k) for ks in seen.values() for k in ks)
        return None, (f"{name!r} names a variant ({' '.join(variant)}) that none of the data-sheet rows {rows} "
                      "describes: the course lists no data sheet for it, and another variant's figures would be "
                      "wrong")
    return None, f"no data-sheet row for {name!r}; known: {', '.join(keys)}"


def find_gpu(name: str) -> GpuPeaks | None:
    """The :data:`GPU_PEAKS` row of a GPU as its driver names it, or None when no data sheet is listed.

    A row matches when its chip is a whole word of ``name`` and its variant fits (:func:`pick_variant`):
    ``"Tesla T4"`` -> T4, ``"NVIDIA A100-SXM4-40GB"`` and ``"NVIDIA A100 80GB PCIe"`` -> A100,
    ``"NVIDIA H100 80GB HBM3"`` -> H100 (the SXM module), ``"NVIDIA H100 PCIe"`` -> its slower PCIe
    card (the longest match wins); ``"NVIDIA H100 NVL"`` -> None (no NVL row: not the SXM module's);
    ``"NVIDIA L40S"`` is not an L4, nor ``"NVIDIA RTX A1000"`` an A100.
    """
    _validate.text("name", name, "the GPU's name as nvidia-smi prints it, e.g. 'Tesla T4'")
    key, _ = pick_variant(name, GPU_PEAKS)
    return GPU_PEAKS[key] if key else None


def _gpu(name) -> GpuPeaks:
    _validate.text("gpu", name, "a GPU name such as 'A100'")
    key = {k.lower(): k for k in GPU_PEAKS}.get(name.strip().lower())
    if key is None:
        raise ValueError(f"no data-sheet figures for GPU {name!r}; known: {', '.join(GPU_PEAKS)}")
    return GPU_PEAKS[key]


def peak_speedup(gpu: str, dtype: str = "float16", tf32: bool = True) -> float:
    """Peak Tensor Core rate of ``dtype`` divided by the float32 baseline's peak on ``gpu``.

    The float32 baseline is TF32 Tensor Cores when the GPU has them and
    ``tf32`` is True (TensorFlow's default), else the plain float32 units.
    This ratio is the ceiling of what mixed precision can do for a
    matmul-bound model: about 2x on an A100 or H100 against TF32, 8x on a T4.
    """
    g = _gpu(gpu)
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32 must be True or False, got {tf32!r}")
    fast = g.peak(_validate.one_of("dtype", dtype, TENSOR_CORE_DTYPES))
    if fast is None:
        raise ValueError(f"the {g.name} (compute capability {g.cc[0]}.{g.cc[1]}) has no {dtype} Tensor Cores: "
                         f"{dtype} runs there on ordinary units, so there is no Tensor Core speed-up to expect")
    base = g.tfloat32 if (tf32 and g.tfloat32) else g.float32
    return fast / base


def peak_table(gpus=None) -> str:
    """Data-sheet peaks (dense TFLOPS) and the mixed-precision ceiling with TF32 on and off."""
    names = list(TABLE_GPUS) if gpus is None else [_gpu(n).name for n in gpus]
    rows = [["GPU", "cc", "Tensor Core dtypes", "FP32", "TF32", "FP16", "BF16", "FP8",
             "FP16/base (TF32 on)", "FP16/base (TF32 off)"]]
    for n in names:
        g = GPU_PEAKS[n]
        support = tensor_core_support(g.cc)
        dtypes = ", ".join(d for d in TENSOR_CORE_DTYPES if support[d]) or "none"
        rows.append([g.name, f"{g.cc[0]}.{g.cc[1]}", dtypes] +
                    [f"{v:g}" if v else "-" for v in (g.float32, g.tfloat32, g.float16, g.bfloat16, g.float8)] +
                    [f"{peak_speedup(n, 'float16', True):.1f}x", f"{peak_speedup(n, 'float16', False):.1f}x"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip() for r in rows)


# --------------------------------------------------------------------------- this machine


def tf32_enabled() -> bool:
    """TensorFlow's TF32 switch (``tf.config.experimental.tensor_float_32_execution_enabled()``).

    On by default. It only matters on compute capability 8.0 and later: there,
    while it is on, float32 matmuls and convolutions read their inputs as TF32.
    ``tf.config.experimental.enable_tensor_float_32_execution(False)`` turns it off.
    """
    return bool(_tf.tf().config.experimental.tensor_float_32_execution_enabled())


def gpu_compute_capability(index: int = 0) -> tuple[int, int] | None:
    """Compute capability of physical GPU ``index`` as TensorFlow reports it, or None without a GPU."""
    index = _validate.whole("index", index, 0, what="a GPU number, 0 for the first")
    tf = _tf.tf()
    gpus = tf.config.list_physical_devices("GPU")
    if index >= len(gpus):
        return None
    cc = tf.config.experimental.get_device_details(gpus[index]).get("compute_capability")
    return tuple(cc) if cc else None


@dataclass(frozen=True)
class PolicyAdvice:
    """The policy to use on a device, and why."""

    policy: str
    reason: str

    def __str__(self) -> str:
        return f"{self.policy}: {self.reason}"


def recommend_policy(cc=None, name: str | None = None) -> PolicyAdvice:
    """Advice for a GPU of compute capability ``cc`` (e.g. '8.6') and name ``name``, or for a CPU (``cc`` None).

    A ``name`` without ``cc`` is a GPU that is not NVIDIA's (tensorflow-metal's 'METAL'): no advice from data here.
    """
    if cc is None and name is not None:
        from ._vendor import explain_not_nvidia

        return PolicyAdvice("float32", f"{explain_not_nvidia(name)} The course has no Tensor Core data for it: "
                                       "float32 is the safe choice; measure mixed_float16 there before using it")
    if cc is None:
        return PolicyAdvice("float32", "a CPU without float16/bfloat16 matrix units gains nothing from mixed "
                                       "precision and usually runs slower: keep float32")
    support = tensor_core_support(cc, name)
    why_not = lacks_tensor_cores(name)
    if why_not:
        return PolicyAdvice("float32", f"{why_not}: mixed precision only saves memory there and may be slower")
    name = "{}.{}".format(*parse_compute_capability(cc))
    if support["bfloat16"]:
        return PolicyAdvice("mixed_bfloat16", f"compute capability {name} has bfloat16 Tensor Cores: float16's "
                                              "speed with float32's range, so no loss scaling (mixed_float16 "
                                              "works too). float32 already runs as TF32 on Tensor Cores here, "
                                              "so expect at most about 2x at peak, not more")
    if support["float16"]:
        return PolicyAdvice("mixed_float16", f"compute capability {name} has float16 Tensor Cores but no "
                                             "bfloat16 or TF32 ones: use mixed_float16 with loss scaling "
                                             "(mixed_bfloat16 would run without Tensor Cores)")
    return PolicyAdvice("float32", f"compute capability {name} is below 7.0: no Tensor Cores, mixed precision "
                                   "only saves memory and may be slower")
