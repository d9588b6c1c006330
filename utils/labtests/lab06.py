"""Public tests for lab 06: XLA.

q1 parses HLO text into opcode counts, q2 counts the fusions XLA makes of a
function, q3 compiles a function once for every length, q4 pads to buckets.
The reference HLO parser below is deliberately independent of gpucourse.xla.
"""

import random
import re

from gpucourse.grading.items import Fail, item

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$")


def _ref_counts(text):
    """Reference: opcode -> number of instructions, over every computation."""
    counts = {}
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        rest = m.group(1).lstrip()
        if rest.startswith("("):  # tuple shape, may contain spaces
            depth = 0
            for i, ch in enumerate(rest):
                depth += (ch == "(") - (ch == ")")
                if depth == 0:
                    rest = rest[i + 1:]
                    break
        else:
            rest = rest.split(None, 1)[1] if " " in rest else ""
        op = re.match(r"\s*([a-z][a-z0-9\-]*)\(", rest)
        if op:
            counts[op.group(1)] = counts.get(op.group(1), 0) + 1
    return counts


_HANDMADE = """HloModule handmade, entry_computation_layout={(f32[4]{0})->(f32[4]{0}, f32[])}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %a, f32[] %b)
}

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(%p), metadata={op_type="Exp" op_name="exp(add)"}
  ROOT %m = f32[4]{0} multiply(%e, %p)
}

ENTRY %main (x: f32[4]) -> (f32[4], f32[]) {
  %x = f32[4]{0} parameter(0)
  %zero = f32[] constant(0)
  %exp_multiply_fusion = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %r = f32[] reduce(f32[4]{0} %exp_multiply_fusion, f32[] %zero), dimensions={0}, to_apply=%add_f32
  ROOT %out = (f32[4]{0}, f32[]) tuple(%exp_multiply_fusion, %r)
}
"""
_HANDMADE_COUNTS = {"parameter": 4, "add": 1, "exponential": 1, "multiply": 1, "constant": 1,
                    "fusion": 1, "reduce": 1, "tuple": 1}


def _random_function(rng):
    """A fresh function of one tensor, built from random elementwise ops and maybe a reduction."""
    import tensorflow as tf

    unary = [tf.sin, tf.exp, tf.tanh, tf.abs, tf.math.sigmoid]
    steps = [rng.choice(["unary", "scale", "add", "square"]) for _ in range(rng.randint(2, 5))]
    fns = [rng.choice(unary) for _ in steps]
    consts = [round(rng.uniform(0.5, 2.0), 2) for _ in steps]
    reduce_axis = rng.choice([None, 0, 1])
    normalise = rng.random() < 0.5

    def f(x):
        for step, u, c in zip(steps, fns, consts):
            if step == "unary":
                x = u(x)
            elif step == "scale":
                x = x * c
            elif step == "add":
                x = x + c
            else:
                x = x * x
        if normalise:
            x = x - tf.reduce_max(x, axis=-1, keepdims=True)
        if reduce_axis is not None:
            x = tf.reduce_sum(x, axis=reduce_axis)
        return x

    desc = " -> ".join(steps) + (" -> normalise rows" if normalise else "")
    desc += "" if reduce_axis is None else f" -> reduce_sum(axis={reduce_axis})"
    return f, desc


def _hlo(f, x, stage):
    import tensorflow as tf

    return tf.function(f, jit_compile=True).experimental_get_compiler_ir(x)(stage=stage)


@item("q1", points=3, title="count_ops counts HLO instructions by opcode")
def q1(ns):
    fn = ns.function("count_ops")
    got = fn(_HANDMADE)
    if not isinstance(got, dict):
        raise Fail(f"count_ops should return a dict {{opcode: count}}, got {type(got).__name__}")
    if dict(got) != _HANDMADE_COUNTS:
        raise Fail(f"for a small hand-written module (3 computations, a tuple-shaped ROOT) expected\n"
                   f"{_HANDMADE_COUNTS}\ngot\n{dict(got)}")
    import tensorflow as tf

    rng = random.Random()
    for _ in range(2):
        f, desc = _random_function(rng)
        shape = (rng.randint(3, 9), rng.randint(3, 9))
        x = tf.random.normal(shape)
        for stage in ("hlo", "optimized_hlo"):
            text = _hlo(f, x, stage)
            want, got = _ref_counts(text), fn(text)
            if not isinstance(got, dict) or dict(got) != want:
                raise Fail(f"for the {stage!r} HLO of a function doing {desc} on a {shape} tensor expected\n"
                           f"{want}\ngot\n{got if not isinstance(got, dict) else dict(got)}")


