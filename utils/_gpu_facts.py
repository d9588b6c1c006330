"""What the driver (NVML) and TensorFlow say about each GPU: memory, utilisation, model, compute capability.

:func:`nvml_gpus` asks the NVIDIA driver (no TensorFlow needed), :func:`gpu_details` asks TensorFlow's GPU
device factory (without starting the eager runtime), and :func:`describe_compute_capability` says what a
compute capability means for speed. Part of topic 01: :mod:`gpucourse.devices` re-exports every name here and
builds its device report on them; notebooks write ``devices.<name>``. Importing this module never imports
TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _tf
from ._vendor import explain_not_nvidia

__all__ = ["GPUDetails", "GPUInfo", "describe_compute_capability", "gpu_details", "nvml_gpus"]


# --------------------------------------------------------------------------- the driver


@dataclass
class GPUInfo:
    """One NVIDIA GPU as the driver (NVML) sees it, independent of TensorFlow."""

    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int | None
    driver_version: str
    compute_capability: str | None = None

    def __str__(self) -> str:
        util = "n/a" if self.utilization_pct is None else f"{self.utilization_pct}%"
        cc = f", compute capability {self.compute_capability}" if self.compute_capability else ""
        return (f"GPU {self.index}: {self.name}{cc}, {self.memory_used_mib}/{self.memory_total_mib} MiB used, "
                f"utilisation {util}, driver {self.driver_version}")


def nvml_gpus() -> list[GPUInfo]:
    """Ask the NVIDIA driver (through NVML) which GPUs exist.

    Returns an empty list when there is no NVIDIA driver, which is the normal
    case on CPU-only machines, so callers never need a try/except.
    """
    try:
        import pynvml  # provided by the nvidia-ml-py package
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                util = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = None
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{major}.{minor}"
            except Exception:
                cc = None
            gpus.append(GPUInfo(i, name, int(mem.total // 2**20), int(mem.used // 2**20), util, driver, cc))
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


# --------------------------------------------------------------------------- TensorFlow


def describe_compute_capability(cc, name: str | None = None) -> str:
    """What a compute capability (and the GPU's name) means for speed: which dtypes its Tensor Cores support.

    ``(7, 5)`` (a T4) -> ``'7.5: Tensor Cores for float16; none for bfloat16, tfloat32'``.
    The dtype list is whatever :func:`gpucourse.precision.tensor_core_support`
    knows (topic 05 teaches it); this function only renders it. With the
    GPU's ``name`` the chips that have no Tensor Cores at their compute
    capability (a GeForce GTX 16xx is 7.5, like a T4) say so and why.
    """
    from . import precision  # looked up at call time, so tests can fake it

    support = precision.tensor_core_support(cc, name)
    major, minor = (int(p) for p in (cc.split(".") if isinstance(cc, str) else cc))
    yes = [k for k, v in support.items() if v]
    no = [k for k, v in support.items() if not v]
    if not yes:
        why = precision.lacks_tensor_cores(name)
        why = f"; {why}" if why else ""
        return f"{major}.{minor}: no Tensor Cores (float32 only; mixed precision saves memory, not time){why}"
    text = f"{major}.{minor}: Tensor Cores for {', '.join(yes)}"
    return text + (f"; none for {', '.join(no)}" if no else "")


@dataclass
class GPUDetails:
    """One GPU as TensorFlow describes it (``tf.config.experimental.get_device_details``)."""

    name: str  # "/physical_device:GPU:0"
    model: str | None  # "Tesla T4"
    compute_capability: tuple[int, int] | None
    tensor_cores: dict[str, bool] = field(default_factory=dict)

    def __str__(self) -> str:
        model = self.model or "unknown model"
        if self.compute_capability is None:  # a plug-in GPU (tensorflow-metal's 'METAL'), or details unknown
            return f"{model}, compute capability unknown: {explain_not_nvidia(self.model)}"
        return f"{model}, compute capability {describe_compute_capability(self.compute_capability, self.model)}"


def gpu_details() -> list[GPUDetails]:
    """Model, compute capability and Tensor Core dtypes of every physical GPU TensorFlow sees.

    Reads ``tf.config.experimental.get_device_details``, which asks the GPU
    device factory (``GetDeviceDetails``) and does not start the eager runtime.
    An empty list without a GPU.
    """
    from . import precision

    tf = _tf.tf()
    out = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            details = dict(tf.config.experimental.get_device_details(gpu))
        except Exception:  # a device TensorFlow cannot describe: report what we know
            details = {}
        cc = details.get("compute_capability")
        cc = (int(cc[0]), int(cc[1])) if cc else None
        model = details.get("device_name")
        cores = dict(precision.tensor_core_support(cc, model)) if cc else {}  # by name too: GTX 16xx is 7.5
        out.append(GPUDetails(gpu.name, model, cc, cores))
    return out
