"""Grading building blocks: item outcomes, the in-notebook Checker, lab generation, source scanning."""

import pytest

from gpucourse import labgen
from gpucourse.grading import Checker
from gpucourse.grading.items import Fail, ItemSpec, Namespace, item, lab_ids, lab_test_path, load_test_file, run_item
from gpucourse.grading.runner import lab_of, scan_source

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
    res = run_item(SPEC, lambda ns: ns.function("add"), {})
    assert res.status == "fail" and "`add` is not defined" in res.message
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


def test_checker_never_raises(capsys):
    check = Checker("01")
    assert check.keys == ["q1", "q2", "q3", "q4"]
    def summarise_devices(devices):
        raise RuntimeError("boom")
    check("q1", {"summarise_devices": summarise_devices})
    check("q2", {})
    check("q9")
    check.summary()
    out = capsys.readouterr().out
    assert "💥 q1 (0/2)" in out and "RuntimeError: boom" in out
    assert "`pick_device` is not defined" in out
    assert "has no item 'q9'" in out
    assert "Score: 0/10" in out
    assert check.score() == (0, 10)


def test_checker_uses_callers_globals(capsys):
    check = Checker("01")
    summarise_devices = None  # noqa: F841 (local, not global: must not be seen)
    check("q1")
    assert "not defined" in capsys.readouterr().out


def test_checker_bad_lab():
    with pytest.raises(ValueError, match="there is no lab '99'"):
        Checker("99")
    with pytest.raises(TypeError):
        Checker(1)


def test_every_lab_has_tests_and_notebooks(root):
    assert lab_ids(), "no lab tests found"
    for lab in lab_ids():
        assert lab_test_path(lab).is_file()
        assert list((root / "solutions").glob(f"{lab}_*.ipynb")), f"lab {lab} has tests but no solution"
        assert list((root / "labs").glob(f"{lab}_*.ipynb")), f"lab {lab} has tests but no lab notebook"
        assert list((root / "notebooks").glob(f"{lab}_*.ipynb")), f"lab {lab} has tests but no tutorial"


def test_strip_solution_rules():
    src = ("def f(x):\n    ### BEGIN SOLUTION\n    # STUB: return None\n    return x + 1\n    ### END SOLUTION\n"
           "def g():\n    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION\n# NBVAL_CHECK_OUTPUT\ncheck('q1')")
    out = labgen.strip_solution(src)
    assert out == ("def f(x):\n    return None\ndef g():\n    raise NotImplementedError(\"TODO\")\ncheck('q1')")
    assert labgen.strip_solution("a\n### BEGIN SOLUTION\nsecret\n### END SOLUTION\nb", markdown=True) == "a\nb"
    for bad in ("### BEGIN SOLUTION\nx", "### END SOLUTION", "### BEGIN SOLUTION\n### BEGIN SOLUTION"):
        with pytest.raises(ValueError):
            labgen.strip_solution(bad)


def test_labs_are_generated_from_solutions(root):
    """labs/ must equal what the generator makes from solutions/ (single source)."""
    assert labgen.main(["--check", "--root", str(root)]) == 0


def test_labs_hide_the_solutions(root):
    import nbformat

    for sol in sorted((root / "solutions").glob("*.ipynb")):
        lab = nbformat.read(labgen.lab_path_for(sol), as_version=4)
        text = "\n".join(c.source for c in lab.cells)
        assert "BEGIN SOLUTION" not in text and "SOLUTION ONLY" not in text
        assert "NotImplementedError" in text or "# STUB" not in text
        assert all(not c.get("outputs") for c in lab.cells if c.cell_type == "code")
        assert lab.metadata["gpucourse"]["kind"] == "lab"
        assert lab_of(lab, "x.ipynb") == sol.name[:2]


def test_scan_source_flags_patching():
    flags = scan_source([
        "import tensorflow as tf\nimport gpucourse.grading.items as gi\nfrom gpucourse.grading import Checker",
        "tf.config.list_physical_devices = lambda *a: []",
        "gi.run_item = None\nsetattr(tf, 'device', None)\nimport sys\nsys.modules['x'] = 1",
        "model = object()\nmodel.trainable = False\n%timeit 1",
    ])
    text = "\n".join(flags)
    assert "tf.config.list_physical_devices" in text and "gi.run_item" in text
    assert "setattr on tf" in text and "sys.modules" in text
    assert "model.trainable" not in text


def test_labgen_only_one_lab(root, capsys):
    assert labgen.main(["--check", "--only", "1", "--root", str(root)]) == 0
    with pytest.raises(SystemExit):
        labgen.main(["--only", "42", "--root", str(root)])
    assert "no solution notebook matches" in capsys.readouterr().err


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
    assert time.monotonic() - t0 < 5
    res = run_item(SPEC, lambda ns: None, {}, timeout_s=0.5)  # the alarm is cancelled afterwards
    time.sleep(0.7)
    assert res.status == "pass"


def test_expect_raises():
    from gpucourse.grading.items import expect_raises

    expect_raises(lambda: int("x"), "int('x')")  # raises ValueError: passes
    with pytest.raises(Fail, match=r"f\(\) should raise ValueError \(why\), but returned 3"):
        expect_raises(lambda: 3, "f()", "why")
    with pytest.raises(Fail, match="it raised KeyError"):
        expect_raises(lambda: {}["k"], "g()")
    with pytest.raises(NotImplementedError):  # an untouched stub stays 'not attempted'
        expect_raises(lambda: (_ for _ in ()).throw(NotImplementedError()), "h()")
