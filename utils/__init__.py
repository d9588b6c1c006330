"""Helpers for the course *TensorFlow GPU acceleration*.

The package lives in the repository's ``utils/`` folder and is installed under
the distinctive name ``gpucourse`` (``pip install -e .``), so notebooks write::

    from gpucourse import devices, timing

One job per module, numbered by the topic that teaches it, plus shared
helpers; each is ``gpucourse.<name>``, imported on first use:

=====================  =======================================================
``devices``            01 device report, environment doctor, logical devices
``startup``            01 fresh-process probes: first calls, thread pools
``placement``          02 placement logging and op -> device tables
``memory``             03 memory growth, limits, peak-memory measurement
``memory_explorer``    03 memory explorer: batch, precision, accumulation vs a budget
``distribute``         04 one process: MirroredStrategy batch arithmetic, devices, all-reduce, sharding
``multiworker``        04 several processes: MultiWorkerMirroredStrategy on 127.0.0.1, failures
``clusters``           04 beyond one machine: the cluster from TF_CONFIG, SLURM or a Kubernetes Indexed Job
``scaling``            04 does data parallelism pay: compute vs all-reduce model, the scaling explorer
``precision``          05 Keras dtype policies (re-exports the three modules below)
``precision_formats``  05 number formats, casts, TF32 emulation
``precision_scaling``  05 loss scaling, its explorers, replicas under a strategy
``precision_hardware`` 05 Tensor Core support, data-sheet peaks, TF32 switch, advice
``xla``                06 XLA compilation and HLO inspection, the fusion explorer
``grappler``           06 Grappler: the graph a tf.function runs after TensorFlow's optimizer
``determinism``        06 reproducible training: fresh-process runs compared bit for bit
``latency``            06 inference latency p50/p99 against batch size
``pipeline``           07 tf.data tuning: the notebook's workload and variants, options, epoch orders
``simulate``           07/08 simulated accelerator: stages, device, lane recorder, runs vs their bound
``profiling``          08 trace capture and reading, step breakdowns, capstone benchmark
``bottleneck``         08 what limits a step (input, host or device) from its time breakdown
``monitor``            08 live utilisation monitor (NVML/CPU) and the utilisation explorer
``roofline``           09 the roofline measured: matmul FLOP/s per dtype, memory bandwidth, data-sheet roofs
``mfu``                09 FLOPs and bytes of ops (TensorFlow's count, formulas), MFU, the roofline explorer
``explore``            interactive explorers (widgets, with a static fallback)
``timing``             warm-up + repeats + medians, ratio tables
``logcapture``         capture C-level log output (TensorFlow's C++ logs)
``plots``              small matplotlib helpers shared by the notebooks
``colab``              setup cell and badges for Google Colab and Kaggle
``grading``            in-notebook ``check()`` and the command-line grader (package)
``labtests``           the public tests of each lab, ``labNN.py`` (package)
``tools``              the maintainers' tools below (package)
=====================  =======================================================

Command-line tools, run as ``python -m gpucourse.<name>`` (not attributes of
the package; the maintainers' tools live in ``tools/``, each with a thin
``gpucourse.<name>`` shim): ``labgen`` generates ``labs/`` from ``solutions/``,
``authoring`` builds and executes notebooks from percent-format source,
``benchmark`` prints the tf.data / XLA / capstone ratio table and this machine's roofline, ``gpureport``
runs the whole course on an NVIDIA GPU and writes ``gpu-report.md`` (``make test-gpu``),
``train_multiworker`` trains notebook 04's multi-worker job on a cluster started by SLURM,
Kubernetes or Vertex AI (templates in ``docs/clusters/``), ``i18n`` builds the translated
editions (``notebooks/zh-CN/``, ``labs/zh-CN/``) from the English notebooks plus one PO file each,
refreshes the PO files and check()'s message catalogue, and reports drift (``make zh``). Private
plumbing (``_validate``: one argument-checking policy; ``_tf``: the one lazy
TensorFlow import; ``_probe``: fresh-process probes; ``_vendor``: whether a GPU is an NVIDIA GPU, and
the message of the NVIDIA-only helpers when it is not; ``_simparts``; ``_labrules``: which helpers answer
a lab item) is not part of the public interface. Three private modules hold parts of a taught module, which
re-exports their names (notebooks import them from there): ``_gpu_facts`` (what the driver and TensorFlow say
about each GPU, for ``devices``), ``_placement_probes`` (the fresh-process logging probes, for ``placement``)
and ``_memory_log`` (TensorFlow's allocator messages and log records, for ``memory``).

Modules are imported lazily so that ``import gpucourse`` never imports
TensorFlow (and so never initialises its runtime) by itself.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Every row of the module map above (tests/test_module_map.py keeps the two in step).
_SUBMODULES = (
    "bottleneck",
    "clusters",
    "colab",
    "determinism",
    "devices",
    "distribute",
    "explore",
    "grading",
    "grappler",
    "labtests",
    "latency",
    "logcapture",
    "memory",
    "memory_explorer",
    "mfu",
    "monitor",
    "multiworker",
    "pipeline",
    "placement",
    "plots",
    "precision",
    "precision_formats",
    "precision_hardware",
    "precision_scaling",
    "profiling",
    "roofline",
    "scaling",
    "simulate",
    "startup",
    "timing",
    "tools",
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
