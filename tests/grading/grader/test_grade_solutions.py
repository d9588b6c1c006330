"""Every solution, run through the command-line grader, scores full marks."""

from pathlib import Path

import pytest

from gpucourse.grading.grader.runner import grade_notebook
from tests.ahead import Ahead

ROOT = Path(__file__).resolve().parents[3]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def graded():
    """Each solution graded once, the next one already being graded while a test checks its own (tests/ahead.py)."""
    ahead = Ahead(lambda path: grade_notebook(path, timeout=300), "path")
    yield ahead
    ahead.close()


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_scores_full_marks(path, graded, request):
    rep = graded.result(request)
    assert rep.status == "graded", rep.table()
    assert rep.max_score > 0 and rep.score == rep.max_score, rep.table()
    assert len(rep.items) >= 3, "each lab needs at least 3 graded items"
    assert not rep.cell_errors and not rep.flags, rep.table()
