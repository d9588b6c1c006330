"""gpucourse.grappler: the graph Grappler makes of a tf.function, read on a CPU."""

import pytest

from gpucourse import grappler


def test_import_does_not_load_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import grappler\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


@pytest.fixture(scope="module")
def conv_fn():
    import tensorflow as tf

    @tf.function
    def f(x, k, b):
        scale = tf.sqrt(tf.constant(36.0)) * tf.constant(0.5)  # a constant subexpression: 3.0
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, k, strides=1, padding="SAME"), b)) * scale

    return f.get_concrete_function(tf.TensorSpec([1, 8, 8, 3]), tf.TensorSpec([3, 3, 3, 4]), tf.TensorSpec([4]))


def test_before_grappler_the_graph_has_every_op(conv_fn):
    ops = {op.type for op in conv_fn.graph.get_operations()}
    assert {"Conv2D", "BiasAdd", "Relu", "Sqrt"} <= ops and "_FusedConv2D" not in ops


def test_grappler_folds_constants_and_fuses_conv_bias_relu(conv_fn):
    ops = grappler.optimize_graph(conv_fn)
    assert ops["_FusedConv2D"] == 1 and not {"Conv2D", "BiasAdd", "Relu", "Sqrt"} & set(ops)
    assert ops["Mul"] == 1 and ops["Const"] == 1  # sqrt(36) * 0.5 became one constant, 3.0


def test_switching_optimizers_off(conv_fn):
    no_folding = grappler.optimize_graph(conv_fn, off=("constant_folding",))
    assert no_folding["Sqrt"] == 1 and no_folding["Mul"] == 2 and no_folding["_FusedConv2D"] == 1
    no_remap = grappler.optimize_graph(conv_fn, off="remapping")
    assert {"Conv2D", "BiasAdd", "Relu"} <= set(no_remap) and "_FusedConv2D" not in no_remap
    assert "Sqrt" not in no_remap


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"off": ("constant_fold",)}, ValueError, "constant_folding"), ({"off": 3}, TypeError, "off"),
    ({"device": ""}, ValueError, "device"),
])
def test_bad_input_is_named(conv_fn, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        grappler.optimize_graph(conv_fn, **kwargs)


def test_not_a_concrete_function():
    with pytest.raises(TypeError, match="get_concrete_function"):
        grappler.optimize_graph(lambda x: x)