@item("q2", points=2, title="fusion_count counts the fusions XLA makes")
def q2(ns):
    import tensorflow as tf

    fn = ns.function("fusion_count")
    rng = random.Random()
    cases = [(lambda x: tf.nn.softmax(x), "tf.nn.softmax"), _random_function(rng), _random_function(rng)]
    for f, desc in cases:
        shape = (rng.randint(4, 12), rng.randint(4, 12))
        x = tf.random.normal(shape)
        want = _ref_counts(_hlo(f, x, "optimized_hlo")).get("fusion", 0)
        got = fn(f, x)
        if got != want:
            raise Fail(f"for a function doing {desc} on a {shape} tensor the optimized HLO has {want} "
                       f"fusion instruction(s); fusion_count returned {got!r}")


@item("q3", points=3, title="compile_any_length traces once and runs under XLA")
def q3(ns):
    import numpy as np
    import tensorflow as tf

    make = ns.function("compile_any_length")
    rng = random.Random()
    a, b = round(rng.uniform(0.5, 3.0), 2), round(rng.uniform(-1.0, 1.0), 2)

    def f(x):
        return tf.sin(x) * a + b

    g = make(f)
    if not hasattr(g, "experimental_get_tracing_count"):
        raise Fail(f"compile_any_length(f) should return a tf.function, got {type(g).__name__}")
    lengths = rng.sample(range(3, 200), 4)
    for n in lengths:
        x = tf.random.normal((n,))
        y = g(x)
        want = np.sin(x.numpy()) * a + b
        if tuple(y.shape) != (n,) or not np.allclose(y.numpy(), want, atol=1e-4):
            raise Fail(f"for f(x) = sin(x) * {a} + {b} on a length-{n} vector the result differs from f(x)")
    traces = g.experimental_get_tracing_count()
    if traces != 1:
        raise Fail(f"after calls with lengths {lengths} the function traced {traces} times; expected 1 "
                   "(give it an input_signature with an unknown length)")
    try:
        g.experimental_get_compiler_ir(tf.ones((5,)))(stage="hlo")
    except ValueError as err:
        raise Fail(f"the function is not compiled with XLA ({err})") from None


@item("q4", points=2, title="pad_to_bucket pads to the smallest bucket that fits")
def q4(ns):
    import numpy as np
    import tensorflow as tf

    pad = ns.function("pad_to_bucket")
    rng = random.Random()
    buckets = rng.sample(range(8, 129), 4)  # any order, on purpose
    lengths = [rng.randint(1, max(buckets)) for _ in range(4)] + [min(buckets), max(buckets)]
    rests = [(3,), (), (rng.randint(2, 4), rng.randint(2, 4))]  # x may have 1, 2 or 3 axes
    rests += [rng.choice(rests) for _ in lengths[len(rests):]]
    for n, rest in zip(lengths, rests):
        shape = (n,) + rest
        x = tf.random.normal(shape)
        try:
            out = pad(x, buckets)
        except NotImplementedError:
            raise
        except Exception as exc:
            raise Fail(f"pad_to_bucket(x of shape {shape}, {buckets}) raised {type(exc).__name__}: "
                       f"{str(exc).strip()[:300]}") from None
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Fail(f"pad_to_bucket should return (padded, n), got {type(out).__name__}")
        padded, got_n = out
        want_len = min(b for b in buckets if b >= n)
        got_shape = tuple(getattr(padded, "shape", ()))
        if got_shape != (want_len,) + rest or got_n != n:
            raise Fail(f"for x of shape {shape} and buckets {buckets} expected a {(want_len,) + rest} tensor and "
                       f"n={n}, got shape {got_shape} and n={got_n!r} (pad only the first axis, whatever the rank)")
        p = np.asarray(padded)
        if not (np.array_equal(p[:n], x.numpy()) and not p[n:].any()):
            raise Fail(f"for x of shape {shape} the first {n} rows must be x and the rest zeros")
    too_long = max(buckets) + rng.randint(1, 10)
    try:
        got = pad(tf.zeros((too_long, 3)), buckets)
    except ValueError:
        return
    except Exception as exc:
        raise Fail(f"x with {too_long} rows does not fit the largest bucket {max(buckets)}: expected ValueError, "
                   f"got {type(exc).__name__}: {exc}") from None
    shape = tuple(getattr(got[0], "shape", ())) if isinstance(got, tuple) and got else got
    raise Fail(f"x with {too_long} rows does not fit the largest bucket {max(buckets)}: expected ValueError, "
               f"got a result of shape {shape} (never cut data off)")
