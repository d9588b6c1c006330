"""The Gradescope bundle: its contents, results.json, and run_autograder for real in Gradescope's layout."""

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from gpucourse.grading.grader import sandbox
from gpucourse.grading.grader.cli import main as cli_main
from gpucourse.grading.grader.gradescope import build_bundle, results_json, run
from gpucourse.grading.items import items_in
from gpucourse.grading.grader.report import GradeReport
from gpucourse.labtests import lab02

ROOT = Path(__file__).resolve().parents[3]
HIDDEN = Path(__file__).resolve().parent / "attacks" / "hidden_inline.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    # lab 02: its judges need no TensorFlow and no probes, so each run_autograder below costs little
    # more than its kernel (the bundle is the same for every lab)
    out = tmp_path_factory.mktemp("bundle") / "lab02.zip"
    build_bundle("02", [HIDDEN], out, timeout=240, hidden_visibility="after_published")
    return out


def test_bundle_holds_what_gradescope_needs(bundle):
    with zipfile.ZipFile(bundle) as zf:
        names = set(zf.namelist())
        for needed in ("setup.sh", "run_autograder", "requirements.txt", "config.json", "course/pyproject.toml",
                       "course/utils/grading/kernel_guard.py", "course/utils/labtests/lab02.py",
                       "course/labs/02_placement_logging.ipynb", "tests/hidden_inline.py"):
            assert needed in names, needed
        assert not any("__pycache__" in n for n in names)
        for script in ("setup.sh", "run_autograder"):
            assert (zf.getinfo(script).external_attr >> 16) & stat.S_IXUSR, f"{script} must be executable"
        reqs = zf.read("requirements.txt").decode()
        config = json.loads(zf.read("config.json"))
        setup = zf.read("setup.sh").decode()
    assert "tensorflow-cpu>=2.21,<2.22" in reqs and "nbclient" in reqs
    assert config == {"lab": "02", "timeout": 240, "hidden": ["tests/hidden_inline.py"],
                      "hidden_visibility": "after_published"}
    assert "pip install --quiet -r requirements.txt" in setup and "./course" in setup


def test_bundle_arguments(tmp_path, capsys):
    with pytest.raises(ValueError, match="there is no lab '99'"):
        build_bundle("99", out=tmp_path / "x.zip")
    with pytest.raises(FileNotFoundError):
        build_bundle("01", [tmp_path / "missing.py"], tmp_path / "x.zip")
    with pytest.raises(ValueError, match="hidden_visibility"):
        build_bundle("01", out=tmp_path / "x.zip", hidden_visibility="soon")
    assert cli_main(["gradescope", "--lab", "1", "--out", str(tmp_path / "b.zip")]) == 0
    assert zipfile.is_zipfile(tmp_path / "b.zip") and "Gradescope bundle written" in capsys.readouterr().out


def test_results_json_format():
    items = [{"key": "q1", "title": "adds", "points": 2, "max_points": 2, "status": "pass", "message": "",
              "source": "public", "trust": "split"},
             {"key": "h1", "title": "hidden", "points": 0, "max_points": 3, "status": "withheld",
              "message": "Marks withheld: ...", "source": "hidden:h.py", "trust": "inline"}]
    rep = GradeReport("s.ipynb", "01", "graded", "", 2, 5, items, flags=["imports inspect"], duration_s=4.4)
    res = results_json(rep, "after_due_date")
    assert res["score"] == 2 and res["execution_time"] == 4 and res["stdout_visibility"] == "hidden"
    q1, h1, integrity = res["tests"]
    assert q1 == {"name": "q1: adds", "score": 2, "max_score": 2, "status": "passed", "output": "Passed.",
                  "visibility": "visible", "tags": ["public", "split"]}
    assert h1["visibility"] == "after_due_date" and h1["status"] == "failed" and "(hidden test)" in h1["name"]
    assert integrity["name"] == "Integrity" and integrity["max_score"] == 0 and "imports inspect" in integrity["output"]
    assert "Flagged for review: imports inspect" in res["output"] and res["extra_data"]["review"] is True


