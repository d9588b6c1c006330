"""Make the course grader a Gradescope autograder.

Two halves of that one job: :func:`build_bundle` packs the grader on the instructor's machine, and
:func:`run` is what the packed ``run_autograder`` calls inside Gradescope's container.

Gradescope runs each submission in its own container (see its "Autograder Specifications"): the
bundle's ``setup.sh`` runs once, as root, when the image is built; ``run_autograder`` runs per
submission, with the learner's files in ``/autograder/submission``, and must write
``/autograder/results/results.json``.

:func:`build_bundle` (``gpucourse-grade gradescope --lab NN``) writes a zip with, at its root:

* ``setup.sh``: creates ``/autograder/venv`` and installs ``requirements.txt`` (CPU TensorFlow and
  the course's other dependencies, pinned like ``pyproject.toml``) and the course package itself;
* ``run_autograder``: runs ``python -m gpucourse.grading.grader.gradescope run`` with
  ``GPUCOURSE_CONTAINER=per-submission``: Gradescope's container holds this submission only, so with the
  seccomp filter on the mark is *summative* even where bubblewrap cannot run (:func:`.runner.summative`);
  the same ``run`` without that variable grades a weakly isolated kernel as *practice*;
* ``requirements.txt``, ``config.json`` (lab, time limit, visibility of hidden tests);
* ``course/``: the whole course package (public tests included; its packages listed in the course's
  ``pyproject.toml``, or read from the folders when the course was installed from a wheel) and the lab's
  notebook (for the scan);
* ``tests/``: the hidden test files given with ``--extra-tests``.

:func:`run` grades the one notebook in ``<root>/submission`` with the same grader as the command
line and writes ``<root>/results/results.json`` in Gradescope's format: ``score``, ``output``
(status, reason, integrity), ``execution_time``, ``tests`` (one per item: ``name``, ``score``,
``max_score``, ``status``, ``output``, ``visibility``, ``tags``), an ``Integrity`` test when the
submission was flagged, and ``extra_data`` (status, mode, flags).
``<root>`` is ``/autograder`` unless ``GPUCOURSE_AUTOGRADER_ROOT`` says otherwise (tests lay out a
temporary folder that way).

Student code never runs as root (Gradescope's own advice for autograders): ``run_autograder``
runs as root, but the grader starts the learner's kernel as a dedicated unprivileged uid in
bubblewrap's namespaces (:mod:`.sandbox`; ``setup.sh`` installs ``bubblewrap``; where the container
forbids namespaces, the dedicated uid alone). The hidden tests are made readable by root only and
hidden from the kernel, ``results/`` is root's, every process of the kernel is killed before the
grader, still root, writes ``results.json`` last (then ``MANIFEST.json`` with its digest), and
``extra_data.isolation`` says how the kernel was isolated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
import zipfile
from pathlib import Path

__all__ = ["VISIBILITIES", "build_bundle", "results_json", "run"]

VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parents[1]  # the course package (utils/, imported as gpucourse): grading/grader/ is two below it
ROOT_ENV = "GPUCOURSE_AUTOGRADER_ROOT"

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder image (Ubuntu).
set -euo pipefail
cd /autograder/source
if ! python3 -m venv --help >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip
fi
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --quiet --upgrade pip
/autograder/venv/bin/pip install --quiet -r requirements.txt
/autograder/venv/bin/pip install --quiet --no-deps ./course
# The learner's kernel runs as an unprivileged user inside bubblewrap (setpriv comes with util-linux).
if ! command -v bwrap >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap || \
        echo "bubblewrap could not be installed: kernels will run as a dedicated user without namespaces"
fi
# Hidden tests: root's only (the kernel's user cannot read them even where namespaces are forbidden).
chmod -R go-rwx /autograder/source/tests 2>/dev/null || true
# Fail the image build now (not at the first submission) if TensorFlow cannot load.
/autograder/venv/bin/python -c "import tensorflow, gpucourse.grading.grader.runner"
# Say now which isolation the kernels will get in this image.
/autograder/venv/bin/python -c "from gpucourse.grading.grader import sandbox; print('kernel isolation:', \
    [lvl for lvl in ('bubblewrap', 'user') if not sandbox.probe(lvl)][:1] or ['none'])"
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission (working directory /autograder).
set -uo pipefail
ROOT="${GPUCOURSE_AUTOGRADER_ROOT:-/autograder}"
PYTHON="${GPUCOURSE_PYTHON:-/autograder/venv/bin/python}"
export TF_CPP_MIN_LOG_LEVEL=2 TF_ENABLE_ONEDNN_OPTS=1 GPUCOURSE_LABS_DIR="$ROOT/source/course/labs"
GPUCOURSE_CONTAINER=per-submission exec "$PYTHON" -m gpucourse.grading.grader.gradescope run --root "$ROOT"
"""


