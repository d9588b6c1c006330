"""gpucourse.grading.grader.report: the report's JSON round trip, its integrity line and the learner's table."""

import dataclasses

from gpucourse.grading.grader.report import STATUSES, GradeReport


def _items():
    return [{"key": "q1", "title": "short_name", "points": 2, "max_points": 2, "status": "pass", "message": "",
             "source": "public", "trust": "split"},
            {"key": "q2", "title": "run_where", "points": 0, "max_points": 3, "status": "error",
             "message": "Stopped after 4 s: the call did not return.\nA loop that never ends?",
             "source": "public", "trust": "split"},
            {"key": "q3", "title": "pick_device", "points": 0, "max_points": 2, "status": "todo",
             "message": "not attempted", "source": "public", "trust": "split"},
            {"key": "h1", "title": "hidden one", "points": 0, "max_points": 1, "status": "fail", "message": "no",
             "source": "hidden:h.py", "trust": "inline"}]


def test_round_trip_keeps_every_field_and_ignores_unknown_keys():
    rep = GradeReport("sub/02_placement.ipynb", "02", "graded", score=2, max_score=8, items=_items(),
                      flags=["imports inspect"], learner="ada", timings={"kernel start": 1.5},
                      isolation="bubblewrap: test", mode="practice")
    d = rep.to_dict()
    assert d["mode"] == "practice" and "tampering" not in d
    assert GradeReport.from_dict(d | {"added_later": 1}) == rep
    # a report written by the old grader (with "tampering") still loads; the field is gone
    assert GradeReport.from_dict(d | {"tampering": ["json.dumps was replaced"]}) == rep
    assert "tampering" not in {f.name for f in dataclasses.fields(GradeReport)}


def test_statuses_are_the_four_of_the_new_design():
    # a hang or a crash costs only the items it touches: no tampered/timeout/crashed submission any more
    assert STATUSES == ("graded", "malformed", "empty", "error")


def test_integrity_line_is_ok_or_flagged_and_never_reads_the_items():
    assert GradeReport("a.ipynb", "01", "graded").integrity() == "ok"
    assert not GradeReport("a.ipynb", "01", "graded").review
    # failed, erroring and untouched items are marks, not integrity: still "ok"
    assert GradeReport("a.ipynb", "02", "graded", items=_items()).integrity() == "ok"
    flagged = GradeReport("a.ipynb", "02", "graded", items=_items(), flags=["imports inspect", "uses exec"])
    assert flagged.integrity() == "flagged: imports inspect; uses exec" and flagged.review
    assert GradeReport("a.ipynb", "01", "error", "the kernel did not start", flags=["uses exec"]).integrity() == \
        "flagged: uses exec"


def test_table_lists_items_sources_messages_errors_and_reasons():
    rep = GradeReport("sub/02_placement.ipynb", "02", "graded", score=2, max_score=8, items=_items(),
                      cell_errors=[{"cell": "4", "ename": "NameError", "evalue": "name 'x' is not defined"}],
                      flags=["imports inspect"], learner="ada", mode="summative")
    lines = rep.table().splitlines()
    assert lines[0] == "Lab 02: 02_placement.ipynb (ada)" and lines[1] == "status: graded (summative)"
    assert any(ln.split()[:3] == ["q1", "2/2", "pass"] for ln in lines)
    assert any(ln.split()[:3] == ["q2", "0/3", "ERROR"] for ln in lines)
    assert any(ln.split()[:3] == ["q3", "0/2", "todo"] for ln in lines)
    assert any(ln.split()[:3] == ["h1", "0/1", "FAIL"] and ln.endswith("[hidden:h.py]") for ln in lines)
    assert not any(ln.split()[:1] == ["q1"] and ln.endswith("]") for ln in lines)  # public items name no source
    stopped = next(i for i, ln in enumerate(lines) if "0/3" in ln)
    assert lines[stopped + 2].strip() == "A loop that never ends?"  # a message's lines stay under its item
    assert lines[stopped + 1].index("Stopped") == lines[stopped + 2].index("A loop")
    assert any(ln.split() == ["total", "2/8"] for ln in lines)
    assert "  cell 4 raised NameError: name 'x' is not defined" in lines
    assert "  flagged for review: imports inspect" in lines
    assert not any("withheld" in ln.lower() for ln in lines)
    bad = GradeReport("x.ipynb", None, "malformed", "not a readable notebook").table()
    assert bad.splitlines()[:2] == ["Lab ??: x.ipynb", "status: malformed: not a readable notebook"]


def test_table_says_a_practice_grade_and_why():
    rep = GradeReport("a.ipynb", "01", "graded", "practice only: without bubblewrap's allow-list", mode="practice")
    assert rep.table().splitlines()[1] == "status: graded (practice): practice only: without bubblewrap's allow-list"
