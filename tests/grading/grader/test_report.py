"""gpucourse.grading.grader.report: the report's JSON round trip, its integrity line and the learner's table."""

from gpucourse.grading.grader.report import STATUSES, GradeReport


def _items():
    return [{"key": "q1", "title": "short_name", "points": 2, "max_points": 2, "status": "pass", "message": "",
             "source": "public", "trust": "split"},
            {"key": "q2", "title": "run_where", "points": 0, "max_points": 3, "status": "withheld",
             "message": "Marks withheld: your code called gpucourse.placement.attempt.\nWrite it yourself.",
             "source": "public", "trust": "split"},
            {"key": "h1", "title": "hidden one", "points": 0, "max_points": 1, "status": "fail", "message": "no",
             "source": "hidden:h.py", "trust": "inline"}]


def test_round_trip_keeps_every_field_and_ignores_unknown_keys():
    rep = GradeReport("sub/02_placement.ipynb", "02", "graded", score=2, max_score=6, items=_items(),
                      flags=["imports inspect"], learner="ada", timings={"kernel start": 1.5})
    d = rep.to_dict()
    assert GradeReport.from_dict(d | {"added_later": 1}) == rep
    assert set(STATUSES) >= {"graded", "tampered", "timeout", "crashed", "malformed", "empty", "error"}


def test_integrity_line_says_ok_flagged_or_withheld():
    assert GradeReport("a.ipynb", "01", "graded").integrity() == "ok"
    flagged = GradeReport("a.ipynb", "02", "graded", items=_items(), flags=["imports inspect"])
    line = flagged.integrity()
    assert line.startswith("flagged: q2: Marks withheld: your code called gpucourse.placement.attempt")
    assert line.endswith("; imports inspect") and flagged.review
    held = GradeReport("a.ipynb", "01", "tampered", tampering=["json.dumps was replaced"], flags=["uses exec"])
    assert held.integrity() == "withheld: json.dumps was replaced | flagged: uses exec"
    assert not GradeReport("a.ipynb", "01", "graded").review


def test_table_lists_items_sources_messages_errors_and_reasons():
    rep = GradeReport("sub/02_placement.ipynb", "02", "graded", score=2, max_score=6, items=_items(),
                      cell_errors=[{"cell": "4", "ename": "NameError", "evalue": "name 'x' is not defined"}],
                      flags=["imports inspect"], tampering=["ctypes"], learner="ada")
    lines = rep.table().splitlines()
    assert lines[0] == "Lab 02: 02_placement.ipynb (ada)" and lines[1] == "status: graded"
    assert any(ln.split()[:3] == ["q1", "2/2", "pass"] for ln in lines)
    assert any(ln.split()[:3] == ["q2", "0/3", "HELD"] for ln in lines)
    assert any(ln.split()[:3] == ["h1", "0/1", "FAIL"] and ln.endswith("[hidden:h.py]") for ln in lines)
    held = next(i for i, ln in enumerate(lines) if "0/3" in ln)
    assert lines[held + 2].strip() == "Write it yourself."  # a message's lines stay under its item
    assert lines[held + 1].index("Marks") == lines[held + 2].index("Write")
    assert any(ln.split() == ["total", "2/6"] for ln in lines)
    assert "  cell 4 raised NameError: name 'x' is not defined" in lines
    assert "  marks withheld: ctypes" in lines and "  flagged for review: imports inspect" in lines
    bad = GradeReport("x.ipynb", None, "malformed", "not a readable notebook").table()
    assert bad.splitlines()[:2] == ["Lab ??: x.ipynb", "status: malformed: not a readable notebook"]
