"""A Mac: an Apple GPU under tensorflow-metal, TensorFlow without oneDNN. Every NVIDIA-only helper says so clearly.

tensorflow-metal adds the Apple GPU as a PluggableDevice of type GPU. TensorFlow's
``PluggableDeviceFactory::GetDeviceDetails`` reports only ``device_name`` for it, which is ``METAL`` (TensorFlow's log
on a Mac: "physical PluggableDevice (device: 0, name: METAL, pci bus id: <undefined>)"): no compute capability. The
fake below is exactly that, on this machine, which like a Mac has no NVIDIA driver (no NVML, no nvidia-smi).
"""

import shutil
import warnings

import pytest

from gpucourse import colab, devices, gpureport, monitor, precision, precision_hardware, roofline
from gpucourse._vendor import METAL, explain_not_nvidia


@pytest.fixture
def metal_gpu(monkeypatch):
    """This CPU-only TensorFlow reports one GPU as tensorflow-metal's: {'device_name': 'METAL'} and nothing else."""
    import tensorflow as tf

    real_list = tf.config.list_physical_devices
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")

    def list_physical_devices(device_type=None):
        cpus = real_list("CPU") if device_type in (None, "CPU") else []
        return cpus + ([gpu] if device_type in (None, "GPU") else [])

    monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda d: {"device_name": METAL} if d.name == gpu.name else {})
    monkeypatch.setattr(devices, "runtime_initialized", lambda: False)
    return gpu


def _says_not_nvidia(text: str) -> None:
    assert "'METAL'" in text and "is not an NVIDIA GPU" in text and "tensorflow-metal" in text, text
    assert "T4" not in text, text


def test_the_message_names_the_gpu_and_what_does_not_apply():
    text = explain_not_nvidia(METAL)
    _says_not_nvidia(text)
    for tool in ("compute capability", "Tensor Cores", "NVML", "nvidia-smi", "data-sheet"):
        assert tool in text
    assert explain_not_nvidia("Tesla T4", (7, 5)) is None
    assert "gives no name" in explain_not_nvidia(None)
    with pytest.raises(TypeError, match="name must be"):
        explain_not_nvidia(42)


def test_the_device_report_and_the_doctor_say_it_is_not_an_nvidia_gpu(metal_gpu):
    (g,) = devices.gpu_details()
    assert g.model == METAL and g.compute_capability is None and g.tensor_cores == {}
    text = devices.device_report().to_text()
    _says_not_nvidia(next(ln for ln in text.splitlines() if ln.startswith("GPU 0")))
    assert "the GPUs above are not NVIDIA GPUs (no NVML, no nvidia-smi)" in text
    facts = devices.gather_facts()
    assert facts["not_nvidia_gpus"] == [METAL] and facts["tf_gpus"] == 1 and facts["driver_gpus"] == 0
    findings = devices.doctor(facts, show=False)
    warning = next(f for f in findings if "METAL" in f.problem)
    assert warning.level == "warning" and "pip uninstall tensorflow-metal" in warning.fix
    _says_not_nvidia(warning.problem)
    assert not any(f.level == "error" for f in findings), findings


def test_mixed_precision_advice_and_bounds_never_guess_a_compute_capability(metal_gpu):
    device = precision.describe_device()
    assert device == {"device_type": "GPU", "device_name": METAL, "compute_capability": None}
    for policy in ("mixed_float16", "mixed_bfloat16"):
        bound = precision.pick_speedup_bound(device, policy)
        assert bound.matmul is None and bound.device == METAL
        _says_not_nvidia(bound.reason)
    advice = precision.recommend_policy(None, METAL)
    assert advice.policy == "float32" and "a CPU without" not in advice.reason
    _says_not_nvidia(advice.reason)
    assert "a CPU without" in precision.recommend_policy(None).reason  # no name: still the CPU's advice
    with pytest.raises(ValueError, match="cc is None.*is not an NVIDIA GPU"):
        precision.tensor_core_support(None, METAL)


def test_the_data_sheet_table_has_no_row_for_it(metal_gpu):
    for name in (METAL, "Apple M2 Max", "Apple M4"):
        assert precision_hardware.find_gpu(name) is None, name
        assert roofline.datasheet_gpu(name) is None
    assert precision_hardware.gpu_compute_capability(0) is None


