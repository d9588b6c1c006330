"""gpucourse.devices: report, doctor, logical-device setup (each in a fresh TensorFlow process)."""

import json
import types

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


@pytest.mark.parametrize("kwargs, err, match", [
    ({"n": 0}, ValueError, "n must be >= 1"), ({"n": 2.5}, TypeError, "n must be a whole number"),
    ({"n": True}, TypeError, "n must be a whole number"),
    ({"n": 2, "device_type": "TPU"}, ValueError, "device_type"),
    ({"n": 2, "memory_limit_mb": -5}, ValueError, "memory_limit_mb"),
    ({"n": 2, "memory_limit_mb": "1G"}, TypeError, "memory_limit_mb"),
    ({"n": 2, "memory_limit_mb": 512, "device_type": "CPU"}, ValueError, "GPU features"),
    ({"n": 2, "use_gpus": 1, "device_type": "CPU"}, ValueError, "GPU features"),
    ({"n": 2, "device_type": "GPU"}, ValueError, "no physical GPU"),
])
def test_setup_bad_input(kwargs, err, match):
    with pytest.raises(err, match=match):
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


@pytest.mark.parametrize("cuda, cudnn", [("12.5.1", "9"), (None, None)])
def test_doctor_says_a_library_mismatch_means_no_gpu_at_all(cuda, cudnn):
    """'A CUDA/cuDNN mismatch makes training several times slower': TensorFlow lists no GPU, so all of it runs on
    the CPU. The doctor reports that as an error naming the build's versions, with the fix."""
    found = devices.doctor(_facts(tf_gpus=0, driver_gpus=2, cuda_version=cuda, cudnn_version=cudnn), show=False)
    (err,) = [f for f in found if f.level == "error"]
    assert "2 GPU(s) but TensorFlow sees none" in err.problem and "runs everything on the CPU" in err.problem
    assert f"CUDA {cuda or '?'}, cuDNN {cudnn or '?'}" in err.problem
    assert "tensorflow[and-cuda]" in err.fix and "Cannot dlopen some GPU libraries" in err.fix
    assert not any(f.level == "ok" for f in found)  # no "take the GPU path" next to it


def test_doctor_bad_input():
    with pytest.raises(TypeError):
        devices.doctor(["not", "a", "dict"], show=False)
    with pytest.raises(ValueError, match="missing"):
        devices.doctor({"tf_version": "2.21.0"}, show=False)


def test_doctor_on_this_machine(capsys):
    found = devices.doctor()
    assert found and "[" in capsys.readouterr().out


def test_fresh_process_devices_asks_a_probe(monkeypatch):
    """The probe machinery itself runs for real in test_first_calls_in_fresh_processes; here: what is asked."""
    asked = {}

    def fake_run(code, *args, env=None, timeout=120, label="probe"):
        asked.update(code=code, env=env)
        return {"physical": [["/physical_device:CPU:0", "CPU"]], "logical": [["/device:CPU:0", "CPU"]]}

    monkeypatch.setattr(devices._probe, "run", fake_run)
    seen = devices.fresh_process_devices({"CUDA_VISIBLE_DEVICES": "-1"})
    assert seen == {"physical": [("/physical_device:CPU:0", "CPU")], "logical": [("/device:CPU:0", "CPU")]}
    assert asked["env"] == {"CUDA_VISIBLE_DEVICES": "-1"} and "list_logical_devices" in asked["code"]
    with pytest.raises(TypeError, match="env"):
        devices.fresh_process_devices({"CUDA_VISIBLE_DEVICES": -1})


def test_the_gpu_facts_are_devices_names():
    """_gpu_facts holds part of topic 01: each of its names is devices.<name>, the same object, in devices.__all__."""
    from gpucourse import _gpu_facts

    for name in _gpu_facts.__all__:
        assert getattr(devices, name) is getattr(_gpu_facts, name) and name in devices.__all__, name


def test_nvml_without_driver_is_empty_list():
    gpus = devices.nvml_gpus()
    assert isinstance(gpus, list)
    assert json.dumps([str(g) for g in gpus])  # printable


# --------------------------------------------------------------------------- GPU paths, with fakes

T4, A100, H100 = ("Tesla T4", (7, 5)), ("NVIDIA A100-SXM4-40GB", (8, 0)), ("NVIDIA H100 80GB HBM3", (9, 0))


