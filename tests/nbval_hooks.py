"""pytest plugin (loaded with ``-p tests.nbval_hooks``) adapting nbval to this course.

* TensorFlow's C++ logging goes to stderr and differs between runs and
  machines: stderr is never compared, only stdout and results.
* ``TF_CPP_MIN_LOG_LEVEL=2`` is set before any kernel starts, so kernels inherit it.
* ``TF_FORCE_GPU_ALLOW_GROWTH=true`` likewise (no effect without a GPU). On a GPU machine the suite runs
  many TensorFlow processes on the same GPU at once: two pytest workers (which import TensorFlow
  themselves), their notebook kernels and fresh subprocesses. Without growth the first one to start
  reserves nearly the whole GPU and the others fail for lack of memory. Tests that study the default
  (greedy) behaviour pass ``TF_FORCE_GPU_ALLOW_GROWTH=false`` explicitly.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")


def pytest_collectstart(collector):
    """Drop stderr from nbval's output comparison for every notebook."""
    if str(getattr(collector, "path", "")).endswith(".ipynb") and hasattr(collector, "skip_compare"):
        collector.skip_compare = tuple(collector.skip_compare) + ("stderr",)
