"""Whether a GPU that TensorFlow lists is an NVIDIA GPU, and what to say when it is not.

The course's GPU helpers are NVIDIA's: compute capability, Tensor Cores, NVML and ``nvidia-smi``, the
data-sheet peaks. TensorFlow's CUDA device factory reports a ``compute_capability`` for every NVIDIA GPU
(``tf.config.experimental.get_device_details``). A GPU that a plug-in adds (a *PluggableDevice*) reports only
its ``device_name``: Apple's ``tensorflow-metal`` registers the Apple GPU as device type ``GPU``, named
``METAL`` (TensorFlow's log: "physical PluggableDevice (device: 0, name: METAL, ...)";
``PluggableDeviceFactory::GetDeviceDetails`` sets ``device_name`` alone). So a GPU without a compute
capability is not an NVIDIA GPU, and every NVIDIA-only helper that meets one says so with
:func:`explain_not_nvidia` instead of crashing, guessing a compute capability, or matching a data sheet.
"""

from __future__ import annotations

__all__ = ["METAL", "explain_not_nvidia", "is_nvidia"]

#: The name TensorFlow gives the GPU of Apple's tensorflow-metal plug-in.
METAL = "METAL"


def is_nvidia(compute_capability) -> bool:
    """True when TensorFlow reported a compute capability for the GPU (only CUDA GPUs have one)."""
    return compute_capability is not None and len(compute_capability) > 0


def explain_not_nvidia(name: str | None, compute_capability=None) -> str | None:
    """Why the GPU ``name`` is not one the course's NVIDIA tools apply to; None when it is an NVIDIA GPU.

    ``name`` and ``compute_capability`` as ``get_device_details`` gives them (``None``: not reported).
    """
    if is_nvidia(compute_capability):
        return None
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be the GPU's name as a string (e.g. 'METAL') or None, got {name!r}")
    who = f"GPU {name!r}" if name else "this GPU (TensorFlow gives no name)"
    apple = " (Apple's tensorflow-metal)" if name == METAL else ""
    return (f"{who}{apple} is not an NVIDIA GPU: TensorFlow reports no compute capability for it, as for every "
            "plug-in GPU such as Apple's tensorflow-metal ('METAL'). The course's NVIDIA tools (compute "
            "capability, Tensor Cores, NVML and nvidia-smi, the data-sheet peaks) do not apply to it, and the "
            "notebooks are tested on NVIDIA GPUs and CPUs only.")