def _project_root() -> Path | None:
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() else None


def requirements() -> list[str]:
    """The course's runtime requirements with CPU TensorFlow, as pinned in ``pyproject.toml``."""
    root = _project_root()
    if root is not None:
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        return list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("cpu", []))
    from importlib.metadata import requires

    out = []
    for req in requires("gpucourse") or []:
        name, _, marker = req.partition(";")
        if "extra" not in marker or '"cpu"' in marker or "'cpu'" in marker:
            out.append(name.strip() + (f"; {marker.strip()}" if marker.strip() and "extra" not in marker else ""))
    return out


def _add_tree(zf: zipfile.ZipFile, folder: Path, arcname: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc",):
            zf.write(path, f"{arcname}/{path.relative_to(folder).as_posix()}")


def _script(zf: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16  # executable, as Gradescope requires for run_autograder
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, text)


def build_bundle(lab: str, extra_tests=(), out: Path | str = "autograder.zip", timeout: float = 300,
                 hidden_visibility: str = "after_due_date") -> Path:
    """Write the Gradescope bundle for ``lab`` to ``out`` and return its path."""
    from ..items import lab_test_path

    lab = str(lab).zfill(2)
    lab_test_path(lab)  # a clear error for a lab without tests
    if hidden_visibility not in VISIBILITIES:
        raise ValueError(f"hidden_visibility must be one of {', '.join(VISIBILITIES)}, got {hidden_visibility!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    extra = [Path(p) for p in extra_tests]
    for p in extra:
        if not p.is_file():
            raise FileNotFoundError(f"extra test file not found: {p}")
    names = [p.name for p in extra]
    if len(set(names)) != len(names):
        raise ValueError(f"hidden test files need distinct names, got {names}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {"lab": lab, "timeout": timeout, "hidden": [f"tests/{n}" for n in names],
              "hidden_visibility": hidden_visibility}
    root = _project_root()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        _script(zf, "setup.sh", SETUP_SH)
        _script(zf, "run_autograder", RUN_AUTOGRADER)
        zf.writestr("requirements.txt", "\n".join(requirements()) + "\n")
        zf.writestr("config.json", json.dumps(config, indent=2) + "\n")
        _add_tree(zf, PACKAGE, "course/utils")
        if root is not None:
            zf.write(root / "pyproject.toml", "course/pyproject.toml")
            zf.write(root / "README.md", "course/README.md")
            for nb in sorted((root / "labs").glob(f"{lab}_*.ipynb")):
                zf.write(nb, f"course/labs/{nb.name}")
        else:  # installed from a wheel: a minimal project that installs the same package
            zf.writestr("course/pyproject.toml", _minimal_pyproject())
            zf.writestr("course/README.md", "gpucourse (autograder copy)\n")
        for p in extra:
            zf.write(p, f"tests/{p.name}")
    return out


def _packages() -> list[str]:
    """Every package of the course (a folder of :data:`PACKAGE` with an ``__init__.py``), read from the folders."""
    return sorted(".".join(("gpucourse",) + p.parent.relative_to(PACKAGE).parts)
                  for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts)


def _minimal_pyproject() -> str:
    """A project that installs the course package as the course's own ``pyproject.toml`` does."""
    packages = ", ".join(f'"{name}"' for name in _packages())
    return f"""\
[build-system]
requires = ["setuptools>=77", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "gpucourse"
version = "0.1.0"
readme = "README.md"
requires-python = ">=3.10"

[tool.setuptools]
package-dir = {{ "gpucourse" = "utils" }}
packages = [{packages}]

[tool.setuptools.package-data]
gpucourse = ["py.typed"]
"gpucourse.grading" = ["locale/*.po"]
"""


# --------------------------------------------------------------------------- inside Gradescope


def _status(row: dict) -> str:
    return "passed" if row["status"] == "pass" else "failed"


def results_json(report, hidden_visibility: str = "after_due_date") -> dict:
    """Gradescope's results.json for a :class:`~gpucourse.grading.grader.report.GradeReport`."""
    tests = []
    for r in report.items:
        hidden = r.get("source", "public") != "public"
        tests.append({
            "name": f"{r['key']}: {r['title']}" + (" (hidden test)" if hidden else ""),
            "score": r["points"], "max_score": r["max_points"], "status": _status(r),
            "output": r.get("message") or ("Passed." if r["status"] == "pass" else ""),
            "visibility": hidden_visibility if hidden else "visible",
            "tags": [r.get("source", "public"), r.get("trust", "split")],
        })
    lines = [f"Lab {report.lab}: {report.status}" + (f" ({report.reason})" if report.reason else ""),
             f"Score: {report.score}/{report.max_score}"]
    if report.mode == "practice":
        lines.append("Practice grade: the kernel was not isolated enough for a mark to upload.")
    if report.flags:
        lines.append("Flagged for review: " + "; ".join(report.flags))
    for e in report.cell_errors:
        lines.append(f"cell {e['cell']} raised {e['ename']}: {e['evalue']}")
    if report.flags:
        tests.append({"name": "Integrity", "score": 0, "max_score": 0, "status": "failed",
                      "output": report.integrity(), "visibility": "visible", "tags": ["integrity"]})
    return {"score": report.score, "execution_time": int(round(report.duration_s)), "output": "\n".join(lines),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"status": report.status, "reason": report.reason, "flags": report.flags,
                           "mode": report.mode, "review": report.review,
                           "isolation": getattr(report, "isolation", "")}}


def _pick(submission: Path, lab: str) -> tuple[Path | None, str]:
    from .runner import lab_of

    nbs = sorted(p for p in submission.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not nbs:
        return None, "No notebook (.ipynb) was submitted: upload your lab notebook."
    if len(nbs) > 1:
        import nbformat

        def is_lab(p):
            try:
                return lab_of(nbformat.read(p, as_version=4), p) == lab
            except Exception:
                return False
        nbs = [p for p in nbs if is_lab(p)] or nbs
        if len(nbs) > 1:
            return nbs[0], f"Several notebooks were submitted; graded {nbs[0].name}."
    return nbs[0], ""


def run(root: Path) -> dict:
    """Grade ``root/submission`` and write ``root/results/results.json``; return what was written."""
    from .report import GradeReport
    from .runner import grade_notebook

    from .manifest import seal

    source = root / "source"
    config = json.loads((source / "config.json").read_text())
    lab, vis = config["lab"], config.get("hidden_visibility", "after_due_date")
    out = root / "results"
    out.mkdir(parents=True, exist_ok=True)
    hidden = [source / h for h in config.get("hidden", [])]
    if os.geteuid() == 0:  # what the kernel's user must neither read nor write: root's alone
        for p in [out, *{h.parent for h in hidden if h.parent.is_dir()}]:
            os.chown(p, 0, 0)
            os.chmod(p, 0o700 if p != out else 0o755)
    nb, note = _pick(root / "submission", lab)
    if nb is None:
        report = GradeReport("", lab, "empty", note)
    else:
        try:
            report = grade_notebook(nb, lab=lab, extra_tests=hidden, timeout=config.get("timeout", 300),
                                    conceal=[str(out)])
        except Exception as exc:  # never leave Gradescope without a results.json
            import traceback

            traceback.print_exc()  # for the instructor (Gradescope shows the autograder's output to staff only)
            report = GradeReport(str(nb), lab, "error", f"the grader failed: {type(exc).__name__}: {exc}")
    results = results_json(report, vis)
    if note and nb is not None:
        results["output"] = note + "\n" + results["output"]
    # Every process of the kernel is dead (grade_notebook ends with a sweep): write last, then seal.
    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, out / "results.json")
    seal(out, [out / "results.json"])
    print(report.table())  # Gradescope shows stdout to instructors only
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucourse.grading.grader.gradescope")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="grade the submission in Gradescope's layout")
    r.add_argument("--root", type=Path, default=Path(os.environ.get(ROOT_ENV, "/autograder")))
    a = ap.parse_args(argv)
    run(a.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
