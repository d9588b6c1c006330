"""Every unsolved lab, run through the grader, runs to the end and scores 0 with feedback."""

from pathlib import Path

import pytest

from gpucourse.grading.grader.runner import grade_notebook

ROOT = Path(__file__).resolve().parents[3]
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_unsolved_lab_runs_to_the_end_and_scores_zero(path):
    rep = grade_notebook(path, timeout=300)
    assert rep.status == "graded", rep.table()
    assert rep.score == 0 and rep.max_score > 0, rep.table()
    assert not rep.cell_errors, f"an unsolved lab must run to the end without errors:\n{rep.table()}"
    assert all(r["status"] in ("todo", "fail") and r["message"] for r in rep.items), rep.table()
