"""gpucourse.precision: dtype policies, dtype reports, memory estimates, the speed comparison, the re-exports."""

import numpy as np
import pytest

from gpucourse import precision


@pytest.fixture
def keras_f32():
    """Keras with the global policy at float32 before and after the test."""
    import keras

    keras.mixed_precision.set_global_policy("float32")
    yield keras
    keras.mixed_precision.set_global_policy("float32")


def _mlp(keras, in_dim=8, width=16, classes=3, float32_output=True):
    inputs = keras.Input((in_dim,))
    x = keras.layers.Dense(width, activation="relu")(inputs)
    x = keras.layers.Dense(classes)(x)
    outputs = keras.layers.Activation("softmax", dtype="float32" if float32_output else None)(x)
    return keras.Model(inputs, outputs)


# --------------------------------------------------------------------------- import


def test_import_starts_nothing(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import precision\n"
                       "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
                       "print(precision.float_format('float16').max, precision.tensor_core_support('7.5')['float16'])\n"
                       "precision.scale_trajectory(1e-3, steps=5)\n"
                       "print('tensorflow' in sys.modules)")
    assert out.split() == ["False", "False", "65504.0", "True", "False"]


def test_one_import_for_the_topic():
    """Every public name of the three topic modules is reachable as precision.<name>, and is the same object."""
    from gpucourse import precision_formats, precision_hardware, precision_scaling

    for module in (precision_formats, precision_hardware, precision_scaling):
        for name in module.__all__:
            assert getattr(precision, name) is getattr(module, name), name
    assert len(set(precision.__all__)) == len(precision.__all__), "a name is exported twice"


@pytest.mark.parametrize("module", ["precision", "precision_formats", "precision_hardware", "precision_scaling"])
def test_modules_stay_small_and_name_their_job(module, root):
    path = root / "utils" / f"{module}.py"
    assert len(path.read_text().splitlines()) <= 600
    import importlib

    doc = importlib.import_module(f"gpucourse.{module}").__doc__
    assert doc and ("job" in doc.split("\n\n")[0] + doc.split("\n\n")[1])


# --------------------------------------------------------------------------- policies


def test_policy_scope_restores_even_on_error(keras_f32):
    keras = keras_f32
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    with pytest.raises(RuntimeError):
        with precision.policy_scope("mixed_float16") as p:
            assert p.name == "mixed_float16" and keras.mixed_precision.global_policy().name == "mixed_float16"
            raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"


@pytest.mark.parametrize("bad, exc", [("mixed_float32", ValueError), ("fp16", ValueError), (None, TypeError)])
def test_policy_scope_bad_name(bad, exc, keras_f32):
    with pytest.raises(exc, match="policy"):
        with precision.policy_scope(bad):
            pass
    assert keras_f32.mixed_precision.global_policy().name == "float32"


def test_dtype_report_mixed_model(keras_f32):
    with precision.policy_scope("mixed_float16"):
        model = _mlp(keras_f32)
    rep = precision.dtype_report(model)
    dense = [r for r in rep.layers if r.kind == "Dense"]
    assert all(r.compute_dtype == "float16" and r.variable_dtype == "float32" and r.output_dtype == "float16"
               and set(r.weights) == {"float32"} for r in dense)
    assert rep.output_dtypes == ["float32"] and not rep.warnings
    assert rep.global_policy == "float32"
    assert "Activation" in rep.to_text() and "model output dtype(s): float32" in str(rep)


def test_dtype_report_warns(keras_f32):
    keras = keras_f32
    with precision.policy_scope("mixed_float16"):
        forgot = _mlp(keras, float32_output=False)
    assert "dtype='float32'" in precision.dtype_report(forgot).warnings[0]
    with precision.policy_scope("float16"):
        pure = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    rep = precision.dtype_report(pure)
    assert rep.output_dtypes == ["float16"]
    assert any("stored in float16" in w for w in rep.warnings)


def test_dtype_report_bad_input():
    with pytest.raises(TypeError, match="Keras model"):
        precision.dtype_report("model")


# --------------------------------------------------------------------------- memory


def test_memory_by_policy(keras_f32):
    keras = keras_f32
    table = precision.memory_by_policy(lambda: _mlp(keras, 8, 16, 3), batch_size=10,
                                       policies=["float32", "mixed_float16", "float16"])
    f32, mixed, pure = table["float32"], table["mixed_float16"], table["float16"]
    params = (8 * 16 + 16) + (16 * 3 + 3)
    assert f32.param_bytes == mixed.param_bytes == 4 * params and pure.param_bytes == 2 * params
    # dense1 (16) + dense2 (3) + softmax (3) outputs per example; softmax stays float32 under mixed
    assert f32.activation_bytes == 10 * 4 * (16 + 3 + 3)
    assert mixed.activation_bytes == 10 * (2 * (16 + 3) + 4 * 3)
    assert f32.cast_copy_bytes == 0 and mixed.cast_copy_bytes == 2 * params and pure.cast_copy_bytes == 0
    assert "mixed_float16" in table.to_text() and keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(KeyError):
        table["bfloat16"]


