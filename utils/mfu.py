"""09 Ops on the roofline and MFU: FLOPs and bytes of TensorFlow ops, counted by TensorFlow and by formula.

Where an op sits on a roofline depends on its *arithmetic intensity*, FLOPs per byte moved::

    from gpucourse import mfu, roofline
    op = mfu.matmul_cost(4096, 4096, 4096, "bfloat16")     # an OpCost: flops, nbytes, intensity
    roofline.datasheet_roof("H100").bound(op.intensity, "bfloat16")   # 'compute'

* Formulas: :func:`matmul_cost`, :func:`conv2d_cost`, :func:`softmax_cost`, :func:`elementwise_cost`,
  :func:`attention_costs`, :func:`dense_train_flops` (a multiply-add is 2 FLOPs; bytes are the
  inputs read once plus the output written once, at the dtype's size in bytes: the compulsory
  traffic, so the intensities are upper bounds, since real kernels may read tiles more than once);
  :meth:`OpCost.cast` puts an op in another dtype.
* From TensorFlow itself: :func:`count_flops` reads the float-operation count TensorFlow's profiler
  registers for each op of a concrete function's graph; :func:`graph_bytes` adds up the bytes every
  op of that graph reads and writes when each runs as its own kernel; :func:`hlo_bytes` does the same
  for the kernels XLA makes after fusion.
* MFU, model FLOPs utilisation (PaLM's definition): :func:`train_step_flops` counts a training
  step's FLOPs (forward and backward) from TensorFlow, :func:`mfu` divides them by the step time and
  the device's data-sheet peak. Divided by a *measured* peak instead, the same arithmetic gives the
  share of the measured (MAMF) peak, another ratio.
* :func:`plot_roofline` draws ops on a roof; :func:`transformer_ops`, :func:`predict_mfu` and
  :func:`roofline_explorer` model a transformer's step on any :class:`gpucourse.roofline.Roof`.

Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from . import _validate, plots
from ._tf import tf as _tf

__all__ = ["DTYPE_BYTES", "OpCost", "dtype_bytes", "matmul_cost", "conv2d_cost", "softmax_cost", "elementwise_cost",
           "attention_costs", "dense_train_flops", "count_flops", "graph_bytes", "hlo_bytes", "train_step_flops",
           "mfu", "plot_roofline", "transformer_ops", "predict_mfu", "roofline_update", "roofline_explorer"]

#: Bytes per element; ``tfloat32`` is float32 in memory (TF32 only changes how Tensor Cores multiply).
DTYPE_BYTES = {"float64": 8, "float32": 4, "tfloat32": 4, "float16": 2, "bfloat16": 2, "float8": 1,
               "int32": 4, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``"bfloat16"`` -> 2): bits / 8, never bits."""
    return DTYPE_BYTES[_validate.one_of("dtype", dtype, DTYPE_BYTES)]


@dataclass(frozen=True)
class OpCost:
    """One op's work: FLOPs, bytes moved, and their ratio, the arithmetic intensity (FLOP/byte)."""

    name: str
    flops: float
    nbytes: float
    dtype: str = "float32"

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes

    def cast(self, dtype: str) -> "OpCost":
        """The same op with every tensor in ``dtype``: the same FLOPs, the bytes scaled by the element size.

        Judge an op against a roof in that roof's dtype: ``matmul_cost(1024, 1024, 1024).cast("bfloat16")``
        is 341 FLOP/byte, twice the float32 figure, and right of an H100's bfloat16 ridge (295).
        """
        return OpCost(self.name, self.flops, self.nbytes * dtype_bytes(dtype) / dtype_bytes(self.dtype), dtype)


def _dims(**dims) -> list[int]:
    return [_validate.whole(k, v, 1) for k, v in dims.items()]


def matmul_cost(m: int, n: int, k: int, dtype: str = "float32", batch: int = 1, name: str = "") -> OpCost:
    """``batch`` matmuls ``(m, k) @ (k, n)``: ``2*m*n*k`` FLOPs each; reads both inputs, writes the output."""
    m, n, k, batch = _dims(m=m, n=n, k=k, batch=batch)
    b = dtype_bytes(dtype)
    return OpCost(name or f"matmul {m}x{k} @ {k}x{n}" + (f" (x{batch})" if batch > 1 else ""),
                  2.0 * batch * m * n * k, float(batch * (m * k + k * n + m * n) * b), dtype)


