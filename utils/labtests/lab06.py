"""Lab 06 (XLA): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`). ``cases``
draws fresh inputs on the grader's side: random hand-written-style HLO
modules (several computations, tuple shapes, metadata with parentheses and
equals signs, ROOT lines, names that mention "fusion"), and *descriptions* of
random elementwise functions. ``observe`` runs the learner's code in the
learner's kernel and returns plain data. ``judge`` computes every expected
answer on the grader's side: opcode counts with the reference parser below,
fusion counts by rebuilding the function from its description and compiling
it with XLA in the grader's own process, on the CPU (XLA's GPU compiler fuses
differently, so both sides compile for the CPU). Nothing here uses
:mod:`gpucourse.xla`.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import re

from gpucourse.grading.items import Fail, expect_raised, in_kernel, item, outcome, tr

# --------------------------------------------------------------------------- reference HLO reading

_INSTR = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")


def _after_shape(rest: str) -> str:
    """The text after an instruction's shape: 'f32[4]{0} add(...)' or '(f32[4]{0}, s32[]) tuple(...)'."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                return rest[i + 1:]
        return ""
    return rest.split(None, 1)[1] if " " in rest else ""


def _instructions(text: str):
    """(computation, is_root, tuple_shaped, opcode) for every instruction line of an HLO module."""
    comp, out = None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("{") and "->" in stripped and "=" not in stripped.split("(", 1)[0]:
            comp = "ENTRY" if stripped.startswith("ENTRY") else stripped.split()[0]
            continue
        if stripped == "}":
            comp = None
            continue
        m = _INSTR.match(line)
        if comp is None or not m:
            continue
        op = _OPCODE.match(_after_shape(m.group(2)))
        if op:
            out.append((comp, bool(m.group(1)), m.group(2).lstrip().startswith("("), op.group(1)))
    return out


def _counts(text: str, keep=lambda comp, root, tup: True) -> dict:
    counts: dict = {}
    for comp, root, tup, op in _instructions(text):
        if keep(comp, root, tup):
            counts[op] = counts.get(op, 0) + 1
    return counts


def _ref_counts(text: str) -> dict:
    """Reference: opcode -> number of instructions, over every computation."""
    return _counts(text)


# --------------------------------------------------------------------------- random hand-written modules

_UNARY = ["exponential", "negate", "tanh", "log", "sqrt", "abs", "cosine", "sine", "rsqrt", "logistic"]
_BINARY = ["add", "multiply", "subtract", "divide", "maximum", "minimum", "power"]
_TF_OPS = ["Mul", "AddV2", "Tanh", "Exp", "Sum", "Max", "Softmax"]


def _metadata(rng) -> str:
    """Metadata the way TensorFlow writes it, with parentheses and equals signs inside the strings."""
    op = rng.choice(_TF_OPS)
    name = rng.choice([f"model/dense_{rng.randint(1, 9)}/{op}(x=2)", f"exp(add(x, y=1))/{op}",
                       f"while/body/{op.lower()}(a)=b", f"multiply_fusion/{op}"])
    src = rng.choice(["/tmp/train (copy).py", "/content/model.py", "<ipython-input-3-ab(c)>"])
    return f', metadata={{op_type="{op}" op_name="{name}" source_file="{src}" source_line={rng.randint(1, 400)}}}'


def _shape(rng, dims) -> str:
    if not dims:
        return "f32[]"
    layout = ",".join(str(i) for i in reversed(range(len(dims))))
    return f"f32[{','.join(map(str, dims))}]{{{layout}}}"


