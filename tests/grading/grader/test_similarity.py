"""Similar submissions (gpucourse.grading.grader.similarity): a renamed copy is found, independent work and the
lab's template are not, the report never touches a score, and a missing copydetect never stops grading.

The fixtures in ``fixtures/similarity/`` are lab 03 submissions: ``alice`` (her own solution), ``bob``
(alice's code with variables and helpers renamed, comments and messages reworded, q5's cells moved
before q4's), ``carol`` (an independent solution), ``dave`` (the lab untouched) and ``erin`` (the lab
untouched but for comments, blank lines and one print). Only the batch test runs kernels. copydetect is
a dev dependency: without it these tests fail with the line that installs it (they never skip).
"""

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

from gpucourse.grading.grader import similarity
from gpucourse.grading.grader.runner import find_template
from gpucourse.grading.grader.similarity import (CSV_NAME, DEFAULT_THRESHOLD, HTML_NAME, SOLUTION, find_similar,
                                          find_solution, notebook_cells, write_similarity)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "similarity"
LEARNERS = ("alice", "bob", "carol", "dave", "erin")


def _batch(*names):
    return {name: FIXTURES / f"{name}.ipynb" for name in names}


@pytest.fixture(scope="module")
def every_pair():
    """Every pair of the fixtures and the public solution with its score (threshold 0: all with code in common)."""
    pairs = find_similar(_batch(*LEARNERS), find_template("03"), find_solution("03"), threshold=0.0)
    return {(p.a, p.b): p for p in pairs}


def test_the_renamed_copy_is_found_and_nothing_else(every_pair):
    flagged = {pair for pair, p in every_pair.items() if p.score > DEFAULT_THRESHOLD}
    assert flagged == {("alice", "bob")}, {pair: round(p.score, 3) for pair, p in every_pair.items()}
    copy = every_pair[("alice", "bob")]
    assert copy.share_a > 0.9 and copy.share_b > 0.9
    # the shared lines, each side in its own words: renamed names, and bob's q5 answer in the cell he moved
    assert any("fresh = optimizer.__class__.from_config" in line for line in copy.lines_a)
    assert any("opt_copy = optimizer.__class__.from_config" in line for line in copy.lines_b)
    assert any(line.startswith("cell 13 line ") and "each_mib = avail // n" in line for line in copy.lines_b)
    assert any(line.startswith("cell 16 line ") and "per_gpu = free_mib // n" in line for line in copy.lines_a)
    # the template's lines are never listed as shared
    assert not any("check(" in line or "def virtual_gpus" in line for line in copy.lines_a + copy.lines_b)


def test_independent_work_shares_only_idioms(every_pair):
    # measured on these fixtures: 0.14 between the two independent solutions, at most 0.45 with the public
    # solution (the lab prescribes the API calls), 0.99 for the renamed copy
    assert every_pair[("alice", "carol")].score < 0.25
    assert max(every_pair[(who, SOLUTION)].score for who in ("alice", "bob", "carol")) < 0.5


def test_the_template_alone_makes_no_two_labs_similar(every_pair):
    untouched = ("dave", "erin")
    assert not [pair for pair in every_pair if set(pair) & set(untouched)]  # not even a score above 0
    # ... because the template is left out: without it the two untouched labs are nearly the same document
    bare = find_similar(_batch(*untouched), template=None, solution=None)
    assert [(p.a, p.b) for p in bare] == [untouched] and bare[0].score > 0.9


def test_the_public_solution_and_template_are_found_beside_the_package():
    root = Path(__file__).resolve().parents[3]  # this checkout, where the package is installed from
    assert find_solution("03") == sorted((root / "solutions").glob("03_*.ipynb"))[0]
    assert find_template("03") and find_solution("99") is None and find_solution(None) is None


def test_a_copy_of_the_public_solution_is_found():
    solution = find_solution("03")
    pairs = find_similar({"mallory": solution, "alice": FIXTURES / "alice.ipynb"}, find_template("03"), solution)
    assert [(p.a, p.b, round(p.score, 3)) for p in pairs] == [("mallory", SOLUTION, 1.0)]


def test_notebook_cells_count_every_cell_and_refuse_what_is_not_a_notebook(tmp_path):
    cells = notebook_cells(FIXTURES / "dave.ipynb")
    assert cells[0][0] == 1 and cells[2][0] == 4 and cells[2][1].startswith("def training_state_bytes")
    assert notebook_cells(["a = 1", "b = 2"]) == [(1, "a = 1"), (2, "b = 2")]
    (tmp_path / "x.ipynb").write_text("not a notebook")
    with pytest.raises(ValueError, match="x.ipynb is not a readable notebook"):
        notebook_cells(tmp_path / "x.ipynb")
    with pytest.raises(TypeError, match="source must be"):
        notebook_cells(42)


@pytest.mark.parametrize("bad, error", [(1.5, ValueError), (-0.1, ValueError), ("0.5", TypeError), (True, TypeError)])
def test_threshold_is_a_share_from_0_to_1(bad, error):
    with pytest.raises(error, match="threshold"):
        find_similar(_batch("alice"), threshold=bad)