def test_run_without_a_notebook_still_writes_results(tmp_path, bundle):
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as zf:
        zf.extract("config.json", root / "source")
    (root / "submission").mkdir(parents=True)
    (root / "submission" / "notes.txt").write_text("oops")
    res = run(root)
    assert res["score"] == 0 and "No notebook" in res["output"]
    assert json.loads((root / "results" / "results.json").read_text()) == res


LATE = """import os, shlex, sys
later = '''
import json, os, time
path = os.path.join({results!r}, "results.json")
for _ in range(300):
    if os.path.exists(path):
        time.sleep(0.3)
        res = json.load(open(path))
        res["score"] = 100
        json.dump(res, open(path, "w"))
        break
    time.sleep(0.1)
'''
os.popen(f"setsid {{sys.executable}} -c {{shlex.quote(later)}} gpucourse-attack-gs >/dev/null 2>&1 &")
"""


def _submission(kind: str, folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    base = "solutions" if kind == "solution" else "labs"
    nb = nbformat.read(ROOT / base / "02_placement_logging.ipynb", as_version=4)
    if kind == "solution":  # the hidden inline test's function too
        nb.cells.append(nbformat.v4.new_code_cell("def secret_sum(a, b, c):\n    return a + b + c"))
    if kind == "tampered":
        nb.cells.append(nbformat.v4.new_code_cell("import json\njson.dumps = lambda *a, **k: '{}'"))
    if kind == "unsolved":  # and a process in a new session that waits to rewrite results.json (issue 22)
        nb.cells.append(nbformat.v4.new_code_cell(LATE.format(results=str(folder.parent / "results"))))
    nbformat.write(nb, folder / "my_lab.ipynb")


def test_run_autograder_in_gradescope_layout(tmp_path, bundle):
    """Run the bundle's run_autograder against /autograder laid out in a temporary folder."""
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    script = root / "source" / "run_autograder"
    script.chmod(0o755)
    env = {**os.environ, "GPUCOURSE_AUTOGRADER_ROOT": str(root), "GPUCOURSE_PYTHON": sys.executable,
           "GPUCOURSE_GRADING_KEY": str(tmp_path / "grading.key")}
    got = {}
    for kind in ("solution", "unsolved", "tampered"):
        _submission(kind, root / "submission")
        shutil.rmtree(root / "results", ignore_errors=True)
        proc = subprocess.run(["bash", str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[kind] = json.loads((root / "results" / "results.json").read_text())
        if kind == "unsolved":  # the learner's late process is dead before results.json is written
            time.sleep(2)
            assert json.loads((root / "results" / "results.json").read_text()) == got[kind]
            check = subprocess.run([sys.executable, "-m", "gpucourse.grading.grader.cli", "verify", str(root / "results")],
                                   env=env, capture_output=True, text=True, timeout=60)
            assert check.returncode == 0, check.stdout
    if os.geteuid() == 0 and not sandbox.probe("bubblewrap"):  # as on Gradescope: the kernel ran as another user
        assert got["solution"]["extra_data"]["isolation"].split(":")[0] in ("bubblewrap", "user"), got["solution"]
    sol, uns, tam = got["solution"], got["unsolved"], got["tampered"]
    public = [spec for spec, _ in items_in(lab02)]
    assert sol["score"] == sum(s.points for s in public) + 5 and all(t["status"] == "passed" for t in sol["tests"]), sol
    assert {t["name"].split(":")[0]: t["visibility"] for t in sol["tests"]} == {
        **{s.key: "visible" for s in public}, "h1": "after_published"}
    assert uns["score"] == 0 and uns["extra_data"]["status"] == "graded"
    assert all(t["score"] == 0 for t in uns["tests"]), uns
    assert all("Not attempted" in t["output"] for t in uns["tests"] if t["name"].startswith("q")), uns
    assert "`secret_sum` is not defined" in uns["tests"][-2]["output"]
    assert uns["tests"][-1]["name"] == "Integrity" and "left 1 process(es) running" in uns["tests"][-1]["output"]
    assert tam["score"] == 0 and tam["extra_data"]["status"] == "tampered"
    integrity = [t for t in tam["tests"] if t["name"] == "Integrity"]
    assert integrity and "json.dumps was replaced" in integrity[0]["output"]
    assert "Marks withheld: json.dumps was replaced" in tam["output"]
