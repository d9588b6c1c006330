"""Command-line grader: one notebook, a folder of submissions, a Gradescope bundle, an LMS gradebook.

    gpucourse-grade labs/01_device_detection.ipynb
    gpucourse-grade submissions/ --lab 01 --extra-tests hidden_lab01.py --jobs 2 --out gradebook-lab01/
    gpucourse-grade gradescope --lab 01 --extra-tests hidden_lab01.py --out lab01-autograder.zip
    gpucourse-grade lms gradebook-lab01/ gradebook-lab02/ --roster canvas-export.csv --out canvas.csv
    gpucourse-grade verify gradebook-lab01/

A folder holds either ``<learner>.ipynb`` files or ``<learner>/`` sub-folders with the notebook
inside. For a folder the grader writes ``gradebook.csv``, ``gradebook.json``, ``canvas.csv``,
``feedback/<learner>.txt``, ``reports/<learner>.json`` and ``similarity.csv``/``.html`` (similar
submissions, flags for a human: :mod:`.similarity`) into ``--out``, then, last,
``MANIFEST.json`` with their digests (``verify`` names any file changed since). Running it again
overwrites the same files with the same results. A crashing, hanging, malformed or empty submission
is recorded with its reason and never stops the batch.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from .gradebook import canvas_csv, read_gradebook, write_canvas, write_gradebook
from .report import GradeReport, is_practice
from ..items import ITEM_TIMEOUT_S
from .runner import DEFAULT_TIMEOUT_S, grade_notebook, lab_of
from .manifest import MANIFEST, practice_marks, seal, verify
from .similarity import DEFAULT_THRESHOLD, write_similarity

__all__ = ["discover", "grade_batch", "main"]


def discover(folder: Path, lab: str | None = None) -> list[tuple[str, Path | None, str]]:
    """Find submissions in ``folder``: ``(learner, notebook or None, problem)``, sorted by learner."""
    import nbformat

    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            found.append((entry.stem, entry, ""))
        elif entry.is_dir():
            nbs = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            if len(nbs) > 1 and lab:
                def matches(p):
                    try:
                        return lab_of(nbformat.read(p, as_version=4), p) == lab
                    except Exception:
                        return lab_of(None, p) == lab
                nbs = [p for p in nbs if matches(p)] or nbs
            if not nbs:
                found.append((entry.name, None, "no notebook submitted"))
            elif len(nbs) > 1:
                found.append((entry.name, None, "several notebooks: " + ", ".join(p.name for p in nbs)))
            else:
                found.append((entry.name, nbs[0], ""))
    return found


def _grade_one(args) -> dict:
    learner, nb, problem, lab, extra, timeout, item_timeout, conceal = args
    if nb is None:
        return GradeReport(submission="", lab=lab, status="empty", reason=problem, learner=learner).to_dict()
    try:
        return grade_notebook(nb, lab=lab, extra_tests=extra, timeout=timeout, learner=learner,
                              conceal=conceal, item_timeout=item_timeout).to_dict()
    except Exception as exc:  # never lose the batch to one submission
        return GradeReport(str(nb), lab, "error", f"grader failed: {type(exc).__name__}: {exc}",
                           learner=learner).to_dict()


def grade_batch(folder: Path, out: Path, lab: str | None = None, extra=(), timeout: float = DEFAULT_TIMEOUT_S,
                jobs: int = 2, echo=print, column: str | None = None,
                similarity_threshold: float = DEFAULT_THRESHOLD, item_timeout: float = ITEM_TIMEOUT_S) -> list[dict]:
    """Grade every submission in ``folder`` in parallel; write the gradebook and feedback into ``out``.

    Workers are reused across submissions, so each imports the tests (and TensorFlow, when a judge
    needs it) once. A worker that dies takes only its submission: the rest are graded again in a
    fresh pool, and a submission that kills two workers is recorded as an error.
    """
    subs = discover(folder, lab)
    if not subs:
        raise SystemExit(f"no submissions found in {folder}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)  # so that the kernels' sandbox can hide it
    conceal = [str(out.resolve())]
    work = {learner: (learner, nb, problem, lab, [str(p) for p in extra], timeout, item_timeout, conceal)
            for learner, nb, problem in subs}
    results: dict[str, dict] = {}
    for attempt in (1, 2):
        todo = [w for learner, w in work.items() if learner not in results]
        if not todo:
            break
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
            futures = {pool.submit(_grade_one, w): w[0] for w in todo}
            for fut in as_completed(futures):
                learner = futures[fut]
                try:
                    results[learner] = fut.result()
                except BrokenProcessPool:
                    if attempt == 2:
                        results[learner] = GradeReport(str(work[learner][1] or ""), lab, "error",
                                                       "the grading process died twice on this submission",
                                                       learner=learner).to_dict()
                    continue
                except Exception as exc:
                    results[learner] = GradeReport("", lab, "error", f"grader process failed: {exc}",
                                                   learner=learner).to_dict()
                r = results[learner]
                echo(f"{learner:<24} {r['status']:<9} {r['score']}/{r['max_score']}  {r['reason']}")
    rows = [results[learner] for learner, _, _ in subs]
    # Every kernel and every process it started is dead by now (each run ends with a sweep): write, then seal.
    write_similarity([(learner, nb) for learner, nb, _ in subs], out, lab, similarity_threshold, echo)  # no score
    write_gradebook(rows, out, column)
    weak = sorted({r.get("isolation", "") for r in rows if r.get("isolation", "").split(":")[0] in ("none", "user")})
    for line in weak:
        echo(f"warning: kernels ran with weak isolation ({line}); see the gradebook's isolation column")
    return rows


def _grade_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="gpucourse-grade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path, help="a submitted .ipynb, or a folder of submissions")
    ap.add_argument("--lab", help="lab number, e.g. 01 (default: from the notebook's metadata or name)")
    ap.add_argument("--extra-tests", nargs="*", type=Path, default=[], metavar="FILE",
                    help="extra (hidden) test files written like gpucourse/labtests/labNN.py")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"seconds for the submission's cells (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--item-timeout", type=float, default=ITEM_TIMEOUT_S,
                    help=f"seconds for each item's checks (default {ITEM_TIMEOUT_S:g})")
    ap.add_argument("--out", type=Path, default=Path("grading-output"), help="folder for JSON/CSV results")
    ap.add_argument("--json", type=Path, help="for one notebook: where to write its JSON report")
    ap.add_argument("--jobs", type=int, default=2, help="submissions graded in parallel (folder mode)")
    ap.add_argument("--canvas-column", help="name of this lab's Canvas column in canvas.csv, e.g. 'Lab 01 (4321)'")
    ap.add_argument("--similarity-threshold", type=float, default=DEFAULT_THRESHOLD, metavar="SHARE",
                    help=f"folder mode: list pairs sharing more than this share of their code in similarity.csv "
                         f"(0 to 1, default {DEFAULT_THRESHOLD})")
    a = ap.parse_args(argv)
    lab = _lab_arg(ap, a.lab)
    _check_extra_tests(ap, lab, a.extra_tests)
    if a.timeout <= 0 or a.item_timeout <= 0 or a.jobs < 1:
        ap.error(f"--timeout and --item-timeout must be > 0 and --jobs >= 1, got {a.timeout:g}, {a.item_timeout:g} "
                 f"and {a.jobs}")
    if not 0 <= a.similarity_threshold <= 1:
        ap.error(f"--similarity-threshold is a share of a submission's code, 0 to 1, got {a.similarity_threshold}")
    if not a.path.exists():
        ap.error(f"no such file or folder: {a.path}")
    if a.path.is_dir():
        rows = grade_batch(a.path, a.out, lab, a.extra_tests, a.timeout, a.jobs, column=a.canvas_column,
                           similarity_threshold=a.similarity_threshold, item_timeout=a.item_timeout)
        print(f"\n{len(rows)} submission(s) graded; gradebook in {a.out}/gradebook.csv")
        return 0
    dest = a.json or a.out / f"{a.path.stem}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    rep = grade_notebook(a.path, lab=lab, extra_tests=a.extra_tests, timeout=a.timeout,
                         conceal=[str(dest.parent.resolve())], item_timeout=a.item_timeout)
    print(rep.table())
    print(f"isolation: {rep.isolation}")
    dest.write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    seal(dest.parent, [dest])
    print(f"report written to {dest} (sealed in {dest.parent / MANIFEST})")
    return 0


def _check_extra_tests(ap, lab: str | None, paths) -> None:
    """Stop before grading anything when a hidden test file is missing, does not load, or lists a helper
    that does not exist (every submission would otherwise fail, or the rule protect nothing)."""
    from ..items import load_test_file
    from .flags import lab_rules

    for p in paths:
        if not p.is_file():
            ap.error(f"extra test file not found: {p}")
        try:
            lab_rules(lab, [load_test_file(p)])
        except ValueError as exc:
            ap.error(str(exc))
        except Exception as exc:  # the file itself is broken: the same message every submission would get
            ap.error(f"extra test file {p} does not load: {type(exc).__name__}: {exc}")


def _lab_arg(ap, lab: str | None) -> str | None:
    if lab is not None and not (lab.isdigit() and len(lab) <= 2):
        ap.error(f"--lab takes a lab number like 01, got {lab!r}")
    return lab.zfill(2) if lab else None


def _gradescope_main(argv) -> int:
    from .gradescope import VISIBILITIES, build_bundle

    ap = argparse.ArgumentParser(prog="gpucourse-grade gradescope",
                                 description="Build a Gradescope autograder bundle (.zip) for one lab.")
    ap.add_argument("--lab", required=True, help="lab number, e.g. 01")
    ap.add_argument("--extra-tests", nargs="*", type=Path, default=[], metavar="FILE", help="hidden test files")
    ap.add_argument("--out", type=Path, help="the .zip to write (default: labNN-autograder.zip)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per notebook")
    ap.add_argument("--hidden-visibility", default="after_due_date", choices=VISIBILITIES,
                    help="when learners see the hidden tests' results (default after_due_date)")
    a = ap.parse_args(argv)
    lab = _lab_arg(ap, a.lab)
    _check_extra_tests(ap, lab, a.extra_tests)
    out = build_bundle(lab, a.extra_tests, a.out or Path(f"lab{lab}-autograder.zip"), a.timeout, a.hidden_visibility)
    print(f"Gradescope bundle written to {out}: upload it as the autograder of a 'Programming Assignment'.")
    return 0


def _lms_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="gpucourse-grade lms",
                                 description="Combine per-lab gradebooks into one Canvas gradebook import CSV.")
    ap.add_argument("gradebooks", nargs="+", type=Path, help="folders written by gpucourse-grade <folder> --out")
    ap.add_argument("--out", type=Path, default=Path("canvas.csv"), help="the CSV to write (default canvas.csv)")
    ap.add_argument("--roster", type=Path, help="a Canvas gradebook export (fills Student, ID, SIS ids, Section)")
    ap.add_argument("--column", action="append", default=[], metavar="NN=NAME",
                    help="Canvas column of a lab, e.g. 01='Lab 01 (4321)' (repeat per lab)")
    a = ap.parse_args(argv)
    columns = {}
    for spec in a.column:
        lab, sep, name = spec.partition("=")
        if not sep or not lab.strip().isdigit() or not name.strip():
            ap.error(f"--column takes NN=NAME, e.g. 01='Lab 01 (4321)', got {spec!r}")
        columns[lab.strip().zfill(2)] = name.strip()
    try:
        books = [read_gradebook(g) for g in a.gradebooks]
        table = canvas_csv(books, a.roster, columns)
    except (FileNotFoundError, ValueError) as exc:
        ap.error(str(exc))
    write_canvas(table, a.out)
    print(f"{len(table) - 2} learner(s), {len(table[0]) - 5} lab column(s) written to {a.out}")
    practice = [f"{r.get('learner')} (lab {r.get('lab')})" for rows in books for r in rows if is_practice(r)]
    if practice:
        print(f"warning: {len(practice)} practice grade(s) left empty, not marks to upload (grade them again with "
              f"bubblewrap or in a container per submission): " + ", ".join(practice[:10])
              + (" ..." if len(practice) > 10 else ""))
    return 0


def _verify_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="gpucourse-grade verify",
                                 description="Check that a results folder is exactly what the grader wrote and "
                                             "sealed, and that none of its grades is practice only.")
    ap.add_argument("folders", nargs="+", type=Path, help="folders written by gpucourse-grade (MANIFEST.json inside)")
    a = ap.parse_args(argv)
    bad = 0
    for folder in a.folders:
        problems = verify(folder)
        practice = set(practice_marks(folder))
        bad += bool(problems)
        for line in problems:
            print(f"{'PRACTICE' if line in practice else 'CHANGED'} {line}")
        if not problems:
            print(f"ok {folder}: every result file is as the grader sealed it, and no grade in it is practice only")
    return 1 if bad else 0


def main(argv=None) -> int:
    """Entry point of ``gpucourse-grade`` / ``python -m gpucourse.grading.grader.cli``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"gradescope": _gradescope_main, "lms": _lms_main, "verify": _verify_main}
    if argv and argv[0] in commands and not Path(argv[0]).exists():
        return commands[argv[0]](argv[1:])
    return _grade_main(argv)


if __name__ == "__main__":
    sys.exit(main())
