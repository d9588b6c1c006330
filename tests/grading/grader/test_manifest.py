"""gpucourse.grading.grader.manifest and `gpucourse-grade verify`: a change to the results after grading is named."""

import json

import pytest

from gpucourse.grading.grader.cli import main as cli_main
from gpucourse.grading.grader.gradebook import write_gradebook
from gpucourse.grading.grader.report import GradeReport
from gpucourse.grading.grader.manifest import MANIFEST, key_path, practice_marks, seal, verify


@pytest.fixture(autouse=True)
def key(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCOURSE_GRADING_KEY", str(tmp_path / "keys" / "grading.key"))
    return tmp_path / "keys" / "grading.key"


PRACTICE = "practice only: without bubblewrap's allow-list (or a container per submission)"


def _report(learner, mode="summative", status="graded"):
    items = [{"key": "q1", "title": "t", "points": 0, "max_points": 5, "status": "fail", "message": "no",
              "source": "public", "trust": "split"}]
    return GradeReport(f"{learner}.ipynb", "02", status, PRACTICE if mode == "practice" else "", 0, 5, items,
                       learner=learner, isolation="none: test" if mode == "practice" else "bubblewrap: test",
                       mode=mode)


def _book(tmp_path, *practice):
    rows = [_report("mallory").to_dict()] + [_report(who, "practice").to_dict() for who in practice]
    out = tmp_path / "out"
    write_gradebook(rows, out)
    return out


def test_the_gradebook_is_sealed_last_and_a_rewritten_row_is_named(tmp_path, key, capsys):
    out = _book(tmp_path)
    assert key_path() == key and (key.stat().st_mode & 0o777) == 0o600
    manifest = json.loads((out / MANIFEST).read_text())
    assert {"gradebook.csv", "gradebook.json", "canvas.csv", "feedback/mallory.txt",
            "reports/mallory.json"} == set(manifest["files"])
    capsys.readouterr()
    assert verify(out) == [] and cli_main(["verify", str(out)]) == 0
    assert capsys.readouterr().out == (f"ok {out}: every result file is as the grader sealed it, and no grade in "
                                       "it is practice only\n")
    assert "isolation" in (out / "gradebook.csv").read_text().splitlines()[0]
    rows = json.loads((out / "gradebook.json").read_text())
    rows[0]["score"] = 5
    (out / "gradebook.json").write_text(json.dumps(rows))
    (out / "extra.txt").write_text("x")
    (out / "feedback" / "mallory.txt").unlink()
    capsys.readouterr()
    assert cli_main(["verify", str(out)]) == 1
    said = capsys.readouterr().out
    assert f"CHANGED {out / 'gradebook.json'}: changed after grading" in said
    assert f"{out / 'extra.txt'}: added after grading" in said
    assert f"{out / 'feedback' / 'mallory.txt'}: removed after grading" in said


def test_a_manifest_rewritten_without_the_key_is_named(tmp_path, key):
    out = _book(tmp_path)
    (out / "gradebook.json").write_text("[]\n")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"]["gradebook.json"] = __import__("hashlib").sha256(b"[]\n").hexdigest()
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert verify(out) == [f"{out / MANIFEST}: changed after grading (its HMAC does not match the grading key)"]
    key.unlink()
    assert "cannot be authenticated: no grading key" in verify(out)[0]
    (out / MANIFEST).unlink()
    assert "missing" in verify(out)[0]


def test_one_report_is_sealed_beside_others(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("the instructor's own file")
    seal(tmp_path, [tmp_path / "a.json"])
    seal(tmp_path, [tmp_path / "b.json"])
    assert set(json.loads((tmp_path / MANIFEST).read_text())["files"]) == {"a.json", "b.json"}
    assert verify(tmp_path) == []
    (tmp_path / "a.json").write_text('{"score": 10}')
    assert verify(tmp_path) == [f"{tmp_path / 'a.json'}: changed after grading"]


def test_verify_names_every_practice_grade_of_an_intact_gradebook(tmp_path, capsys):
    out = _book(tmp_path, "pat", "quinn")
    lines = verify(out)
    assert lines == practice_marks(out) and len(lines) == 2  # nothing changed, but two grades are not marks
    assert lines[0] == (f"{out / 'gradebook.json'}: pat was graded as practice ({PRACTICE}): not a mark to upload; "
                        "grade again with bubblewrap or in a container per submission")
    assert lines[1].startswith(f"{out / 'gradebook.json'}: quinn was graded as practice")
    capsys.readouterr()
    assert cli_main(["verify", str(out)]) == 1
    said = capsys.readouterr().out.splitlines()
    assert said == [f"PRACTICE {line}" for line in lines]  # named as practice, not as a change
    assert practice_marks(_book(tmp_path / "other")) == []  # mallory's grade is summative


def test_verify_names_a_changed_practice_gradebook_both_ways(tmp_path, capsys):
    out = _book(tmp_path, "pat")
    rows = json.loads((out / "gradebook.json").read_text())
    rows[1]["score"] = 5
    (out / "gradebook.json").write_text(json.dumps(rows))
    capsys.readouterr()
    assert cli_main(["verify", str(out)]) == 1
    said = capsys.readouterr().out
    assert f"CHANGED {out / 'gradebook.json'}: changed after grading" in said
    assert f"PRACTICE {out / 'gradebook.json'}: pat was graded as practice" in said


def test_verify_names_a_single_practice_report_and_only_graded_ones(tmp_path):
    for rep in (_report("pat", "practice"), _report("sam"), _report("kim", "practice", status="error")):
        path = tmp_path / f"{rep.learner}.json"
        path.write_text(json.dumps(rep.to_dict()))
        seal(tmp_path, [path])  # as `gpucourse-grade x.ipynb --out tmp_path` seals one report
    assert verify(tmp_path) == [f"{tmp_path / 'pat.json'}: pat was graded as practice ({PRACTICE}): not a mark to "
                                "upload; grade again with bubblewrap or in a container per submission"]
    assert cli_main(["verify", str(tmp_path)]) == 1


def test_verify_names_a_practice_grade_in_gradescopes_results(tmp_path):
    from gpucourse.grading.grader.gradescope import results_json

    for mode in ("summative", "practice"):
        path = tmp_path / mode / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps(results_json(_report("pat", mode))))
        seal(path.parent, [path])
    assert verify(tmp_path / "summative") == []
    assert verify(tmp_path / "practice") == [
        f"{tmp_path / 'practice' / 'results.json'}: the submission was graded as practice ({PRACTICE}): not a mark "
        "to upload; grade again with bubblewrap or in a container per submission"]
