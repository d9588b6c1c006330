"""The grader's benchmark (gpucourse.grading.grader.benchmark) finds the course's solutions and labs, and grades
copies of both as one batch (grade_batch replaced by a fake here: the real one is timed on an idle machine)."""

from pathlib import Path

import pytest

from gpucourse.grading.grader import benchmark, cli

ROOT = Path(__file__).resolve().parents[3]


def test_measure_grades_copies_of_this_checkouts_solution_and_lab(monkeypatch):
    seen = {}

    def fake_batch(subs, out, lab, jobs, echo):
        seen.update(names=sorted(p.name for p in subs.iterdir()), lab=lab, jobs=jobs,
                    texts={p.read_bytes() for p in subs.iterdir()})
        return [{"learner": p.stem, "status": "graded", "score": 0, "max_score": 10, "flags": [], "reason": "",
                 "isolation": "none: fake", "timings": {"checks": 1.0}} for p in sorted(subs.iterdir())]

    monkeypatch.setattr(cli, "grade_batch", fake_batch)
    res = benchmark.measure("02", copies=2, jobs=1)
    assert seen["names"] == ["solution00.ipynb", "solution01.ipynb", "unsolved00.ipynb", "unsolved01.ipynb"]
    assert seen["texts"] == {(ROOT / "solutions" / "02_placement_logging.ipynb").read_bytes(),
                             (ROOT / "labs" / "02_placement_logging.ipynb").read_bytes()}
    assert (seen["lab"], seen["jobs"], res["submissions"], res["stage_median_s"]) == ("02", 1, 4, {"checks": 1.0})


def test_measure_names_what_is_missing():
    with pytest.raises(SystemExit, match=rf"lab 99: need solutions/99_\*\.ipynb and labs/99_\*\.ipynb under {ROOT}$"):
        benchmark.measure("99", copies=1, jobs=1)