def _random_module(rng) -> tuple[str, dict]:
    """A hand-written-style HLO module and, by construction, its opcode counts (used by the unit tests)."""
    counts: dict = {}
    n = rng.choice([4, 8, 16])
    vec = _shape(rng, [n])
    lines = [f"HloModule {rng.choice(['jit_step', 'handmade', 'a_inference_f_12__'])}.{rng.randint(1, 99)}, "
             f"entry_computation_layout={{({vec})->({vec}, f32[])}}", ""]

    def emit(comp_lines, name, shape, op, operands, attrs="", root=False):
        comp_lines.append(f"  {'ROOT ' if root else ''}%{name} = {shape} {op}({operands}){attrs}")
        counts[op] = counts.get(op, 0) + 1

    # A scalar reduction body: parameters, then ROOT.
    red = f"%{rng.choice(['add', 'region_0', 'sum_f32'])}.{rng.randint(1, 50)}"
    body = [f"{red} (Arg_0.1: f32[], Arg_1.2: f32[]) -> f32[] {{"]
    emit(body, "Arg_0.1", "f32[]", "parameter", "0")
    emit(body, "Arg_1.2", "f32[]", "parameter", "1")
    emit(body, "add.3", "f32[]", rng.choice(["add", "maximum"]), "f32[] %Arg_0.1, f32[] %Arg_1.2", root=True)
    lines += body + ["}", ""]

    # Fused computations: elementwise chains, one of them multi-output with a tuple ROOT.
    fused_names = []
    for k in range(rng.randint(2, 3)):
        name = f"%fused_computation{'.' + str(k) if k else ''}"
        fused_names.append(name)
        comp = [f"{name} (param_0.{k}: {vec}) -> {'(' + vec + ', ' + vec + ')' if k == 0 else vec} {{"]
        emit(comp, f"param_0.{k}", vec, "parameter", "0")
        prev = f"%param_0.{k}"
        for j in range(rng.randint(2, 5)):
            meta = _metadata(rng) if rng.random() < 0.6 else ""
            if rng.random() < 0.5:
                op = rng.choice(_UNARY)
                emit(comp, f"{op}.{k}{j}", vec, op, f"{vec} {prev}", meta)
            else:
                op = rng.choice(_BINARY)
                emit(comp, f"{op}.{k}{j}", vec, op, f"{vec} {prev}, {vec} %param_0.{k}", meta)
            prev = f"%{op}.{k}{j}"
        if k == 0:
            emit(comp, f"tuple.{k}", f"({vec}, {vec})", "tuple", f"{prev}, %param_0.{k}", root=True)
        else:
            op = rng.choice(_UNARY)
            emit(comp, f"{op}.{k}9", vec, op, f"{vec} {prev}", _metadata(rng), root=True)
        lines += comp + ["}", ""]

    # The entry computation: parameters, fusions (one multi-output), a reduce, a nested tuple, a tuple ROOT.
    entry = [f"ENTRY %main.{rng.randint(10, 99)} (x: {vec}) -> ({vec}, f32[]) {{"]
    emit(entry, "x.1", vec, "parameter", "0")
    emit(entry, "constant.2", "f32[]", "constant", rng.choice(["0", "-inf", "1.5"]))
    emit(entry, "loop_multiply_fusion", f"({vec}, {vec})", "fusion", f"{vec} %x.1",
         f", kind=kLoop, calls={fused_names[0]}" + _metadata(rng))
    emit(entry, "get-tuple-element.4", vec, "get-tuple-element", f"({vec}, {vec}) %loop_multiply_fusion", ", index=0")
    last = "%get-tuple-element.4"
    for name in fused_names[1:]:
        fname = f"{rng.choice(['loop_add', 'input_exp', 'fusion'])}_fusion.{rng.randint(1, 99)}"
        emit(entry, fname, vec, "fusion", f"{vec} {last}", f", kind={rng.choice(['kLoop', 'kInput'])}, calls={name}")
        last = "%" + fname
    loss = rng.choice(["exp", "mean", "softplus", "relu"])  # words with "(" in metadata that are no opcode
    emit(entry, "reduce.7", "f32[]", "reduce", f"{vec} {last}, f32[] %constant.2", f", dimensions={{0}}, to_apply={red}"
         f', metadata={{op_type="Sum" op_name="loss/{loss}(logits=y)/Sum" source_file="/tmp/a.py" source_line=7}}')
    if rng.random() < 0.7:
        emit(entry, "nested.8", f"(({vec}, f32[]), f32[])", "tuple", f"%pair.9, f32[] %reduce.7")
        entry.insert(len(entry) - 1, f"  %pair.9 = ({vec}, f32[]) tuple({vec} {last}, f32[] %reduce.7)")
        counts["tuple"] = counts.get("tuple", 0) + 1
    emit(entry, "tuple.10", f"({vec}, f32[])", "tuple", f"{vec} {last}, f32[] %reduce.7", root=True)
    lines += entry + ["}", ""]
    return "\n".join(lines), counts


# --------------------------------------------------------------------------- random functions, by description

