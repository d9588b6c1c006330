"""Attack notebooks: every attack class is withheld or flagged, with its reason (golden files in attacks/).

An attack is ``attacks/<name>.py``: one extra code cell appended to a lab's notebook (``"lab"``,
default ``"01"``; ``"base": "lab"`` is the unsolved notebook the learner starts from, ``"solution"``
the solved one). Beside it, ``<name>.expected.json`` holds the golden outcome::

    {"class": "stdlib replacement", "lab": "01", "base": "lab", "status": "tampered", "score": 0,
     "hidden": "hidden_inline.py",            # optional: an extra test file from attacks/
     "tampering": ["json.dumps was replaced"], # fragments, each found in one tampering reason
     "tampering_any": ["...", "..."],          # at least one of these (the run stops at the first sign)
     "flags": ["..."],                         # fragments, each found in one review flag
     "no_flags": ["..."],                      # fragments found in no review flag (correct answers)
     "unsandboxed": {...},                     # replaces keys above when the kernel ran without bubblewrap
     "withheld": ["q4"],                       # items whose marks are withheld
     "items": {"q1": "fail"},                  # item statuses
     "messages": {"q4": ["fragment"]},         # fragments of an item's message
     "batch": {"wait_s": 4, "marker": "...",   # graded by `gpucourse-grade <folder> --out out` in a
               "absent": ["out/x.txt"],        # subprocess: then, wait_s later, no process with the marker
               "out_in": "/var/tmp"}}          # runs, `verify out` is clean and no absent file exists
                                               # (out_in: the output folder's parent, else the test's tmp
                                               # folder, which the sandbox's own empty /tmp hides anyway)

Every reason must also reach the learner's feedback (the report's table) and the gradebook's
integrity column. Each attack runs in its own kernel, once.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from gpucourse.grading.grader.report import GradeReport
from gpucourse.grading.grader.runner import grade_notebook
from gpucourse.grading.grader.manifest import verify

ROOT = Path(__file__).resolve().parents[3]
ATTACKS = Path(__file__).resolve().parent / "attacks"
FILES = sorted(p for p in ATTACKS.glob("*.py") if p.with_suffix(".expected.json").is_file())


def expected(path: Path) -> dict:
    return json.loads(path.with_suffix(".expected.json").read_text())


#: Every other attack runs here, the rest from test_attacks_flagged.py, so that pytest-xdist's
#: --dist loadfile spreads the kernels evenly over both workers.
WITHHELD = FILES[::2]
FLAGGED = FILES[1::2]
BASES = {"lab": "labs", "solution": "solutions"}


def base_notebook(want: dict) -> Path:
    """The notebook the attack cell is appended to: the lab's unsolved notebook or its solution."""
    return next((ROOT / BASES[want.get("base", "lab")]).glob(f"{want.get('lab', '01')}_*.ipynb"))


def test_every_attack_class_has_a_golden_file():
    classes = {expected(p)["class"] for p in FILES}
    for needed in ("stdlib replacement", "frame introspection", "class patching", "helper import",
                   "fixture special-casing", "late action",
                   # issue 22 §2: each class has the issue's attack and at least one more
                   "serialisation patched for one call", "objects the check passes in, mutated",
                   "a fresh copy of a course module", "reading the tests by another path",
                   "closures (the check's own state)", "judged by the end state", "a fake object claiming"):
        assert any(needed in c for c in classes), f"no attack notebook for the class {needed!r}"
        if needed in ISSUE_22:
            count = sum(needed in expected(p)["class"] for p in FILES)
            assert count >= 2, f"the class {needed!r} needs the issue's attack and one more, has {count}"


#: Attack classes of issue 22 §2: each has at least two attack notebooks.
ISSUE_22 = ("serialisation patched for one call", "objects the check passes in, mutated",
            "a fresh copy of a course module", "reading the tests by another path",
            "closures (the check's own state)", "judged by the end state", "a fake object claiming")


@pytest.mark.parametrize("path", WITHHELD, ids=lambda p: p.stem)
def test_attack_gets_its_golden_outcome(path, tmp_path):
    check_attack(path, tmp_path)


def test_the_two_files_run_every_attack():
    assert sorted(WITHHELD + FLAGGED) == FILES


