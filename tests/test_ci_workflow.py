"""The CI workflow runs the same suite on a CPU job and a self-hosted GPU job."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _workflow():
    return yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())


def test_cpu_and_gpu_jobs_run_the_same_suite():
    jobs = _workflow()["jobs"]
    assert set(jobs) == {"cpu", "gpu"}
    runs = {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in jobs.items()}
    assert "make test" in runs["cpu"]
    assert any(r.startswith("make test TF=gpu") for r in runs["gpu"]), "GPU job must use the GPU wheel"
    labels = jobs["gpu"]["runs-on"]
    assert "self-hosted" in labels and "gpu" in labels
    assert jobs["gpu"]["env"]["GPUCOURSE_REQUIRE_GPU"] == "1"


def test_gpu_extra_exists_in_makefile():
    make = (ROOT / "Makefile").read_text()
    assert 'pip install --quiet -e ".[$(TF),dev]"' in make


@pytest.mark.gpu
def test_gpu_is_visible_to_tensorflow():
    import tensorflow as tf

    assert tf.config.list_physical_devices("GPU"), "the GPU job's TensorFlow does not see the GPU"
