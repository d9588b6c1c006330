"""Grappler: read what TensorFlow's graph optimizer makes of a ``tf.function``, on any machine.

The one job: :func:`optimize_graph` runs Grappler, the optimizer TensorFlow
applies to every ``tf.function`` graph before it runs it (with or without
XLA), on a traced concrete function, and returns the op types of the graph it
would run. ``fn.get_concrete_function(...).graph`` shows the graph *before*
Grappler; this shows it after, so constant folding and the remapper's fusions
(``Conv2D + BiasAdd + Relu`` -> ``_FusedConv2D``) can be seen on a CPU.

It uses the same entry point TensorFlow's own Grappler tests use
(``tensorflow.python.grappler.tf_optimizer.OptimizeGraph``), with every node
placed on one device (default ``/device:CPU:0``), because several optimizers,
the remapper among them, only rewrite nodes whose device they know. Importing
this module never imports TensorFlow.
"""

from __future__ import annotations

from collections import Counter

from . import _validate
from ._tf import tf as _tf

__all__ = ["OPTIMIZERS", "optimize_graph"]

#: Grappler optimizers that can be switched off here (fields of ``RewriterConfig``, and keys of
#: ``tf.config.optimizer.set_experimental_options``).
OPTIMIZERS = ("constant_folding", "arithmetic_optimization", "remapping", "layout_optimizer",
              "dependency_optimization", "loop_optimization", "shape_optimization")


def optimize_graph(concrete_function, *, off=(), device: str = "/device:CPU:0") -> Counter:
    """Op types (with counts) of ``concrete_function``'s graph after Grappler, with the optimizers in ``off`` disabled.

    Args:
        concrete_function: ``fn.get_concrete_function(...)`` of a ``tf.function``.
        off: names from :data:`OPTIMIZERS` to switch off, e.g. ``("constant_folding",)``.
        device: the device every node is placed on before optimizing.
    """
    tf = _tf()
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph = getattr(concrete_function, "graph", None)
    outputs = getattr(concrete_function, "outputs", None)
    if graph is None or outputs is None or not hasattr(graph, "as_graph_def"):
        raise TypeError(f"concrete_function must be what fn.get_concrete_function(...) returns, got "
                        f"{type(concrete_function).__name__}")
    if isinstance(off, str):
        off = (off,)
    off = _validate.sequence("off", off, f"optimizer names from {', '.join(OPTIMIZERS)}") if off != () else []
    for name in off:
        _validate.one_of("each name in off", name, OPTIMIZERS)
    _validate.text("device", device, "e.g. '/device:CPU:0'")
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        node.device = device
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph)
    fetch = meta.collection_def["train_op"]  # Grappler keeps what this collection names, prunes the rest
    for t in outputs:
        fetch.node_list.value.append(t.name)
    config = config_pb2.ConfigProto()
    for name in off:
        setattr(config.graph_options.rewrite_options, name, rewriter_config_pb2.RewriterConfig.OFF)
    optimized = tf_optimizer.OptimizeGraph(config, meta)
    return Counter(node.op for node in optimized.node)

