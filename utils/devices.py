"""Topic 01: what TensorFlow can see, and configuring devices before it is too late.

Four jobs:

* :func:`device_report` collects, without side effects, everything you need
  to know about the devices: physical and logical devices, each GPU's compute
  capability and which dtypes its Tensor Cores speed up, the build (CUDA and
  cuDNN versions when it is a GPU build), ``CUDA_VISIBLE_DEVICES`` and, when a
  driver is present, what NVML says about each GPU.
* :func:`doctor` turns those facts into a list of problems and how to fix them.
* :func:`setup_logical_devices` makes ``n`` logical devices: virtual GPUs
  spread over the GPUs, or logical CPUs without a GPU. It is idempotent, and
  when the runtime has already started it explains that the kernel must be
  restarted.
* :func:`fresh_process_devices` shows what environment variables do, in a
  fresh process (:mod:`gpucourse.startup` asks fresh processes more).

The report is built on what the driver and TensorFlow say about each GPU
(:func:`nvml_gpus`, :func:`gpu_details`, :func:`describe_compute_capability`):
those live in :mod:`gpucourse._gpu_facts` and are re-exported here.

The one rule behind most surprises: TensorFlow fixes its device configuration
the first time its eager runtime initialises. Running an op, or calling
``tf.config.list_logical_devices()``, initialises it. Listing *physical*
devices does not, but on a GPU machine it initialises CUDA, which reads
``CUDA_VISIBLE_DEVICES`` once and for all.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Iterable

from . import _probe, _tf, _validate
from ._gpu_facts import GPUDetails, GPUInfo, describe_compute_capability, gpu_details, nvml_gpus
from ._vendor import explain_not_nvidia

__all__ = [
    "DeviceReport",
    "Finding",
    "GPUDetails",
    "GPUInfo",
    "TooLateError",
    "describe",
    "describe_compute_capability",
    "device_report",
    "doctor",
    "fresh_process_devices",
    "gather_facts",
    "gpu_details",
    "nvml_gpus",
    "plan_gpu_split",
    "runtime_initialized",
    "setup_logical_devices",
]

#: Oldest TensorFlow this course is written for (Keras 3 is the default Keras from 2.16).
MIN_TF = (2, 16)
#: The TensorFlow minor release the notebooks were tested with.
TESTED_TF = (2, 21)
#: Memory per virtual GPU when a GPU is split and no limit is given.
DEFAULT_VIRTUAL_GPU_MB = 1024


class TooLateError(RuntimeError):
    """Raised when a device setting is requested after the runtime started."""


# --------------------------------------------------------------------------- facts


def runtime_initialized() -> bool:
    """Return True once TensorFlow's eager runtime has initialised its devices.

    After that point logical-device, visible-device, memory-growth and
    threading settings can no longer change. The check itself does not
    initialise anything (unlike ``tf.config.list_logical_devices()``).
    """
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context  # private, but stable since TF 2.0

    return bool(getattr(context.context(), "_initialized", False))


# --------------------------------------------------------------------------- report


@dataclass
class DeviceReport:
    """A snapshot of what TensorFlow (and the driver) can see. Print it, or read its fields."""

    tensorflow_version: str
    keras_version: str | None
    python_version: str
    is_cuda_build: bool
    cuda_version: str | None
    cudnn_version: str | None
    physical: list[tuple[str, str]]
    logical: list[tuple[str, str]] | None
    runtime_initialized: bool
    cuda_visible_devices: str | None
    nvml: list[GPUInfo] = field(default_factory=list)
    gpus: list[GPUDetails] = field(default_factory=list)

    @property
    def gpu_count(self) -> int:
        """Number of physical GPUs TensorFlow can use."""
        return sum(1 for _, kind in self.physical if kind == "GPU")

    @property
    def has_gpu(self) -> bool:
        """True when TensorFlow can place work on at least one GPU."""
        return self.gpu_count > 0

    def to_text(self) -> str:
        """Render the report as aligned plain text."""
        build = "CUDA build" if self.is_cuda_build else "CPU-only build"
        if self.is_cuda_build:
            build += f" (CUDA {self.cuda_version or '?'}, cuDNN {self.cudnn_version or '?'})"
        rows = [
            ("TensorFlow", f"{self.tensorflow_version}, {build}"),
            ("Keras", self.keras_version or "not installed"),
            ("Python", self.python_version),
            ("CUDA_VISIBLE_DEVICES", "(not set)" if self.cuda_visible_devices is None
             else repr(self.cuda_visible_devices)),
            ("physical devices", ", ".join(f"{n} ({k})" for n, k in self.physical) or "none"),
        ]
        if self.logical is None:
            rows.append(("logical devices", "runtime not initialised yet (listing them would initialise it)"))
        else:
            rows.append(("logical devices", ", ".join(n for n, _ in self.logical) or "none"))
        rows += [(f"GPU {g.name.rsplit(':', 1)[-1]}", str(g)) for g in self.gpus]
        if not self.gpus:
            rows.append(("GPUs", "none: no compute capability, no Tensor Cores (the CPU path)"))
        if self.nvml:
            rows += [(f"NVML GPU {g.index}", str(g).split(": ", 1)[1]) for g in self.nvml]
        elif self.gpus and all(g.compute_capability is None for g in self.gpus):
            rows.append(("NVIDIA driver", "not found: the GPUs above are not NVIDIA GPUs (no NVML, no nvidia-smi)"))
        else:
            rows.append(("NVIDIA driver", "not found (no GPU, or no driver)"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle):  # IPython display
        p.text(self.to_text())


def device_report(initialize: bool = False) -> DeviceReport:
    """Collect facts about devices, builds and drivers.

    Args:
        initialize: also list *logical* devices even if the runtime has not
            started yet. That initialises the runtime and freezes the device
            configuration, so it is off by default; once the runtime is up the
            logical devices are always reported.
    """
    if not isinstance(initialize, bool):
        raise TypeError(f"initialize must be True or False, got {initialize!r}")
    tf = _tf.tf()
    info = dict(tf.sysconfig.get_build_info())  # a CPU build has no cuda_version key: always .get()
    try:
        keras_version = _tf.keras().__version__
    except ImportError:
        keras_version = None
    started = runtime_initialized()
    logical = None
    if started or initialize:
        logical = [(d.name, d.device_type) for d in tf.config.list_logical_devices()]
        started = True
    return DeviceReport(
        tensorflow_version=tf.__version__,
        keras_version=keras_version,
        python_version=platform.python_version(),
        is_cuda_build=bool(info.get("is_cuda_build", False)),
        cuda_version=info.get("cuda_version"),
        cudnn_version=info.get("cudnn_version"),
        physical=[(d.name, d.device_type) for d in tf.config.list_physical_devices()],
        logical=logical,
        runtime_initialized=started,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        nvml=nvml_gpus(),
        gpus=gpu_details(),
    )


# --------------------------------------------------------------------------- doctor


@dataclass
class Finding:
    """One diagnosis: how serious it is, what is wrong, and what to do about it."""

    level: str  # "error", "warning" or "ok"
    problem: str
    fix: str = ""

    def __str__(self) -> str:
        mark = {"error": "[ERROR]", "warning": "[WARN] ", "ok": "[OK]   "}[self.level]
        return f"{mark} {self.problem}" + (f"\n        fix: {self.fix}" if self.fix else "")


def gather_facts() -> dict:
    """The facts :func:`doctor` reasons about, as a plain dict (easy to fake in tests)."""
    report = device_report()
    try:
        import ipywidgets

        widgets_version = ipywidgets.__version__
    except ImportError:
        widgets_version = None
    return {
        "tf_version": report.tensorflow_version,
        "keras_version": report.keras_version,
        "python_version": report.python_version,
        "is_cuda_build": report.is_cuda_build,
        "cuda_version": report.cuda_version,
        "cudnn_version": report.cudnn_version,
        "tf_gpus": report.gpu_count,
        "driver_gpus": len(report.nvml),
        "cuda_visible_devices": report.cuda_visible_devices,
        "ipywidgets_version": widgets_version,
        "allow_growth_env": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
        "not_nvidia_gpus": [g.model or "" for g in report.gpus if g.compute_capability is None],
    }


def _version_tuple(text: str | None) -> tuple[int, ...]:
    """'2.21.0rc1' -> (2, 21, 0); None or garbage -> ()."""
    parts = []
    for piece in (text or "").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


_FACT_KEYS = ("tf_version", "keras_version", "is_cuda_build", "tf_gpus", "driver_gpus", "cuda_visible_devices")


def doctor(facts: dict | None = None, show: bool = True) -> list[Finding]:
    """Diagnose the environment: what is wrong, and how to fix it.

    Args:
        facts: the dict from :func:`gather_facts`; gathered now when None.
            Pass your own to see what the doctor says about another machine.
        show: print the findings.

    Returns:
        The findings, errors first. An empty-handed machine still gets one
        ``ok`` finding saying which path (GPU or CPU) the course will take.
    """
    if facts is None:
        facts = gather_facts()
    if not isinstance(facts, dict):
        raise TypeError(f"facts must be a dict like gather_facts() returns, got {type(facts).__name__}")
    missing = [k for k in _FACT_KEYS if k not in facts]
    if missing:
        raise ValueError(f"facts is missing {', '.join(missing)}; start from gather_facts() and change what you need")

    out: list[Finding] = []
    tf_v = _version_tuple(facts["tf_version"])
    if tf_v[:2] < MIN_TF:
        out.append(Finding("error", f"TensorFlow {facts['tf_version']} is older than {MIN_TF[0]}.{MIN_TF[1]}: "
                           "the course uses Keras 3 APIs that do not exist there.",
                           "pip install -U 'tensorflow>=2.21' (or tensorflow-cpu on a machine without a GPU)"))
    elif tf_v[:2] != TESTED_TF:
        out.append(Finding("warning", f"TensorFlow {facts['tf_version']} is not the tested "
                           f"{TESTED_TF[0]}.{TESTED_TF[1]}: most things work, some error texts and defaults differ.",
                           f"pip install 'tensorflow=={TESTED_TF[0]}.{TESTED_TF[1]}.*' for identical results"))
    k_v = _version_tuple(facts["keras_version"])
    if not k_v:
        out.append(Finding("error", "Keras is not installed.", "pip install 'keras>=3'"))
    elif k_v[0] < 3:
        out.append(Finding("error", f"Keras {facts['keras_version']} is Keras 2; the course teaches Keras 3.",
                           "pip install -U 'keras>=3' (and unset TF_USE_LEGACY_KERAS)"))

    cvd = facts["cuda_visible_devices"]
    hidden = cvd is not None and cvd.strip() in ("", "-1", "none", "NoDevFiles")
    tf_gpus, drv_gpus = int(facts["tf_gpus"]), int(facts["driver_gpus"])
    if drv_gpus and not facts["is_cuda_build"]:
        out.append(Finding("error", f"The driver sees {drv_gpus} GPU(s) but this TensorFlow is a CPU-only build "
                           "(e.g. tensorflow-cpu), so it will never use them.",
                           "pip uninstall -y tensorflow-cpu && pip install 'tensorflow[and-cuda]==2.21.*' "
                           "(or: make lab TF=gpu)"))
    elif drv_gpus and hidden:
        out.append(Finding("error", f"CUDA_VISIBLE_DEVICES={cvd!r} hides all {drv_gpus} GPU(s) from TensorFlow.",
                           "unset CUDA_VISIBLE_DEVICES (or set it to e.g. '0'), then restart the kernel"))
    elif drv_gpus and tf_gpus == 0:
        cuda, cudnn = facts.get("cuda_version") or "?", facts.get("cudnn_version") or "?"
        built = f" (this build wants CUDA {cuda}, cuDNN {cudnn})" if facts["is_cuda_build"] else ""
        out.append(Finding("error", f"The driver sees {drv_gpus} GPU(s) but TensorFlow sees none: usually the CUDA "
                           f"or cuDNN libraries TensorFlow was built for{built} are missing or do not match the "
                           "driver. TensorFlow then skips the GPUs and runs everything on the CPU: that, not slower "
                           "GPU code, is what a CUDA/cuDNN mismatch costs.",
                           "pip install 'tensorflow[and-cuda]==2.21.*' to get matching CUDA/cuDNN wheels; check that "
                           "the driver is recent enough (nvidia-smi) and read TensorFlow's startup log for "
                           "'Could not load dynamic library' or 'Cannot dlopen some GPU libraries'"))
    elif facts["is_cuda_build"] and drv_gpus == 0 and tf_gpus == 0:
        out.append(Finding("warning", "This is a CUDA build of TensorFlow but no NVIDIA driver or GPU was found.",
                           "on a GPU machine install the NVIDIA driver; otherwise nothing to do: the course "
                           "runs on CPU (tensorflow-cpu is a smaller download)"))
    for name in facts.get("not_nvidia_gpus") or ():  # a plug-in GPU: Apple's tensorflow-metal, ...
        out.append(Finding("warning", explain_not_nvidia(name or None),
                           "to run the course as tested, use the CPU: pip uninstall tensorflow-metal (or the "
                           "plug-in that adds this GPU) and restart the kernel, or hide it with "
                           "tf.config.set_visible_devices([], 'GPU') before the first op"))
    if tf_gpus and facts.get("allow_growth_env") not in (None, "true", "false"):
        out.append(Finding("warning", f"TF_FORCE_GPU_ALLOW_GROWTH={facts['allow_growth_env']!r} is not 'true' "
                           "or 'false' and will be ignored.", "export TF_FORCE_GPU_ALLOW_GROWTH=true"))
    w_v = _version_tuple(facts.get("ipywidgets_version"))
    if "ipywidgets_version" in facts and not w_v:
        out.append(Finding("warning", "ipywidgets is not installed: the live monitors in topic 08 will print "
                           "text instead of widgets.", "pip install 'ipywidgets>=7.7'"))
    elif w_v and w_v[:2] < (7, 7):
        out.append(Finding("warning", f"ipywidgets {facts['ipywidgets_version']} is older than 7.7.",
                           "pip install 'ipywidgets>=7.7,<9'"))

    if not any(f.level == "error" for f in out):
        if tf_gpus:
            out.append(Finding("ok", f"TensorFlow sees {tf_gpus} GPU(s): the notebooks take the GPU path."))
        else:
            out.append(Finding("ok", "No GPU: the notebooks take the CPU path and emulate several devices "
                               "with logical CPUs."))
    order = {"error": 0, "warning": 1, "ok": 2}
    out.sort(key=lambda f: order[f.level])
    if show:
        print("\n".join(str(f) for f in out))
    return out


# --------------------------------------------------------------------------- logical devices


def plan_gpu_split(n: int, gpus: int, memory_limit_mb: int | None = None, use_gpus: int | None = None) -> list:
    """How :func:`setup_logical_devices` spreads ``n`` logical GPUs over ``gpus`` physical ones.

    The rule: use the first ``use_gpus`` GPUs (default ``min(n, gpus)``) and
    hide the others; give each used GPU ``n // use_gpus`` logical devices (the
    first ones one more when it does not divide). A GPU that carries one
    logical device stays whole, unless a GPU is split or ``memory_limit_mb``
    is given: then every logical GPU gets the same limit (default
    ``DEFAULT_VIRTUAL_GPU_MB``), so the replicas of topic 04 are alike.

    Returns one entry per used GPU: ``None`` (whole) or a list of MiB limits,
    e.g. ``plan_gpu_split(3, 2) == [[1024, 1024], [1024]]``.
    """
    n = _validate.whole("n", n, 1, what="how many logical GPUs")
    gpus = _validate.whole("gpus", gpus, 1, what="how many physical GPUs are visible")
    if memory_limit_mb is not None:
        _validate.whole("memory_limit_mb", memory_limit_mb, 1, what="MiB per virtual GPU")
    use = min(n, gpus) if use_gpus is None else _validate.whole(
        "use_gpus", use_gpus, 1, min(n, gpus), what=f"at most one per logical GPU and at most the {gpus} visible")
    counts = [n // use + (1 if i < n % use else 0) for i in range(use)]
    if max(counts) == 1 and memory_limit_mb is None:
        return [None] * use
    return [[memory_limit_mb or DEFAULT_VIRTUAL_GPU_MB] * c for c in counts]


def _layout(configs: list) -> str:
    """[None, [1024, 1024]] -> 'GPU 0 whole, GPU 1 as 2 x 1024 MiB'."""
    parts = [f"GPU {i} whole" if not c else f"GPU {i} as {len(c)} x {c[0]} MiB" for i, c in enumerate(configs)]
    return ", ".join(parts) or "no GPU"


def setup_logical_devices(n: int, memory_limit_mb: int | None = None, device_type: str | None = None,
                          use_gpus: int | None = None) -> list:
    """Make ``n`` logical devices: virtual GPUs over the GPUs, or logical CPUs without a GPU.

    Safe to call again with the same arguments (it is idempotent), which is
    what happens when a notebook is run top to bottom twice.

    With several GPUs the ``n`` logical GPUs are spread over them (see
    :func:`plan_gpu_split`): on Kaggle's 2 x T4, ``n=2`` gives one logical
    GPU per T4 and ``n=4`` two per T4; GPUs beyond ``use_gpus`` are hidden
    (``tf.config.set_visible_devices``), so none sits idle with its memory
    reserved. A GPU used whole is left unconfigured (no
    ``set_logical_device_configuration`` call at all): an empty
    configuration would count as "virtual devices configured", dropping its
    memory-growth setting and making a later ``set_memory_growth`` raise.

    Args:
        n: how many logical devices of that type you want (>= 1).
        memory_limit_mb: memory per virtual GPU. GPU only; defaults to
            ``DEFAULT_VIRTUAL_GPU_MB`` whenever a GPU is split.
        device_type: ``"GPU"`` or ``"CPU"`` to force one; default: GPU if any.
        use_gpus: how many physical GPUs to use (default: as many as useful).

    Returns:
        The logical devices of that type (this initialises the runtime).

    Raises:
        TooLateError: the runtime already started with a different layout; the
            message says to restart the kernel and call this first.
        TypeError / ValueError: bad arguments, or a GPU-only setting on a CPU.
    """
    n = _validate.whole("n", n, 1, what="how many logical devices")
    if device_type is not None:
        _validate.one_of("device_type", device_type, ("CPU", "GPU"))
    if memory_limit_mb is not None:
        _validate.whole("memory_limit_mb", memory_limit_mb, 1, what="MiB per virtual GPU")
    tf = _tf.tf()
    kind = device_type or ("GPU" if tf.config.list_physical_devices("GPU") else "CPU")
    physical = tf.config.list_physical_devices(kind)
    if not physical:
        raise ValueError(f"device_type={kind!r}, but no physical {kind} is visible; device_report() shows what is")
    if kind == "CPU" and (memory_limit_mb is not None or use_gpus is not None):
        raise ValueError("memory_limit_mb and use_gpus are GPU features (TensorFlow: 'Setting memory limit on CPU "
                         "virtual devices is currently not supported'). Call setup_logical_devices(n) without "
                         "them on CPU.")
    if kind == "CPU":
        cpu = physical[0]
        config = tf.config.get_logical_device_configuration(cpu)  # None until someone splits it
        have = len(config) if config else 1
        if have != n:
            _too_late(f"{have} logical CPU(s) on {cpu.name}", f"{n}")
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        return tf.config.list_logical_devices("CPU")

    plan = plan_gpu_split(n, len(physical), memory_limit_mb, use_gpus)
    wanted_visible = physical[:len(plan)]
    visible = tf.config.get_visible_devices("GPU")
    have = [[c.memory_limit for c in (tf.config.get_logical_device_configuration(g) or [])] or None
            for g in visible]
    if visible != wanted_visible or have != plan:
        _too_late(f"{_layout(have)} ({len(physical) - len(visible)} hidden)",
                  f"{_layout(plan)} ({len(physical) - len(plan)} hidden)")
        if visible != wanted_visible:
            tf.config.set_visible_devices(wanted_visible, "GPU")
        for gpu, limits in zip(wanted_visible, plan):
            if not limits:  # a whole GPU stays unconfigured, so its memory-growth setting keeps working
                if tf.config.get_logical_device_configuration(gpu) is not None:
                    _forget_logical_device_configuration(gpu)  # an earlier call in this kernel split it
                continue
            configs = [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in limits]
            try:
                tf.config.set_logical_device_configuration(gpu, configs)
            except ValueError as err:
                if "memory growth" in str(err).lower():
                    raise ValueError(f"{err}. Memory growth and virtual GPUs cannot be combined: turn memory "
                                     "growth off, restart the kernel, then split.") from err
                raise
    return tf.config.list_logical_devices("GPU")


def _forget_logical_device_configuration(gpu) -> None:
    """Undo a split of ``gpu`` before the runtime starts, leaving it as if never configured.

    ``tf.config.set_logical_device_configuration(gpu, [])`` is no undo: it
    marks the GPU as having virtual devices (an empty list of them), and from
    then on ``set_memory_growth(gpu, ...)`` raises "Cannot set memory growth on
    device when virtual devices configured" and a growth setting made earlier
    is dropped. TensorFlow has no public call to remove the entry, so this
    removes it from the context's map (private since TF 2.1, still there in 2.21).
    """
    from tensorflow.python.eager import context

    context.context()._virtual_device_map.pop(gpu, None)


def _too_late(have: str, want: str) -> None:
    """Raise TooLateError (have -> want) once the runtime has started; return otherwise."""
    if runtime_initialized():
        raise TooLateError(
            f"Too late: TensorFlow's runtime has already started with {have}, and you asked for {want}. "
            f"Devices are fixed once any op runs (or logical devices are listed). Restart the kernel "
            f"(Kernel > Restart Kernel) and run this setup cell before any other TensorFlow code.")


def describe(devices: Iterable) -> str:
    """One line per device: ``name (type)`` for PhysicalDevice/LogicalDevice objects."""
    return "\n".join(f"{d.name} ({d.device_type})" for d in devices)


# --------------------------------------------------------------------------- fresh processes

_DEVICES_PROBE = """
import tensorflow as tf
emit({"physical": [(d.name, d.device_type) for d in tf.config.list_physical_devices()],
      "logical": [(d.name, d.device_type) for d in tf.config.list_logical_devices()]})
"""


def fresh_process_devices(env: dict | None = None, timeout: float = 120) -> dict:
    """Start a fresh Python with extra environment variables and report the devices it sees.

    Device-related environment variables (``CUDA_VISIBLE_DEVICES``,
    ``TF_FORCE_GPU_ALLOW_GROWTH``, ...) are read once, when TensorFlow starts;
    setting them later in ``os.environ`` changes nothing in this kernel. A fresh
    process shows what they would do. Returns ``{"physical": [...], "logical": [...]}``
    as ``(name, type)`` pairs.
    """
    data = _probe.run(_DEVICES_PROBE, env=_validate.env_vars("env", env), timeout=timeout, label="devices probe")
    return {k: [tuple(x) for x in v] for k, v in data.items()}

