"""pytest plugin (loaded with ``-p tests.nbval_hooks``) adapting nbval to this course.

* TensorFlow's C++ logging goes to stderr and differs between runs and
  machines: stderr is never compared, only stdout and results.
* ``TF_CPP_MIN_LOG_LEVEL=2`` is set before any kernel starts, so kernels inherit it.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collectstart(collector):
    """Drop stderr from nbval's output comparison for every notebook."""
    if str(getattr(collector, "path", "")).endswith(".ipynb") and hasattr(collector, "skip_compare"):
        collector.skip_compare = tuple(collector.skip_compare) + ("stderr",)