_UNARY_TF = ["sin", "exp", "tanh", "abs", "sigmoid"]


def _describe(rng) -> dict:
    """A JSON-able description of a random function of one 2-D tensor."""
    steps = [rng.choice(["unary", "scale", "add", "square"]) for _ in range(rng.randint(2, 5))]
    return {"steps": steps, "unary": [rng.choice(_UNARY_TF) for _ in steps],
            "consts": [round(rng.uniform(0.5, 2.0), 2) for _ in steps],
            "normalise": rng.random() < 0.5, "reduce_axis": rng.choice([None, 0, 1])}


def _words(desc: dict) -> str:
    if desc == "softmax":
        return "tf.nn.softmax"
    text = " -> ".join(u if s == "unary" else s for s, u in zip(desc["steps"], desc["unary"]))
    text += " -> " + tr("normalise rows") if desc["normalise"] else ""
    return text + ("" if desc["reduce_axis"] is None else f" -> reduce_sum(axis={desc['reduce_axis']})")


def _build(desc):
    """The function a description stands for (the same on both sides)."""
    import tensorflow as tf

    if desc == "softmax":
        return lambda x: tf.nn.softmax(x)
    unary = {"sin": tf.sin, "exp": tf.exp, "tanh": tf.tanh, "abs": tf.abs, "sigmoid": tf.math.sigmoid}

    def f(x):
        for step, u, c in zip(desc["steps"], desc["unary"], desc["consts"]):
            if step == "unary":
                x = unary[u](x)
            elif step == "scale":
                x = x * c
            elif step == "add":
                x = x + c
            else:
                x = x * x
        if desc["normalise"]:
            x = x - tf.reduce_max(x, axis=-1, keepdims=True)
        if desc["reduce_axis"] is not None:
            x = tf.reduce_sum(x, axis=desc["reduce_axis"])
        return x

    return f


def _input(case):
    import numpy as np
    import tensorflow as tf

    with tf.device("/CPU:0"):
        return tf.constant(np.random.default_rng(case["seed"]).standard_normal(case["shape"]).astype(np.float32))


def _cpu_hlo(desc, case, stage: str) -> str:
    """HLO of the described function for the case's input, compiled for the CPU."""
    import tensorflow as tf

    with tf.device("/CPU:0"):
        return tf.function(_build(desc), jit_compile=True).experimental_get_compiler_ir(_input(case))(stage=stage)


def _function_case(rng, desc) -> dict:
    return {"fn": desc, "shape": [rng.randint(4, 12), rng.randint(4, 12)], "seed": rng.randint(0, 10**6)}


# --------------------------------------------------------------------------- q1


def _q1_hint(text: str, got: dict, want: dict) -> str:
    if got == _counts(text, lambda comp, root, tup: comp == "ENTRY"):
        return tr(" You counted only the ENTRY computation: count the instructions of every computation "
                  "(fused computations and reduction bodies too).")
    if got == _counts(text, lambda comp, root, tup: not root):
        return tr(" You skipped the ROOT lines: `ROOT %name = ...` is an instruction too.")
    if got == _counts(text, lambda comp, root, tup: not tup):
        return tr(" You missed the instructions whose shape is a tuple, such as `(f32[4]{0}, f32[]) tuple(...)`: "
                  "skip the whole parenthesised shape before reading the opcode.")
    extra = sorted(k for k in got if k not in want)
    if extra:
        return tr(" {extra} is not the opcode of any instruction: such words appear inside metadata={{...}}, "
                  "attributes or computation headers. Read only the word right after the shape.", extra=extra)
    return ""


def _dict_or_none(value):
    return value if isinstance(value, dict) and all(isinstance(v, int) for v in value.values()) else None


