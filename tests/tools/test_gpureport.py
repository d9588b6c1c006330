"""gpucourse.gpureport (`make test-gpu`): refusal without a GPU, the plan, JUnit results, the report's format."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucourse.tools import gpureport

ROOT = Path(__file__).resolve().parents[2]
JUNIT = ROOT / "tests" / "fixtures" / "junit_nbval_and_grader.xml"  # real pytest + nbval output


def _smi(stdout="", returncode=0):
    return lambda argv, **kw: SimpleNamespace(stdout=stdout, returncode=returncode, argv=argv)


def test_nvidia_smi_rows_become_gpus():
    out = "NVIDIA H200, 9.0, 143771, 580.95.05\nTesla T4, 7.5, 15360, 535.104.05\n"
    gpus = gpureport.query_gpus(_smi(out))
    assert gpus == [{"name": "NVIDIA H200", "compute_cap": "9.0", "memory.total": "143771", "driver_version": "580.95.05"},
                    {"name": "Tesla T4", "compute_cap": "7.5", "memory.total": "15360", "driver_version": "535.104.05"}]


def _missing(argv, **kw):
    raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")


@pytest.mark.parametrize("run", [_missing, _smi("", 9), _smi("No devices were found\n")],
                         ids=["no nvidia-smi", "driver error", "no devices"])
def test_no_gpu_means_an_empty_list_and_a_clear_refusal(run):
    assert gpureport.query_gpus(run) == []
    with pytest.raises(gpureport.NoGpuError, match="needs an NVIDIA GPU.*Nothing was installed.*make test"):
        gpureport.preflight(gpureport.query_gpus(run))


@pytest.mark.skipif(bool(gpureport.query_gpus()), reason="this machine has an NVIDIA GPU: make test-gpu would run")
def test_make_test_gpu_stops_at_once_on_a_machine_without_a_gpu_before_installing():
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no nvidia-smi here (nor on any CPU-only machine)
    proc = subprocess.run(["make", "--no-print-directory", "test-gpu", "GPU_VENV=/nonexistent-gpu-venv",
                           f"PYTHON={sys.executable}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "needs an NVIDIA GPU" in proc.stderr and "Nothing was installed" in proc.stderr
    assert not Path("/nonexistent-gpu-venv").exists()


def test_tensorflow_without_a_gpu_names_the_build_or_the_library():
    def fake_tf(cuda):
        return SimpleNamespace(__version__="2.21.0",
                               config=SimpleNamespace(list_physical_devices=lambda kind: []),
                               sysconfig=SimpleNamespace(get_build_info=lambda: (
                                   {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
                                   if cuda else {"is_cuda_build": False})))
    with pytest.raises(gpureport.NoGpuError, match="CPU-only build"):
        gpureport.require_tensorflow_gpu(fake_tf(False))
    with pytest.raises(gpureport.NoGpuError, match="could not load a CUDA library.*TF_CPP_MIN_LOG_LEVEL=0"):
        gpureport.require_tensorflow_gpu(fake_tf(True))


def test_the_plan_runs_every_notebook_kind_and_the_gpu_tests_with_the_gpu_required(tmp_path):
    steps = gpureport.plan("/venv/bin/python", tmp_path, jobs=4)
    argv = [" ".join(s.argv) for s in steps]
    assert any(" notebooks " in a for a in argv)
    assert any("test_grade_solutions.py" in a and "test_grade_labs.py" in a for a in argv)
    assert any("tests -m gpu" in a for a in argv)
    for s in steps:
        assert s.env["GPUCOURSE_REQUIRE_GPU"] == "1"
        assert s.argv[:3] == ["/venv/bin/python", "-m", "pytest"] and "-n 4" in " ".join(s.argv)
        assert f"--junitxml={s.junit}" in s.argv and Path(s.junit).parent == tmp_path
    with pytest.raises(ValueError, match="jobs must be"):
        gpureport.plan("python", tmp_path, jobs=0)


def test_every_step_runs_even_after_one_fails(tmp_path):
    seen = []

    def run(argv, cwd, env):
        seen.append(env["GPUCOURSE_REQUIRE_GPU"])
        return SimpleNamespace(returncode=1 if len(seen) == 1 else 0)

    codes = gpureport.run_plan(gpureport.plan("python", tmp_path), run=run, echo=lambda *a: None)
    assert list(codes.values()) == [1, 0, 0] and seen == ["1", "1", "1"]


def test_junit_results_per_notebook_with_the_exception_line():
    res = gpureport.notebook_results([JUNIT, "/no/such/step.xml"])
    assert res["notebooks/05_x.ipynb"] == {"passed": 1, "failed": 1, "skipped": 0,
                                           "first_error": "Cell 1: ValueError: boom"}
    assert res["solutions/05_x.ipynb"]["failed"] == 0
    assert res["solutions/06_y.ipynb"]["first_error"].startswith("test_solution_scores_full_marks[06_y]: AssertionError")
    assert "the step did not run" in res["(step.xml)"]["first_error"]


def _measured():
    return {"date": "2026-11-25",
            "gpu": {"name": "Tesla T4", "compute_capability": "7.5", "memory_mib": 15360, "driver": "535.104.05", "count": 1},
            "tensorflow": {"version": "2.21.0", "cuda": "12.5.1", "cudnn": "9"},
            "datasheet": "NVIDIA T4 data sheet",
            "matmul": [{"dtype": "float32", "device": "GPU:0", "best_tflops": 4.1, "best_shape": [4096, 4096, 4096]},
                       {"dtype": "float16", "device": "GPU:0", "best_tflops": 26.0, "best_shape": [8192, 8192, 8192]}],
            "roof": {"name": "this machine (GPU:0)", "peaks": {"float32": 4.1, "float16": 26.0}, "bandwidth_gbs": 250.0,
                     "source": "measured"},
            "ratios": [{"what": "matmul, float16 vs float32 (TF32 off)", "claim": "at most 8.0x", "measured": 6.3,
                        "ceiling": 8.0},
                       {"what": "training step", "claim": "at most 8.0x", "measured": 9.9, "ceiling": 8.0}],
            "benchmark": [{"topic": "06 XLA", "case": "gelu_chain jit_compile", "median_s": 0.001, "bound_s": 0.0005,
                           "ratio_to_bound": 2.0, "speedup": 3.0, "note": "n"}]}


def test_the_report_lists_machine_notebooks_peaks_and_ratios():
    report = gpureport.format_report(_measured(), gpureport.notebook_results([JUNIT]), {"tutorials (nbval)": 1})
    assert report.startswith("# GPU report: Tesla T4, 2026-11-25")
    assert "2 failing test(s)" in report
    assert "| Tesla T4 | 7.5 | 15360 MiB | 535.104.05 | 1 | 2.21.0 | 12.5.1 | 9 |" in report
    assert "| notebooks/05_x.ipynb | 1 | 1 | 0 | Cell 1: ValueError: boom |" in report
    assert "| float16 | 26.0 | 8192x8192x8192 | 65 | 40% |" in report
    assert "| matmul, float16 vs float32 (TF32 off) | at most 8.0x | 6.30x | yes |" in report
    assert "| training step | at most 8.0x | 9.90x | NO: above the ceiling |" in report
    assert "| 06 XLA | gelu_chain jit_compile | 1.00 ms | 0.50 ms | 2.00x | 3.00x | n |" in report
    assert "## The roofline: measured beside the data sheet" in report
    assert "| memory GB/s | 250 | 320 | 78% |" in report  # T4: 320 GB/s on its data sheet


def test_a_notebook_falls_back_to_the_cpu_only_when_no_gpu_is_required(monkeypatch):
    import tensorflow as tf

    from gpucourse import colab

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])  # as on a CPU-only machine
    monkeypatch.delenv("GPUCOURSE_REQUIRE_GPU", raising=False)
    colab.require_gpu_if_asked()  # a learner without a GPU: the CPU path, no error
    monkeypatch.setenv("GPUCOURSE_REQUIRE_GPU", "1")
    with pytest.raises(RuntimeError, match="TensorFlow sees no GPU, so this notebook would silently run on the CPU"):
        colab.require_gpu_if_asked()


def test_the_claimed_ceilings_are_notebook_05s_data_sheet_ratios():
    t4 = {"device_type": "GPU", "device_name": "Tesla T4", "compute_capability": (7, 5)}
    a100 = {"device_type": "GPU", "device_name": "NVIDIA A100-SXM4-80GB", "compute_capability": (8, 0)}
    assert gpureport._ceiling(t4, "float16", tf32=True) == pytest.approx(65 / 8.1)
    assert gpureport._ceiling(a100, "bfloat16", tf32=True) == pytest.approx(2.0)
    assert gpureport._ceiling(a100, "bfloat16", tf32=False) == pytest.approx(312 / 19.5)
    assert gpureport._ceiling(t4, "bfloat16", tf32=True) is None  # no bfloat16 Tensor Cores: no claim


def test_measuring_refuses_a_machine_whose_tensorflow_sees_no_gpu(monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    with pytest.raises(gpureport.NoGpuError):
        gpureport.measure(echo=lambda *a: None)
