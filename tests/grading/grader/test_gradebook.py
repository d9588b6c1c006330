"""Gradebooks without a kernel: the per-lab files, the Canvas CSV, and `gpucourse-grade lms`.

A *practice* grade (the kernel was not isolated enough: ``mode == "practice"``) stays in the lab's own
gradebook with its mode and reason, and never reaches a Canvas CSV: its cell is empty.
"""

import csv
import json

import pytest

from gpucourse.grading.grader.cli import main as cli_main
from gpucourse.grading.grader.gradebook import CANVAS_IDENTITY, canvas_csv, write_gradebook
from gpucourse.grading.grader.report import GradeReport, is_practice

PRACTICE = "practice only: without bubblewrap's allow-list (or a container per submission)"


def _row(learner, lab, status, score, max_score=10, flags=(), mode=None, item=None):
    """One gradebook row: a graded row is summative unless ``mode`` says otherwise; others have no mode."""
    item = item or ("pass" if score else "fail")
    items = [{"key": "q1", "title": "t", "points": score, "max_points": max_score, "status": item,
              "message": "" if item == "pass" else "why", "source": "public", "trust": "split"}]
    if mode is None:
        mode = "summative" if status == "graded" else ""
    reason = PRACTICE if mode == "practice" else ("" if status == "graded" else "why")
    return GradeReport(f"{learner}.ipynb", lab, status, reason, score, max_score, items, flags=list(flags),
                       learner=learner, duration_s=1.5, timings={"judging": 0.1}, mode=mode,
                       isolation="none: test" if mode == "practice" else "bubblewrap: test").to_dict()


def test_write_gradebook_keeps_every_learner_with_status_mode_and_reason(tmp_path):
    rows = [_row("ann", "01", "graded", 10, flags=["imports inspect"]), _row("bob", "01", "error", 0),
            _row("cy/z", "01", "graded", 7, mode="practice"), _row("dee", "01", "graded", 0, item="error"),
            _row("eve", "01", "malformed", 0)]
    write_gradebook(rows, tmp_path, column="Lab 01 (77)")
    header = next(csv.reader(open(tmp_path / "gradebook.csv")))
    assert header == ["learner", "lab", "status", "mode", "score", "max_score", "q1", "integrity", "reason", "flags",
                      "isolation"]
    book = list(csv.DictReader(open(tmp_path / "gradebook.csv")))
    assert [r["learner"] for r in book] == ["ann", "bob", "cy/z", "dee", "eve"]
    assert [(r["status"], r["mode"], r["score"]) for r in book] == [
        ("graded", "summative", "10"), ("error", "", "0"), ("graded", "practice", "7"), ("graded", "summative", "0"),
        ("malformed", "", "0")]
    assert book[0]["integrity"] == "flagged: imports inspect" and book[0]["flags"] == "imports inspect"
    assert book[1]["reason"] == "why" and book[2]["reason"] == PRACTICE and book[2]["isolation"] == "none: test"
    assert book[3]["integrity"] == "ok" and book[3]["q1"] == "0"  # an item that errs is a mark, not a flag
    data = json.loads((tmp_path / "gradebook.json").read_text())
    assert "duration_s" not in data[0] and "timings" not in data[0]
    assert [r["mode"] for r in data] == ["summative", "", "practice", "summative", ""]
    assert json.loads((tmp_path / "reports" / "cy_z.json").read_text())["mode"] == "practice"
    assert (tmp_path / "feedback" / "cy_z.txt").read_text().splitlines()[1] == f"status: graded (practice): {PRACTICE}"
    assert "flagged for review: imports inspect" in (tmp_path / "feedback" / "ann.txt").read_text()
    canvas = list(csv.reader(open(tmp_path / "canvas.csv")))
    assert canvas[0] == list(CANVAS_IDENTITY) + ["Lab 01 (77)"]
    assert canvas[1][0] == "Points Possible" and canvas[1][-1] == "10"
    # the practice grade (7) is not a mark to upload: empty, like a learner who did not submit
    assert [(r[0], r[-1]) for r in canvas[2:]] == [("ann", "10"), ("bob", "0"), ("cy/z", ""), ("dee", "0"),
                                                   ("eve", "0")]


