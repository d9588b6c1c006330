"""Gradebooks without a kernel: the per-lab files, the Canvas CSV, and `gpucourse-grade lms`."""

import csv
import json

import pytest

from gpucourse.grading.grader.cli import main as cli_main
from gpucourse.grading.grader.gradebook import CANVAS_IDENTITY, canvas_csv, write_gradebook
from gpucourse.grading.grader.report import GradeReport


def _row(learner, lab, status, score, max_score=10, flags=(), tampering=(), withheld=False):
    items = [{"key": "q1", "title": "t", "points": score, "max_points": max_score,
              "status": "pass" if score else "fail", "message": "", "source": "public", "trust": "split"}]
    if withheld:
        items[0].update(status="withheld", points=0, message="Marks withheld: called a helper")
    return GradeReport(f"{learner}.ipynb", lab, status, "why" if status != "graded" else "", score, max_score, items,
                       flags=list(flags), tampering=list(tampering), learner=learner, duration_s=1.5,
                       timings={"judging": 0.1}).to_dict()


def test_write_gradebook_keeps_every_learner_with_status_and_reason(tmp_path):
    rows = [_row("ann", "01", "graded", 10, flags=["imports inspect"]), _row("bob", "01", "crashed", 0),
            _row("cy/z", "01", "tampered", 0, tampering=["json.dumps was replaced"]),
            _row("dee", "01", "graded", 0, withheld=True)]
    write_gradebook(rows, tmp_path, column="Lab 01 (77)")
    book = list(csv.DictReader(open(tmp_path / "gradebook.csv")))
    assert [r["learner"] for r in book] == ["ann", "bob", "cy/z", "dee"]
    assert book[0]["integrity"] == "flagged: imports inspect" and book[1]["status"] == "crashed"
    assert book[2]["integrity"] == "withheld: json.dumps was replaced" and book[1]["reason"] == "why"
    assert book[3]["integrity"].startswith("flagged: q1: Marks withheld")
    data = json.loads((tmp_path / "gradebook.json").read_text())
    assert "duration_s" not in data[0] and "timings" not in data[0]
    assert (tmp_path / "feedback" / "cy_z.txt").read_text().count("marks withheld: json.dumps was replaced") == 1
    assert "flagged for review: imports inspect" in (tmp_path / "feedback" / "ann.txt").read_text()
    canvas = list(csv.reader(open(tmp_path / "canvas.csv")))
    assert canvas[0] == list(CANVAS_IDENTITY) + ["Lab 01 (77)"]
    assert canvas[1][0] == "Points Possible" and canvas[1][-1] == "10"
    assert [r[-1] for r in canvas[2:]] == ["10", "0", "0", "0"]


def test_canvas_csv_one_row_per_learner_one_column_per_lab(tmp_path):
    lab1 = [_row("ann", "01", "graded", 7), _row("bob", "01", "timeout", 0)]
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
    assert by["bob"][-2:] == ["0", ""]          # timed out: 0; no lab 02 submission: empty
    assert by["zed"][-2:] == ["", ""]           # on the roster, submitted nothing
    assert by["eve"][:5] == ["eve", "", "", "eve", ""] and by["eve"][-2:] == ["", "12"]  # not on the roster: kept


def test_lms_command(tmp_path, capsys):
    write_gradebook([_row("ann", "01", "graded", 7)], tmp_path / "g1")
    write_gradebook([_row("bob", "03", "graded", 3)], tmp_path / "g3")
    out = tmp_path / "canvas.csv"
    assert cli_main(["lms", str(tmp_path / "g1"), str(tmp_path / "g3"), "--out", str(out), "--column", "3=Lab 3"]) == 0
    table = list(csv.reader(open(out)))
    assert table[0][5:] == ["Lab 01", "Lab 3"] and len(table) == 4
    assert "2 learner(s), 2 lab column(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["lms", str(tmp_path / "nothing-here"), "--out", str(out)])
    with pytest.raises(SystemExit):
        cli_main(["lms", str(tmp_path / "g1"), "--column", "oops"])