def conv2d_cost(batch: int, height: int, width: int, c_in: int, c_out: int, kernel: int = 3,
                dtype: str = "float32", name: str = "") -> OpCost:
    """A stride-1 ``SAME`` convolution: ``2 * kernel^2 * c_in`` FLOPs per output value; input, filter, output bytes."""
    batch, height, width, c_in, c_out, kernel = _dims(batch=batch, height=height, width=width, c_in=c_in,
                                                      c_out=c_out, kernel=kernel)
    b = dtype_bytes(dtype)
    out = batch * height * width * c_out
    return OpCost(name or f"conv {kernel}x{kernel} {c_in}->{c_out} on {batch}x{height}x{width}",
                  2.0 * out * kernel * kernel * c_in,
                  float((batch * height * width * c_in + kernel * kernel * c_in * c_out + out) * b), dtype)


def softmax_cost(rows: int, cols: int, dtype: str = "float32", name: str = "") -> OpCost:
    """Softmax over the last axis: 5 FLOPs per element (TensorFlow's count); read once, write once (fused)."""
    rows, cols = _dims(rows=rows, cols=cols)
    return OpCost(name or f"softmax {rows}x{cols}", 5.0 * rows * cols, 2.0 * rows * cols * dtype_bytes(dtype), dtype)


def elementwise_cost(n: int, ops: int, dtype: str = "float32", fused: bool = True, name: str = "") -> OpCost:
    """A chain of ``ops`` elementwise ops on ``n`` elements: ``ops * n`` FLOPs.

    Fused, the chain reads its input once and writes its result once (``2 * n`` elements); unfused,
    every op reads one full array and writes one (``2 * ops * n``): same FLOPs, ``ops`` times the bytes.
    """
    n, ops = _dims(n=n, ops=ops)
    if not isinstance(fused, bool):
        raise TypeError(f"fused must be True or False, got {fused!r}")
    moved = 2 * n * (1 if fused else ops)
    return OpCost(name or f"{ops} elementwise ops on {n}" + (" (fused)" if fused else ""), float(ops * n),
                  float(moved * dtype_bytes(dtype)), dtype)


def attention_costs(batch: int, seq: int, width: int, heads: int, dtype: str = "float32") -> list[OpCost]:
    """The three ops of attention's core: ``Q @ K^T`` scores, their softmax, and ``scores @ V``."""
    batch, seq, width, heads = _dims(batch=batch, seq=seq, width=width, heads=heads)
    if width % heads:
        raise ValueError(f"width must be a multiple of heads, got width={width}, heads={heads}")
    d = width // heads
    return [matmul_cost(seq, seq, d, dtype, batch * heads, "attention scores Q @ K^T"),
            softmax_cost(batch * heads * seq, seq, dtype, "attention softmax"),
            matmul_cost(seq, d, seq, dtype, batch * heads, "attention scores @ V")]


def dense_train_flops(batch: int, d_in: int, d_out: int, first_layer: bool = False) -> float:
    """FLOPs of a dense layer's forward and backward pass (bias ignored): ``6 * batch * d_in * d_out``.

    Forward ``x @ W`` is ``2*b*d_in*d_out``; backward computes ``dW = x^T @ dy`` and ``dx = dy @ W^T``,
    the same again each. The first layer needs no ``dx`` (nothing before it learns): ``4*b*d_in*d_out``.
    """
    batch, d_in, d_out = _dims(batch=batch, d_in=d_in, d_out=d_out)
    if not isinstance(first_layer, bool):
        raise TypeError(f"first_layer must be True or False, got {first_layer!r}")
    return (4.0 if first_layer else 6.0) * batch * d_in * d_out


# --------------------------------------------------------------------------- counted by TensorFlow


