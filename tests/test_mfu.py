"""gpucourse.mfu: formulas against TensorFlow's own counts, HLO bytes, training-step FLOPs, MFU, the explorer."""

import pytest

from gpucourse import mfu, roofline


def _spec(*shape):
    import tensorflow as tf

    return tf.TensorSpec(shape, tf.float32)


def test_formulas_count_a_multiply_add_as_two_and_bytes_not_bits():
    mm = mfu.matmul_cost(2, 3, 4, "bfloat16")
    assert mm.flops == 48 and mm.nbytes == (8 + 12 + 6) * 2 and mm.intensity == pytest.approx(48 / 52)
    assert mfu.matmul_cost(2, 3, 4, batch=5).flops == 5 * 48
    assert mfu.conv2d_cost(1, 4, 4, 2, 3, kernel=3).flops == 2 * 16 * 3 * 9 * 2
    assert mfu.softmax_cost(2, 10).flops == 100 and mfu.softmax_cost(2, 10, "float16").nbytes == 80
    fused, apart = mfu.elementwise_cost(100, 8), mfu.elementwise_cost(100, 8, fused=False)
    assert fused.flops == apart.flops == 800 and apart.nbytes == 8 * fused.nbytes == 8 * 800
    assert mfu.dtype_bytes("float16") == 2
    # judged against a roof, an op is built in the roof's dtype: a 1024^3 matmul is 171 FLOP/B in
    # float32 bytes, 341 in bfloat16 bytes (issue 32: one side of the H100's bf16 ridge or the other)
    big = mfu.matmul_cost(1024, 1024, 1024)
    in_bf16 = big.cast("bfloat16")
    assert in_bf16 == mfu.matmul_cost(1024, 1024, 1024, "bfloat16", name=big.name)
    assert round(big.intensity) == 171 and round(in_bf16.intensity) == 341
    assert roofline.datasheet_roof("H100").bound(big.intensity, "bfloat16") == "memory"
    assert roofline.datasheet_roof("H100").bound(in_bf16.intensity, "bfloat16") == "compute"
    assert mfu.softmax_cost(2, 10, "float16").cast("float32") == mfu.softmax_cost(2, 10, "float32")
    assert big.cast("tfloat32").nbytes == big.nbytes  # TF32 is float32 in memory
    with pytest.raises(ValueError, match="dtype must be one of"):
        big.cast("fp8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        mfu.dtype_bytes("fp16")
    with pytest.raises(ValueError, match="k must be >= 1"):
        mfu.matmul_cost(2, 3, 0)
    with pytest.raises(TypeError, match="fused must be True or False"):
        mfu.elementwise_cost(10, 2, fused="yes")


def test_attention_is_two_batched_matmuls_and_a_softmax():
    scores, soft, values = mfu.attention_costs(batch=2, seq=8, width=32, heads=4)
    assert scores.flops == values.flops == 2 * 2 * 8 * 8 * 32 and soft.flops == 5 * 2 * 4 * 8 * 8
    with pytest.raises(ValueError, match="width must be a multiple of heads"):
        mfu.attention_costs(1, 8, 30, 4)


def test_dense_layer_training_is_six_flops_per_weight_and_row_and_four_for_the_first():
    assert mfu.dense_train_flops(2, 3, 4) == 6 * 24
    assert mfu.dense_train_flops(2, 3, 4, first_layer=True) == 4 * 24


@pytest.mark.parametrize("build, specs, cost", [
    (lambda: (lambda a, b: __import__("tensorflow").matmul(a, b)), [(16, 32), (32, 8)], mfu.matmul_cost(16, 8, 32)),
    (lambda: (lambda x, k: __import__("tensorflow").nn.conv2d(x, k, 1, "SAME")), [(2, 8, 8, 3), (3, 3, 3, 4)],
     mfu.conv2d_cost(2, 8, 8, 3, 4)),
    (lambda: (lambda x: __import__("tensorflow").nn.softmax(x)), [(4, 50)], mfu.softmax_cost(4, 50)),
])
def test_tensorflows_own_counts_agree_with_the_formulas(build, specs, cost):
    fn = build()
    flops, per_op = mfu.count_flops(fn, *[_spec(*s) for s in specs])
    assert flops == cost.flops and sum(per_op.values()) == flops
    assert mfu.graph_bytes(fn, *[_spec(*s) for s in specs]) == cost.nbytes


def test_the_gelu_chain_fused_reads_and_writes_once_and_op_by_op_22_times():
    import tensorflow as tf

    from gpucourse import xla

    n = 1024
    flops, per_op = mfu.count_flops(xla.gelu_chain, _spec(n))
    assert flops == 8 * n and len(per_op) == 8  # tanh has no registered FLOP count
    assert mfu.graph_bytes(xla.gelu_chain, _spec(n)) == 22 * 4 * n + 16  # + four float32 scalar constants
    with tf.device("/CPU:0"):
        hlo = tf.function(xla.gelu_chain, jit_compile=True).experimental_get_compiler_ir(tf.zeros((n,)))(
            stage="optimized_hlo")
    assert mfu.hlo_bytes(hlo) == (1, 2 * 4 * n)


def test_hlo_bytes_reads_operands_by_name_and_skips_parameters_and_tuples():
    text = """HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %e = f32[4]{0} exponential(%p)
}

ENTRY %main (a: f32[4], b: bf16[2,4]) -> (f32[4], bf16[2,4]) {
  %a = f32[4]{0} parameter(0)
  %b = bf16[2,4]{1,0} parameter(1)
  %f = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused, metadata={op_name="x(y)"}
  %c = bf16[2,4]{1,0} copy(%b)
  ROOT %t = (f32[4]{0}, bf16[2,4]{1,0}) tuple(%f, %c)
}
"""
    assert mfu.hlo_bytes(text) == (2, (16 + 16) + (16 + 16))
    # TF 2.19's XLA prints each operand with its shape: `fusion(f32[4]{0} %a)`.
    older = text.replace("fusion(%a)", "fusion(f32[4]{0} %a)").replace("copy(%b)", "copy(bf16[2,4]{1,0} %b)")
    assert mfu.hlo_bytes(older) == mfu.hlo_bytes(text)
    with pytest.raises(ValueError, match="no ENTRY computation"):
        mfu.hlo_bytes("HloModule m\n")


def test_specs_must_be_full_tensorspecs():
    import tensorflow as tf

    with pytest.raises(TypeError, match="one tf.TensorSpec per argument"):
        mfu.count_flops(lambda x: x * 2, (4,))
    with pytest.raises(ValueError, match="needs a full shape"):
        mfu.count_flops(lambda x: x * 2, tf.TensorSpec((None, 4)))


def test_a_training_steps_flops_from_tensorflow_are_near_six_n_t():
    import keras

    layers = 3
    model = keras.Sequential([keras.Input((16,))] + [keras.layers.Dense(16, use_bias=False) for _ in range(layers)])
    flops, per_op = mfu.train_step_flops(model, _spec(8, 16), _spec(8, 16))
    rule = 6 * model.count_params() * 8
    matmuls = sum(v for k, v in per_op.items() if "MatMul" in k)
    assert matmuls == rule * (6 * layers - 2) / (6 * layers)  # the first layer computes no input gradient
    assert matmuls < flops < 1.05 * rule


def test_mfu_is_model_flops_per_second_over_the_peak():
    assert mfu.mfu(6e12, 2.0, 10.0) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="step_s must be > 0"):
        mfu.mfu(1.0, 0.0, 10.0)
    with pytest.raises(ValueError, match="peak_tflops must be > 0"):
        mfu.mfu(1.0, 1.0, 0)