def test_write_similarity_writes_the_csv_and_copydetects_html(tmp_path):
    said = []
    subs = [(name, FIXTURES / f"{name}.ipynb") for name in LEARNERS] + [("zoe", None)]  # zoe submitted nothing
    pairs = write_similarity(subs, tmp_path, lab=None, echo=said.append)  # the lab from the notebooks' metadata
    rows = list(csv.DictReader(open(tmp_path / CSV_NAME, newline="", encoding="utf-8")))
    assert list(rows[0]) == similarity.HEADER
    assert [(r["learner_a"], r["learner_b"]) for r in rows] == [("alice", "bob")] == [(p.a, p.b) for p in pairs]
    assert float(rows[0]["score"]) > 0.9 and int(rows[0]["shared_tokens"]) > 500
    assert "cell 16 line 5:     free_mib = total_bytes // (1024 * 1024) - reserve_mib" in rows[0]["shared_lines_a"]
    html = (tmp_path / HTML_NAME).read_text(encoding="utf-8")
    assert "alice.py" in html and "bob.py" in html and "gpucourse-similarity-" not in html  # no temporary paths
    assert "1 pair(s) above 0.6" in said[-1] and "alice~bob" in said[-1] and "no score changed" in said[-1]
    assert not [line for line in said if "no template" in line or "no public solution" in line], said
    first = (tmp_path / CSV_NAME).read_bytes()
    write_similarity(subs, tmp_path, lab="03", echo=said.append)
    assert (tmp_path / CSV_NAME).read_bytes() == first  # the same batch, the same report


def test_a_learners_name_cannot_write_into_the_html(tmp_path):
    name = "<img src=x onerror=alert(1)>"
    pairs = write_similarity([(name, FIXTURES / "alice.ipynb"), ("bob", FIXTURES / "bob.ipynb")], tmp_path, "03",
                             echo=lambda line: None)
    assert [(p.a, p.b) for p in pairs] == [(name, "bob")]
    html = (tmp_path / HTML_NAME).read_text(encoding="utf-8")
    assert "<img src=x" not in html and "img_src_x_onerror_alert_1.py" in html


def test_unreadable_notebooks_are_named_and_the_rest_compared(tmp_path):
    (tmp_path / "carol.ipynb").write_text("not a notebook")
    said = []
    subs = [("alice", FIXTURES / "alice.ipynb"), ("bob", FIXTURES / "bob.ipynb"), ("carol", tmp_path / "carol.ipynb")]
    pairs = write_similarity(subs, tmp_path / "out", lab="03", echo=said.append)
    assert [(p.a, p.b) for p in pairs] == [("alice", "bob")]
    assert any("not compared (not a readable notebook): carol" in line for line in said)


def test_without_copydetect_the_report_is_skipped_and_says_how_to_install_it(tmp_path, monkeypatch):
    (tmp_path / CSV_NAME).write_text("an old report\n")  # from an earlier run: must not pass for this batch's
    monkeypatch.setitem(sys.modules, "copydetect", None)  # import copydetect -> ImportError
    said = []
    assert write_similarity([("alice", FIXTURES / "alice.ipynb")], tmp_path, "03", echo=said.append) is None
    assert not (tmp_path / CSV_NAME).exists() and not (tmp_path / HTML_NAME).exists()
    assert len(said) == 1 and said[0].startswith("similarity report skipped: the similarity report needs "
                                                 "copydetect, which is not installed")
    assert said[0].endswith(f"install it with: pip install '{similarity.INSTALL}'")
    with pytest.raises(ImportError, match="pip install 'copydetect"):
        find_similar(_batch("alice", "bob"))


def test_a_failure_in_the_report_never_raises(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(similarity, "_compare", broken)
    said = []
    assert write_similarity([("alice", FIXTURES / "alice.ipynb")], tmp_path, "03", echo=said.append) is None
    assert said[-1] == "similarity report skipped: it failed with RuntimeError: boom"
    assert not (tmp_path / CSV_NAME).exists()


def test_a_batch_gets_the_report_and_the_same_gradebook_as_without_it(tmp_path):
    """One real batch (two kernels): the pair is in the sealed results, and every other file is byte for byte
    what the gradebook writer makes of the same rows without the similarity step."""
    from gpucourse.grading.grader.cli import grade_batch
    from gpucourse.grading.grader.gradebook import write_gradebook
    from gpucourse.grading.grader.manifest import MANIFEST, verify

    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("alice", "bob"):
        shutil.copy(FIXTURES / f"{name}.ipynb", subs / f"{name}.ipynb")
    said = []
    rows = grade_batch(subs, tmp_path / "with", lab="03", timeout=240, jobs=2, echo=said.append)
    assert [(r["learner"], r["status"], r["score"] == r["max_score"]) for r in rows] == [
        ("alice", "graded", True), ("bob", "graded", True)], said
    with_step = tmp_path / "with"
    rows_csv = list(csv.DictReader(open(with_step / CSV_NAME, newline="", encoding="utf-8")))
    assert [(r["learner_a"], r["learner_b"]) for r in rows_csv] == [("alice", "bob")]
    assert verify(with_step) == []  # the report is sealed with the results
    assert {CSV_NAME, HTML_NAME} <= set(json.loads((with_step / MANIFEST).read_text())["files"])
    write_gradebook(json.loads(json.dumps(rows)), tmp_path / "without")
    files = sorted(p.relative_to(tmp_path / "without").as_posix() for p in (tmp_path / "without").rglob("*")
                   if p.is_file() and p.name != MANIFEST)
    assert "gradebook.csv" in files and "feedback/bob.txt" in files
    for name in files:
        assert (with_step / name).read_bytes() == (tmp_path / "without" / name).read_bytes(), name
    assert not any("similar" in json.dumps(r) for r in rows)  # nothing of it in a learner's row or feedback


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "nan"])
def test_the_cli_refuses_a_threshold_outside_0_to_1(tmp_path, capsys, bad):
    from gpucourse.grading.grader.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main([str(tmp_path), "--lab", "03", "--similarity-threshold", bad])
    err = capsys.readouterr().err
    assert f"--similarity-threshold is a share of a submission's code, 0 to 1, got {float(bad)}" in err
