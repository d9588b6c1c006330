"""Attack notebooks: no attack gets a mark it did not earn (golden outcomes in attacks/).

An attack is ``attacks/<name>.py``: one extra code cell appended to a lab's notebook (``"lab"``; ``"base":
"lab"`` is the unsolved notebook the learner starts from, ``"solution"`` the solved one). Beside it,
``<name>.expected.json`` holds the golden outcome, strict::

    {"class": "stdlib replacement",              # the attack's class (see REQUIRED_CLASSES)
     "lab": "01", "base": "lab",
     "hidden": "hidden_inline.py",              # optional: an extra test file from attacks/
     "timeout": 30, "item_timeout": 10,         # optional: grade_notebook's limits (default 240 s, and its own)
     "status": "graded",                        # the report's status
     "score": 0,                                # the exact score
     "items": {"q1": "todo", "q2": "fail"},     # the status of EVERY item of the lab
     "attacked": ["q4"],                        # the items the attack is after: none may pass, unless the
                                                # report carries one of the "flags" below (flagged for review)
     "honest": ["q1"],                          # unsolved base only: the items its honest code solves; no
                                                # other item may pass unless flagged (default: none)
     "messages": {"q4": ["fragment"]},          # fragments of an item's message
     "flags": ["fragment"],                     # each found in one review flag (and in the feedback)
     "no_flags": ["fragment"],                  # found in no review flag
     "sandboxed": true,                         # the outcome rests on bubblewrap's allow-list: where grading is
                                                # only practice (no allow-list), the test is skipped
     "batch": {"wait_s": 4, "markers": ["..."], # graded by `gpucourse-grade <folder> --out out` in a subprocess:
               "absent": ["out/x.txt"],         # then, wait_s later, no process with a marker runs, the
               "out_in": "/var/tmp"}}           # gradebook is unchanged, `verify out` is clean and no absent
                                                # file exists (out_in: the output folder's parent, else the
                                                # test's tmp folder)

The rule every golden keeps (checked here for all of them, whatever the golden says): an attack gets no mark it
did not earn. The score is the sum of the passing items' points; an attacked item passes only when the report
carries one of the golden's flags (it is flagged for review); on an unsolved lab nothing beyond the attack's
honest part passes, unless so flagged. A summative report comes from bubblewrap's allow-list. Each attack runs
in its own kernel, once; the next attack is graded while a test checks its own (``graded``).
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
from gpucourse.grading.items import items_in, lab_test_path, load_test_file
from gpucourse.grading.grader.runner import grade_notebook

from tests.ahead import Ahead

ROOT = Path(__file__).resolve().parents[3]
ATTACKS = Path(__file__).resolve().parent / "attacks"
FILES = sorted(p for p in ATTACKS.glob("*.py") if p.with_suffix(".expected.json").is_file())
KEYS = {"class", "lab", "base", "hidden", "timeout", "item_timeout", "status", "score", "items", "attacked",
        "honest", "messages", "flags", "no_flags", "sandboxed", "batch"}
BATCH_KEYS = {"wait_s", "markers", "absent", "out_in"}

#: Every class of attack tried so far (issues 22 and 34). A class made moot by grading v2 keeps one notebook that
#: shows it gains nothing; a class whose check still depends on what the learner's code does keeps two.
REQUIRED_CLASSES = (
    # made moot by v2: the item is judged on what the observer saw
    "stdlib replacement", "class patching", "serialisation patched for one call", "forged grader messages",
    "reading a check's cases from the kernel's history", "closures (the check's own state)",
    "a fresh copy of a course module", "reading the tests by another path", "late action",
    # still meaningful
    "frame introspection", "helper import", "fixture special-casing", "objects the check passes in, mutated",
    "judged by the end state", "a fake object claiming", "false penalty", "a kernel that breaks its own messages",
    # issue 34, "How they did it", 1-8, and the two failures that must stay in their item
    "code inside the tripwire's hook", "the tripwire's hook at the deepest recursion depth",
    "a profiler installed by library code", "a signal handler rewrites a timing check's measurements",
    "an int subclass whose __int__ runs later", "a probe told apart by its position",
    "os.environ replaced by a proxy", "answers from helpers not on the list", "another checkout of the course",
    "a KeyboardInterrupt from a learner function", "a hang",
    # issue 35's reworked items
    "judged by the end state: the loss history kept in memory",
    "fabricated measurement: a timing from the roofline model", "fabricated measurement: allocator statistics patched",
    "the kernel's clock rewritten", "a stage's work learned and skipped",
)
#: Classes whose outcome still depends on the learner's code in the kernel: each has two attack notebooks.
TWO_EACH = ("objects the check passes in, mutated", "judged by the end state", "a fake object claiming")


def expected(path: Path) -> dict:
    return json.loads(path.with_suffix(".expected.json").read_text())


#: Every other attack runs here, the rest from test_attacks_flagged.py, so that pytest-xdist's
#: --dist loadfile spreads the kernels evenly over both workers.
FIRST_HALF = FILES[::2]
SECOND_HALF = FILES[1::2]
BASES = {"lab": "labs", "solution": "solutions"}


def base_notebook(want: dict) -> Path:
    """The notebook the attack cell is appended to: the lab's unsolved notebook or its solution."""
    return next((ROOT / BASES[want["base"]]).glob(f"{want['lab']}_*.ipynb"))


