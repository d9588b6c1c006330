"""The grader on real notebooks: partial marks, hidden tests, every way a run can go wrong (runner, cli)."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from gpucourse.grading.grader.cli import main as cli_main
from gpucourse.grading.items import items_in
from gpucourse.grading.grader.runner import grade_notebook
from gpucourse.labtests import lab01, lab02

ROOT = Path(__file__).resolve().parents[3]
#: Lab 01's points per item, read from its tests (so adding an item does not break these tests).
POINTS = {spec.key: spec.points for spec, _ in items_in(lab01)}
FULL = sum(POINTS.values())
FULL_02 = sum(spec.points for spec, _ in items_in(lab02))


def _solution_with(tmp_path, replace: dict, name="sub.ipynb", solution="01_device_detection.ipynb") -> Path:
    """A solution notebook (lab 01 unless named), some code cells replaced (keyed by a substring of the cell)."""
    nb = nbformat.read(ROOT / "solutions" / solution, as_version=4)
    for cell in nb.cells:
        for key, new in replace.items():
            if cell.cell_type == "code" and key in cell.source:
                cell.source = new
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_partial_submission_and_hidden_tests(tmp_path):
    sub = _solution_with(tmp_path, {"def pick_device": "def pick_device(devices):\n    return '/device:GPU:0'"})
    hidden = tmp_path / "hidden_lab01.py"
    hidden.write_text(
        "from gpucourse.grading.items import item, Fail\n"
        "@item('h1', points=4, title='hidden: summarise an empty list')\n"
        "def h1(ns):\n"
        "    if ns.function('summarise_devices')([]) != {}:\n"
        "        raise Fail('empty list should give {}')\n")
    rep = grade_notebook(sub, extra_tests=[hidden], timeout=240)
    assert rep.status == "graded", rep.table()
    by_key = {r["key"]: r for r in rep.items}
    assert by_key["q2"]["status"] == "fail" and "expected '/device:CPU:0'" in by_key["q2"]["message"]
    assert by_key["h1"]["status"] == "pass" and by_key["h1"]["source"] == "hidden:hidden_lab01.py"
    assert by_key["h1"]["trust"] == "inline" and by_key["q1"]["trust"] == "split"
    assert (rep.score, rep.max_score) == (FULL - POINTS["q2"] + 4, FULL + 4)
    assert "FAIL" in rep.table() and "total" in rep.table()



def test_crash_hang_malformed_empty(tmp_path):
    crash = _solution_with(tmp_path, {"def pick_device": "import os\nos._exit(3)"}, "crash.ipynb")
    rep = grade_notebook(crash, timeout=240)
    assert rep.status == "crashed" and "kernel died" in rep.reason and rep.score == 0 and rep.max_score == FULL
    assert "cell" in rep.reason

    hang = _solution_with(tmp_path, {"def pick_device": "import time\nwhile True:\n    time.sleep(1)"}, "hang.ipynb")
    rep = grade_notebook(hang, timeout=6)  # (under load the limit may already run out in the grader's set-up)
    assert rep.status == "timeout" and "6 s time limit" in rep.reason and rep.score == 0

    bad = tmp_path / "01_bad.ipynb"
    bad.write_text("{ this is not json")
    rep = grade_notebook(bad)
    assert rep.status == "malformed" and rep.score == 0

    empty = tmp_path / "01_empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("nothing")]), empty)
    rep = grade_notebook(empty)
    assert rep.status == "empty" and rep.max_score == FULL

    unknown = tmp_path / "notes.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), unknown)
    rep = grade_notebook(unknown)
    assert rep.status == "error" and "--lab" in rep.reason


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        grade_notebook(tmp_path / "x.ipynb", timeout=0)
    with pytest.raises(FileNotFoundError):
        grade_notebook(tmp_path / "x.ipynb", extra_tests=[tmp_path / "nope.py"])
    with pytest.raises(SystemExit):
        cli_main([str(tmp_path / "missing.ipynb")])
    with pytest.raises(SystemExit):
        cli_main([str(tmp_path), "--lab", "one"])


def test_cli_single_writes_json(tmp_path, capsys):
    sub = _solution_with(tmp_path, {"def visible_gpu_count": "def visible_gpu_count(v, p):\n    return p"})
    out = tmp_path / "r.json"
    assert cli_main([str(sub), "--lab", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["status"] == "graded" and data["score"] == FULL - POINTS["q4"] and data["lab"] == "01"
    assert "Lab 01" in capsys.readouterr().out


def test_batch_gradebook(tmp_path, capsys):
    # lab 02: its judges need no TensorFlow, so the two pool workers start quickly
    subs = tmp_path / "subs"
    subs.mkdir()
    lab02 = "02_placement_logging.ipynb"
    good = _solution_with(tmp_path, {}, "good.ipynb", solution=lab02)
    shutil.copy(good, subs / "alice.ipynb")
    (subs / "bob").mkdir()
    shutil.copy(_solution_with(tmp_path, {"def short_name": "import os\nos._exit(1)"}, "c.ipynb", solution=lab02),
                subs / "bob" / "lab.ipynb")
    (subs / "carol.ipynb").write_text("not a notebook")
    (subs / "dave").mkdir()
    out = tmp_path / "book"
    args = [str(subs), "--lab", "02", "--out", str(out), "--jobs", "2", "--timeout", "240"]
    assert cli_main(args) == 0
    book = json.loads((out / "gradebook.json").read_text())
    status = {r["learner"]: (r["status"], r["score"]) for r in book}
    assert status == {"alice": ("graded", FULL_02), "bob": ("crashed", 0), "carol": ("malformed", 0),
                      "dave": ("empty", 0)}
    csv = (out / "gradebook.csv").read_text().splitlines()
    assert csv[0].startswith("learner,lab,status,score,max_score,q1,q2,q3,q4")
    assert (out / "feedback" / "bob.txt").read_text().startswith("Lab 02")
    first = (out / "gradebook.json").read_text()
    assert cli_main(args) == 0  # idempotent: same gradebook again
    assert (out / "gradebook.json").read_text() == first


def test_rewriting_test_files_on_disk_gains_nothing(tmp_path):
    hidden = tmp_path / "hidden.py"
    hidden.write_text(
        "from gpucourse.grading.items import item, Fail\n"
        "@item('h1', points=5, title='hidden: two GPUs and a CPU')\n"
        "def h1(ns):\n"
        "    import tensorflow as tf\n"
        "    devs = [tf.config.PhysicalDevice(f'/physical_device:GPU:{i}', 'GPU') for i in range(2)]\n"
        "    if ns.function('summarise_devices')(devs) != {'GPU': 2}:\n"
        "        raise Fail('expected {\"GPU\": 2}')\n")
    forged = ("from gpucourse.grading.items import item\n"
              "@item('h1', points=5)\ndef h1(ns):\n    pass\n"
              "@item('bonus', points=50)\ndef bonus(ns):\n    pass\n")
    sub = _solution_with(tmp_path, {"def summarise_devices": (
        "def summarise_devices(devices):\n    return {}\n"
        f"open({str(hidden)!r}, 'w').write({forged!r})\n")})
    rep = grade_notebook(sub, extra_tests=[hidden], timeout=240)
    keys = {r["key"]: r["status"] for r in rep.items}
    assert "bonus" not in keys and keys["h1"] == "fail" and keys["q1"] == "fail", rep.table()
    assert rep.max_score == FULL + 5 and rep.score == FULL - POINTS["q1"]
