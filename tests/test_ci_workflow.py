"""The CI workflow runs the same suite on a CPU job and a self-hosted GPU job; what each part of it checks."""

import importlib.util
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


def _cpu_paths():
    spec = importlib.util.spec_from_file_location("cpu_paths", ROOT / ".ci" / "cpu_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("avx512", [True, False], ids=["AVX-512 CPU", "AVX2 CPU"])
def test_ci_reruns_the_checked_outputs_on_other_cpu_code_paths(avx512):
    """A checked output that holds only on the CPU that stored it fails CI, not a learner's `make test`."""
    paths = _cpu_paths()
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    steps = paths.plan(notebooks, avx512)
    runs = {name: run for name, env, run, notes in steps}
    envs = {name: env for name, env, run, notes in steps}
    assert {"ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"} in envs.values()
    assert {"TF_ENABLE_ONEDNN_OPTS": "0"} in envs.values()
    for nb in notebooks:  # every tutorial runs on at least two paths unlike the default, one of them oneDNN-capped
        on = [name for name, run in runs.items() if nb in run]
        assert len(on) >= (1 if nb.name[:2] in paths.NEEDS_ONEDNN else 2), (nb.name, on)
        assert any("ONEDNN_MAX_CPU_ISA" in envs[name] for name in on), (nb.name, on)
    avx2 = next(run for name, run in runs.items() if envs[name].get("ONEDNN_MAX_CPU_ISA") == "AVX2")
    crash = {nb.name[:2] for nb in notebooks} - {nb.name[:2] for nb in avx2}
    assert crash == (set(paths.BFLOAT16) & {nb.name[:2] for nb in notebooks} if avx512 else set())
    for name, env, run, notes in steps:
        left_out = {nb.name[:2] for nb in notebooks} - {nb.name[:2] for nb in run}
        if "AVX512_CORE" not in env.get("ONEDNN_MAX_CPU_ISA", ""):
            assert {n[:2] for n in notes} == left_out, f"{name}: every notebook left out is named with its reason"


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
        assert (ROOT / "tests" / "grading" / name).is_file(), f"tests/grading/{name} is what executes them: it must exist"


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
