"""The in-notebook check(): never raises, reads the caller's globals, steps aside while the grader runs."""

import pytest

from gpucourse.grading import Checker


def test_checker_never_raises(capsys):
    check = Checker("01")
    assert check.keys == ["q1", "q2", "q3", "q4", "q5"]
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
    assert "Score: 0/12" in out
    assert check.score() == (0, 12)


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