@contextlib.contextmanager
def _quiet():
    """TensorFlow's v1 profiler prints deprecation notices; they say nothing about the count."""
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        yield


def _concrete(fn, specs):
    tf = _tf()
    _validate.callable_("fn", fn)
    if not specs or not all(isinstance(s, tf.TensorSpec) for s in specs):
        raise TypeError("pass one tf.TensorSpec per argument of fn, e.g. tf.TensorSpec((64, 128), tf.float32)")
    if not all(s.shape.is_fully_defined() for s in specs):
        raise ValueError(f"every TensorSpec needs a full shape to count FLOPs and bytes, got {list(specs)}")
    fn = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
    return fn.get_concrete_function(*specs)


def count_flops(fn: Callable, *specs) -> tuple[int, dict]:
    """``(total, {op name: FLOPs})`` of ``fn``'s graph for ``specs``, from TensorFlow's profiler.

    TensorFlow registers a float-operation count for its arithmetic ops (``MatMul``: ``2*m*n*k``,
    ``Conv2D``, ``Mul``, ``Softmax``, ...), not for every op: ``Tanh`` and ``Exp`` count nothing.
    """
    tf = _tf()
    graph = _concrete(fn, specs).graph
    opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    with _quiet():
        prof = tf.compat.v1.profiler.profile(graph, options=opts)
    return int(prof.total_float_ops), {c.name: int(c.total_float_ops) for c in prof.children}


_PLUMBING = {"Placeholder", "Const", "Identity", "NoOp", "ReadVariableOp", "VarHandleOp", "Shape", "Reshape",
             "StopGradient", "IdentityN"}


def graph_bytes(fn: Callable, *specs) -> int:
    """Bytes ``fn``'s graph reads and writes when every op is its own kernel (no fusion), from its static shapes.

    Reshapes, identities and constants move nothing; scalars are counted (they are tiny).
    """
    graph = _concrete(fn, specs).graph
    total = 0
    for op in graph.get_operations():
        if op.type in _PLUMBING:
            continue
        for t in list(op.inputs) + list(op.outputs):
            if t.dtype.is_floating or t.dtype.is_integer:
                n = t.shape.num_elements()
                if n is None:
                    raise ValueError(f"op {op.name} has an unknown shape {t.shape}: give fn fully defined TensorSpecs")
                total += n * t.dtype.size
    return total


_HLO_SIZES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
              "s16": 2, "u16": 2, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_HLO_SHAPE = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}


def _shape_bytes(shape: str) -> int:
    total = 0
    for ty, dims in _HLO_SHAPE.findall(shape):
        if ty in _HLO_SIZES:
            total += _HLO_SIZES[ty] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def hlo_bytes(hlo_text: str) -> tuple[int, int]:
    """``(kernels, bytes)`` of an optimized HLO module's ENTRY computation: each kernel reads its operands, writes its result."""
    _validate.text("hlo_text", hlo_text, "optimized HLO from fn.experimental_get_compiler_ir(x)(stage='optimized_hlo')")
    entry = hlo_text[hlo_text.find("\nENTRY"):]
    if not entry.strip():
        raise ValueError("hlo_text has no ENTRY computation: pass a whole HLO module")
    shapes, kernels, total = {}, 0, 0
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\(.*?\)|\S+)\s+([a-z][a-z0-9\-]*)\((.*?)\)", line)
        if not m:
            continue
        name, shape, opcode, operands = m.groups()
        shapes[name] = _shape_bytes(shape)
        if opcode in _NOT_KERNELS:
            continue
        kernels += 1
        # Operands are `%name` (TF 2.21's XLA) or `f32[4]{0} %name` (TF 2.19's): read the names.
        total += shapes[name] + sum(shapes.get(o, 0) for o in re.findall(r"%([\w.\-]+)", operands))
    return kernels, total


def train_step_flops(model, x_spec, y_spec, loss: Callable | None = None) -> tuple[int, dict]:
    """FLOPs of one training step of a Keras ``model`` (forward, loss, gradients), from TensorFlow's profiler.

    The optimizer's update (a few FLOPs per parameter) is left out, as in the ``6 * params * tokens`` rule.
    """
    tf = _tf()
    loss = loss or (lambda y, p: tf.reduce_mean(tf.square(p - y)))

    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return tape.gradient(value, model.trainable_variables)

    return count_flops(step, x_spec, y_spec)