def test_every_attack_class_has_a_notebook():
    classes = [expected(p)["class"] for p in FILES]
    for needed in REQUIRED_CLASSES:
        count = sum(needed in c for c in classes)
        assert count >= 1, f"no attack notebook for the class {needed!r}"
        if needed in TWO_EACH:
            assert count >= 2, f"the class {needed!r} needs two attack notebooks, has {count}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_golden_is_complete_and_strict(path):
    """A golden names its lab and base, the status and score, every item's status, and nothing unknown."""
    want = expected(path)
    assert set(want) <= KEYS, f"unknown keys {set(want) - KEYS} (the format is in this module's docstring)"
    assert set(want.get("batch", {})) <= BATCH_KEYS, f"unknown batch keys {set(want['batch']) - BATCH_KEYS}"
    for key in ("class", "lab", "base", "status", "score", "items"):
        assert key in want, f"the golden has no {key!r}"
    assert want["base"] in BASES
    assert base_notebook(want).is_file()
    files = [lab_test_path(want["lab"])] + ([ATTACKS / want["hidden"]] if want.get("hidden") else [])
    keys = [spec.key for f in files for spec, _ in items_in(load_test_file(f))]
    assert sorted(want["items"]) == sorted(keys), "items must give the status of every item of the lab"
    for key in want.get("attacked", []) + want.get("honest", []) + list(want.get("messages", {})):
        assert key in want["items"], f"{key} is not an item of lab {want['lab']}"
    assert not (want.get("honest") and want["base"] == "solution"), "honest items are for an unsolved base"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Each attack graded once, the next one already being graded while a test checks its own (tests/ahead.py:
    many attacks are a kernel waiting for a time limit)."""
    ahead = Ahead(lambda path: grade_attack(path, tmp_path_factory.mktemp(path.stem)), "path")
    yield ahead
    ahead.close()


@pytest.mark.parametrize("path", FIRST_HALF, ids=lambda p: p.stem)
def test_attack_gets_its_golden_outcome(path, graded, request):
    check_outcome(path, graded.result(request))


def test_the_two_files_run_every_attack():
    assert sorted(FIRST_HALF + SECOND_HALF) == FILES


def grade_attack(path: Path, tmp_path: Path) -> GradeReport:
    """Grade the lab plus the attack cell (in ``tmp_path``), as the golden says."""
    want = expected(path)
    nb = nbformat.read(base_notebook(want), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(path.read_text()))
    sub = tmp_path / f"{want['lab']}_attack.ipynb"
    nbformat.write(nb, sub)
    extra = [ATTACKS / want["hidden"]] if want.get("hidden") else []
    limits = {"timeout": want.get("timeout", 240)}
    if "item_timeout" in want:
        limits["item_timeout"] = want["item_timeout"]
    if want.get("batch"):
        return grade_in_batch(sub, want, tmp_path)
    return grade_notebook(sub, extra_tests=extra, **limits)


def check_outcome(path: Path, rep: GradeReport) -> None:
    """Compare an attack's report with its golden outcome, and with the rule every golden keeps."""
    want = expected(path)
    text = rep.table() + f"\nisolation: {rep.isolation}\nmode: {rep.mode}"
    if want.get("sandboxed") and not rep.isolation.startswith("bubblewrap"):
        pytest.skip(f"the outcome rests on bubblewrap's allow-list; this machine grades without it ({rep.isolation})")
    assert rep.status == want["status"], text
    if rep.status == "graded" and rep.isolation.startswith("bubblewrap"):
        assert rep.mode == "summative", text
    rows = {r["key"]: r for r in rep.items}
    # The rule, whatever the golden says.
    assert rep.score == sum(r["points"] for r in rep.items if r["status"] == "pass"), text
    assert all(r["points"] in (0, r["max_points"]) and (r["points"] > 0) == (r["status"] == "pass")
               for r in rep.items), text
    flagged = [f for f in want.get("flags", []) if any(f in g for g in rep.flags)]
    for key in want.get("attacked", []):
        assert rows[key]["status"] != "pass" or flagged, f"{key} passed unflagged: the attack gained its marks\n{text}"
    if want["base"] == "lab":
        gained = [k for k, r in rows.items() if r["status"] == "pass" and k not in want.get("honest", [])]
        assert not gained or flagged, f"{gained} passed unflagged on an unsolved lab, beyond the attack's honest part\n{text}"
    # The golden.
    assert {k: r["status"] for k, r in rows.items()} == want["items"], text
    assert rep.score == want["score"], text
    for key, fragments in want.get("messages", {}).items():
        for fragment in fragments:
            assert fragment in rows[key]["message"], f"{key}'s message lacks {fragment!r}\n{text}"
    for fragment in want.get("flags", []):
        assert any(fragment in f for f in rep.flags), f"no flag with {fragment!r}:\n{text}"
        assert fragment in text and fragment in rep.integrity(), f"{fragment!r} missing from the feedback"
    for fragment in want.get("no_flags", []):
        assert not any(fragment in f for f in rep.flags), f"a flag with {fragment!r}:\n{text}"
    if want.get("flags"):
        assert rep.review and rep.integrity() != "ok", text


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
        cmd = [sys.executable, "-m", "gpucourse.grading.grader.cli", "subs", "--lab", want["lab"],
               "--out", str(out) if batch.get("out_in") else "out", "--jobs", "1",
               "--timeout", str(want.get("timeout", 240))]
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
    markers = batch.get("markers", [])
    if markers:
        import psutil

        alive = [p.pid for p in psutil.process_iter(["cmdline"]) if set(markers) & set(p.info["cmdline"] or [])]
        assert not alive, f"a process the submission started ({markers}) outlived the grader: {alive}"
    return GradeReport.from_dict(report)


