"""Platform support: one setup cell and one pair of badges, identical in every notebook.

Every notebook's first code cell is exactly :data:`SETUP_CELL` (a test checks
that). Locally, `make lab` has already installed the helpers and the cell only
prepares the session. On Colab or Kaggle it installs this package from the
repository *without its dependencies*, so the platform's own TensorFlow and
ipywidgets are never replaced. Then :func:`setup`

* turns on GPU memory growth for this kernel (``TF_FORCE_GPU_ALLOW_GROWTH``,
  unless you set it yourself), so that several open notebooks can share one
  GPU instead of the first one reserving all of its memory;
* turns on oneDNN on CPUs where it is off by default, so CPU memory statistics
  exist on every machine; where TensorFlow has no oneDNN (its macOS build) or
  you turned it off, it turns on TensorFlow's BFC CPU allocator instead, which
  keeps the same statistics (:func:`keep_cpu_memory_statistics`);
* prints where it runs and the TensorFlow/Keras versions, and warns about any
  version outside the range the course is tested with (:data:`TESTED`), then
  what differs on this platform (:func:`platform_notes`: no oneDNN, an Apple
  GPU under ``tensorflow-metal``).
"""

from __future__ import annotations

import os
import sys
import warnings

# No imports from the rest of gpucourse (not even _tf or _validate): .ci/colab_setup.py loads this
# file on its own, before the package is installed, to read SETUP_CELL. So TensorFlow and Keras are
# imported directly below, inside functions, which keeps them as lazy as gpucourse._tf does.

__all__ = ["REPO", "BRANCH", "SETUP_CELL", "TESTED", "badge", "colab_url", "kaggle_url", "check_versions",
           "in_colab", "in_kaggle", "platform", "IMPORT_NOISE", "drop_import_noise", "quiet_import", "require_gpu_if_asked", "setup", "version_problems",
           "onednn_enabled", "keep_cpu_memory_statistics", "platform_notes"]

#: Packages the setup cell installs *with* their dependencies: none of them may pull in TensorFlow,
#: Keras or ipywidgets (tests/test_notebook_structure.py checks their metadata). The same pip command
#: pins protobuf to the version already installed: xprof (the profile plugin) would otherwise upgrade
#: it to 7.x, which breaks TensorFlow 2.19 on Colab (`make test-colab` caught it).
COLAB_WITH_DEPS = ("tensorboard-plugin-profile",)

#: GitHub "owner/name" of this course (used by badges and the Colab/Kaggle install).
REPO = "tf-gpu-course/tf-gpu-acceleration"
BRANCH = "main"

#: Versions the notebooks are tested with: (oldest, newest) as (major, minor). The oldest is
#: Colab's stack (``make test-colab``), the newest the local one (``make test``).
TESTED = {"tensorflow": ((2, 19), (2, 21)), "keras": ((3, 10), (3, 15)), "ipywidgets": ((7, 7), (8, 1))}

SETUP_CELL = f"""\
# Setup (run first). On Colab or Kaggle this installs the course helpers without touching the
# platform's own TensorFlow or ipywidgets; locally `make lab` already installed them.
import os, sys
if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    %pip install -q --no-deps "gpucourse @ git+https://github.com/{REPO}@{BRANCH}" wurlitzer nvidia-ml-py
    from google.protobuf import __version__ as _protobuf  # the platform's TensorFlow needs this very version
    %pip install -q tensorboard-plugin-profile "protobuf=={{_protobuf}}"  # reads profiler traces (topic 08)
from gpucourse import colab
colab.setup()"""


def in_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules


def in_kaggle() -> bool:
    """True inside a Kaggle notebook (Kaggle sets ``KAGGLE_KERNEL_RUN_TYPE``)."""
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


def platform() -> str:
    """``"Colab"``, ``"Kaggle"`` or ``"local"``."""
    return "Colab" if in_colab() else "Kaggle" if in_kaggle() else "local"