def _fake_tensor_cores(cc, name=None):
    """The four-key table topic 05 teaches (fp16 >= 7.0, bf16 and TF32 >= 8.0, FP8 >= 8.9); a 'GTX 16' has none."""
    cc = tuple(cc)
    if name and "GTX 16" in name:
        return dict.fromkeys(("float16", "bfloat16", "tfloat32", "float8"), False)
    return {"float16": cc >= (7, 0), "bfloat16": cc >= (8, 0), "tfloat32": cc >= (8, 0), "float8": cc >= (8, 9)}


@pytest.fixture
def fake_gpus(monkeypatch):
    """Make this CPU-only TensorFlow report the given GPUs (physical devices and device details)."""
    import tensorflow as tf

    from gpucourse import precision

    real_list = tf.config.list_physical_devices

    def install(*gpus):
        fakes = [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
                 for i in range(len(gpus))]
        details = {d.name: {"device_name": model, "compute_capability": cc} for d, (model, cc) in zip(fakes, gpus)}

        def list_physical_devices(device_type=None):
            cpus = real_list("CPU") if device_type in (None, "CPU") else []
            return cpus + (fakes if device_type in (None, "GPU") else [])

        monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
        monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda d: dict(details[d.name]))
        monkeypatch.setattr(precision, "tensor_core_support", _fake_tensor_cores)
        monkeypatch.setattr(devices, "nvml_gpus", lambda: [])
        monkeypatch.setattr(devices, "runtime_initialized", lambda: False)
        return fakes

    return install


@pytest.mark.parametrize("gpu, yes, no", [
    (T4, ["float16"], ["bfloat16", "tfloat32", "float8"]),
    (A100, ["float16", "bfloat16", "tfloat32"], ["float8"]),
    (H100, ["float16", "bfloat16", "tfloat32", "float8"], []),
])
def test_report_shows_compute_capability_and_tensor_core_dtypes(fake_gpus, gpu, yes, no):
    fake_gpus(gpu)
    report = devices.device_report()
    (g,) = report.gpus
    assert (g.model, g.compute_capability) == gpu and report.gpu_count == 1
    assert g.tensor_cores == {k: True for k in yes} | {k: False for k in no}
    line = next(ln for ln in report.to_text().splitlines() if ln.startswith("GPU 0"))
    major, minor = gpu[1]
    assert f"{gpu[0]}, compute capability {major}.{minor}: Tensor Cores for {', '.join(yes)}" in line
    assert (f"none for {', '.join(no)}" in line) if no else ("none for" not in line)


def test_report_renders_whatever_dtypes_precision_knows(fake_gpus, monkeypatch):
    from gpucourse import precision

    fake_gpus(T4, H100)
    monkeypatch.setattr(precision, "tensor_core_support", lambda cc, name=None: {"float16": tuple(cc) >= (7, 0),
                                                                                 "bfloat16": tuple(cc) >= (8, 0)})
    text = "\n".join(" ".join(ln.split()) for ln in devices.device_report().to_text().splitlines())
    assert "GPU 0 Tesla T4, compute capability 7.5: Tensor Cores for float16; none for bfloat16" in text
    assert "GPU 1 NVIDIA H100 80GB HBM3, compute capability 9.0: Tensor Cores for float16, bfloat16\n" in text
    assert devices.describe_compute_capability((6, 1)).startswith("6.1: no Tensor Cores")


def test_report_asks_by_name_and_says_why_a_gtx_16xx_has_no_tensor_cores(fake_gpus):
    """Compute capability 7.5 is a T4 (float16 Tensor Cores) and a GTX 1660 (none): the name decides."""
    fake_gpus(T4, ("NVIDIA GeForce GTX 1660 Ti", (7, 5)))
    report = devices.device_report()
    t4, gtx = report.gpus
    assert t4.tensor_cores["float16"] and not any(gtx.tensor_cores.values())
    lines = {ln.split()[1]: " ".join(ln.split()) for ln in report.to_text().splitlines() if ln.startswith("GPU ")}
    assert "7.5: Tensor Cores for float16" in lines["0"]
    assert "GTX 1660 Ti, compute capability 7.5: no Tensor Cores" in lines["1"]
    assert "GTX 16xx" in lines["1"] and "TU116/TU117" in lines["1"]  # the reason, from precision_hardware


def test_report_without_gpu_says_cpu_path():
    text = devices.device_report().to_text()
    assert "GPUs" in text and "the CPU path" in text


def test_report_survives_a_gpu_without_details(fake_gpus, monkeypatch):
    import tensorflow as tf

    fake_gpus(T4)
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda d: {})
    (g,) = devices.gpu_details()
    assert g.compute_capability is None and g.tensor_cores == {} and "unknown" in str(g)


