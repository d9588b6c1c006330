"""gpucourse.xla: HLO parsing, tracing and bucketing helpers, fresh-process XLA probes, benchmark rows."""

import math

import pytest

from gpucourse import xla
from gpucourse.labtests.lab06 import _HANDMADE as HANDMADE  # the same hand-written module the lab uses


def test_import_does_not_load_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import xla\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_parse_handmade_module():
    s = xla.parse_hlo(HANDMADE)
    assert s.module == "handmade" and s.entry == "main"
    assert set(s.computations) == {"add_f32", "fused_computation", "main"}
    assert s.op_counts == {"parameter": 4, "add": 1, "exponential": 1, "multiply": 1, "constant": 1,
                           "fusion": 1, "reduce": 1, "tuple": 1}
    assert s.entry_ops["tuple"] == 1 and s.entry_ops["multiply"] == 0
    assert s.fusions == 1 and s.fusion_kinds == {"kLoop": 1}
    assert s.kernels == 2  # the fusion and the reduce; parameter, constant, tuple do no work
    assert "fusions: 1" in str(s)


@pytest.mark.parametrize("text, exc, match", [
    (42, TypeError, "HLO text"),
    ("not hlo at all", ValueError, "HloModule"),
    ("HloModule m\n%c (a: f32[]) -> f32[] {\n  ROOT %a = f32[] parameter(0)\n}\n", ValueError, "ENTRY"),
])
def test_parse_bad_input(text, exc, match):
    with pytest.raises(exc, match=match):
        xla.parse_hlo(text)


def test_real_hlo_fuses_the_chain():
    import tensorflow as tf

    x = tf.random.normal((16,))
    before = xla.parse_hlo(xla.compiler_ir(xla.gelu_chain, x, stage="hlo"))
    after = xla.parse_hlo(xla.compiler_ir(xla.gelu_chain, x))
    assert before.fusions == 0 and before.entry_ops["tanh"] == 1
    assert after.fusions == 1 and after.kernels == 1
    runs = xla.variants(xla.gelu_chain)
    assert list(runs) == ["eager", "tf.function", "jit_compile"]
    ref = runs["eager"](x).numpy()
    for fn in runs.values():
        assert abs(fn(x).numpy() - ref).max() < 1e-4


def test_compiler_ir_bad_input():
    import tensorflow as tf

    x = tf.ones((3,))
    with pytest.raises(ValueError, match="jit_compile=True"):
        xla.compiler_ir(tf.function(lambda t: t * 2.0), x)
    with pytest.raises(ValueError, match="stage must be"):
        xla.compiler_ir(xla.gelu_chain, x, stage="llvm")
    with pytest.raises(TypeError):
        xla.compiler_ir("gelu", x)
    with pytest.raises(TypeError):
        xla.variants(None)


def test_count_traces():
    import tensorflow as tf

    f = tf.function(lambda v: v * 2.0, jit_compile=True)
    assert xla.count_traces(f, [tf.ones((n,)) for n in (3, 4, 3)]) == [1, 2, 2]
    g = tf.function(lambda v: v * 2.0, input_signature=[tf.TensorSpec([None], tf.float32)])
    assert xla.count_traces(g, [tf.ones((n,)) for n in (3, 4, 5)]) == [1, 1, 1]
    with pytest.raises(TypeError, match="tf.function"):
        xla.count_traces(lambda v: v, [1])
    with pytest.raises(ValueError, match="non-empty"):
        xla.count_traces(f, [])


@pytest.mark.parametrize("n, want", [(0, 8), (1, 8), (8, 8), (9, 32), (32, 32), (33, 100)])
def test_bucket_length(n, want):
    assert xla.bucket_length(n, [100, 8, 32]) == want


@pytest.mark.parametrize("n, buckets, match", [
    (101, [8, 100], "does not fit"), (-1, [8], "n must be"), (2.5, [8], "n must be"),
    (3, [], "non-empty"), (3, [0, 4], "positive"), (3, "8", "non-empty"), (3, [True], "positive"),
])
def test_bucket_length_bad_input(n, buckets, match):
    with pytest.raises(ValueError, match=match):
        xla.bucket_length(n, buckets)


