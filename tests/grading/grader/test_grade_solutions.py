"""Every solution, run through the command-line grader, scores full marks."""

from pathlib import Path

import pytest

from gpucourse.grading.grader.runner import grade_notebook

ROOT = Path(__file__).resolve().parents[3]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_scores_full_marks(path):
    rep = grade_notebook(path, timeout=300)
    assert rep.status == "graded", rep.table()
    assert rep.max_score > 0 and rep.score == rep.max_score, rep.table()
    assert len(rep.items) >= 3, "each lab needs at least 3 graded items"
    assert not rep.cell_errors and not rep.flags, rep.table()