@pytest.mark.parametrize("n, gpus, limit, use, plan", [
    (1, 1, None, None, [None]),
    (2, 1, None, None, [[1024, 1024]]),
    (2, 2, None, None, [None, None]),  # Kaggle 2 x T4: one logical GPU per T4, both whole
    (3, 2, None, None, [[1024, 1024], [1024]]),  # never a split GPU next to an unlimited one
    (4, 2, 512, None, [[512, 512], [512, 512]]),
    (1, 2, None, None, [None]),  # GPU 1 hidden, not left idle with its memory reserved
    (2, 2, 256, None, [[256], [256]]),
    (3, 2, None, 1, [[1024, 1024, 1024]]),
    (2, 8, None, None, [None, None]),
])
def test_plan_gpu_split(n, gpus, limit, use, plan):
    assert devices.plan_gpu_split(n, gpus, limit, use) == plan
    assert sum(len(p or [None]) for p in plan) == n


@pytest.mark.parametrize("kwargs, err, match", [
    ({"n": 2, "gpus": 2, "use_gpus": 3}, ValueError, "use_gpus must be <= 2"),
    ({"n": 1, "gpus": 2, "use_gpus": 2}, ValueError, "use_gpus must be <= 1"),
    ({"n": 2, "gpus": 0}, ValueError, "gpus must be >= 1"),
    ({"n": "2", "gpus": 1}, TypeError, "n must be a whole number"),
    ({"n": 2, "gpus": 1, "memory_limit_mb": 0}, ValueError, "memory_limit_mb"),
])
def test_plan_gpu_split_bad_input(kwargs, err, match):
    with pytest.raises(err, match=match):
        devices.plan_gpu_split(**kwargs)


class _FakeConfig:
    """tf.config's device-configuration calls, with TensorFlow's rules, over fake GPUs."""

    def __init__(self, n_gpus, started=False):
        import tensorflow as tf

        self.LogicalDeviceConfiguration = tf.config.LogicalDeviceConfiguration
        self.gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(n_gpus)]
        self.visible, self.virtual, self.started, self.calls = list(self.gpus), {}, started, []
        self.experimental = types.SimpleNamespace(set_memory_growth=self.set_memory_growth)

    def list_physical_devices(self, device_type=None):
        return list(self.gpus) if device_type in (None, "GPU") else []

    def get_visible_devices(self, device_type=None):
        return list(self.visible)

    def set_visible_devices(self, devices_, device_type=None):
        assert not self.started, "TensorFlow would raise: visible devices cannot be modified after init"
        self.calls.append(("visible", [d.name for d in devices_]))
        self.visible = list(devices_)

    def get_logical_device_configuration(self, dev):
        return self.virtual.get(dev)

    def set_logical_device_configuration(self, dev, configs):
        assert not self.started, "TensorFlow would raise: Virtual devices cannot be modified after being initialized"
        assert all(c.memory_limit for c in configs), "TensorFlow: memory limit is required for GPU virtual devices"
        self.calls.append(("split", dev.name, [c.memory_limit for c in configs]))
        self.virtual[dev] = list(configs)

    def set_memory_growth(self, dev, enable):
        if dev in self.virtual:  # TensorFlow's check (context.py), made before the runtime starts
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        assert not self.started, "TensorFlow would raise: Physical devices cannot be modified after being initialized"
        self.calls.append(("growth", dev.name, enable))

    def forget(self, dev):
        assert not self.started
        self.calls.append(("forget", dev.name))
        self.virtual.pop(dev, None)

    def list_logical_devices(self, device_type=None):
        self.started = True
        names = []
        for gpu in self.visible:
            names += [None] * max(1, len(self.virtual.get(gpu) or []))
        return [f"/device:GPU:{i}" for i in range(len(names))]


@pytest.fixture
def fake_config(monkeypatch):
    def install(n_gpus, started=False):
        cfg = _FakeConfig(n_gpus, started)
        monkeypatch.setattr(devices._tf, "tf", lambda: types.SimpleNamespace(config=cfg))
        monkeypatch.setattr(devices, "_forget_logical_device_configuration", cfg.forget)
        monkeypatch.setattr(devices, "runtime_initialized", lambda: cfg.started)
        return cfg
    return install