def test_memory_by_policy_bad_input(keras_f32):
    keras = keras_f32
    with pytest.raises(TypeError, match="build_fn"):
        precision.memory_by_policy(None, 4)
    with pytest.raises(ValueError, match="batch_size"):
        precision.memory_by_policy(lambda: _mlp(keras), 0)
    with pytest.raises(TypeError, match="batch_size"):
        precision.memory_by_policy(lambda: _mlp(keras), 4.0)
    with pytest.raises(TypeError, match="policies"):
        precision.memory_by_policy(lambda: _mlp(keras), 4, policies="float32")

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(2)

        def call(self, x):
            return self.d(x)

    def build_sub():
        m = Sub()
        m(np.zeros((1, 3), np.float32))
        return m

    with pytest.raises(ValueError, match="keras.Input"):
        precision.memory_by_policy(build_sub, 4)


def test_measure_peak_bytes():
    import tensorflow as tf

    with tf.device("/CPU:0"):  # on a GPU machine the op would otherwise run (and allocate) on GPU:0
        peak = precision.measure_peak_bytes(lambda: tf.ones((256, 1024)) * 2.0, "CPU:0")
    assert isinstance(peak, int) and peak >= 256 * 1024 * 4
    with pytest.raises(TypeError):
        precision.measure_peak_bytes(42)
    with pytest.raises(ValueError, match="CPU:0"):
        precision.measure_peak_bytes(lambda: None, "cpu")
    with pytest.raises(TypeError, match="device"):
        precision.measure_peak_bytes(lambda: None, 0)


def test_measure_peak_bytes_without_cpu_statistics(fresh_python):
    """oneDNN off: TensorFlow tracks no CPU allocator statistics, and the error says how to get them."""
    out = fresh_python("from gpucourse import precision\n"
                       "try:\n"
                       "    precision.measure_peak_bytes(lambda: None, 'CPU:0')\n"
                       "except ValueError as err:\n"
                       "    print(err)\n", env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert "no allocator statistics for 'CPU:0'" in out and "TF_ENABLE_ONEDNN_OPTS=1" in out


# --------------------------------------------------------------------------- speed


def test_compare_policies_runs_and_restores(keras_f32):
    keras = keras_f32
    x = np.random.default_rng(0).random((16, 8), dtype=np.float32)
    y = np.zeros(16, np.int32)
    cmp = precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32", "mixed_float16"],
                                     warmup=1, repeats=2)
    assert [t.name for t in cmp.timings] == ["float32", "mixed_float16"]
    assert cmp.baseline == "float32" and cmp.bound_s == pytest.approx(cmp["float32"].median_s / 2)
    assert "half-bytes bound" in cmp.table()
    assert keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(ValueError, match="policy"):
        precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32", "fp8"])
    with pytest.raises(ValueError, match="jit_compile"):
        precision.compare_policies(lambda: _mlp(keras), x, y, jit_compile="yes")


def test_compare_policies_pins_jit_compile(keras_f32, monkeypatch):
    """Keras's 'auto' means XLA on a GPU only; the comparison pins jit_compile=False unless told otherwise."""
    keras = keras_f32
    seen = []
    real_compile = keras.Model.compile

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("jit_compile"))
        return real_compile(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "compile", spy)
    x, y = np.zeros((4, 8), np.float32), np.zeros(4, np.int32)
    precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32"], warmup=1, repeats=1)
    precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32"], warmup=1, repeats=1,
                               jit_compile="auto")
    assert seen == [False, "auto"]




def test_compare_policies_takes_the_ceiling_that_applies(keras_f32):
    keras = keras_f32
    x, y = np.zeros((8, 8), np.float32), np.zeros(8, np.int32)
    cmp = precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32", "mixed_float16"], warmup=1,
                                     repeats=1, ceiling=8.0, ceiling_label="matmul-bound ceiling")
    assert cmp.bound_s == pytest.approx(cmp["float32"].median_s / 8) and "matmul-bound ceiling" in cmp.table()
    none = precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32"], warmup=1, repeats=1,
                                      ceiling=None)
    assert none.bound_s is None and "bound" not in none.table()
    with pytest.raises(ValueError, match="ceiling"):
        precision.compare_policies(lambda: _mlp(keras), x, y, policies=["float32"], ceiling=0)


# --------------------------------------------------------------------------- speed-up ceilings