def test_predicted_mfu_rises_with_batch_and_is_never_above_one():
    h100 = roofline.datasheet_roof("H100")
    small = mfu.predict_mfu(h100, 1024, 4, 1, 128, "bfloat16")
    big = mfu.predict_mfu(h100, 4096, 4, 32, 2048, "bfloat16")
    assert 0 < small["mfu"] < big["mfu"] <= 1.0
    assert small["params"] == 12 * 1024 * 1024 * 4
    # model FLOPs per token: 6N plus attention's 12 * layers * width * sequence (PaLM appendix B)
    for p, (width, depth, batch, seq) in [(small, (1024, 4, 1, 128)), (big, (4096, 4, 32, 2048))]:
        assert p["model_flops"] == pytest.approx((6 * p["params"] + 12 * depth * width * seq) * batch * seq)
    a100 = roofline.datasheet_roof("A100")
    f32 = mfu.predict_mfu(a100, 2048, 2, 8, 512, "float32")
    bf16 = mfu.predict_mfu(a100, 2048, 2, 8, 512, "bfloat16")
    assert bf16["step_s"] < f32["step_s"] / 5  # 16x the roof, half the bytes


def test_plot_draws_the_roof_and_every_point():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roof = roofline.datasheet_roof("T4")
    ax = mfu.plot_roofline(roof, [mfu.softmax_cost(8, 8), (mfu.matmul_cost(64, 64, 64), 1.0)], "float32",
                           extra_dtypes=["float16"])
    assert len(ax.lines) == 2 and len(ax.collections) == 3  # two roofs; two circles and one measured cross
    from tests.test_plots import tick_labels

    assert not [t for t in tick_labels(ax) if "$" in t]  # plain numbers on both log axes, no mathtext
    plt.close(ax.figure)
    with pytest.raises(TypeError, match="points must hold OpCost"):
        mfu.plot_roofline(roof, [("softmax", 1.0)])


def test_explorer_on_change_without_a_browser_state_and_static_fallback(monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpucourse import explore

    roofs = {"this machine": roofline.Roof("CPU", {"float32": 0.1}, 10.0, "measured"),
             "T4": roofline.datasheet_roof("T4"), "H100": roofline.datasheet_roof("H100")}
    update = mfu.roofline_update(roofs)
    view = update(width=1024, depth=2, batch=8, seq=512, dtype="bfloat16", device="H100")
    assert view.text.startswith("predicted MFU at best") and "attention softmax" in view.text
    assert view.figure is not None
    plt.close(view.figure)
    assert "T4 has no bfloat16 roof" in update(dtype="bfloat16", device="T4").text
    assert "CPU has no float16 roof" in update(dtype="float16", device="this machine").text

    ex = mfu.roofline_explorer(roofs, device="H100")
    ex.render({"batch": 64, "device": "T4", "dtype": "float16"})
    again = mfu.roofline_explorer(roofs, device="H100")
    assert again.values["batch"] == 64 and again.values["device"] == "T4"  # kept when the cell is re-run
    monkeypatch.setenv("GPUCOURSE_STATIC", "1")
    monkeypatch.setattr(explore, "_display", lambda obj: None)
    views = again.show_static()
    assert len(views) == 3 and "Roofline and MFU explorer" in capsys.readouterr().out
    with pytest.raises(TypeError, match="roofs must be a non-empty"):
        mfu.roofline_explorer({"T4": "T4"})
