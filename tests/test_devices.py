"""gpucourse.devices: report, doctor, logical-device setup (each in a fresh TensorFlow process)."""

import json

import pytest

from gpucourse import devices


def test_report_does_not_start_the_runtime(fresh_python):
    out = fresh_python(
        "from gpucourse import devices\n"
        "r = devices.device_report()\n"
        "print(devices.runtime_initialized(), r.logical is None, r.has_gpu == bool(r.gpu_count))\n"
        "print(r.to_text())\n"
        "r2 = devices.device_report(initialize=True)\n"
        "print(devices.runtime_initialized(), len(r2.logical) >= 1)\n")
    lines = out.splitlines()
    assert lines[0] == "False True True"
    assert "TensorFlow" in out and "physical devices" in out and "CUDA_VISIBLE_DEVICES" in out
    assert lines[-1] == "True True"


def test_report_rejects_bad_argument():
    with pytest.raises(TypeError, match="initialize"):
        devices.device_report(initialize="yes")


def test_setup_is_idempotent_and_explains_restart(fresh_python):
    out = fresh_python(
        "from gpucourse import devices\n"
        "a = devices.setup_logical_devices(3, device_type='CPU')\n"
        "b = devices.setup_logical_devices(3, device_type='CPU')\n"
        "print(len(a), [d.name for d in a] == [d.name for d in b])\n"
        "try:\n"
        "    devices.setup_logical_devices(2, device_type='CPU')\n"
        "except devices.TooLateError as e:\n"
        "    print('TOO LATE', e)\n")
    assert out.startswith("3 True")
    assert "TOO LATE" in out and "Restart the kernel" in out and "3 logical CPU" in out


def test_setup_after_an_op_without_config(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse import devices\n"
        "tf.constant(1) + 1\n"
        "print(len(devices.setup_logical_devices(1, device_type='CPU')))\n"
        "try:\n    devices.setup_logical_devices(4, device_type='CPU')\n"
        "except devices.TooLateError as e:\n    print('restart' in str(e).lower())\n")
    assert out.split() == ["1", "True"]


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, "n must be"), ({"n": 2.5}, "n must be"), ({"n": True}, "n must be"),
    ({"n": 2, "device_type": "TPU"}, "device_type"),
    ({"n": 2, "memory_limit_mb": -5}, "memory_limit_mb"),
    ({"n": 2, "memory_limit_mb": 512, "device_type": "CPU"}, "GPU feature"),
])
def test_setup_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        devices.setup_logical_devices(**kwargs)


def _facts(**over):
    base = dict(tf_version="2.21.0", keras_version="3.15.1", python_version="3.11.7", is_cuda_build=True,
                cuda_version="12.5", cudnn_version="9", tf_gpus=1, driver_gpus=1, cuda_visible_devices=None,
                ipywidgets_version="8.1.5", allow_growth_env=None)
    base.update(over)
    return base


@pytest.mark.parametrize("over, level, words", [
    ({}, "ok", "1 GPU"),
    ({"is_cuda_build": False, "tf_gpus": 0}, "error", "CPU-only build"),
    ({"tf_gpus": 0, "cuda_visible_devices": "-1"}, "error", "hides all"),
    ({"tf_gpus": 0, "cuda_visible_devices": ""}, "error", "hides all"),
    ({"tf_gpus": 0}, "error", "TensorFlow sees none"),
    ({"tf_gpus": 0, "driver_gpus": 0}, "warning", "no NVIDIA driver"),
    ({"is_cuda_build": False, "tf_gpus": 0, "driver_gpus": 0}, "ok", "CPU path"),
    ({"tf_version": "2.12.0"}, "error", "older than"),
    ({"tf_version": "2.19.1"}, "warning", "not the tested"),
    ({"keras_version": "2.15.0"}, "error", "Keras 2"),
    ({"keras_version": None}, "error", "not installed"),
    ({"allow_growth_env": "yes"}, "warning", "TF_FORCE_GPU_ALLOW_GROWTH"),
    ({"ipywidgets_version": "7.6.5"}, "warning", "older than 7.7"),
])
def test_doctor_diagnoses(over, level, words):
    found = devices.doctor(_facts(**over), show=False)
    assert found[0].level == level, [str(f) for f in found]
    assert any(words in f.problem for f in found if f.level == level), [str(f) for f in found]
    if level != "ok":
        assert all(f.fix for f in found if f.level != "ok"), "every problem needs a fix"


def test_doctor_bad_input():
    with pytest.raises(TypeError):
        devices.doctor(["not", "a", "dict"], show=False)
    with pytest.raises(ValueError, match="missing"):
        devices.doctor({"tf_version": "2.21.0"}, show=False)


def test_doctor_on_this_machine(capsys):
    found = devices.doctor()
    assert found and "[" in capsys.readouterr().out


def test_fresh_process_sees_cuda_visible_devices():
    seen = devices.fresh_process_devices({"CUDA_VISIBLE_DEVICES": "-1"})
    assert not [n for n, t in seen["physical"] if t == "GPU"]
    assert ("/device:CPU:0", "CPU") in seen["logical"]
    with pytest.raises(TypeError):
        devices.fresh_process_devices({"CUDA_VISIBLE_DEVICES": -1})


def test_nvml_without_driver_is_empty_list():
    gpus = devices.nvml_gpus()
    assert isinstance(gpus, list)
    assert json.dumps([str(g) for g in gpus])  # printable


@pytest.mark.gpu
def test_gpu_path_splits_into_virtual_gpus(fresh_python):
    out = fresh_python("import tensorflow as tf\nfrom gpucourse import devices\n"
                       "print(len(devices.setup_logical_devices(2, memory_limit_mb=512)))\n"
                       "print(devices.device_report().gpu_count)\n"
                       "first = tf.config.list_physical_devices('GPU')[0]\n"
                       "print([c.memory_limit for c in tf.config.get_logical_device_configuration(first)])\n"
                       "print(len(devices.setup_logical_devices(2, memory_limit_mb=512)))\n"
                       "try:\n    devices.setup_logical_devices(3, memory_limit_mb=512)\n"
                       "except devices.TooLateError:\n    print('too late')\n")
    lines = out.splitlines()
    logical, physical = int(lines[0]), int(lines[1])
    assert physical >= 1 and logical == physical + 1  # GPU 0 split in two; any other GPU stays whole
    assert lines[2] == "[512, 512]" and int(lines[3]) == logical and lines[4] == "too late"
