"""Every unsolved lab, run through the grader, runs to the end and scores 0, every item "not attempted".

An untouched stub raises ``NotImplementedError``: its item is ``todo`` with the "Not attempted" feedback, never
``fail`` (which would tell the learner their answer is wrong) nor ``error``; and the lab's own code raises no
review flag.
"""

from pathlib import Path

import pytest

from gpucourse.grading.grader.runner import grade_notebook
from tests.ahead import Ahead

ROOT = Path(__file__).resolve().parents[3]
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def graded():
    """Each unsolved lab graded once, the next one being graded while a test checks its own (tests/ahead.py)."""
    ahead = Ahead(lambda path: grade_notebook(path, timeout=300), "path")
    yield ahead
    ahead.close()


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_unsolved_lab_runs_to_the_end_and_scores_zero(path, graded, request):
    rep = graded.result(request)
    assert rep.status == "graded", rep.table()
    assert rep.score == 0 and rep.max_score > 0 and rep.items, rep.table()
    assert not rep.cell_errors, f"an unsolved lab must run to the end without errors:\n{rep.table()}"
    not_attempted = [r["key"] for r in rep.items if r["status"] == "todo" and r["points"] == 0
                     and r["message"].startswith("Not attempted")]
    assert not_attempted == [r["key"] for r in rep.items], f"every item of an untouched lab is not attempted:\n" \
                                                           f"{rep.table()}"
    assert not rep.flags, f"the lab as given raised review flags:\n{rep.table()}"