def test_the_roofline_measures_float32_only_and_says_why(metal_gpu):
    with pytest.warns(UserWarning, match="'METAL' .*is not an NVIDIA GPU.*Measuring float32 only"):
        results = roofline.measure_matmul_peaks(device="GPU:0", shapes=[(32, 32, 32)], repeats=1)
    assert [r.dtype for r in results] == ["float32"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CPU: no warning, its usual dtypes
        assert [r.dtype for r in roofline.measure_matmul_peaks(device="CPU:0", shapes=[(32, 32, 32)], repeats=1)] \
            == roofline.device_dtypes("CPU")


def test_the_monitor_reads_the_cpu_and_nvidia_smi_says_what_it_cannot_read(metal_gpu, monkeypatch):
    assert list(monitor.default_sources()) == ["CPU load (psutil)"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert shutil.which("nvidia-smi") is None
    with pytest.raises(FileNotFoundError, match="Apple GPU under tensorflow-metal has neither"):
        monitor.read_nvidia_smi_utilisation()


def test_make_test_gpu_stops_and_says_an_apple_gpu_is_not_one(metal_gpu):
    with pytest.raises(gpureport.NoGpuError, match="Apple GPU under tensorflow-metal is not an NVIDIA GPU"):
        gpureport.preflight([])


def test_the_setup_cell_says_what_differs_on_a_mac():
    notes = colab.platform_notes(bfc_allocator=True, system="darwin", onednn=False, metal="1.2.0")
    text = "\n".join(notes)
    assert notes[0].startswith("macOS: TensorFlow has no CUDA build for macOS") and "CPU path" in notes[0]
    assert "oneDNN is off" in text and "TF_CPU_ALLOCATOR_USE_BFC=true" in text and "256 KiB" in text
    assert "tensorflow-metal 1.2.0 is installed" in text and "(named METAL), which is not an NVIDIA GPU" in text
    assert "pip uninstall tensorflow-metal" in text
    assert colab.platform_notes(system="linux", onednn=True, metal=None) == []
    assert colab.platform_notes(system="darwin", onednn=False, metal=None)[0].endswith("CPU path.")


def test_without_onednn_the_setup_turns_on_the_bfc_cpu_allocator(monkeypatch):
    monkeypatch.setenv(colab.CPU_BFC, "recorded")  # so that monkeypatch restores the variable's absence, or value
    monkeypatch.delenv(colab.CPU_BFC)
    monkeypatch.setattr(colab, "onednn_enabled", lambda: True)
    assert colab.keep_cpu_memory_statistics() is False and colab.CPU_BFC not in colab.os.environ
    monkeypatch.setattr(colab, "onednn_enabled", lambda: False)
    assert colab.keep_cpu_memory_statistics() is True and colab.os.environ[colab.CPU_BFC] == "true"
    monkeypatch.setenv(colab.CPU_BFC, "false")  # the learner's own choice is kept
    assert colab.keep_cpu_memory_statistics() is False and colab.os.environ[colab.CPU_BFC] == "false"


def test_the_cpu_memory_statistics_of_03_exist_without_onednn(fresh_python):
    """As on a Mac (TensorFlow's macOS build has no oneDNN): the course's setup, then get_memory_info('CPU:0')."""
    code = ("from gpucourse import colab\ncolab.setup()\nimport tensorflow as tf\n"
            "print('oneDNN', colab.onednn_enabled())\nx = tf.random.uniform((512, 512))\n"
            "info = tf.config.experimental.get_memory_info('CPU:0')\nprint('current', info['current'] > 0)")
    out = fresh_python(code, env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert "oneDNN False" in out and "current True" in out, out
    assert "the course set TF_CPU_ALLOCATOR_USE_BFC=true" in out
    plain = fresh_python("import tensorflow as tf\nx = tf.random.uniform((512, 512))\n"
                         "try:\n    tf.config.experimental.get_memory_info('CPU:0')\nexcept ValueError as e:\n"
                         "    print('raised', e)", env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert "raised Allocator stats not available" in plain, "without the setup there are none: the fallback matters"
