"""Items: outcomes, the decorator, time limits, learner-facing errors (gpucourse.grading.items)."""

import pytest

from gpucourse.grading.items import Fail, ItemSpec, item, load_test_file, run_item

SPEC = ItemSpec("q1", 2, "adds numbers")


def _item(body):
    def fn(ns):
        return body(ns)
    return fn


@pytest.mark.parametrize("learner, status, words", [
    (lambda a, b: a + b, "pass", ""),
    (lambda a, b: a - b, "fail", "expected 5"),
    (lambda a, b: (_ for _ in ()).throw(NotImplementedError()), "todo", "Not attempted"),
    (lambda a, b: 1 / 0, "error", "ZeroDivisionError"),
    (lambda a, b: exit(), "error", "SystemExit"),
])
def test_run_item_classifies(learner, status, words):
    def test(ns):
        got = ns.function("add")(2, 3)
        if got != 5:
            raise Fail(f"expected 5, got {got}")
    res = run_item(SPEC, test, {"add": learner})
    assert res.status == status and words in res.message
    assert res.points == (2 if status == "pass" else 0) and res.max_points == 2


def test_missing_and_wrong_type_names():
    res = run_item(SPEC, lambda ns: ns.function("add"), {})  # check("q1") before the function's cell ran
    assert res.status == "todo" and res.points == 0
    assert res.message.startswith("Not attempted: `add` is not defined yet. Run the cell above first")
    assert res.line().startswith("📝")
    res = run_item(SPEC, lambda ns: ns.function("add"), {"add": 3})
    assert res.status == "fail" and "should be a function" in res.message


def test_bare_assert_reports_its_line(tmp_path):
    path = tmp_path / "labXX.py"  # loaded like a real lab test file, outside pytest's assert rewriting
    path.write_text('from gpucourse.grading.items import item\n'
                    '@item("q1")\ndef test(ns):\n    assert ns.value("x") == 1\n')
    test = load_test_file(path).test
    res = run_item(SPEC, test, {"x": 2})
    assert res.status == "fail" and 'ns.value("x") == 1' in res.message


def test_item_decorator_validates():
    with pytest.raises(ValueError):
        item("not a key")
    with pytest.raises(ValueError):
        item("q1", points=0)










def test_error_in_the_check_itself_is_not_blamed_on_the_learner():
    def test(ns):
        ns.function("f")()
        return {}["missing"]  # the check's own bug

    res = run_item(SPEC, test, {"f": lambda: 1})
    assert res.status == "error" and res.message.startswith("The check raised KeyError")
    learner_ns = {}
    exec(compile("def f():\n    return 1 / 0\n", "/tmp/ipykernel_1/123.py", "exec"), learner_ns)
    res = run_item(SPEC, lambda ns: ns.function("f")(), learner_ns)
    assert res.message.startswith("Your code raised ZeroDivisionError") and "in `f`" in res.message


def test_endless_loop_is_stopped():
    import time

    def forever():
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # a learner's broad except must not swallow the time limit
                pass

    t0 = time.monotonic()
    res = run_item(SPEC, lambda ns: ns.function("f")(), {"f": forever}, timeout_s=0.5)
    assert res.status == "error" and "Stopped after 0.5 s" in res.message
    assert "endless loop" in res.message and "the machine may just be busy" in res.message
    assert time.monotonic() - t0 < 5
    res = run_item(SPEC, lambda ns: None, {}, timeout_s=0.5)  # the alarm is cancelled afterwards
    time.sleep(0.7)
    assert res.status == "pass"


def test_an_item_that_knows_the_progress_says_it_when_time_is_up():
    """observe may raise ItemTimeout(text) again: the text replaces the generic "endless loop?" advice."""
    import time

    from gpucourse.grading.items import ItemTimeout

    class slow:
        def cases(rng):
            return [{}]

        def observe(ns, case):
            done = []
            try:
                while True:
                    ns.function("step")()
                    done.append(1)
                    time.sleep(0.01)
            except ItemTimeout:
                raise ItemTimeout(f"Your code was still making progress ({len(done) > 0}).") from None

        def judge(case, seen):
            pass

    res = run_item(SPEC, slow, {"step": lambda: None}, timeout_s=0.3)
    assert res.status == "error" and res.message == ("Stopped after 0.3 s: the check's time is up. Your code was "
                                                     "still making progress (True).")


def test_an_object_the_check_cannot_send_reads_as_python_shows_it():
    """expect_raised names what came back as "a Sequential (<Sequential ...>)", not the transport's dict."""
    from gpucourse.grading.items import expect_raised, outcome

    class Sequential:
        def __repr__(self):
            return "<Sequential name=sequential, built=True>"

    with pytest.raises(Fail) as err:
        expect_raised(outcome(Sequential), "f(-1)", "negative")
    assert str(err.value) == ("f(-1) should raise ValueError (negative), but returned a Sequential "
                              "(<Sequential name=sequential, built=True>)")
    with pytest.raises(Fail) as err:
        expect_raised(outcome(lambda: [1, 2]), "f(-1)")
    assert str(err.value).endswith("but returned [1, 2]")


def test_expect_raises():
    from gpucourse.grading.items import expect_raises

    expect_raises(lambda: int("x"), "int('x')")  # raises ValueError: passes
    with pytest.raises(Fail, match=r"f\(\) should raise ValueError \(why\), but returned 3"):
        expect_raises(lambda: 3, "f()", "why")
    with pytest.raises(Fail, match="it raised KeyError"):
        expect_raises(lambda: {}["k"], "g()")
    with pytest.raises(NotImplementedError):  # an untouched stub stays 'not attempted'
        expect_raises(lambda: (_ for _ in ()).throw(NotImplementedError()), "h()")