def test_setup_spreads_over_two_gpus_and_is_idempotent(fake_config):
    cfg = fake_config(2)
    assert devices.setup_logical_devices(3) == ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]
    assert cfg.calls == [("split", "/physical_device:GPU:0", [1024, 1024]), ("split", "/physical_device:GPU:1", [1024])]
    cfg.calls.clear()
    assert len(devices.setup_logical_devices(3)) == 3 and cfg.calls == []  # same request after start: nothing
    with pytest.raises(devices.TooLateError, match=r"GPU 0 as 2 x 1024 MiB, GPU 1 as 1 x 1024 MiB.*Restart"):
        devices.setup_logical_devices(2)


def test_setup_two_gpus_whole_and_hiding(fake_config):
    cfg = fake_config(2)
    assert len(devices.setup_logical_devices(2)) == 2 and cfg.calls == []  # the default already is that
    cfg = fake_config(2)
    assert devices.setup_logical_devices(1) == ["/device:GPU:0"]
    assert cfg.calls[0] == ("visible", ["/physical_device:GPU:0"])


def test_setup_can_change_its_mind_before_the_runtime_starts(fake_config):
    cfg = fake_config(1)
    devices.setup_logical_devices(2, memory_limit_mb=512).clear()
    cfg.started = False  # as if nothing had been listed yet
    assert len(devices.setup_logical_devices(1)) == 1  # back to one whole GPU
    assert cfg.calls[-1] == ("forget", "/physical_device:GPU:0") and cfg.virtual == {}  # not configured with []


@pytest.mark.parametrize("n_gpus, n", [(1, 1), (2, 2), (2, 1), (8, 2)])
def test_whole_gpus_stay_unconfigured_so_memory_growth_still_works(fake_config, n_gpus, n):
    """set_logical_device_configuration(gpu, []) would mark the GPU as split: growth dropped, and raising later."""
    cfg = fake_config(n_gpus)
    for gpu in cfg.gpus[:n]:  # growth first (the course's order), then the layout
        cfg.set_memory_growth(gpu, True)
    devices.setup_logical_devices(n)
    assert cfg.virtual == {} and not any(c[0] in ("split", "forget") for c in cfg.calls)
    cfg.started = False
    for gpu in cfg.gpus[:n]:  # and growth after the layout
        cfg.set_memory_growth(gpu, True)


def test_tensorflow_counts_an_empty_configuration_as_virtual_devices(fresh_python):
    """TensorFlow's own rule, on the CPU: after set_logical_device_configuration(dev, []) the memory-growth
    call fails on the 'virtual devices configured' check (made before its GPU-only check), so [] is no undo."""
    out = fresh_python("import tensorflow as tf\ncpu = tf.config.list_physical_devices('CPU')[0]\n"
                       "def growth():\n    try:\n        tf.config.experimental.set_memory_growth(cpu, True)\n"
                       "    except ValueError as e:\n        return str(e)\n"
                       "print(growth())\ntf.config.set_logical_device_configuration(cpu, [])\n"
                       "print(tf.config.get_logical_device_configuration(cpu))\nprint(growth())\n"
                       "from gpucourse import devices\ndevices._forget_logical_device_configuration(cpu)\n"
                       "print(tf.config.get_logical_device_configuration(cpu))\nprint(growth())\n")
    before, config, after, forgotten, again = out.strip().splitlines()[-5:]
    assert "non-GPU" in before and config == "[]" and "virtual devices configured" in after
    assert forgotten == "None" and "non-GPU" in again  # the setup's undo leaves the device as never configured


def test_setup_on_a_started_runtime_with_defaults(fake_config):
    fake_config(2, started=True)
    assert len(devices.setup_logical_devices(2)) == 2  # two whole GPUs is what it already has
    with pytest.raises(devices.TooLateError, match=r"GPU 0 whole, GPU 1 whole \(0 hidden\).*GPU 0 whole \(1 hidden\)"):
        devices.setup_logical_devices(1)


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
    assert physical >= 1 and logical == 2  # two logical GPUs: GPU 0 split in two, or one per GPU
    assert lines[2] in ("[512, 512]", "[512]") and int(lines[3]) == logical and lines[4] == "too late"


# --------------------------------------------------------------------------- gpucourse.startup (fresh processes)


def test_first_calls_in_fresh_processes():
    from gpucourse import startup

    got = startup.probe_first_calls()
    before, after, dl = got.values()
    assert before == {"physical_gpus": 0, "logical_gpus": 0}
    assert after["runtime_started"] is False  # listing physical devices starts no runtime (it may start CUDA)
    assert dl["runtime_started"] is False and dl["cpu_split_ok"] and dl["logical_cpus"] == 2
    assert dl["listed"] == ["/device:CPU:0"] and dl["gpu_used_mib"] == {"before": [], "listed": [], "after": []}