def mfu(model_flops: float, step_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: ``model_flops / step_s`` as a fraction of ``peak_tflops`` (dense, this dtype).

    MFU proper divides by the data sheet's peak. Given a measured peak (a MAMF sweep's best matmul), the
    same arithmetic gives the share of the measured peak, a larger and different ratio: say which.
    """
    model_flops = _validate.real("model_flops", model_flops, 0.0, what="FLOPs of one step, forward and backward")
    step_s = _validate.real("step_s", step_s, 0.0, strict_min=True, what="seconds per step")
    peak = _validate.real("peak_tflops", peak_tflops, 0.0, strict_min=True, what="the device's dense peak")
    return model_flops / step_s / (peak * 1e12)


# --------------------------------------------------------------------------- the picture and the model


def plot_roofline(roof, points: Sequence, dtype: str = "float32", *, extra_dtypes: Sequence[str] = (),
                  title: str = "", ax=None):
    """Log-log roofline of ``roof`` for ``dtype`` (and dashed roofs for ``extra_dtypes``) with ``points``.

    ``points`` holds :class:`OpCost` (drawn at their attainable rate) or ``(OpCost, measured TFLOP/s)``.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    points = _validate.sequence("points", points, "OpCost or (OpCost, measured TFLOP/s) items")
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.6))
    pairs = [(p, None) if isinstance(p, OpCost) else tuple(p) for p in points]
    if not all(isinstance(p, OpCost) for p, _ in pairs):
        raise TypeError("points must hold OpCost items or (OpCost, measured TFLOP/s) pairs")
    lows = [p.intensity for p, _ in pairs] + [roof.ridge(dtype)]
    xs = np.logspace(math.log10(min(lows) / 4), math.log10(max(lows + [p.intensity for p, _ in pairs]) * 4), 200)
    for d, style in [(dtype, "-")] + [(d, "--") for d in extra_dtypes]:
        ax.plot(xs, [roof.attainable(x, d) for x in xs], style, color="#333333" if style == "-" else "#8172b2",
                label=f"{roof.name} {d} roof ({roof.peak(d):.3g} TFLOP/s, {roof.bandwidth_gbs:,.0f} GB/s)")
    for i, (p, measured) in enumerate(pairs):
        color = plt.cm.tab10(i % 10)
        ax.scatter([p.intensity], [roof.attainable(p.intensity, p.dtype if p.dtype in roof.peaks else dtype)],
                   marker="o", facecolors="none", edgecolors=[color], s=60, label=f"{p.name}: {p.intensity:.3g} FLOP/B")
        if measured is not None:
            ax.scatter([p.intensity], [measured], marker="x", color=color, s=50)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plots.label_log_axes(ax)
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or f"Roofline of {roof.name} (o: what the roof allows, x: measured)")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def transformer_ops(width: int, depth: int, batch: int, seq: int, dtype: str = "float32") -> list[OpCost]:
    """The forward ops of one transformer layer (heads of 64, MLP 4x wide, GELU) for ``batch x seq`` tokens."""
    width, depth, batch, seq = _dims(width=width, depth=depth, batch=batch, seq=seq)
    tokens, heads = batch * seq, max(1, width // 64)
    if width % heads:
        raise ValueError(f"width must be a multiple of 64 (heads of 64), got {width}")
    return [matmul_cost(tokens, 3 * width, width, dtype, name="QKV projection"),
            *attention_costs(batch, seq, width, heads, dtype),
            matmul_cost(tokens, width, width, dtype, name="output projection"),
            matmul_cost(tokens, 4 * width, width, dtype, name="MLP up"),
            elementwise_cost(tokens * 4 * width, 8, dtype, fused=True, name="GELU (fused)"),
            matmul_cost(tokens, width, 4 * width, dtype, name="MLP down")]


def predict_mfu(roof, width: int, depth: int, batch: int, seq: int, dtype: str = "bfloat16") -> dict:
    """The roofline's best case for a transformer step on ``roof``: step time and MFU.

    Every op takes ``max(flops / peak, bytes / bandwidth)``; the backward pass costs twice the
    forward, so a step is 3 forward passes of ``depth`` layers. Model FLOPs per token are PaLM's
    (appendix B): ``6 * params`` plus attention's ``12 * depth * width * seq`` (``Q @ K^T`` and
    ``scores @ V``, 2 FLOPs per multiply-add each, forward and backward), which no parameter count
    shows and which dominates at long sequences. Host overhead, input, communication and launch gaps
    are *not* in it: a real step is slower, so this is an upper bound on MFU.
    """
    ops = transformer_ops(width, depth, batch, seq, dtype)
    step_s = 3 * depth * sum(roof.seconds(op.flops, op.nbytes, dtype) for op in ops)
    params = 12 * width * width * depth
    attention = 3 * depth * (ops[1].flops + ops[3].flops)
    model_flops = 6.0 * params * batch * seq + attention
    return {"ops": ops, "step_s": step_s, "params": params, "model_flops": model_flops,
            "mfu": model_flops / step_s / (roof.peak(dtype) * 1e12)}


_WIDTHS = (256, 512, 1024, 2048, 4096, 8192)
_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
_SEQS = (128, 256, 512, 1024, 2048, 4096)


def roofline_update(roofs: Mapping) -> Callable:
    """The explorer's on-change function over ``roofs`` ({name: Roof}); returns a View (no browser needed)."""
    from .explore import View

    def update(width=1024, depth=12, batch=8, seq=512, dtype="bfloat16", device=""):
        import matplotlib.pyplot as plt

        roof = roofs[device or next(iter(roofs))]
        if dtype not in roof.peaks:
            return View(f"{roof.name} has no {dtype} roof (its roofs: {', '.join(roof.peaks)}): pick another dtype")
        p = predict_mfu(roof, width, depth, batch, seq, dtype)
        memory = [op.name for op in p["ops"] if roof.bound(op.intensity, dtype) == "memory"]
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        plot_roofline(roof, p["ops"], dtype, ax=ax, title=f"One layer of a {p['params'] / 1e6:,.0f}M-parameter "
                                                           f"transformer on {roof.name}, {dtype}")
        text = (f"predicted MFU at best {p['mfu']:.0%} ({roof.name}, {dtype}): step {p['step_s'] * 1e3:.3g} ms for "
                f"{p['model_flops'] / 1e12:.3g} TFLOP; memory-bound: {', '.join(memory) or 'none'}\n"
                "(the roofline's upper bound: host, input and communication time come on top)")
        return View(text, fig)

    return update


def roofline_explorer(roofs: Mapping, **defaults):
    """An :class:`gpucourse.explore.Explorer` over ``roofs`` ({name: Roof}, e.g. this machine and data-sheet GPUs)."""
    from . import roofline
    from .explore import Explorer, dropdown, slider

    if not isinstance(roofs, Mapping) or not roofs or not all(isinstance(r, roofline.Roof) for r in roofs.values()):
        raise TypeError("roofs must be a non-empty {name: roofline.Roof} dict (measure_roof, datasheet_roof)")
    controls = [dropdown("width", _WIDTHS, defaults.get("width", 1024), label="model width"),
                slider("depth", 1, 48, defaults.get("depth", 12), label="layers"),
                dropdown("batch", _BATCHES, defaults.get("batch", 8), label="batch size"),
                dropdown("seq", _SEQS, defaults.get("seq", 512), label="sequence length"),
                dropdown("dtype", ("float32", "tfloat32", "bfloat16", "float16"), defaults.get("dtype", "bfloat16")),
                dropdown("device", list(roofs), defaults.get("device", next(iter(roofs))))]
    names = list(roofs)
    presets = [{"device": names[-1], "batch": 1, "seq": 128}, {"device": names[-1], "batch": 64, "seq": 2048}]
    return Explorer("09-roofline", roofline_update(roofs), controls, title="Roofline and MFU explorer",
                    presets=presets)