def test_canvas_csv_one_row_per_learner_one_column_per_lab(tmp_path):
    lab1 = [_row("ann", "01", "graded", 7), _row("bob", "01", "error", 0)]
    lab2 = [_row("ann", "02", "graded", 9, 12), _row("eve", "02", "graded", 12, 12)]
    roster = tmp_path / "export.csv"
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Lab 01\n"
                      "    Points Possible,,,,,10\n"
                      "\"Doe, Ann\",101,s101,ann,A\n\"Roe, Bob\",102,s102,bob,A\n\"Loe, Zed\",103,s103,zed,B\n")
    table = canvas_csv([lab1, lab2], roster, {"02": "Lab 02 (55)"})
    assert table[0] == list(CANVAS_IDENTITY) + ["Lab 01", "Lab 02 (55)"]
    assert table[1] == ["Points Possible", "", "", "", "", "10", "12"]
    by = {r[3]: r for r in table[2:]}
    assert by["ann"] == ["Doe, Ann", "101", "s101", "ann", "A", "7", "9"]
    assert by["bob"][-2:] == ["0", ""]          # the grader could not grade it: 0; no lab 02 submission: empty
    assert by["zed"][-2:] == ["", ""]           # on the roster, submitted nothing
    assert by["eve"][:5] == ["eve", "", "", "eve", ""] and by["eve"][-2:] == ["", "12"]  # not on the roster: kept


def test_canvas_csv_leaves_every_practice_grade_empty(tmp_path):
    lab1 = [_row("ann", "01", "graded", 7, mode="practice"), _row("bob", "01", "graded", 10),
            _row("cy", "01", "graded", 0, mode="practice")]
    lab2 = [_row("ann", "02", "graded", 12, 12), _row("bob", "02", "graded", 12, 12, mode="practice")]
    table = canvas_csv([lab1, lab2])
    assert table[0][5:] == ["Lab 01", "Lab 02"] and table[1][5:] == ["10", "12"]
    by = {r[0]: r[5:] for r in table[2:]}
    assert by == {"ann": ["", "12"], "bob": ["10", ""], "cy": ["", ""]}  # every learner kept, no practice mark
    assert [is_practice(r) for r in lab1] == [True, False, True]
    # only a graded row is practice; a row from before the mode column (no "mode") is a mark
    assert not is_practice(_row("dan", "01", "error", 0, mode="practice"))
    old = {k: v for k, v in _row("dan", "01", "graded", 5).items() if k != "mode"}
    assert canvas_csv([[old]])[2][5:] == ["5"]
    assert canvas_csv([[_row("dan", "01", "error", 4)]])[2][5:] == ["0"]  # only a graded row uploads its points


def test_lms_command(tmp_path, capsys):
    write_gradebook([_row("ann", "01", "graded", 7)], tmp_path / "g1")
    write_gradebook([_row("bob", "03", "graded", 3)], tmp_path / "g3")
    out = tmp_path / "canvas.csv"
    assert cli_main(["lms", str(tmp_path / "g1"), str(tmp_path / "g3"), "--out", str(out), "--column", "3=Lab 3"]) == 0
    table = list(csv.reader(open(out)))
    assert table[0][5:] == ["Lab 01", "Lab 3"] and len(table) == 4
    assert {r[0]: r[5:] for r in table[2:]} == {"ann": ["7", ""], "bob": ["", "3"]}
    said = capsys.readouterr().out
    assert "2 learner(s), 2 lab column(s)" in said and "practice" not in said
    with pytest.raises(SystemExit):
        cli_main(["lms", str(tmp_path / "nothing-here"), "--out", str(out)])
    with pytest.raises(SystemExit):
        cli_main(["lms", str(tmp_path / "g1"), "--column", "oops"])


def test_lms_command_leaves_practice_grades_empty_and_names_them(tmp_path, capsys):
    write_gradebook([_row("ann", "01", "graded", 7), _row("bob", "01", "graded", 9, mode="practice")], tmp_path / "g1")
    out = tmp_path / "canvas.csv"
    capsys.readouterr()
    assert cli_main(["lms", str(tmp_path / "g1"), "--out", str(out)]) == 0
    assert {r[0]: r[5:] for r in list(csv.reader(open(out)))[2:]} == {"ann": ["7"], "bob": [""]}
    said = capsys.readouterr().out
    assert "warning: 1 practice grade(s) left empty, not marks to upload" in said and said.rstrip().endswith(
        "bob (lab 01)")
