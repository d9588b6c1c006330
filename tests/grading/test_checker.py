"""The in-notebook check(): never raises, reads the caller's globals, steps aside while the grader runs."""

import pytest

from gpucourse.grading import Checker
from gpucourse.grading.items import items_in
from gpucourse.labtests import lab01

FULL = sum(spec.points for spec, _ in items_in(lab01))


def test_checker_never_raises(capsys):
    check = Checker("01")
    assert check.keys == [spec.key for spec, _ in items_in(lab01)] and check.keys[:2] == ["q1", "q2"]
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
    assert f"Score: 0/{FULL}" in out
    assert check.score() == (0, FULL)


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


def test_checker_steps_aside_while_the_grader_runs(capsys, monkeypatch):
    monkeypatch.setenv("GPUCOURSE_GRADING", "1")
    check = Checker("01")
    check("q1", {"summarise_devices": lambda d: 1 / 0})
    check.summary()
    out = capsys.readouterr().out
    assert "q1: checked by the grader" in out and "scored by the grader" in out and "ZeroDivisionError" not in out
    assert check.results == {}


def _verdicts_with(reader, judge):
    """An answer to lab 08 q5 built on the tutorial's helpers (``reader`` parses the table, ``judge`` rules)."""
    def step_verdicts(table):
        rows = reader(table)
        if not rows:
            raise ValueError("no steps")
        return {"steps": {r["stepnum"]: judge([r]) for r in rows}, "overall": judge(rows)}
    return step_verdicts


def _own_rows(table):
    ids = [c["id"] for c in table["cols"]]
    return [dict(zip(ids, (cell["v"] for cell in row["c"]))) for row in table["rows"]]


def test_check_says_the_grader_withholds_an_item_answered_by_a_course_helper(capsys):
    """Lab 08 q5 built on bottleneck.classify (or _step_table) is right, but the grader withholds it: check()
    says so and scores 0, whether the helper is called through its module or through a name bound to it."""
    from gpucourse import bottleneck

    classify, step_table = bottleneck.classify, bottleneck._step_table
    check = Checker("08")
    via_module = _verdicts_with(_own_rows, lambda rows: bottleneck.classify(rows).kind)
    check("q5", {"step_verdicts": via_module})
    result = check.results["q5"]
    assert (result.status, result.points) == ("fail", 0)
    assert "The grader withholds this item's marks: your code called `gpucourse.bottleneck.classify`" in result.message
    assert result.message.endswith("the answer is right.")

    namespace = {"classify": classify}  # from gpucourse.bottleneck import classify: the notebook's own name
    exec("def step_verdicts(table):\n    return answer(table)", namespace)
    namespace["answer"] = _verdicts_with(lambda t: bottleneck._step_table(t).rows,
                                         lambda rows: namespace["classify"](rows).kind)
    check("q5", namespace)
    assert "`gpucourse.bottleneck._step_table`, `gpucourse.bottleneck.classify`" in check.results["q5"].message
    assert namespace["classify"] is classify  # put back as it was
    assert (bottleneck.classify, bottleneck._step_table) == (classify, step_table)

    def own_rule(rows):
        step = sum(r["stepTimeMs"] for r in rows)
        share = {g: sum(r[k] for r in rows for k, v in GROUPS.items() if v == g) / step for g in set(GROUPS.values())}
        if share["input"] >= 0.2:
            return "input-bound"
        return "device-bound" if share["device"] > share["host"] else "host-bound"

    check("q5", {"step_verdicts": _verdicts_with(_own_rows, own_rule)})
    assert check.results["q5"].passed
    capsys.readouterr()


GROUPS = {"infeedTimeMs": "input", "kernelLaunchTimeMs": "host", "hostComputeTimeMs": "host", "compileTimeMs": "host",
          "otherTimeMs": "host", "deviceComputeTimeMs": "device", "deviceToDeviceTimeMs": "device",
          "deviceCollectivesTimeMs": "device", "outfeedTimeMs": "device"}
