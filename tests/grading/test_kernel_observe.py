"""The kernel-side observation driver, run in this process with a recording ``audit``."""

import hashlib
import json
import sys

from gpucourse.grading import items as items_mod
from gpucourse.grading import kernel_observe
from gpucourse.grading.items import items_in, load_test_source, make_cases

TESTS = '''
from gpucourse.grading.items import Fail, item, outcome, expect_raised

def _secret(a, b):
    return a * b + 7

@item("q1", points=2, title="mul7")
class q1:
    def cases(rng):
        return [{"a": rng.randint(1, 99), "b": rng.randint(1, 99)} for _ in range(3)] + [{"bad": True}]

    def observe(ns, case):
        fn = ns.function("mul7")
        if case.get("bad"):
            return outcome(lambda: fn(None, 1))
        return {"got": fn(case["a"], case["b"])}

    def judge(case, seen):
        if case.get("bad"):
            return expect_raised(seen, "mul7(None, 1)", exc_name="TypeError")
        if seen["got"] != _secret(case["a"], case["b"]):
            raise Fail("wrong")

@item("q2", points=1, title="inline")
def q2(ns):
    if ns.function("mul7")(2, 3) != 13:
        raise Fail("mul7(2, 3) should be 13")
'''


def _config(tests, plan):
    return json.dumps({"items_src": open(items_mod.__file__).read(), "items_path": items_mod.__file__,
                       "tests": tests, "plan": plan, "timeout_s": 10})


def test_driver_sends_plain_observations_and_inline_verdicts_in_order():
    module = load_test_source(TESTS, "/tests/lab99.py")
    (spec1, q1), _ = items_in(module)
    cases = make_cases(q1, seed=3)
    plan = [{"source": "public", "key": "q1", "split": True, "cases": cases},
            {"source": "public", "key": "q2", "split": False, "cases": None},
            {"source": "hidden:x.py", "key": "h9", "split": True, "cases": [{}]}]
    events = []
    user_ns = {"mul7": lambda a, b: a * b + 7, "_private": 1, "In": [], "get_ipython": None}
    before = sys.modules.get("gpucourse.grading.items")
    sent = kernel_observe.run(_config([["public", "/tests/lab99.py", TESTS]], plan), user_ns,
                              audit=lambda *a: events.append(a))
    assert sys.modules.get("gpucourse.grading.items") is before  # restored after loading the tests
    config = _config([["public", "/tests/lab99.py", TESTS]], plan)
    assert events[0] == ("gpucourse.phase", "begin", hashlib.sha256(config.encode()).hexdigest())
    assert [e[:2] for e in events] == [
        ("gpucourse.phase", "begin"), ("gpucourse.phase", "item"), ("gpucourse.observed", "public:q1"),
        ("gpucourse.phase", "item"), ("gpucourse.observed", "public:q2"), ("gpucourse.phase", "item"),
        ("gpucourse.observed", "hidden:x.py:h9"), ("gpucourse.phase", "end")]
    obs = sent["public:q1"]["observed"]
    assert obs["status"] == "ok" and [s.get("got") for s in obs["seen"][:3]] == [c["a"] * c["b"] + 7 for c in cases[:3]]
    assert obs["seen"][3]["raised"] == "TypeError"
    assert "_secret" not in str(sent["public:q1"]) and "want" not in str(sent["public:q1"])
    assert sent["public:q2"]["result"]["status"] == "pass"
    assert "could not load" in sent["hidden:x.py:h9"]["error"]


def test_driver_reports_broken_tests_and_todo():
    plan = [{"source": "public", "key": "q1", "split": True, "cases": [{"a": 1, "b": 2}]}]
    events = []

    def stub(a, b):
        raise NotImplementedError

    sent = kernel_observe.run(_config([["public", "/tests/lab99.py", TESTS]], plan), {"mul7": stub},
                              audit=lambda *a: events.append(a))
    assert sent["public:q1"]["observed"]["status"] == "todo"
    sent = kernel_observe.run(_config([["public", "/tests/lab99.py", "def broken(:"]], plan), {},
                              audit=lambda *a: events.append(a))
    assert "SyntaxError" in sent["public:q1"]["error"]
