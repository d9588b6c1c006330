"""gpucourse.memory: peak measurement, batch search, estimates, fresh-process probes."""

import json
import math
import random

import pytest

from gpucourse import memory


def test_import_does_not_load_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import memory\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


@pytest.mark.parametrize("n, text", [(0, "0 B"), (512, "512 B"), (1536, "1.50 KiB"), (3 * 2**20, "3.00 MiB"),
                                     (5 * 2**30, "5.00 GiB"), (-2048, "-2.00 KiB")])
def test_format_bytes(n, text):
    assert memory.format_bytes(n) == text


def test_format_bytes_bad_input():
    for bad in ("12", None, True, float("nan")):
        with pytest.raises(TypeError, match="number of bytes"):
            memory.format_bytes(bad)


@pytest.mark.parametrize("name, want", [("GPU:0", "GPU:0"), ("/device:GPU:1", "GPU:1"), ("/GPU:2", "GPU:2"),
                                        ("cpu:0", "CPU:0"), ("/job:localhost/replica:0/task:0/device:CPU:3", "CPU:3")])
def test_normalize_device(name, want):
    assert memory.normalize_device(name) == want


def test_normalize_device_bad_input():
    with pytest.raises(ValueError, match="GPU:0"):
        memory.normalize_device("TPU:0")
    with pytest.raises(ValueError):
        memory.normalize_device("GPU")
    with pytest.raises(TypeError):
        memory.normalize_device(0)


def test_measure_peak_sees_an_intermediate(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse import memory\n"
        "x = tf.random.normal((1000, 1000))\n"
        "f = tf.function(lambda: tf.reduce_sum(x @ x))\n"
        "p = memory.measure_peak(f, device='/device:CPU:0', repeats=3)\n"
        "print(p.device, p.extra_bytes >= 4_000_000, p.after_bytes <= p.peak_bytes, 'peak' in str(p))\n"
        "print(memory.memory_info()['current'] >= 4_000_000)\n"
        "try:\n    memory.measure_peak(f, device='GPU:0')\nexcept ValueError as e:\n    print('NOGPU', e)\n",
        env={"CUDA_VISIBLE_DEVICES": "-1"})  # the CPU path, also on a GPU machine
    lines = out.splitlines()
    assert lines[0] == "CPU:0 True True True"
    assert lines[1] == "True"
    assert "No matching devices found for 'GPU:0'" in out


def test_measure_peak_bad_input():
    with pytest.raises(TypeError, match="callable"):
        memory.measure_peak("not a function")
    with pytest.raises(ValueError, match="warmup"):
        memory.measure_peak(lambda: None, warmup=-1, device="CPU:0")
    with pytest.raises(ValueError, match="repeats"):
        memory.measure_peak(lambda: None, repeats=0, device="CPU:0")


def _fake(fixed, per, cap=None):
    calls = []

    def measure(n):
        calls.append(n)
        used = fixed + per * n
        if cap is not None and used > cap:
            raise MemoryError(f"OOM at batch {n}")
        return used

    return measure, calls


def test_largest_fitting_matches_brute_force():
    rng = random.Random(3)
    for _ in range(50):
        fixed, per = rng.randint(0, 10**6), rng.randint(1, 10**4)
        hi = rng.randint(1, 5000)
        budget = fixed + per * rng.randint(0, 6000) + rng.randint(1, per)
        measure, calls = _fake(fixed, per)
        got = memory.largest_fitting(measure, budget, hi=hi)
        fitting = [n for n in range(1, hi + 1) if fixed + per * n <= budget]
        assert got.best == (max(fitting) if fitting else None), (fixed, per, hi, budget)
        assert len(calls) <= 2 * math.ceil(math.log2(hi)) + 2
        assert len(set(calls)) == len(calls), "never measure the same batch twice"


def test_largest_fitting_treats_oom_as_too_big():
    class ResourceExhaustedError(Exception):  # stands in for tf.errors.ResourceExhaustedError
        pass

    def measure(n):
        if n > 300:
            raise ResourceExhaustedError("OOM when allocating tensor")
        return 10 * n

    got = memory.largest_fitting(measure, 100_000, hi=1000)
    assert got.best == 300 and (512, None) in got.tried and "out of memory" in got.table()
    measure, _ = _fake(0, 10, cap=50)
    assert memory.largest_fitting(measure, 10_000, hi=64).best == 5


def test_largest_fitting_nothing_fits_and_errors_pass_through():
    measure, _ = _fake(1000, 1)
    assert memory.largest_fitting(measure, 10).best is None

    def broken(n):
        raise KeyError("a bug, not an OOM")

    with pytest.raises(KeyError):
        memory.largest_fitting(broken, 10)


@pytest.mark.parametrize("args, exc, match", [
    (("nope", 10), TypeError, "measure"),
    ((lambda n: n, 0), ValueError, "budget_bytes"),
    ((lambda n: n, 10, 0), ValueError, "lo"),
    ((lambda n: n, 10, 5, 4), ValueError, "hi must be"),
    ((lambda n: "big", 10), TypeError, "number of bytes"),
])
def test_largest_fitting_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        memory.largest_fitting(*args)


def test_linear_fit():
    fixed, per = memory.linear_fit([(1, 110), (2, 120), (10, 200)])
    assert fixed == pytest.approx(100) and per == pytest.approx(10)
    with pytest.raises(ValueError, match="at least 2"):
        memory.linear_fit([(1, 2)])
    with pytest.raises(ValueError, match="different"):
        memory.linear_fit([(1, 2), (1, 3)])
    with pytest.raises(TypeError):
        memory.linear_fit([("a", 2), (1, 3)])