@item("q1", points=3, title="count_ops counts HLO instructions by opcode")
class q1:
    def cases(rng):
        out = [{"text": _random_module(rng)[0]} for _ in range(3)]
        desc = _describe(rng)
        real = _function_case(rng, desc)
        return out + [dict(real, stage="hlo"), dict(real, stage="optimized_hlo")]

    def observe(ns, case):
        fn = ns.function("count_ops")
        if "text" in case:
            got = fn(case["text"])
        else:
            got = fn(_cpu_hlo(case["fn"], case, case["stage"]))
        return {"got": got, "is_dict": isinstance(got, dict), "type": type(got).__name__}

    def judge(case, seen):
        if not seen["is_dict"]:
            raise Fail(tr("count_ops should return a dict {{opcode: count}}, got a {kind}", kind=seen["type"]))
        got = _dict_or_none(seen["got"])
        if got is None:
            raise Fail(tr("count_ops should map each opcode to a whole number, got {got}", got=seen["got"]))
        if "text" in case:
            text, what = case["text"], tr("a hand-written module (several computations, tuple shapes, metadata)")
        else:
            text = _cpu_hlo(case["fn"], case, case["stage"])
            what = tr("the {stage} HLO of a function doing {steps} on a {shape} tensor", stage=repr(case["stage"]),
                      steps=_words(case["fn"]), shape=case["shape"])
        want = _ref_counts(text)
        if got != want:
            diff = {k: (want.get(k, 0), got.get(k, 0)) for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)}
            shown = "\n".join(tr("  {opcode}: expected {want}, got {got}", opcode=k, want=w, got=g)
                              for k, w, g in ((k, *v) for k, v in diff.items()))
            raise Fail(tr("for {what} the counts differ:\n{shown}\n{hint}", what=what, shown=shown,
                          hint=_q1_hint(text, got, want).strip()).rstrip()
                       + ("" if "text" not in case else "\n" + tr("The module:\n{text}", text=text)))


# --------------------------------------------------------------------------- q2


@in_kernel
def _q2_observe(ns, case):
    import tensorflow as tf

    fn = ns.function("fusion_count")
    f, x = _build(case["fn"]), _input(case)
    with tf.device("/CPU:0"):
        got = fn(f, x)
    # If the learner's fusion_count builds on count_ops (q1), q2's message says when that is the culprit.
    helper = None
    if "count_ops" in ns:
        try:
            counted = ns.value("count_ops")(_cpu_hlo(case["fn"], case, "optimized_hlo"))
            helper = counted.get("fusion", 0) if isinstance(counted, dict) else None
        except Exception:  # not written yet, or broken: q1 reports that
            helper = None
    return {"got": got, "type": type(got).__name__, "count_ops_fusions": helper}


@item("q2", points=2, title="fusion_count counts the fusions XLA makes")
class q2:
    def cases(rng):
        return [_function_case(rng, "softmax"), _function_case(rng, _describe(rng)), _function_case(rng, _describe(rng))]

    def observe(ns, case):
        return ns.kernel(_q2_observe, case)

    def judge(case, seen):
        text = _cpu_hlo(case["fn"], case, "optimized_hlo")
        want = _ref_counts(text).get("fusion", 0)
        got = seen["got"]
        what = tr("for a function doing {steps} on a {shape} tensor", steps=_words(case["fn"]), shape=case["shape"])
        if isinstance(got, bool) or not isinstance(got, int):
            raise Fail(tr("fusion_count should return a whole number (int), got {got} ({kind}) {what}", got=repr(got),
                          kind=seen["type"], what=what))
        if got == want:
            return
        msg = tr("{what} the optimized HLO has {want} fusion instruction(s); fusion_count returned {got}.", what=what,
                 want=want, got=got)
        helper = seen.get("count_ops_fusions")
        if helper is not None and helper == got:
            msg += tr(" Your count_ops (q1) also finds {helper} fusion(s) in that same HLO, so the mistake is "
                      "probably in count_ops, not here: fix it first (run check(\"q1\")), then re-run this check.",
                      helper=helper)
        elif got > want:
            msg += tr(" Count instructions whose opcode is `fusion`, not mentions of the word: fusion "
                      "instructions' names, `calls=%fused_computation` and metadata mention it too.")
        elif got == 0:
            msg += tr(" Compile with jit_compile=True and read stage=\"optimized_hlo\": the \"hlo\" stage is "
                      "what XLA receives, before its passes fuse anything.")
        raise Fail(msg)


# --------------------------------------------------------------------------- q3


def _q3_input(seed: int, n: int):
    import numpy as np

    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _q3_want(case, i):
    """Reference: fn(x, scale, mode) of the i-th call, in float32 like TensorFlow."""
    import numpy as np

    x, scale, b = _q3_input(case["seed"] + i, case["lengths"][i]), np.float32(case["scales"][i]), np.float32(case["b"])
    return np.sin(x) * scale + b if case["modes"][i] == "train" else np.cos(x) * scale - b


