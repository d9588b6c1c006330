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
                       "course/utils/grading/protocol.py", "course/utils/grading/kernel/agent.py",
                       "course/utils/grading/kernel/launch.py", "course/utils/grading/kernel/tripwire.py",
                       "course/utils/grading/grader/runner.py", "course/utils/grading/locale/zh_CN.po",
                       "course/utils/labtests/lab02.py", "course/labs/02_placement_logging.ipynb",
                       "tests/hidden_inline.py"):
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


def _packages_in(folder: Path) -> set[str]:
    """Every package under ``folder`` (imported as gpucourse): a folder with an ``__init__.py``."""
    return {".".join(("gpucourse",) + p.parent.relative_to(folder).parts) for p in folder.rglob("__init__.py")
            if "__pycache__" not in p.parts}


@pytest.mark.parametrize("installed_from_a_wheel", [False, True])
def test_the_bundles_course_installs_every_package(tmp_path, monkeypatch, installed_from_a_wheel):
    """setup.sh runs `pip install ./course`: its pyproject installs every package of the course it holds (the
    grader, the kernel's code, the tests) and check()'s translations, also when the bundle was built from an
    installed course (no pyproject.toml beside the package: the bundle writes a minimal one)."""
    import tomllib

    from gpucourse.grading.grader import gradescope

    if installed_from_a_wheel:
        monkeypatch.setattr(gradescope, "_project_root", lambda: None)
    with zipfile.ZipFile(build_bundle("02", out=tmp_path / "b.zip")) as zf:
        zf.extractall(tmp_path / "source")
    course = tmp_path / "source" / "course"
    assert _packages_in(course / "utils") == _packages_in(ROOT / "utils")  # the whole package, not a part of it
    setuptools = tomllib.loads((course / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"gpucourse": "utils"}
    assert set(setuptools["packages"]) == _packages_in(ROOT / "utils"), sorted(set(setuptools["packages"]) ^
                                                                               _packages_in(ROOT / "utils"))
    assert "locale/*.po" in setuptools["package-data"]["gpucourse.grading"]
    assert (course / "utils" / "grading" / "locale" / "zh_CN.po").is_file()


def test_bundle_arguments(tmp_path, capsys):
    with pytest.raises(ValueError, match="there is no lab '99'"):
        build_bundle("99", out=tmp_path / "x.zip")
    with pytest.raises(FileNotFoundError):
        build_bundle("01", [tmp_path / "missing.py"], tmp_path / "x.zip")
    with pytest.raises(ValueError, match="hidden_visibility"):
        build_bundle("01", out=tmp_path / "x.zip", hidden_visibility="soon")
    assert cli_main(["gradescope", "--lab", "1", "--out", str(tmp_path / "b.zip")]) == 0
    assert zipfile.is_zipfile(tmp_path / "b.zip") and "Gradescope bundle written" in capsys.readouterr().out


def _items():
    return [{"key": "q1", "title": "adds", "points": 2, "max_points": 2, "status": "pass", "message": "",
             "source": "public", "trust": "split"},
            {"key": "q2", "title": "loops", "points": 0, "max_points": 1, "status": "error",
             "message": "Stopped after 30 s: the call did not return.", "source": "public", "trust": "split"},
            {"key": "q3", "title": "stub", "points": 0, "max_points": 1, "status": "todo",
             "message": "Not attempted yet: your code still raises NotImplementedError.", "source": "public",
             "trust": "split"},
            {"key": "h1", "title": "hidden", "points": 0, "max_points": 3, "status": "fail",
             "message": "secret_sum(1, 2, 3) should be 6, got 5", "source": "hidden:h.py", "trust": "inline"}]


def test_results_json_format():
    rep = GradeReport("s.ipynb", "01", "graded", "", 2, 7, _items(), flags=["imports inspect"], duration_s=4.4,
                      isolation="bubblewrap: test", mode="summative")
    res = results_json(rep, "after_due_date")
    assert res["score"] == 2 and res["execution_time"] == 4 and res["stdout_visibility"] == "hidden"
    q1, q2, q3, h1, integrity = res["tests"]
    assert q1 == {"name": "q1: adds", "score": 2, "max_score": 2, "status": "passed", "output": "Passed.",
                  "visibility": "visible", "tags": ["public", "split"]}
    assert (q2["status"], q2["output"]) == ("failed", "Stopped after 30 s: the call did not return.")
    assert q3["status"] == "failed" and q3["output"].startswith("Not attempted yet")
    assert h1["visibility"] == "after_due_date" and h1["status"] == "failed" and "(hidden test)" in h1["name"]
    assert h1["output"] == "secret_sum(1, 2, 3) should be 6, got 5"
    assert integrity == {"name": "Integrity", "score": 0, "max_score": 0, "status": "failed",
                         "output": "flagged: imports inspect", "visibility": "visible", "tags": ["integrity"]}
    assert res["output"].splitlines() == ["Lab 01: graded", "Score: 2/7", "Flagged for review: imports inspect"]
    assert res["extra_data"] == {"status": "graded", "reason": "", "flags": ["imports inspect"], "mode": "summative",
                                 "review": True, "isolation": "bubblewrap: test"}
    clean = results_json(GradeReport("s.ipynb", "01", "graded", "", 2, 7, _items(), mode="summative"))
    assert [t["name"] for t in clean["tests"]] == ["q1: adds", "q2: loops", "q3: stub", "h1: hidden (hidden test)"]
    assert clean["extra_data"]["review"] is False and "Flagged" not in clean["output"]


def test_results_json_says_a_practice_grade():
    why = "practice only: without bubblewrap's allow-list (or a container per submission)"
    res = results_json(GradeReport("s.ipynb", "01", "graded", why, 2, 7, _items(), mode="practice"))
    assert res["extra_data"]["mode"] == "practice" and res["extra_data"]["reason"] == why
    assert res["output"].splitlines() == [f"Lab 01: graded ({why})", "Score: 2/7",
                                          "Practice grade: the kernel was not isolated enough for a mark to upload."]


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
    base = "labs" if kind == "unsolved" else "solutions"
    nb = nbformat.read(ROOT / base / "02_placement_logging.ipynb", as_version=4)
    if kind != "unsolved":  # the hidden inline test's function too
        nb.cells.append(nbformat.v4.new_code_cell("def secret_sum(a, b, c):\n    return a + b + c"))
    if kind == "flagged":  # frame introspection, as a cheat needs: a flag for review, never a mark
        nb.cells.append(nbformat.v4.new_code_cell("import inspect\nHERE = inspect.currentframe()"))
    if kind == "unsolved":  # and a process in a new session that waits to rewrite results.json (issue 22)
        nb.cells.append(nbformat.v4.new_code_cell(LATE.format(results=str(folder.parent / "results"))))
    nbformat.write(nb, folder / "my_lab.ipynb")


def _grade(root: Path, kind: str, env: dict, command: list[str]) -> dict:
    """Grade one submission of ``kind`` in Gradescope's layout under ``root``; results.json."""
    _submission(kind, root / "submission")
    shutil.rmtree(root / "results", ignore_errors=True)
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["extra_data"]["status"] == "graded", (results["output"], proc.stderr[-5000:])
    return results


def _verify(root: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucourse.grading.grader.cli", "verify", str(root / "results")],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def layout(tmp_path_factory, bundle):
    """/autograder laid out in a temporary folder: the bundle in source/, and the environment to run it in."""
    tmp = tmp_path_factory.mktemp("gradescope")
    root = tmp / "autograder"
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    (root / "source" / "run_autograder").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUCOURSE_CONTAINER", "GPUCOURSE_SANDBOX")}
    env.update({"GPUCOURSE_AUTOGRADER_ROOT": str(root), "GPUCOURSE_PYTHON": sys.executable,
                "GPUCOURSE_GRADING_KEY": str(tmp / "grading.key")})
    return root, env


def test_run_autograder_in_gradescope_layout(layout):
    """Run the bundle's run_autograder for a solution, an untouched lab and a solution flagged for review."""
    root, env = layout
    script = ["bash", str(root / "source" / "run_autograder")]
    got = {}
    for kind in ("solution", "unsolved", "flagged"):
        got[kind] = _grade(root, kind, env, script)
        if kind == "unsolved":  # the learner's late process is dead before results.json is written
            time.sleep(2)
            assert json.loads((root / "results" / "results.json").read_text()) == got[kind]
            check = _verify(root, env)
            assert check.returncode == 0, check.stdout
    if os.geteuid() == 0 and not sandbox.probe("bubblewrap"):  # as on Gradescope: the kernel ran as another user
        assert got["solution"]["extra_data"]["isolation"].split(":")[0] in ("bubblewrap", "user"), got["solution"]
    sol, uns, fla = got["solution"], got["unsolved"], got["flagged"]
    public = [spec for spec, _ in items_in(lab02)]
    full = sum(s.points for s in public) + 5
    assert sol["score"] == full and all(t["status"] == "passed" for t in sol["tests"]), sol
    assert {t["name"].split(":")[0]: t["visibility"] for t in sol["tests"]} == {
        **{s.key: "visible" for s in public}, "h1": "after_published"}
    assert sol["extra_data"]["mode"] == "summative" and sol["extra_data"]["flags"] == [], sol["extra_data"]
    assert "tampering" not in sol["extra_data"] and sol["extra_data"]["status"] == "graded"
    assert uns["score"] == 0 and uns["extra_data"]["status"] == "graded" and uns["extra_data"]["mode"] == "summative"
    assert all(t["score"] == 0 for t in uns["tests"]), uns
    assert all("Not attempted" in t["output"] for t in uns["tests"] if t["name"].startswith("q")), uns
    assert "`secret_sum` is not defined" in uns["tests"][-2]["output"]
    assert uns["tests"][-1]["name"] == "Integrity" and "left 1 process(es) running" in uns["tests"][-1]["output"]
    # flagged for review, and it costs nothing: the marks rest on what the grader saw
    assert fla["score"] == full and fla["extra_data"]["review"] and fla["extra_data"]["mode"] == "summative", fla
    assert [t["score"] for t in fla["tests"][:-1]] == [t["score"] for t in sol["tests"]]
    integrity = fla["tests"][-1]
    assert integrity["name"] == "Integrity" and integrity["max_score"] == 0, fla["tests"]
    assert "frame introspection" in integrity["output"] and integrity["output"].startswith("flagged: "), integrity
    assert f"Flagged for review: {'; '.join(fla['extra_data']['flags'])}" in fla["output"]
    assert "withheld" not in json.dumps(fla).lower()


def test_run_autograder_says_its_a_container_per_submission(layout):
    """run_autograder sets GPUCOURSE_CONTAINER=per-submission: with a kernel that is not sandboxed at all
    (GPUCOURSE_SANDBOX=none) the mark is still summative, because Gradescope's container holds only this
    submission. The same grader run without that variable gives a practice grade, which verify names."""
    root, env = layout
    bare = {**env, "GPUCOURSE_SANDBOX": "none"}
    boxed = _grade(root, "solution", bare, ["bash", str(root / "source" / "run_autograder")])
    assert boxed["extra_data"]["isolation"].startswith("none:"), boxed["extra_data"]
    assert boxed["extra_data"]["mode"] == "summative" and boxed["extra_data"]["reason"] == "", boxed["extra_data"]
    assert "Practice grade" not in boxed["output"] and _verify(root, bare).returncode == 0
    direct = [sys.executable, "-m", "gpucourse.grading.grader.gradescope", "run", "--root", str(root)]
    practice = _grade(root, "solution", bare, direct)
    assert practice["score"] == boxed["score"] and practice["extra_data"]["mode"] == "practice", practice["extra_data"]
    assert practice["extra_data"]["reason"].startswith("practice only: without bubblewrap's allow-list")
    assert "Practice grade: the kernel was not isolated enough for a mark to upload." in practice["output"]
    check = _verify(root, bare)
    assert check.returncode == 1 and check.stdout.startswith(f"PRACTICE {root / 'results' / 'results.json'}: "), \
        check.stdout