def test_device_lib_takes_the_growth_setting_itself(fresh_python):
    """The other way round the reservation: list_local_devices(session_config=...) with gpu_options.allow_growth,
    so the GPU allocators it creates grow. Its signature and the field are TensorFlow's API; on a CPU it runs."""
    out = fresh_python("import inspect, tensorflow as tf\nfrom tensorflow.python.client import device_lib\n"
                       "print(inspect.signature(device_lib.list_local_devices))\n"
                       "config = tf.compat.v1.ConfigProto()\nconfig.gpu_options.allow_growth = True\n"
                       "print([d.device_type for d in device_lib.list_local_devices(session_config=config)][:1])\n")
    assert out.strip().splitlines()[-2:] == ["(session_config=None)", "['CPU']"]


def test_threading_measurement_runs_side_by_side(monkeypatch):
    """The probes start together (one per setting, its pools set before the runtime starts) and the best
    run of each workload is kept. The probe processes themselves run for real in notebook 01 (nbval)."""
    from gpucourse import startup

    started = []

    def fake_run_many(probes, timeout):
        started.append([(p.args[:4], p.env, p.label) for p in probes])
        return [{"intra": p.args[0], "inter": p.args[1], "times": {"one_big_op": [0.3, 0.2, 0.4],
                                                                   "branches": [0.9 / (1 + k), 0.8 / (1 + k)]}}
                for k, p in enumerate(probes)]

    monkeypatch.setattr(startup._probe, "run_many", fake_run_many)
    res = startup.measure_threading({"one": (1, 1), "default": (0, 0)}, rounds=3, size=64)
    assert started == [[((1, 1, 3, 64), {"CUDA_VISIBLE_DEVICES": "-1"}, "threads one"),
                        ((0, 0, 3, 64), {"CUDA_VISIBLE_DEVICES": "-1"}, "threads default")]]
    assert [(r.label, r.intra, r.inter, r.one_big_op_s, r.branches_s) for r in res.rows] == [
        ("one", 1, 1, 0.2, 0.8), ("default", 0, 0, 0.2, 0.4)]
    assert res.speedups() == {"one": (1.0, 1.0), "default": (1.0, 2.0)}
    assert "speed-up over intra=1, inter=1" in res.to_text()


def test_threading_limits_and_bad_input():
    from gpucourse import startup

    res = startup.ThreadingResult([startup.ThreadRow("one", 1, 1, 2.0, 4.0), startup.ThreadRow("auto", 0, 0, 1.0, 1.0),
                                   startup.ThreadRow("inter", 1, 8, 2.0, 1.0)], logical_cpus=8, physical_cores=4)
    assert res.speedups() == {"one": (1.0, 1.0), "auto": (2.0, 4.0), "inter": (1.0, 4.0)}
    assert [res.limits(r) for r in res.rows] == [(1, 1), (8, 4), (1, 4)]
    bads = [({}, ValueError), ({"x": 1}, TypeError), ({"x": (1, -1)}, ValueError), ({"x": (1.5, 1)}, TypeError)]
    for bad, err in bads:
        with pytest.raises(err, match="settings"):
            startup.measure_threading(bad)
    with pytest.raises(ValueError, match="rounds"):
        startup.measure_threading({"x": (1, 1)}, rounds=0)
    logical, physical = startup.core_counts()
    assert 1 <= physical <= logical


def test_threading_benchmark_rows(monkeypatch):
    from gpucourse import startup
    from gpucourse.tools import benchmark

    fake = startup.ThreadingResult([startup.ThreadRow("1 thread each", 1, 1, 2.0, 4.0, (2.2, 4.4)),
                                    startup.ThreadRow("auto", 0, 0, 1.0, 2.0, (1.1, 2.2))], 2, 2)
    monkeypatch.setattr(startup, "measure_threading", lambda rounds: fake)
    rows = startup.benchmark(quick=True)
    assert len(rows) == 4 and all(set(benchmark.REQUIRED_KEYS) <= set(r) for r in rows)
    auto_big = next(r for r in rows if r["case"] == "one big MatMul, auto")
    assert auto_big["bound_s"] == 1.0 and auto_big["median_s"] == 1.1 and auto_big["speedup"] == 2.0
    with pytest.raises(TypeError, match="quick"):
        startup.benchmark(quick="yes")