@in_kernel
def _q3_observe(ns, case, traced):
    import tensorflow as tf
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    b = case["b"]
    traced = tf.autograph.experimental.do_not_convert(traced)

    def fn(x, scale, mode):
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a Python str ('train' or 'eval'): fn branches on it in Python, "
                            f"got a {type(mode).__name__}")
        # Tells the check each time this Python body runs (once per trace; on every call when run eagerly) and
        # whether it runs inside an XLA compilation: the count lives in the check, not in this kernel.
        traced(mode, bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())),
               tf.executing_eagerly())
        if mode == "train":
            return tf.sin(x) * scale + b
        return tf.cos(x) * scale - b

    g = ns.function("compile_once")(fn)
    if not callable(g):
        return {"type": type(g).__name__}
    outputs = []
    try:
        for i, (n, scale, mode) in enumerate(zip(case["lengths"], case["scales"], case["modes"])):
            outputs.append(g(tf.constant(_q3_input(case["seed"] + i, n)), scale, mode))
    except TypeError as exc:
        if "mode must be a Python str" not in str(exc):
            raise
        return {"type": "callable", "mode_error": str(exc).split("TypeError: ")[-1].strip().splitlines()[0][:200]}
    return {"type": "callable", "outputs": outputs}


def _q3_hint(case, mode, traces) -> str:
    """Why the calls with ``mode`` traced ``traces`` times (several traces), as a hint."""
    calls = [i for i, m in enumerate(case["modes"]) if m == mode]
    if all(eager for _, _, eager in traces):
        return tr(" fn's Python ran on every call: it is not traced at all (a plain Python function, or functions "
                  "run eagerly).")
    if len(traces) == 2:
        return tr(" reduce_retracing=True still traces twice (once with the first shape, once generalised).")
    if len(traces) == len(calls):
        return tr(" Every call traced anew: a Python number is part of the trace's signature, so every new scale "
                  "is a new trace (and so is every new length without an unknown dimension). Pass scale as a tensor, "
                  "give x the shape [None], and keep mode, which fn needs in Python, out of the signature.")
    return ""


@item("q3", points=3, title="compile_once traces once per mode, for any length and scale, under XLA")
class q3:
    def cases(rng):
        modes = ["train"] * 3 + ["eval"] * 3  # three calls per mode: a trace per call (3) is not reduce_retracing's 2
        rng.shuffle(modes)
        return [{"b": round(rng.uniform(-1.0, 1.0), 2), "modes": modes, "lengths": rng.sample(range(3, 200), 6),
                 "scales": [round(rng.uniform(0.1, 3.0), 3) for _ in range(6)], "seed": rng.randint(0, 10**6)}]

    def observe(ns, case):
        traces = []  # [mode, in XLA, eager] each time fn's body ran: recorded here, where the check runs
        seen = ns.kernel(_q3_observe, case, lambda mode, xla, eager: traces.append([str(mode), bool(xla),
                                                                                      bool(eager)]))
        return dict(seen, traces=list(traces))

    def judge(case, seen):
        import numpy as np

        if seen["type"] != "callable":
            raise Fail(tr("compile_once(fn) should return a function to call as g(x, scale, mode), got a {kind}",
                          kind=seen["type"]))
        if "mode_error" in seen:
            raise Fail(tr("g passed mode to fn as a tensor, but fn needs it in Python (it branches on it with `if`): "
                          "{error}. Keep mode a Python str: one trace per mode is expected", error=seen["mode_error"]))
        b = case["b"]
        for i, (n, y) in enumerate(zip(case["lengths"], seen["outputs"])):
            y = np.asarray(y, dtype=np.float32)
            if y.shape != (n,) or not np.allclose(y, _q3_want(case, i), rtol=1e-5, atol=1e-5):
                raise Fail(tr("g(x, {scale}, {mode}) on a length-{n} vector should equal fn(x, {scale}, {mode}) "
                              "(here sin(x) * scale + {b} for 'train', cos(x) * scale - {b} for 'eval'); got shape "
                              "{shape} or other values", scale=case["scales"][i], mode=repr(case["modes"][i]), n=n, b=b,
                              shape=list(y.shape)))
        calls = list(zip(case["lengths"], case["scales"], case["modes"]))
        for mode in ("train", "eval"):
            mine = [t for t in seen["traces"] if t[0] == mode]
            if len(mine) > 1:
                raise Fail(tr("the {count} calls with mode={mode} (lengths {lengths}, scales {scales}) ran fn's "
                              "Python {traces} times; it should be traced once per mode.{hint}",
                              count=sum(m == mode for _, _, m in calls), mode=repr(mode),
                              lengths=[n for n, _, m in calls if m == mode],
                              scales=[s for _, s, m in calls if m == mode], traces=len(mine),
                              hint=_q3_hint(case, mode, mine)))
        if any(not xla for _, xla, _ in seen["traces"]):
            raise Fail(tr("fn was traced once per mode, but not for XLA: compile it with jit_compile=True"))


