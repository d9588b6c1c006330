"""gpucourse.precision: number formats, policies, dtype reports, memory estimates and loss scaling."""

import math
import random

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
                       "print(precision.float_format('float16').max)\n"
                       "print('tensorflow' in sys.modules)")
    assert out.split() == ["False", "False", "65504.0", "False"]


# --------------------------------------------------------------------------- formats


def test_float_formats():
    f16, bf16, f32 = (precision.float_format(d) for d in ("float16", "bfloat16", "float32"))
    assert (f16.bits, f16.exponent_bits, f16.mantissa_bits) == (16, 5, 10)
    assert f16.max == 65504.0 and f16.smallest_subnormal == 2.0 ** -24 and f16.smallest_normal == 2.0 ** -14
    assert (bf16.bits, bf16.exponent_bits, bf16.mantissa_bits) == (16, 8, 7)
    assert bf16.smallest_normal == f32.smallest_normal and bf16.eps == 2.0 ** -7
    assert 3 < f16.decimal_digits < 3.5 and "float16" in str(f16)
    table = precision.format_table()
    assert table.splitlines()[0].startswith("format") and len(table.splitlines()) == 4


@pytest.mark.parametrize("bad, exc", [("float8", ValueError), ("int32", ValueError), (16, TypeError)])
def test_float_format_bad_input(bad, exc):
    with pytest.raises(exc, match="float16|dtype"):
        precision.float_format(bad)


@pytest.mark.parametrize("value, dtype, outcome, result", [
    (70000, "float16", "overflow", math.inf),
    (-70000, "float16", "overflow", -math.inf),
    (65519, "float16", "rounded", 65504.0),
    (65520, "float16", "overflow", math.inf),
    (65504, "float16", "exact", 65504.0),
    (1e-8, "float16", "underflow", 0.0),
    (3e-5, "float16", "subnormal", None),
    (1e-8, "bfloat16", "rounded", None),
    (1.001, "bfloat16", "rounded", 1.0),
    (0.5, "bfloat16", "exact", 0.5),
    (0.0, "float16", "exact", 0.0),
])
def test_classify_cast(value, dtype, outcome, result):
    r = precision.classify_cast(value, dtype)
    assert r.outcome == outcome
    if result is not None:
        assert r.result == result
    if outcome == "underflow":
        assert r.relative_error == 1.0


@pytest.mark.parametrize("bad, exc", [(float("nan"), ValueError), (float("inf"), ValueError),
                                      ("1.0", TypeError), (True, TypeError)])
def test_classify_cast_bad_input(bad, exc):
    with pytest.raises(exc):
        precision.classify_cast(bad, "float16")


def test_cast_table():
    text = precision.cast_table([70000, 1e-8], ["float16", "bfloat16"])
    assert "inf (overflow)" in text and "0 (underflow)" in text and "70144 (rounded)" in text
    with pytest.raises(ValueError, match="empty"):
        precision.cast_table([])
    with pytest.raises(ValueError, match="dtypes"):
        precision.cast_table([1.0], "float16")


def test_flush_fractions():
    g = np.array([1e-9, 1e-9, 1e-3, 0.0, 10.0])
    assert precision.flush_fractions(g, 1.0) == {"underflow": 0.5, "overflow": 0.0}
    assert precision.flush_fractions(g, 2.0 ** 15) == {"underflow": 0.0, "overflow": 0.2}
    assert precision.flush_fractions(g, 1.0, "bfloat16")["underflow"] == 0.0
    with pytest.raises(ValueError, match="scale"):
        precision.flush_fractions(g, 0)
    with pytest.raises(ValueError, match="finite"):
        precision.flush_fractions([1.0, np.inf])
    with pytest.raises(ValueError, match="empty"):
        precision.flush_fractions([])


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
    with pytest.raises(ValueError, match="policies"):
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


# --------------------------------------------------------------------------- loss scaling


def test_simulated_rule():
    steps = precision.simulate_loss_scale([True, True, True, False, True], initial_scale=8.0, growth_steps=3)
    assert [s.scale_after for s in steps] == [8.0, 8.0, 16.0, 8.0, 8.0]
    assert [s.applied for s in steps] == [True, True, True, False, True]
    assert [s.good_steps for s in steps] == [1, 2, 0, 0, 1]


def test_simulation_matches_real_optimizer():
    rnd = random.Random(5)
    for growth in (1, 2, 4):
        flags = [rnd.random() < 0.75 for _ in range(20)]
        sim = precision.simulate_loss_scale(flags, 2.0 ** 10, growth)
        real = precision.loss_scale_trace(flags, 2.0 ** 10, growth)
        assert sim == real, (growth, flags)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"finite": "TTF"}, TypeError, "list of booleans"),
    ({"finite": [1, 0]}, TypeError, "True/False"),
    ({"finite": [True], "initial_scale": 0}, ValueError, "initial_scale"),
    ({"finite": [True], "initial_scale": float("inf")}, ValueError, "initial_scale"),
    ({"finite": [True], "growth_steps": 0}, ValueError, "growth_steps"),
    ({"finite": [True], "growth_steps": 2.0}, ValueError, "growth_steps"),
])
def test_loss_scale_bad_input(kwargs, exc, match):
    for fn in (precision.simulate_loss_scale, precision.loss_scale_trace):
        with pytest.raises(exc, match=match):
            fn(**kwargs)


# --------------------------------------------------------------------------- hardware and speed


@pytest.mark.parametrize("cc, fp16, bf16", [("6.1", False, False), ("7.0", True, False), ((7, 5), True, False),
                                            ("8.0", True, True), ((9, 0), True, True)])
def test_tensor_core_support(cc, fp16, bf16):
    assert precision.tensor_core_support(cc) == {"float16": fp16, "bfloat16": bf16}


def test_recommend_policy():
    assert precision.recommend_policy(None).policy == "float32"
    assert precision.recommend_policy("6.1").policy == "float32"
    assert precision.recommend_policy("7.5").policy == "mixed_float16"
    advice = precision.recommend_policy((8, 6))
    assert advice.policy == "mixed_bfloat16" and "8.6" in str(advice)


@pytest.mark.parametrize("bad, exc", [("eight", ValueError), ("8", ValueError), (8.6, TypeError), ((8,), TypeError)])
def test_compute_capability_bad_input(bad, exc):
    with pytest.raises(exc, match="compute capability"):
        precision.tensor_core_support(bad)


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


def test_gpu_compute_capability_without_gpu():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    assert precision.gpu_compute_capability() is None
    with pytest.raises(ValueError, match="index"):
        precision.gpu_compute_capability(-1)


@pytest.mark.gpu
def test_gpu_compute_capability_on_gpu():
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU on this machine")
    cc = precision.gpu_compute_capability()
    assert isinstance(cc, tuple) and len(cc) == 2 and cc >= (3, 0)
    assert precision.recommend_policy(cc).policy in ("float32", "mixed_float16", "mixed_bfloat16")