def check_attack(path: Path, tmp_path: Path) -> None:
    """Grade the lab plus the attack cell and compare with the golden outcome."""
    want = expected(path)
    nb = nbformat.read(base_notebook(want), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(path.read_text()))
    sub = tmp_path / f"{want.get('lab', '01')}_attack.ipynb"
    nbformat.write(nb, sub)
    extra = [ATTACKS / want["hidden"]] if want.get("hidden") else []
    if want.get("batch"):
        rep = grade_in_batch(sub, want, tmp_path)
    else:
        rep = grade_notebook(sub, extra_tests=extra, timeout=240)
    text = rep.table() + f"\nisolation: {rep.isolation}"
    if not rep.isolation.startswith("bubblewrap") and want.get("unsandboxed"):
        want = {**want, **want["unsandboxed"]}  # e.g. the tests on disk are readable: the guard's verdict counts
    assert rep.status == want["status"], text
    if "score" in want:
        assert rep.score == want["score"], text
    for fragment in want.get("tampering", []):
        assert any(fragment in t for t in rep.tampering), f"no tampering reason with {fragment!r}:\n{text}"
    if want.get("tampering_any"):
        assert any(f in t for f in want["tampering_any"] for t in rep.tampering), text
    for fragment in want.get("flags", []):
        assert any(fragment in f for f in rep.flags), f"no flag with {fragment!r}:\n{text}"
    for fragment in want.get("no_flags", []):
        assert not any(fragment in f for f in rep.flags), f"a flag with {fragment!r}:\n{text}"
    rows = {r["key"]: r for r in rep.items}
    for key in want.get("withheld", []):
        assert rows[key]["status"] == "withheld" and rows[key]["points"] == 0, text
    for key, status in want.get("items", {}).items():
        assert rows[key]["status"] == status, text
    for key, fragments in want.get("messages", {}).items():
        for fragment in fragments:
            assert fragment in rows[key]["message"], text
    if rep.status == "tampered":
        assert all(r["points"] == 0 for r in rep.items), text
    if want.get("tampering") or want.get("flags") or want.get("withheld"):
        assert rep.integrity() != "ok" and rep.review or want.get("withheld"), text
    for fragment in want.get("tampering", []) + want.get("flags", []):
        assert fragment in text and fragment in rep.integrity(), f"{fragment!r} missing from the feedback"


def grade_in_batch(sub: Path, want: dict, tmp_path: Path) -> GradeReport:
    """Grade ``sub`` as learner ``mallory`` with the command line, as an instructor would, and check that
    nothing the submission started changes the results afterwards."""
    batch = want["batch"]
    (tmp_path / "subs").mkdir()
    sub.rename(tmp_path / "subs" / "mallory.ipynb")
    env = {**os.environ, "GPUCOURSE_GRADING_KEY": str(tmp_path / "grading.key")}
    out = tmp_path / "out"
    if batch.get("out_in"):  # a folder anyone may enter, as an instructor's output folder may be
        out = Path(tempfile.mkdtemp(dir=batch["out_in"])) / "out"
        out.parent.chmod(0o755)
    try:
        cmd = [sys.executable, "-m", "gpucourse.grading.grader.cli", "subs", "--lab", want.get("lab", "01"),
               "--out", str(out) if batch.get("out_in") else "out", "--jobs", "1", "--timeout", "240"]
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        book = (out / "gradebook.json").read_text()
        time.sleep(batch.get("wait_s", 4))  # what a surviving process would have used to rewrite the results
        assert (out / "gradebook.json").read_text() == book, "the gradebook changed after grading"
        check = subprocess.run([sys.executable, "-m", "gpucourse.grading.grader.cli", "verify", str(out)], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0 and "ok " in check.stdout, check.stdout + check.stderr
        for name in batch.get("absent", []):
            assert not (tmp_path / name).exists() and not (out / name).exists(), f"the submission wrote {name}"
        report = json.loads((out / "reports" / "mallory.json").read_text())
    finally:
        if batch.get("out_in"):
            shutil.rmtree(out.parent, ignore_errors=True)
    marker = batch.get("marker")
    if marker:
        import psutil

        alive = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
        assert not alive, f"a process the submission started ({marker}) outlived the grader: {alive}"
    return GradeReport.from_dict(report)
