"""The grader on real notebooks: partial marks, hidden tests, every way a run can go wrong (runner, cli).

A failure stays in its item: an item whose call hangs, raises a ``BaseException`` or kills the kernel
fails alone, and the items after it are graded in a kernel started again; a cell that hangs or kills
the kernel costs only what it would have defined.
"""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from gpucourse.colab import SETUP_CELL
from gpucourse.grading.grader.cli import main as cli_main
from gpucourse.grading.items import items_in
from gpucourse.grading.grader.runner import grade_notebook
from gpucourse.labtests import lab01, lab09
from gpucourse.labtests import lab02 as lab02_tests

ROOT = Path(__file__).resolve().parents[3]
POINTS_09 = {spec.key: spec.points for spec, _ in items_in(lab09)}
#: Lab 01's points per item, read from its tests (so adding an item does not break these tests).
POINTS = {spec.key: spec.points for spec, _ in items_in(lab01)}
FULL = sum(POINTS.values())
FULL_02 = sum(spec.points for spec, _ in items_in(lab02_tests))


def _solution_with(tmp_path, replace: dict, name="sub.ipynb", solution="01_device_detection.ipynb",
                   setup: bool = True) -> Path:
    """A solution notebook (lab 01 unless named), some code cells replaced (keyed by a substring of the cell);
    ``setup=False`` leaves out the course's setup cell."""
    nb = nbformat.read(ROOT / "solutions" / solution, as_version=4)
    if not setup:
        kept = [c for c in nb.cells if c.source != SETUP_CELL]
        assert len(kept) == len(nb.cells) - 1, f"{solution} no longer has the course's setup cell"
        nb.cells = kept
    for cell in nb.cells:
        for key, new in replace.items():
            if cell.cell_type == "code" and key in cell.source:
                cell.source = new
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


HIDDEN = """\
from gpucourse.grading.items import Fail, in_kernel, item

@in_kernel
def _summary_of_gpus(ns, n):
    import tensorflow as tf  # live TensorFlow objects exist only in the kernel
    return ns.function("summarise_devices")([tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
                                             for i in range(n)])

@item("h1", points=4, title="hidden: GPUs only")
class h1:
    def cases(rng):
        return [{"n": rng.randint(1, 5)}]
    def observe(ns, case):
        return {"got": ns.kernel(_summary_of_gpus, case["n"])}
    def judge(case, seen):
        if seen["got"] != {"GPU": case["n"]}:
            raise Fail(f"expected {{'GPU': {case['n']}}}, got {seen['got']}")

@item("h2", points=1, title="hidden, inline: an empty list")
def h2(ns):
    if ns.function("summarise_devices")([]) != {}:
        raise Fail("empty list should give {}")
"""


def test_partial_submission_and_hidden_tests(tmp_path):
    sub = _solution_with(tmp_path, {"def pick_device": "def pick_device(devices):\n    return '/device:GPU:0'"})
    hidden = tmp_path / "hidden_lab01.py"
    hidden.write_text(HIDDEN)
    rep = grade_notebook(sub, extra_tests=[hidden], timeout=240)
    assert rep.status == "graded", rep.table()
    by_key = {r["key"]: r for r in rep.items}
    assert by_key["q2"]["status"] == "fail" and "expected '/device:CPU:0'" in by_key["q2"]["message"]
    assert by_key["h1"]["status"] == "pass" and by_key["h1"]["source"] == "hidden:hidden_lab01.py"
    assert by_key["h2"]["status"] == "pass" and by_key["h2"]["trust"] == "inline" and by_key["q1"]["trust"] == "split"
    assert (rep.score, rep.max_score) == (FULL - POINTS["q2"] + 5, FULL + 5)
    assert "FAIL" in rep.table() and "total" in rep.table()
    assert rep.mode == "summative" or "practice only" in rep.reason



def _lab09_with(tmp_path, replace: dict, name: str, measure: bool = True) -> Path:
    """Lab 09's solution with some cells replaced, and without its setup cell: q1-q4 are arithmetic, and the setup
    cell's TensorFlow import (about 5 CPU-seconds, again in each restarted kernel) is not what these tests are
    about. ``measure=False`` leaves q5 unwritten (it times real ops on the grader's side, which takes longer than
    the 4 s these tests give an item)."""
    if not measure:
        replace = {**replace, "def measure_roof": "pass  # q5 not written"}
    return _solution_with(tmp_path, replace, name, solution="09_roofline_mfu.ipynb", setup=False)


def test_a_failure_stays_in_its_item(tmp_path):
    """q1 hangs (interrupted at its time limit), q2 raises KeyboardInterrupt, q3 kills the kernel: each fails
    alone, with its own reason, and q4 is still graded, in a kernel started again after q3."""
    sub = _lab09_with(tmp_path, {
        "def arithmetic_intensity": "import time\ndef arithmetic_intensity(m, n, k, dtype):\n    while True:\n"
                                    "        time.sleep(0.1)",
        "def bounding_roof": "def bounding_roof(flops, nbytes, peak_tflops, bandwidth_gbs):\n"
                             "    raise KeyboardInterrupt('pressed stop')",
        "def dense_train_flops": "import os\ndef dense_train_flops(batch, d_in, d_out):\n    os._exit(3)"}, "items.ipynb",
        measure=False)
    rep = grade_notebook(sub, item_timeout=4)
    by_key = {r["key"]: r for r in rep.items}
    assert rep.status == "graded", rep.table()
    assert by_key["q1"]["status"] == "error" and "Stopped after 4 s" in by_key["q1"]["message"], rep.table()
    assert by_key["q2"]["status"] == "error" and "KeyboardInterrupt" in by_key["q2"]["message"], rep.table()
    assert by_key["q3"]["status"] == "error" and "kernel stopped" in by_key["q3"]["message"], rep.table()
    assert by_key["q4"]["status"] == "pass" and by_key["q5"]["status"] == "todo", rep.table()
    assert rep.score == POINTS_09["q4"]


