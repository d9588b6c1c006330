"""The CI workflow runs the same suite on a CPU job and a self-hosted GPU job; what each part of it checks."""

import re
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def _workflow():
    return yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())


def test_cpu_and_gpu_jobs_run_the_same_suite():
    jobs = _workflow()["jobs"]
    assert set(jobs) == {"cpu", "gpu", "pages"}
    runs = {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in jobs.items()}
    assert runs["cpu"][:4] == ["make test", "make test-cpu-paths", "make test-colab", "make site"], runs["cpu"]
    assert any(r.startswith("make test TF=gpu") for r in runs["gpu"]), "GPU job must use the GPU wheel"
    labels = jobs["gpu"]["runs-on"]
    assert "self-hosted" in labels and "gpu" in labels
    assert jobs["gpu"]["env"]["GPUCOURSE_REQUIRE_GPU"] == "1"


def test_the_cpu_path_step_runs_in_ci_after_make_test():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("test-cpu-paths: env", 1)[1].split("\n\n", 1)[0]
    assert ".ci/cpu_paths.py" in recipe
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [ln for ln in run if ln.startswith("make ")]
    assert commands == ["make test", "make test-cpu-paths", "make test-colab"], commands


def test_gpu_extra_exists_in_makefile():
    make = (ROOT / "Makefile").read_text()
    assert 'pip install --quiet -e ".[$(TF),lab,dev,site]"' in make


def test_the_website_is_published_from_main_only_after_the_tests():
    jobs = _workflow()["jobs"]
    cpu_steps = jobs["cpu"]["steps"]
    upload = next(s for s in cpu_steps if "upload-pages-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "_build/site"
    make = (ROOT / "Makefile").read_text()
    assert "SITE_OUT ?= _build/site" in make
    pages = jobs["pages"]
    assert pages["needs"] == "cpu" and "refs/heads/main" in pages["if"] and "push" in pages["if"]
    assert any("deploy-pages" in s.get("uses", "") for s in pages["steps"])
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}


@pytest.mark.gpu
def test_gpu_is_visible_to_tensorflow():
    import tensorflow as tf

    assert tf.config.list_physical_devices("GPU"), "the GPU job's TensorFlow does not see the GPU"


def test_labs_and_solutions_run_once_through_the_grader():
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "notebooks" in ini["testpaths"], "nbval must run every tutorial"
    assert "labs" not in ini["testpaths"] and "solutions" not in ini["testpaths"], \
        "labs and solutions already run in tests/grading/grader/test_grade_labs.py and tests/grading/grader/test_grade_solutions.py"
    for name in ("test_grade_labs.py", "test_grade_solutions.py"):
        assert (ROOT / "tests" / "grading" / "grader" / name).is_file(), \
            f"tests/grading/grader/{name} is what executes them: it must exist"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_stored_solution_checks_show_full_marks(path):
    """What nbval compared in solutions/: the stored check() outputs. The grader test proves a fresh run
    scores full marks; this proves the stored outputs a reader sees say the same."""
    nb = nbformat.read(path, as_version=4)
    checked = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# NBVAL_CHECK_OUTPUT")]
    assert checked, f"{path.name} has no checked check() cells"
    for cell in checked:
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert text.strip(), f"{path.name}: a checked cell has no stored output: {cell.source[:80]!r}"
        assert not re.search("❌|📝|💥", text), f"{path.name}: a stored check did not pass:\n{text}"
    scores = re.findall(r"Score: (\d+)/(\d+)", "".join(str(o.get("text", "")) for c in checked for o in c.outputs))
    assert scores and all(a == b for a, b in scores), f"{path.name}: stored score is not full marks: {scores}"


def test_ci_prints_the_time_of_each_phase_also_when_one_fails(tmp_path):
    """`.ci/run` with a stand-in `make` (first on PATH) that fails in test-colab: each phase's time, then all."""
    import os
    import shutil
    import subprocess

    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text('#!/bin/sh\necho "stand-in make $*"\n[ "$1" = test-colab ] && exit 3\nexit 0\n')
    (bin_dir / "make").chmod(0o755)
    proc = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"^== make test took \d+ s$", out, re.M), out
    assert re.search(r"^== make test-cpu-paths took \d+ s$", out, re.M), out
    summary = out.split("== CI phase times\n", 1)[1]
    assert re.search(r"make test: \d+ s\n  make test-cpu-paths: \d+ s\n  the phase that failed \(exit code 3\): "
                     r"\d+ s\n  total: \d+ s", summary), summary