T4 = {"device_type": "GPU", "device_name": "Tesla T4", "compute_capability": (7, 5)}
A100 = {"device_type": "GPU", "device_name": "NVIDIA A100-SXM4-40GB", "compute_capability": (8, 0)}
H100 = {"device_type": "GPU", "device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}


@pytest.mark.parametrize("device, policy, tf32, ceiling", [
    (T4, "mixed_float16", True, 65 / 8.1),        # no TF32 on a T4: against plain float32, about 8x
    (T4, "mixed_float16", False, 65 / 8.1),
    (A100, "mixed_float16", True, 2.0),           # float32 already runs on TF32 Tensor Cores
    (A100, "mixed_bfloat16", True, 2.0),
    (A100, "mixed_float16", False, 312 / 19.5),   # TF32 off: against plain float32
    (H100, "mixed_float16", True, 989.5 / 494.5),
    ({"device_name": "NVIDIA H200", "compute_capability": (9, 0)}, "mixed_bfloat16", False, 989.5 / 67),
    ({"device_name": "Tesla V100-SXM2-16GB", "compute_capability": "7.0"}, "float16", True, 125 / 15.7),
    ({"device_name": "NVIDIA L4"}, "mixed_bfloat16", True, 121 / 60),  # no cc given: the table's
    ({"device_name": "NVIDIA A100-SXM4-40GB", "compute_capability": (8, 0)}, "mixed_bfloat16", False, 312 / 19.5),
    ({"device_name": "NVIDIA A100 80GB PCIe", "compute_capability": (8, 0)}, "mixed_float16", True, 2.0),
])
def test_speedup_bound_of_a_gpu_is_its_data_sheet_ratio(device, policy, tf32, ceiling):
    bound = precision.pick_speedup_bound(device, policy, tf32=tf32)
    assert bound.matmul == pytest.approx(ceiling) and bound.memory == 2.0
    assert bound.policy == policy and bound.device == device["device_name"]
    assert "data sheet" in bound.reason and f"matmul-bound ceiling {ceiling:.1f}x" in str(bound)


@pytest.mark.parametrize("device, policy, why", [
    (T4, "mixed_bfloat16", "no bfloat16 Tensor Cores"),
    ({"device_name": "NVIDIA GeForce GTX 1660 Ti", "compute_capability": (7, 5)}, "mixed_float16", "GTX 16xx"),
    # 'L4' must not match an L40S, nor 'A100' an A1000
    ({"device_name": "NVIDIA L40S", "compute_capability": (8, 9)}, "mixed_float16", "no data-sheet row"),
    ({"device_name": "NVIDIA RTX A1000", "compute_capability": (8, 6)}, "mixed_float16", "no data-sheet row"),
    # an NVL card is not the SXM module: no row, rather than the SXM module's ratio
    ({"device_name": "NVIDIA H100 NVL", "compute_capability": (9, 0)}, "mixed_bfloat16", "names a variant (NVL)"),
    ({"device_name": "Quadro P5000", "compute_capability": (6, 1)}, "mixed_float16", "no float16 Tensor Cores"),
])
def test_speedup_bound_of_a_gpu_without_a_figure(device, policy, why):
    bound = precision.pick_speedup_bound(device, policy, tf32=True)
    assert bound.matmul is None and bound.memory == 2.0 and why in bound.reason
    assert "matmul-bound ceiling unknown, memory-bound ceiling 2.0x" in str(bound)


def test_speedup_bound_of_a_cpu():
    plain = precision.pick_speedup_bound(None, "mixed_float16")  # None: a CPU without 16-bit units
    assert (plain.device, plain.matmul, plain.memory) == ("CPU", 1.0, 2.0)
    bf16_cpu = {"device_type": "CPU", "cpu_flags": ["avx512_bf16"]}
    assert precision.pick_speedup_bound(bf16_cpu, "mixed_float16").matmul == 1.0  # bf16 units do not help float16
    native = precision.pick_speedup_bound(bf16_cpu, "mixed_bfloat16")
    assert native.matmul is None and "avx512_bf16" in native.reason
    amx = {"device_type": "CPU", "cpu_flags": ("amx_fp16", "amx_bf16")}
    assert precision.pick_speedup_bound(amx, "float16").matmul is None


def test_speedup_bound_reads_tf32_only_when_it_matters(monkeypatch):
    calls = []
    monkeypatch.setattr(precision._hardware, "tf32_enabled", lambda: calls.append(1) or False)
    assert precision.pick_speedup_bound(A100).matmul == pytest.approx(16.0)  # TensorFlow's switch, read: off
    assert precision.pick_speedup_bound(None).matmul == 1.0                 # a CPU: not read
    assert calls == [1]


def test_speedup_bound_errors_name_the_argument():
    with pytest.raises(ValueError, match="policy.*baseline"):
        precision.pick_speedup_bound(T4, "float32")
    with pytest.raises(ValueError, match="policy"):
        precision.pick_speedup_bound(T4, "mixed_float8")
    with pytest.raises(TypeError, match="device must be a dict"):
        precision.pick_speedup_bound("T4")
    with pytest.raises(ValueError, match="device_type"):
        precision.pick_speedup_bound({"device_type": "TPU"})
    with pytest.raises(TypeError, match="cpu_flags"):
        precision.pick_speedup_bound({"device_type": "CPU", "cpu_flags": "avx512_bf16"})
    with pytest.raises(TypeError, match="tf32"):
        precision.pick_speedup_bound(A100, tf32="on")


def test_describe_device_on_this_machine(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_flags", lambda: frozenset({"avx2", "fma", "amx_bf16", "avx512f"}))
    described = precision.describe_device()
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        assert described["device_type"] == "GPU" and described["compute_capability"]
    else:
        assert described == {"device_type": "CPU", "cpu_flags": ("amx_bf16",)}
    with pytest.raises(TypeError, match="index"):
        precision.describe_device("0")
