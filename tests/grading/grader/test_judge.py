"""The grader's side of items: tests loaded once, secret cases, verdicts, and when TensorFlow is warmed up."""

from gpucourse.grading.grader import judge
from gpucourse.grading.items import lab_test_path

TESTS = '''
from gpucourse.grading.items import Fail, item

@item("q1", points=2, title="double")
class q1:
    def cases(rng):
        return [{"x": rng.randint(1, 10**9)}]

    def observe(ns, case):
        return {"got": ns.function("double")(case["x"])}

    def judge(case, seen):
        if seen["got"] != 2 * case["x"]:
            raise Fail(f"double({case['x']}) should be {2 * case['x']}, got {seen['got']}")

@item("q2", points=1, title="inline")
def q2(ns):
    ns.function("double")
'''


def test_tests_load_once_and_cases_are_secret():
    tests = [("public", "/t/lab98.py", TESTS)]
    (_, _, first), = judge.load_tests(tests)
    (_, _, again), = judge.load_tests(tests)
    assert first is again  # one module per text and process: judges' caches survive between submissions
    plans = [judge.make_plan(judge.load_tests(tests))[0] for _ in range(3)]
    assert [e.name for e in plans[0]] == ["public:q1", "public:q2"] and plans[0][1].cases is None
    assert len({p[0].cases[0]["x"] for p in plans}) == 3  # a fresh secret seed each time
    (_, _, broken), = judge.load_tests([("hidden:x.py", "/t/x.py", "def broken(:")])
    assert isinstance(broken, SyntaxError)
    assert judge.make_plan([("hidden:x.py", "/t/x.py", broken)])[1][0].startswith("/t/x.py: SyntaxError")


def test_judge_split_inline_and_missing_observations():
    plan, _ = judge.make_plan(judge.load_tests([("public", "/t/lab98.py", TESTS)]))
    q1, q2 = plan
    x = q1.cases[0]["x"]
    ok = judge.judge(q1, {"observed": {"status": "ok", "seen": [{"got": 2 * x}]}})
    bad = judge.judge(q1, {"observed": {"status": "ok", "seen": [{"got": x}]}})
    assert (ok["status"], ok["points"], ok["trust"]) == ("pass", 2, "split")
    assert bad["status"] == "fail" and f"double({x}) should be {2 * x}" in bad["message"]
    # An inline verdict's points always come from the grader's spec, never from the kernel's row.
    forged = judge.judge(q2, {"result": {"status": "pass", "points": 99, "max_points": 99, "message": ""}})
    assert (forged["points"], forged["max_points"], forged["trust"]) == (1, 1, "inline")
    assert judge.judge(q2, {"result": {"status": "bogus"}})["status"] == "error"
    assert "no observation" in judge.judge(q1, None)["message"]
    assert "could not load" in judge.judge(q1, {"error": "the kernel could not load this item"})["message"]


def _globals_used(fn, module, seen) -> set[str]:
    """Global names ``fn`` (and the module functions it calls) look up, that ``module`` lacks."""
    import builtins
    import types

    missing = set()
    code = fn.__code__
    todo = [code]
    while todo:
        c = todo.pop()
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        for name in c.co_names:
            value = vars(module).get(name)
            if isinstance(value, types.FunctionType) and value.__globals__ is vars(module) and value not in seen:
                seen.add(value)
                missing |= _globals_used(value, module, seen)
    return missing | {n for n in code.co_names if n not in vars(module) and not hasattr(builtins, n)
                      and n.isidentifier() and n in {i.argval for i in __import__("dis").get_instructions(code)
                                                     if i.opname == "LOAD_GLOBAL"}}


def test_kernel_source_of_every_lab_keeps_what_its_kernel_functions_use():
    """Only the ``@in_kernel`` functions, and what they use, go to the kernel: no item (cases, observe, judge)
    and no reference helper of the judges."""
    from gpucourse.grading.items import is_kernel_function, lab_ids, load_test_source

    tricky = '''
from gpucourse.grading.items import Fail, in_kernel, item
A, B = 1, 2
[(K, _), *L] = (2, 0), 3
M = 3
M = M * K
_REF = {"x": 1}

def _reference(x):
    return _REF[x]

def _build(x):
    return [x] * A * M

@in_kernel
def _observe(ns, x):
    return ns.function("f")(_build(x))

@item("q1", points=1)
class q1:
    def cases(rng):
        return [{"x": "x"}]
    def observe(ns, case):
        return {"got": ns.kernel(_observe, case["x"])}
    def judge(case, seen):
        if seen["got"] != _reference(case["x"]):
            raise Fail("no")
'''
    stripped = judge.kernel_source(tricky)
    assert "_REF" not in stripped and "def _reference" not in stripped and "class q1" not in stripped
    assert "A, B = 1, 2" in stripped and "def _build" in stripped and "def _observe" in stripped
    assert stripped.count("\n") == tricky.count("\n") + (0 if tricky.endswith("\n") else 1)
    # every binding a kept function reads is kept: tuple targets, nested ones, and a name bound twice
    assert load_test_source(stripped, "k.py")._build("x") == ["x"] * 6
    for lab in lab_ids():
        text = lab_test_path(lab).read_text()
        full, kept = load_test_source(text, f"lab{lab}.py"), load_test_source(judge.kernel_source(text), "k.py")
        functions = [name for name, value in vars(full).items() if is_kernel_function(value)]
        assert not [k for k, v in vars(kept).items() if hasattr(v, "__gpucourse_item__")], f"lab {lab}: items kept"
        for name in functions:
            assert not _globals_used(getattr(kept, name), kept, set()), f"lab {lab} {name}: the kernel's copy lacks names"