# attacks/README.md lists every golden, so what a cheat gets is read from the goldens that `make test` holds (the
# instructors' guide has the short table by class, and points there).
GUIDE = ATTACKS / "README.md"
TABLE_START, TABLE_END = "<!-- attack-table: made by tests/grading/grader/test_attacks.py -->", "<!-- /attack-table -->"


def describe_outcome(want: dict) -> str:
    """One golden's outcome in words: the attacked items' statuses, else what the honest solution keeps."""
    if want.get("batch"):
        told = "nothing it started outlives the grader; the gradebook is unchanged and sealed"
    elif want.get("attacked"):
        told = ", ".join(f"{key} {want['items'][key]}" for key in want["attacked"])
    elif want["base"] == "solution":
        told = "every item passes" if set(want["items"].values()) == {"pass"} else "its items as the solution's"
    else:
        told = "nothing passes"
    if want["status"] != "graded":
        told += f"; status {want['status']}"
    if want.get("flags"):
        told += "; flagged for review"
    elif want.get("no_flags"):
        told += "; no flag"
    return told


def render_attack_table() -> str:
    """The markdown table of every attack notebook and its golden outcome, in the guide's order (by lab)."""
    rows = ["| attack | lab | on | outcome | score | notebook |", "|---|---|---|---|---|---|"]
    for path in sorted(FILES, key=lambda p: (expected(p)["lab"], expected(p)["class"])):
        want = expected(path)
        on = "the unsolved lab" if want["base"] == "lab" else "the solution"
        klass = want["class"].replace("|", "\\|")
        files = [lab_test_path(want["lab"])] + ([ATTACKS / want["hidden"]] if want.get("hidden") else [])
        full = sum(spec.points for f in files for spec, _ in items_in(load_test_file(f)))
        rows.append(f"| {klass} | {want['lab']} | {on} | {describe_outcome(want)} | {want['score']} of {full} | "
                    f"`{path.name}` |")
    return "\n".join([TABLE_START, *rows, TABLE_END])


def test_the_attacks_readme_shows_every_golden():
    text = GUIDE.read_text(encoding="utf-8")
    assert TABLE_START in text and TABLE_END in text, f"{GUIDE.name} lacks the attack table's markers"
    shown = text[text.index(TABLE_START):text.index(TABLE_END) + len(TABLE_END)]
    assert shown == render_attack_table(), (f"{GUIDE.name}'s attack table is not the goldens': "
                                            "run `python tests/grading/grader/test_attacks.py` to rewrite it")


if __name__ == "__main__":  # rewrite the README's table from the goldens
    text = GUIDE.read_text(encoding="utf-8")
    if TABLE_START in text:
        text = text[:text.index(TABLE_START)] + "ATTACK_TABLE" + text[text.index(TABLE_END) + len(TABLE_END):]
    GUIDE.write_text(text.replace("ATTACK_TABLE", render_attack_table(), 1), encoding="utf-8")
    print(f"{GUIDE}: {len(FILES)} attacks")