def test_a_call_that_ignores_the_interrupt_costs_only_its_item(tmp_path):
    """q1 swallows KeyboardInterrupt and loops on: the kernel is killed and started again (the cells run again),
    and the other items pass."""
    sub = _lab09_with(tmp_path, {"def arithmetic_intensity": (
        "import time\ndef arithmetic_intensity(m, n, k, dtype):\n    while True:\n        try:\n"
        "            time.sleep(0.1)\n        except KeyboardInterrupt:\n            pass")}, "stubborn.ipynb", measure=False)
    rep = grade_notebook(sub, item_timeout=4)
    by_key = {r["key"]: r["status"] for r in rep.items}
    assert by_key == {"q1": "error", "q2": "pass", "q3": "pass", "q4": "pass", "q5": "todo"}, rep.table()


def test_a_cell_that_hangs_is_stopped_and_the_cells_after_it_are_skipped(tmp_path):
    sub = _lab09_with(tmp_path, {"def dense_train_flops": "import time\nwhile True:\n    time.sleep(0.1)"},
                      "hang.ipynb")
    rep = grade_notebook(sub, timeout=8)  # the cells before the hang take well under a second
    by_key = {r["key"]: r["status"] for r in rep.items}
    assert rep.status == "graded" and "was still running when the 8 s for the cells ran out" in rep.reason
    assert by_key == {"q1": "pass", "q2": "pass", "q3": "todo", "q4": "todo", "q5": "todo"}, rep.table()


def test_a_cell_that_kills_the_kernel_is_left_out_of_a_second_run(tmp_path):
    sub = _lab09_with(tmp_path, {"def bounding_roof": "import os\nos._exit(3)"}, "crash.ipynb")
    rep = grade_notebook(sub)
    by_key = {r["key"]: r["status"] for r in rep.items}
    assert rep.status == "graded" and "the kernel died while running cell" in rep.reason, rep.table()
    assert by_key == {"q1": "pass", "q2": "todo", "q3": "pass", "q4": "pass", "q5": "pass"}, rep.table()


def test_malformed_empty_and_unknown_notebooks(tmp_path):
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
    with pytest.raises(ValueError, match="item_timeout"):
        grade_notebook(tmp_path / "x.ipynb", item_timeout=-1)
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
    shutil.copy(_solution_with(tmp_path, {"def short_name": "def short_name(name):\n    import os\n    os._exit(1)"},
                               "c.ipynb", solution=lab02), subs / "bob" / "lab.ipynb")
    (subs / "carol.ipynb").write_text("not a notebook")
    (subs / "dave").mkdir()
    out = tmp_path / "book"
    args = [str(subs), "--lab", "02", "--out", str(out), "--jobs", "2", "--timeout", "240"]
    assert cli_main(args) == 0
    book = json.loads((out / "gradebook.json").read_text())
    status = {r["learner"]: (r["status"], r["score"]) for r in book}
    q1 = {spec.key: spec.points for spec, _ in items_in(lab02_tests)}["q1"]
    assert status == {"alice": ("graded", FULL_02), "bob": ("graded", FULL_02 - q1), "carol": ("malformed", 0),
                      "dave": ("empty", 0)}
    csv = (out / "gradebook.csv").read_text().splitlines()
    assert csv[0].startswith("learner,lab,status,mode,score,max_score,q1,q2,q3,q4")
    assert (out / "feedback" / "bob.txt").read_text().startswith("Lab 02")
    first = (out / "gradebook.json").read_text()
    assert cli_main(args) == 0  # idempotent: same gradebook again
    assert (out / "gradebook.json").read_text() == first


def test_rewriting_test_files_on_disk_gains_nothing(tmp_path):
    hidden = tmp_path / "hidden.py"
    hidden.write_text(HIDDEN.replace('"h1", points=4', '"h1", points=5'))
    forged = ("from gpucourse.grading.items import item\n"
              "@item('h1', points=5)\ndef h1(ns):\n    pass\n"
              "@item('bonus', points=50)\ndef bonus(ns):\n    pass\n")
    sub = _solution_with(tmp_path, {"def summarise_devices": (
        "def summarise_devices(devices):\n    return {}\n"
        f"open({str(hidden)!r}, 'w').write({forged!r})\n")})
    rep = grade_notebook(sub, extra_tests=[hidden], timeout=240)
    keys = {r["key"]: r["status"] for r in rep.items}
    assert "bonus" not in keys and keys["h1"] == "fail" and keys["h2"] == "pass" and keys["q1"] == "fail", rep.table()
    assert rep.max_score == FULL + 6 and rep.score == FULL - POINTS["q1"] + 1
