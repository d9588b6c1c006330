"""Colab support: one setup cell and one badge, identical in every notebook.

Every notebook's first code cell is exactly :data:`SETUP_CELL` (a test checks
that). Locally, `make lab` has already installed the helpers and the cell only
checks versions. In Colab it installs this package from the repository *without
its dependencies*, so Colab's own TensorFlow and ipywidgets 7.7 are never
replaced, then warns about any version the course was not written for.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["REPO", "BRANCH", "SETUP_CELL", "badge", "colab_url", "check_versions", "in_colab", "version_problems"]

#: Packages the setup cell installs *with* their dependencies: none of them may pull in TensorFlow,
#: Keras or ipywidgets (tests/test_notebook_structure.py checks their metadata).
COLAB_WITH_DEPS = ("tensorboard-plugin-profile",)

#: GitHub "owner/name" of this course (used by badges and the Colab install).
REPO = "tf-gpu-course/tf-gpu-acceleration"
BRANCH = "main"

SETUP_CELL = f"""\
# Setup (run first). In Colab this installs the course helpers without touching
# Colab's own TensorFlow or ipywidgets; locally `make lab` already installed them.
import sys
if "google.colab" in sys.modules:
    %pip install -q --no-deps "gpucourse @ git+https://github.com/{REPO}@{BRANCH}" wurlitzer nvidia-ml-py
    %pip install -q tensorboard-plugin-profile  # reads profiler traces (topic 08); needs no TensorFlow
from gpucourse import colab
colab.check_versions()"""


def in_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules


def colab_url(path: str) -> str:
    """Colab URL that opens ``path`` (relative to the repository root) from GitHub."""
    if not isinstance(path, str) or not path.endswith(".ipynb"):
        raise ValueError(f"path must be a notebook path like 'notebooks/01_x.ipynb', got {path!r}")
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/{path.lstrip('/')}"


def badge(path: str) -> str:
    """Markdown for the Open-in-Colab badge of ``path``."""
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(path)})")


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
                            "upgrade with: pip install -U 'tensorflow>=2.20'")
    except ImportError:
        problems.append("TensorFlow is not installed: run `make lab` locally, or pip install tensorflow-cpu")
    try:
        import keras

        if _v(keras.__version__) < (3, 0):
            problems.append(f"Keras {keras.__version__} is Keras 2; the course needs Keras 3 "
                            "(unset TF_USE_LEGACY_KERAS and restart)")
    except ImportError:
        problems.append("Keras is not installed")
    try:
        import ipywidgets

        if not (7, 7) <= _v(ipywidgets.__version__) < (9, 0):
            problems.append(f"ipywidgets {ipywidgets.__version__} is outside 7.7-8.x; widgets may not render")
    except ImportError:
        problems.append("ipywidgets is missing: widgets will fall back to text")
    return problems


def check_versions() -> None:
    """Print which environment this is and warn about each of :func:`version_problems`."""
    problems = version_problems()
    import tensorflow as tf

    print(f"gpucourse ready ({'Colab' if in_colab() else 'local'}; TensorFlow {tf.__version__})")
    for p in problems:
        warnings.warn(p, stacklevel=2)