def test_needs_tensorflow_follows_judges_cases_and_observe():
    assert judge.needs_tensorflow(lab_test_path("01").read_text())  # q5's observe reads the build info here
    judged = '''
def _want(x):
    import tensorflow as tf
    return tf.constant(x)

class q1:
    def cases(rng):
        return [1]
    def observe(ns, case):
        return 1
    def judge(case, seen):
        _want(case)
'''
    assert judge.needs_tensorflow(judged)
    assert judge.needs_tensorflow("import keras\n")
    assert not judge.needs_tensorflow("def broken(:")
    # what the kernel runs for observe (and what only it calls) is the kernel's import, not the grader's
    in_kernel = judged.replace("return 1\n    def judge", "return _seen(ns)\n    def judge").replace(
        "        _want(case)", "        return seen == case") + "\n@in_kernel\ndef _seen(ns):\n    return _want(1)\n"
    assert not judge.needs_tensorflow(in_kernel)
    assert not judge.needs_tensorflow(lab_test_path("02").read_text())  # TensorFlow only inside its @in_kernel code
    assert judge.needs_tensorflow(in_kernel.replace("return seen == case", "return _want(seen)"))


def test_the_kernel_gets_no_import_of_the_lab_tests_package():
    """A lab may keep its judges and reference answers in ``gpucourse.labtests._labNN_*`` and import them at its
    top; the graded kernel's course copy has no ``labtests``, so those imports are left out of what it loads, in
    every form, and everything else stays (the kernel's functions still find what they use)."""
    from gpucourse.grading.items import lab_ids, load_test_source

    text = '''import json
from gpucourse.grading.items import in_kernel, item
from gpucourse.labtests._lab03_reference import need
from gpucourse.labtests import _lab03_judges as judges
import gpucourse.labtests._lab04_reference
import gpucourse.labtests._lab04_reference as ref04
import math

@in_kernel
def _observe(ns, x):
    return json.dumps(math.floor(x))

@item("q1", points=1)
class q1:
    def cases(rng):
        return [{"n": need({"per": 1, "quad": 0, "hidden": 0, "fixed": 0}, 3)}]
    def observe(ns, case):
        return ns.kernel(_observe, case["n"])
    judge = judges.judge_q3
'''
    kept = judge.kernel_source(text)
    assert "labtests" not in kept and kept.count("\n") == text.count("\n")
    assert "import json" in kept and "from gpucourse.grading.items import in_kernel, item" in kept
    assert load_test_source(kept, "k.py")._observe(None, 2.7) == "2"
    mixed = "import math, gpucourse.labtests._lab04_reference\n"  # kept whole: the kernel needs math
    assert judge.kernel_source(mixed) == mixed
    for lab in lab_ids():
        full = lab_test_path(lab).read_text()
        assert "labtests" not in "\n".join(line for line in judge.kernel_source(full).splitlines()
                                           if line.startswith(("import ", "from "))), f"lab {lab}"


def test_needs_tensorflow_follows_a_labs_grader_side_modules():
    """Lab 05's q2 judge compares with a real Keras LossScaleOptimizer, from its reference module: the grader warms
    TensorFlow up for it although lab05.py's own judges are assignments, not functions that import Keras."""
    judged = '''
from gpucourse.labtests._lab05_reference import real_optimizer_trace

class q2:
    def cases(rng):
        return [1]
    def observe(ns, case):
        return 1
    judge = staticmethod(lambda case, seen: real_optimizer_trace([True], 1.0, 1))
'''
    assert judge.needs_tensorflow(judged)
    assert not judge.needs_tensorflow(judged.replace("_lab05_reference import real_optimizer_trace",
                                                     "_lab04_reference import array_split"))