# --------------------------------------------------------------------------- q4


@in_kernel
def _q4_observe(ns, case):
    import numpy as np
    import tensorflow as tf

    pad = ns.function("pad_to_bucket")
    if "too_long" in case:
        return outcome(lambda: pad(tf.zeros((case["too_long"], 3)), case["buckets"]))
    x = tf.constant(np.random.default_rng(case["seed"]).standard_normal(case["shape"]).astype(np.float32))
    out = pad(x, case["buckets"])
    if not (isinstance(out, tuple) and len(out) == 2):
        return {"type": type(out).__name__}
    padded = np.asarray(out[0])
    return {"type": "pair", "shape": list(padded.shape), "values": padded, "n": out[1]}


@item("q4", points=2, title="pad_to_bucket pads to the smallest bucket that fits")
class q4:
    def cases(rng):
        buckets = rng.sample(range(8, 129), 4)
        rest_order = sorted(buckets)[:-1]
        rng.shuffle(rest_order)
        buckets = [max(buckets)] + rest_order  # any order, on purpose: the largest comes first
        lengths = [rng.randint(1, min(buckets))] + [rng.randint(1, max(buckets)) for _ in range(3)] + [
            min(buckets), max(buckets)]
        rests = [[], [3], [rng.randint(2, 4), rng.randint(2, 4)]]  # x may have 1, 2 or 3 axes
        rests += [rng.choice(rests) for _ in lengths[len(rests):]]
        out = [{"buckets": buckets, "shape": [n] + r, "seed": rng.randint(0, 10**6)} for n, r in zip(lengths, rests)]
        return out + [{"buckets": buckets, "too_long": max(buckets) + rng.randint(1, 10)}]

    def observe(ns, case):
        return ns.kernel(_q4_observe, case)

    def judge(case, seen):
        import numpy as np

        buckets = case["buckets"]
        if "too_long" in case:
            return expect_raised(seen, tr("pad_to_bucket(x with {rows} rows, {buckets})", rows=case["too_long"],
                                          buckets=buckets),
                                 tr("it does not fit the largest bucket {largest}: never cut data off",
                                    largest=max(buckets)))
        shape = case["shape"]
        n = shape[0]
        if seen["type"] != "pair":
            raise Fail(tr("pad_to_bucket should return a pair (padded, n), got a {kind}", kind=seen["type"]))
        want = [min(b for b in buckets if b >= n)] + shape[1:]
        if seen["shape"] != want or seen["n"] != n:
            hint = tr(" (pad only the first axis, whatever the rank)")
            first_fit = next(b for b in buckets if b >= n)
            if seen["shape"][:1] == [first_fit] and first_fit != want[0]:
                hint = tr(" The buckets come in any order: {first} is the first that fits, but {smallest} is "
                          "the smallest; take the smallest bucket that holds x.", first=first_fit, smallest=want[0])
            raise Fail(tr("for x of shape {shape} and buckets {buckets} expected a {want} tensor and n={n}, "
                          "got shape {got_shape} and n={got_n}.{hint}", shape=shape, buckets=buckets, want=want, n=n,
                          got_shape=seen["shape"], got_n=repr(seen["n"]), hint=hint))
        x = np.random.default_rng(case["seed"]).standard_normal(shape).astype(np.float32)
        p = np.asarray(seen["values"], dtype=np.float32)
        if not (np.array_equal(p[:n], x) and not p[n:].any()):
            raise Fail(tr("for x of shape {shape} the first {n} rows must be x and the rest zeros "
                          "(pad at the end, with zeros)", shape=shape, n=n))