def test_pad_to_bucket():
    import numpy as np
    import tensorflow as tf

    x = tf.reshape(tf.range(10, dtype=tf.float32), (5, 2))
    padded, n = xla.pad_to_bucket(x, [16, 8])
    assert n == 5 and padded.shape == (8, 2)
    assert np.array_equal(padded.numpy()[:5], x.numpy()) and not padded.numpy()[5:].any()
    with pytest.raises(ValueError, match="at least one axis"):
        xla.pad_to_bucket(tf.constant(1.0), [4])
    with pytest.raises(ValueError, match="does not fit"):
        xla.pad_to_bucket(tf.zeros((9,)), [4, 8])


def test_break_even_calls():
    assert xla.break_even_calls(0.2, 0.01) == pytest.approx(20)
    assert math.isinf(xla.break_even_calls(0.2, 0.0))
    assert math.isinf(xla.break_even_calls(0.2, -0.01))
    with pytest.raises(ValueError, match=">= 0"):
        xla.break_even_calls(-1.0, 0.1)
    with pytest.raises(TypeError, match="seconds"):
        xla.break_even_calls("0.2", 0.1)


def test_probes_count_compilations():
    code = ("import tensorflow as tf\n"
            "@tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None], tf.float32)])\n"
            "def f(v):\n    return tf.reduce_sum(v * v)\n"
            "for n in (10, 20, 30, 20):\n    f(tf.ones((n,)))\n"
            "print(f.experimental_get_tracing_count())\n")
    # Two fresh processes keep this test short; the notebook's checked cell also runs the flags-on probe.
    off, on = xla.auto_clustering_jobs()
    assert on.tf_xla_flags == xla.AUTO_JIT_FLAGS and on.env == {"CUDA_VISIBLE_DEVICES": "-1"}
    off, shapes = xla.run_probes([off, xla.ProbeJob("shapes", code, env={"CUDA_VISIBLE_DEVICES": "-1"})])
    assert off.compilations == 0 and off.stdout.strip() == "autoclustering"
    assert shapes.compilations == 3 and shapes.stdout.strip() == "1"  # traced once, compiled per length
    assert "3 XLA compilation(s)" in str(shapes)


def test_run_probes_bad_input():
    with pytest.raises(TypeError, match="ProbeJob"):
        xla.run_probes([])
    with pytest.raises(TypeError, match="ProbeJob"):
        xla.run_probes(["print(1)"])
    with pytest.raises(ValueError, match="no code"):
        xla.run_probes([xla.ProbeJob("empty", "  ")])
    with pytest.raises(ValueError, match="timeout"):
        xla.run_probes([xla.ProbeJob("x", "print(1)")], timeout=0)
    with pytest.raises(RuntimeError, match="exited with 3"):
        xla.run_probes([xla.ProbeJob("fails", "import sys; sys.exit(3)")])
    with pytest.raises(TypeError, match="cpu_only"):
        xla.auto_clustering_jobs(cpu_only="yes")


def test_benchmark_rows_quick():
    rows = xla.benchmark(quick=True)
    keys = {"topic", "case", "median_s", "bound_s", "ratio_to_bound", "speedup", "note"}
    assert all(set(r) == keys and r["topic"] == "06 XLA" for r in rows)
    cases = [r["case"] for r in rows]
    assert cases == ["one memory pass", "gelu_chain eager", "gelu_chain tf.function", "gelu_chain jit_compile",
                     "MLP train step jit_compile=False", "MLP train step jit_compile=True"]
    by_case = {r["case"]: r for r in rows}
    assert by_case["gelu_chain tf.function"]["speedup"] == pytest.approx(1.0)
    assert by_case["MLP train step jit_compile=False"]["speedup"] == pytest.approx(1.0)
    assert by_case["MLP train step jit_compile=True"]["bound_s"] is None
    assert all(r["median_s"] > 0 for r in rows)
    assert all(r["ratio_to_bound"] > 0 for r in rows if r["bound_s"] is not None)
    with pytest.raises(TypeError, match="quick"):
        xla.benchmark(quick="yes")


@pytest.mark.gpu
def test_gpu_chain_fuses(fresh_python):
    from gpucourse import devices

    if not devices.nvml_gpus():
        pytest.skip("no NVIDIA GPU on this machine")
    out = fresh_python("import tensorflow as tf\nfrom gpucourse import xla\n"
                       "with tf.device('/GPU:0'):\n    x = tf.random.normal((1024,))\n"
                       "print(xla.parse_hlo(xla.compiler_ir(xla.gelu_chain, x)).fusions)")
    assert out.split()[-1] == "1"
