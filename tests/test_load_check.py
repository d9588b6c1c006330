""".ci/load_check.py (the timing items under load, run by hand): its arguments and its fixture bookkeeping.

The check itself takes minutes and burns every core, so it is not run here."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / ".ci" / "load_check.py"
_spec = importlib.util.spec_from_file_location("load_check", _PATH)
load_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load_check)


def test_defaults_are_ten_runs_three_burners_and_the_two_timing_items():
    args = load_check.parse_args([])
    assert (args.runs, args.burners, args.items) == (10, 3, [("07", "q3"), ("08", "q4")])
    args = load_check.parse_args(["--runs", "2", "--burners", "0", "--items", "08:q4, 08:q4,07:q1"])
    assert (args.runs, args.burners, args.items) == (2, 0, [("08", "q4"), ("07", "q1")])


@pytest.mark.parametrize("argv, words", [
    (["--runs", "0"], ["--runs", "from 1 to 1000", "got 0"]),
    (["--runs", "ten"], ["--runs", "whole number", "'ten'"]),
    (["--burners", "-1"], ["--burners", "from 0 to 64", "got -1"]),
    (["--items", "07-q3"], ["--items", "LAB:ITEM", "'07-q3'"]),
    (["--items", "42:q1"], ["--items", "lab '42'", "no public tests"]),
])
def test_bad_arguments_are_named_with_their_value(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_check.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and all(w in err for w in words), err


def test_every_default_item_has_wrong_answers_with_golden_verdicts(tmp_path):
    for lab, key in load_check.parse_args([]).items:
        fixtures = load_check.wrong_answers(lab, key)
        assert fixtures and all(p.name.startswith(f"{key}_") for p in fixtures)
    fixture = tmp_path / "q3_x.py"
    fixture.with_suffix(".expected.json").write_text(json.dumps({"item": "q3", "status": "fail",
                                                                 "message": ["bound", "prefetch"]}))
    assert load_check.golden({"status": "fail", "message": "1.5x the bound; is there a prefetch?"}, fixture)
    assert not load_check.golden({"status": "fail", "message": "1.5x the bound"}, fixture)
    assert not load_check.golden({"status": "error", "message": "bound prefetch"}, fixture)


def _run(first_start, steps, step_s=0.1, stopped=None):
    """Records of one run: a stage starting at ``first_start``, then ``steps`` (start, end) of the device."""
    return {"stages": [["load", 1, None, first_start, first_start + 0.01]], "marks": {}, "stopped": stopped,
            "steps": [[i, None, s, e] for i, (s, e) in enumerate(steps)]}


@pytest.mark.parametrize("lab, key, case", [
    ("07", "q3", {"read_s": 0.2, "decode_s": 0.3, "step_s": 0.1}),
    ("08", "q4", {"load_s": 0.05, "augment_s": 0.05, "step_s": 0.1}),
])
def test_the_margin_is_the_best_runs_beside_the_items_limits(lab, key, case):
    """As the judge picks: a run whose first element came in time beats a busier one that came late."""
    busy = _run(0.0, [(0.2, 0.3), (0.3, 0.4), (0.4, 0.5)])  # first at 200 ms, then busy all the time
    late = _run(0.0, [(9.0, 9.1), (9.1, 9.2), (9.2, 9.3)])  # first element far too late, then as busy
    idle = _run(0.0, [(0.2, 0.3), (0.5, 0.6), (0.8, 0.9)])  # on time, busy 1/3 after the first step
    got = load_check.margin(lab, key, case, {"runs": [late, idle, busy]})
    assert got["value"] == pytest.approx(1.0) and "util 100.0%" in got["text"] and "first 200 ms" in got["text"]
    got = load_check.margin(lab, key, case, {"runs": [late, idle]})
    assert got["value"] == pytest.approx(1 / 3) and "first 200 ms" in got["text"]
    with pytest.raises(ValueError, match="no run"):
        load_check.margin(lab, key, case, {"runs": []})