def _notebook_path(path: str) -> str:
    if not isinstance(path, str):  # the policy of gpucourse._validate, restated (see the imports)
        raise TypeError(f"path must be a string like 'notebooks/01_x.ipynb', got {type(path).__name__}")
    if not path.endswith(".ipynb"):
        raise ValueError(f"path must be a notebook path like 'notebooks/01_x.ipynb', got {path!r}")
    return path.lstrip("/")


def colab_url(path: str) -> str:
    """Colab URL that opens ``path`` (relative to the repository root) from GitHub."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/{_notebook_path(path)}"


def kaggle_url(path: str) -> str:
    """Kaggle URL that imports ``path`` (relative to the repository root) from GitHub into a new notebook."""
    return f"https://kaggle.com/kernels/welcome?src=https://github.com/{REPO}/blob/{BRANCH}/{_notebook_path(path)}"


def badge(path: str) -> str:
    """Markdown for the Open-in-Colab and Open-in-Kaggle badges of ``path``."""
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(path)}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({kaggle_url(path)})")


#: Variables :func:`setup` sets on the learner's behalf, recorded here so that fresh-process probes
#: (``gpucourse._probe``) can start without them.
SET_BY_COURSE = "GPUCOURSE_SET_VARS"


def allow_gpu_memory_growth() -> bool:
    """Set ``TF_FORCE_GPU_ALLOW_GROWTH=true`` unless it is set already; True if this call set it.

    TensorFlow reads the variable when it creates its GPU devices, so it must be set before the
    first op; it then overrides ``tf.config.experimental.set_memory_growth``. It changes nothing
    on a CPU-only machine.
    """
    if "TF_FORCE_GPU_ALLOW_GROWTH" in os.environ:
        return False
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    names = [n for n in os.environ.get(SET_BY_COURSE, "").split(",") if n]
    os.environ[SET_BY_COURSE] = ",".join(dict.fromkeys(names + ["TF_FORCE_GPU_ALLOW_GROWTH"]))
    return True


#: Lines TensorFlow's C++ libraries write to stderr while TensorFlow and Keras are imported, before its
#: logging is set up (so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them), none of them a problem. In a
#: notebook they show in red, each twice (two libraries print them), and read as "something broke".
#: :func:`quiet_import` drops these and passes anything else on.
IMPORT_NOISE = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",  # absl: logging not set up
    "oneDNN custom operations are on",  # INFO: oneDNN on (the setup cell turns it on, for memory statistics)
    "This TensorFlow binary is optimized to use available CPU instructions",  # INFO: the wheel's CPU baseline
    "To enable the following instructions:",  # the second line of the one above
    "Unable to register cuDNN factory", "Unable to register cuBLAS factory",  # GPU wheels: a plugin loaded twice
    "Unable to register cuFFT factory", "computation placer already registered",
)


def quiet_import() -> None:
    """Import TensorFlow and Keras with :data:`IMPORT_NOISE` removed from what they print to stderr.

    The lines come from C++ code, below Python's ``sys.stderr``, so they are caught at the file
    descriptor (``wurlitzer``); any other line is printed again. Without ``wurlitzer`` (Windows),
    a plain import.
    """
    if "tensorflow" in sys.modules and "keras" in sys.modules:
        return
    try:
        from wurlitzer import pipes
    except ImportError:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
        return
    with pipes() as (out, err):
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    text = out.read()
    if text:
        sys.stdout.write(text)
    kept = drop_import_noise(err.read())
    if kept:
        print(kept, file=sys.stderr)


def drop_import_noise(text: str) -> str:
    """``text`` without the lines of :data:`IMPORT_NOISE` (and blank lines)."""
    return "\n".join(ln for ln in text.splitlines() if ln.strip() and not any(n in ln for n in IMPORT_NOISE))


def setup() -> None:
    """What the setup cell does after installing: memory growth on, oneDNN on, TensorFlow's INFO and WARNING lines off,
    a quiet import, CPU memory statistics where oneDNN is off, then :func:`check_versions` and :func:`platform_notes`.

    oneDNN is TensorFlow's default only on CPUs with AVX-512 and newer; without it TensorFlow keeps
    no CPU allocator statistics and ``tf.config.experimental.get_memory_info("CPU:0")`` raises, which
    topic 03 relies on. Like memory growth it must be set before TensorFlow starts, and a value you
    set yourself is kept.
    """
    allow_gpu_memory_growth()
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    # TensorFlow's INFO and WARNING lines (profiler sessions, the first XLA compile, tf.data under a
    # strategy) read as errors in red; errors still show. The same level `make lab` sets; yours is kept.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    quiet_import()
    bfc = keep_cpu_memory_statistics()
    check_versions()
    for note in platform_notes(bfc_allocator=bfc):
        print(note)
    require_gpu_if_asked()


def onednn_enabled() -> bool | None:
    """Whether this TensorFlow runs its oneDNN kernels (``TF_ENABLE_ONEDNN_OPTS`` as TensorFlow read it).

    False for a build without oneDNN (TensorFlow's macOS wheels have none: no ``_MklMatMul``, no
    ``MklCPUAllocator`` in their libraries) and where oneDNN was turned off; None when TensorFlow cannot
    say (not installed, or its private flag moved). Imports TensorFlow; does not start its runtime.
    """
    try:
        from tensorflow.python.util import _pywrap_util_port  # private; present from TF 2.4 to 2.21 at least
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


#: TensorFlow's switch for a BFC allocator on the CPU (read when its runtime creates the CPU device).
CPU_BFC = "TF_CPU_ALLOCATOR_USE_BFC"


def keep_cpu_memory_statistics() -> bool:
    """Where oneDNN is off, turn on TensorFlow's BFC CPU allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``); True if set.

    Without oneDNN TensorFlow's default CPU allocator keeps no statistics, so
    ``tf.config.experimental.get_memory_info("CPU:0")`` raises ``ValueError: Allocator stats not available``
    and topic 03 could not measure anything on a CPU. The BFC allocator keeps them. TensorFlow reads the
    variable when its runtime creates the CPU device, so this works after the import but not once an op
    has run. A value you set yourself is kept. Unlike oneDNN's allocator, it also counts tensors under
    256 KiB. The variable is not recorded as set by the course: a fresh-process probe keeps it, so that it
    measures what the notebook's kernel would.
    """
    if CPU_BFC in os.environ or onednn_enabled() is not False:
        return False
    os.environ[CPU_BFC] = "true"
    return True


def _metal_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("tensorflow-metal")
    except metadata.PackageNotFoundError:
        return None


def platform_notes(bfc_allocator: bool = False, system: str | None = None, onednn: bool | None | str = "ask",
                   metal: str | None = "ask") -> list[str]:
    """What behaves differently here than on the Linux x86-64 machines the course is tested on (empty: nothing).

    ``bfc_allocator``: :func:`keep_cpu_memory_statistics` turned the BFC CPU allocator on. ``system``
    (default ``sys.platform``), ``onednn`` (default :func:`onednn_enabled`) and ``metal`` (the installed
    ``tensorflow-metal`` version, default: looked up) can be given to see another machine's notes. Nothing
    here lists devices, so ``CUDA_VISIBLE_DEVICES`` and topic 01's device settings still work afterwards.
    """
    system = sys.platform if system is None else system
    onednn = onednn_enabled() if onednn == "ask" else onednn
    metal = _metal_version() if metal == "ask" else metal
    notes = []
    if system == "darwin":
        notes.append("macOS: TensorFlow has no CUDA build for macOS, so there is no NVIDIA GPU here: the notebooks "
                     "take their CPU path" + (" (tensorflow-metal: see below)." if metal else "."))
    if onednn is False:
        note = ("oneDNN is off in this TensorFlow (its macOS build has none; elsewhere TF_ENABLE_ONEDNN_OPTS=0 "
                "turns it off): the CPU runs TensorFlow's own Eigen kernels, on which CI checks the notebooks too.")
        if bfc_allocator:
            note += (f" For topic 03's CPU memory statistics (get_memory_info) the course set {CPU_BFC}=true: "
                     "TensorFlow's BFC allocator keeps them. Unlike oneDNN's allocator it also counts tensors "
                     "under 256 KiB, so 03's smallest measurements come out larger than its text says.")
        notes.append(note)
    if metal:
        notes.append(f"tensorflow-metal {metal} is installed: TensorFlow shows the Apple GPU as a GPU device "
                     "(named METAL), which is not an NVIDIA GPU. The notebooks are written and tested for NVIDIA "
                     "GPUs and CPUs: their NVIDIA tools (nvidia-smi, NVML, compute capability, Tensor Cores, the "
                     "data-sheet peaks) say they do not apply to it, and GPU cells may fail on it. To run the "
                     "course as tested, on the CPU: pip uninstall tensorflow-metal, then restart the kernel.")
    return notes


def require_gpu_if_asked() -> None:
    """With ``GPUCOURSE_REQUIRE_GPU=1`` (``make test-gpu``, the GPU CI job), fail unless TensorFlow sees a GPU.

    Every notebook takes its CPU path when no GPU is visible, which is right for a learner but would let
    a GPU test pass without ever touching the GPU (a CPU-only TensorFlow, a CUDA library that failed
    to load). Listing the physical GPUs does not start TensorFlow's runtime, so the notebook can still
    configure its devices afterwards.
    """
    if os.environ.get("GPUCOURSE_REQUIRE_GPU") != "1":
        return
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        raise RuntimeError("GPUCOURSE_REQUIRE_GPU=1 but TensorFlow sees no GPU, so this notebook would silently "
                           "run on the CPU. Check `nvidia-smi` and that TensorFlow is the CUDA build "
                           "(pip install 'tensorflow[and-cuda]'), or unset GPUCOURSE_REQUIRE_GPU.")


def _v(text: str) -> tuple[int, ...]:
    out = []
    for part in str(text).split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def version_problems() -> list[str]:
    """TensorFlow, Keras or ipywidgets versions the notebooks were not written for (empty if none).

    Importing TensorFlow here does not initialise its runtime, so device setup can still follow.
    """
    problems = []
    try:
        import tensorflow as tf

        if _v(tf.__version__) < (2, 16):
            problems.append(f"TensorFlow {tf.__version__} is too old (Keras 3 arrived in 2.16); "
                            "upgrade with: pip install -U 'tensorflow>=2.19'")
        elif not _in_range("tensorflow", tf.__version__):
            problems.append(f"TensorFlow {tf.__version__} is outside the tested range {_range('tensorflow')}: "
                            "most cells will work, but stored outputs and error texts may differ")
    except ImportError:
        problems.append("TensorFlow is not installed: run `make lab` locally, or pip install tensorflow-cpu")
    try:
        import keras

        if _v(keras.__version__) < (3, 0):
            problems.append(f"Keras {keras.__version__} is Keras 2; the course needs Keras 3 "
                            "(unset TF_USE_LEGACY_KERAS and restart)")
        elif not _in_range("keras", keras.__version__):
            problems.append(f"Keras {keras.__version__} is outside the tested range {_range('keras')}: "
                            "most cells will work, but stored outputs and error texts may differ")
    except ImportError:
        problems.append("Keras is not installed")
    try:
        import ipywidgets

        if not (7, 7) <= _v(ipywidgets.__version__) < (9, 0):
            problems.append(f"ipywidgets {ipywidgets.__version__} is outside 7.7-8.x; widgets may not render")
    except ImportError:
        problems.append("ipywidgets is missing: widgets will fall back to text")
    return problems


def _range(package: str) -> str:
    lo, hi = TESTED[package]
    return f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}"


def _in_range(package: str, version: str) -> bool:
    lo, hi = TESTED[package]
    return lo <= _v(version) <= hi


def _version(package: str) -> str:
    """``package.__version__``, or "missing" when it cannot be imported (version_problems() says why)."""
    import importlib

    try:
        return importlib.import_module(package).__version__
    except ImportError:
        return "missing"


def check_versions() -> None:
    """Print which environment this is and the tested range; warn about each of :func:`version_problems`."""
    problems = version_problems()
    print(f"gpucourse ready ({platform()}; TensorFlow {_version('tensorflow')}, Keras {_version('keras')}; "
          f"tested with TensorFlow {_range('tensorflow')}, Keras {_range('keras')})")
    for p in problems:
        warnings.warn(p, stacklevel=2)