def test_slots_by_name_and_bad_names():
    assert memory.slots_per_param("adam") == 2 and memory.slots_per_param("SGD") == 0
    with pytest.raises(ValueError, match="Adafactor"):
        memory.slots_per_param("adafactor")
    with pytest.raises(ValueError, match="known"):
        memory.slots_per_param("mem_fraction")


def test_training_memory_from_a_count():
    est = memory.training_memory(1000, "adam")
    assert (est.params_bytes, est.gradient_bytes, est.optimizer_bytes, est.accumulator_bytes) == (4000, 4000, 8000, 0)
    assert est.total_bytes == 16000 and "total" in est.table()
    assert memory.training_memory(10, "sgd", bytes_per_param=2, accumulate=True).total_bytes == 60
    with pytest.raises(TypeError, match="Keras model or a parameter count"):
        memory.training_memory("big")
    with pytest.raises(ValueError, match=">= 0"):
        memory.training_memory(-1)
    with pytest.raises(TypeError, match="accumulate"):
        memory.training_memory(10, accumulate="yes")


def test_training_memory_matches_real_keras_optimizers(fresh_python):
    """The slot table agrees with the variables Keras 3 optimizers really create."""
    out = fresh_python(
        "import json, keras, numpy as np\nfrom gpucourse import memory\n"
        "m = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5), keras.layers.BatchNormalization(),"
        " keras.layers.Dense(3)])\n"
        "O = keras.optimizers\n"
        "opts = [O.SGD(), O.SGD(momentum=0.9), O.Adam(), O.Adam(amsgrad=True), O.AdamW(), O.RMSprop(),"
        " O.RMSprop(momentum=0.5, centered=True), O.Adagrad(), O.Nadam(), O.Adamax(), O.Lion(), O.Ftrl(),"
        " O.Adadelta(), O.Adam(gradient_accumulation_steps=4), O.SGD(momentum=0.9, gradient_accumulation_steps=2)]\n"
        "rows = []\n"
        "for o in opts:\n"
        "    o.build(m.trainable_variables)\n"
        "    real = sum(int(np.prod(v.shape)) * 4 for v in o.variables if len(v.shape))\n"
        "    est = memory.training_memory(m, o)\n"
        "    rows.append([type(o).__name__, real, est.optimizer_bytes + est.accumulator_bytes,"
        " est.params_bytes, est.gradient_bytes])\n"
        "print(json.dumps(rows))\n"
        "try:\n    memory.training_memory(keras.Sequential([keras.layers.Dense(3)]))\n"
        "except ValueError as e:\n    print('UNBUILT', e)\n")
    rows = json.loads(out.splitlines()[0])
    for name, real, est, params, grads in rows:
        assert real == est, f"{name}: Keras holds {real} bytes of state, estimate says {est}"
        assert params == (7 * 5 + 5 + 4 * 5 + 5 * 3 + 3) * 4 and grads == params - 2 * 5 * 4
    assert "UNBUILT" in out and "keras.Input" in out


def test_accumulation_plan():
    p = memory.accumulation_plan(256, 48)
    assert (p.micro_batch, p.steps) == (32, 8) and p.optimizer_kwargs == {"gradient_accumulation_steps": 8}
    p = memory.accumulation_plan(64, 100)
    assert (p.micro_batch, p.steps) == (64, 1) and p.optimizer_kwargs == {}
    assert memory.accumulation_plan(7, 3).micro_batch == 1
    rng = random.Random(5)
    for _ in range(200):
        eff, mx = rng.randint(1, 500), rng.randint(1, 600)
        p = memory.accumulation_plan(eff, mx)
        assert p.micro_batch * p.steps == eff and p.micro_batch <= mx
        assert not any(eff % s == 0 and eff // s <= mx for s in range(1, p.steps))
    for bad in [(0, 4), (4, 0), (4.0, 2), (True, 2)]:
        with pytest.raises(ValueError):
            memory.accumulation_plan(*bad)


def test_fresh_probe_on_this_machine():
    r = memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": "true"},
                                   "tf.config.experimental.set_memory_growth("
                                   "tf.config.list_physical_devices('CPU')[0], True)")
    assert r.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert r.setup_error == ("ValueError", "Cannot set memory growth on non-GPU and non-Pluggable devices")
    assert any(name.endswith("CPU:0") for name in r.logical)
    assert "setup error" in str(r)


def test_fresh_probe_bad_input():
    with pytest.raises(TypeError, match="env"):
        memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": True})
    with pytest.raises(TypeError, match="setup"):
        memory.fresh_process_probe(setup=42)
    with pytest.raises(ValueError, match="timeout"):
        memory.fresh_process_probe(timeout=0)


@pytest.mark.gpu
def test_growth_keeps_gpu_memory_small():
    from gpucourse import devices

    if not devices.nvml_gpus():
        pytest.skip("no NVIDIA GPU on this machine")
    grow = memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    greedy = memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": "false"})
    assert grow.setup_error is None and grow.memory_growth and grow.memory_growth[0] is None
    if grow.gpu_process_mib is None or greedy.gpu_process_mib is None:
        pytest.skip("NVML gave no memory figures")
    # Summed over GPUs: NVML numbers every GPU, CUDA_VISIBLE_DEVICES may have given TensorFlow another one than 0.
    assert sum(grow.gpu_process_mib) < sum(greedy.gpu_process_mib)
