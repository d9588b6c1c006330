"""Helpers for the course *TensorFlow GPU acceleration*.

The package lives in the repository's ``utils/`` folder and is installed under
the distinctive name ``gpucourse`` (``pip install -e .``), so notebooks write::

    from gpucourse import devices, timing

One module per topic, plus shared plumbing:

=====================  =======================================================
``devices``            01 device report, environment doctor, logical devices
``startup``            01 fresh-process probes: first calls, thread pools
``placement``          02 placement logging and op -> device tables
``memory``             03 memory growth, limits, peak-memory measurement
``memory_explorer``    03 memory explorer: batch, precision, accumulation vs a budget
``distribute``         04 MirroredStrategy and multi-worker helpers
``precision``          05 dtype policies, and the topic's one import
``precision_formats``  05 number formats, casts, TF32 emulation
``precision_scaling``  05 loss scaling, its explorers, replicas under a strategy
``precision_hardware`` 05 Tensor Core support, data-sheet peaks, TF32 switch, advice
``xla``                06 XLA compilation and HLO inspection, the fusion explorer
``determinism``        06 reproducible training: fresh-process runs compared bit for bit
``latency``            06 inference latency p50/p99 against batch size
``pipeline``           07 tf.data tuning: the notebook's workload and variants, options, epoch orders
``simulate``           07/08 simulated accelerator: stages, device, lane recorder, runs vs their bound
``profiling``          08 trace capture and reading, step breakdowns, capstone benchmark
``monitor``            08 live utilisation monitor (NVML/CPU) and the utilisation explorer
``explore``            interactive explorers (widgets, with a static fallback)
``timing``             warm-up + repeats + medians, ratio tables
``logcapture``         capture C-level log output (TensorFlow's C++ logs)
``plots``              small matplotlib helpers shared by the notebooks
``colab``              setup cell support for Google Colab
``grading``            in-notebook ``check()`` and the command-line grader
``labtests``           the public tests of each lab (``labNN.py``)
``labgen``             generates ``labs/`` from ``solutions/``
``authoring``          builds notebooks from percent-format source
``benchmark``          the tf.data / XLA / capstone ratio table
=====================  =======================================================

Modules are imported lazily so that ``import gpucourse`` never imports
TensorFlow (and so never initialises its runtime) by itself.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "colab",
    "determinism",
    "devices",
    "explore",
    "distribute",
    "grading",
    "latency",
    "logcapture",
    "memory",
    "memory_explorer",
    "monitor",
    "pipeline",
    "placement",
    "plots",
    "precision",
    "precision_formats",
    "precision_hardware",
    "precision_scaling",
    "profiling",
    "simulate",
    "startup",
    "timing",
    "xla",
)

__all__ = list(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    """Import ``gpucourse.<name>`` on first attribute access."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gpucourse' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
