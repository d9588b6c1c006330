"""Command-line grader: one notebook, or a folder with one submission per learner.

    gpucourse-grade labs/01_device_detection.ipynb
    gpucourse-grade submissions/ --lab 01 --extra-tests hidden_lab01.py --jobs 2 --out gradebook/

A folder holds either ``<learner>.ipynb`` files or ``<learner>/`` sub-folders
with the notebook inside. For a folder the grader writes ``gradebook.csv``,
``gradebook.json``, ``feedback/<learner>.txt`` and ``reports/<learner>.json``
into ``--out``. Running it again overwrites the same files with the same
results (it is idempotent). A crashing, hanging, malformed or empty submission
is recorded with its reason and never stops the batch.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .runner import DEFAULT_TIMEOUT_S, GradeReport, grade_notebook, lab_of

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
    learner, nb, problem, lab, extra, timeout = args
    if nb is None:
        rep = GradeReport(submission="", lab=lab, status="empty", reason=problem, learner=learner)
        return rep.to_dict()
    try:
        return grade_notebook(nb, lab=lab, extra_tests=extra, timeout=timeout, learner=learner).to_dict()
    except Exception as exc:  # never lose the batch to one submission
        return GradeReport(str(nb), lab, "error", f"grader failed: {type(exc).__name__}: {exc}",
                           learner=learner).to_dict()


def _report(d: dict) -> GradeReport:
    return GradeReport(**d)


def grade_batch(folder: Path, out: Path, lab: str | None = None, extra=(), timeout: float = DEFAULT_TIMEOUT_S,
                jobs: int = 2, echo=print) -> list[dict]:
    """Grade every submission in ``folder`` in parallel; write the gradebook and feedback into ``out``."""
    subs = discover(folder, lab)
    if not subs:
        raise SystemExit(f"no submissions found in {folder}")
    work = [(learner, nb, problem, lab, [str(p) for p in extra], timeout) for learner, nb, problem in subs]
    results: dict[str, dict] = {}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(_grade_one, w): w[0] for w in work}
        for fut in as_completed(futures):
            learner = futures[fut]
            try:
                results[learner] = fut.result()
            except Exception as exc:
                results[learner] = GradeReport("", lab, "error", f"grader process failed: {exc}",
                                               learner=learner).to_dict()
            r = results[learner]
            echo(f"{learner:<24} {r['status']:<9} {r['score']}/{r['max_score']}  {r['reason']}")
    rows = [results[learner] for learner, _, _ in subs]
    write_gradebook(rows, out)
    return rows


def write_gradebook(rows: list[dict], out: Path) -> None:
    """gradebook.csv / gradebook.json, plus per-learner feedback text and JSON report."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    (out / "reports").mkdir(exist_ok=True)
    keys = list(dict.fromkeys(i["key"] for r in rows for i in r["items"]))
    with open(out / "gradebook.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["learner", "lab", "status", "score", "max_score", *keys, "reason", "flags"])
        for r in rows:
            per = {i["key"]: i["points"] for i in r["items"]}
            w.writerow([r["learner"], r["lab"], r["status"], r["score"], r["max_score"],
                        *[per.get(k, "") for k in keys], r["reason"], "; ".join(r["flags"] + r["tampering"])])
    stable = [{k: v for k, v in r.items() if k != "duration_s"} for r in rows]
    (out / "gradebook.json").write_text(json.dumps(stable, indent=2) + "\n")
    for r in rows:
        (out / "feedback" / f"{r['learner']}.txt").write_text(_report(r).table() + "\n")
        (out / "reports" / f"{r['learner']}.json").write_text(json.dumps(r, indent=2) + "\n")


def main(argv=None) -> int:
    """Entry point of ``gpucourse-grade`` / ``python -m gpucourse.grading.cli``."""
    ap = argparse.ArgumentParser(prog="gpucourse-grade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path, help="a submitted .ipynb, or a folder of submissions")
    ap.add_argument("--lab", help="lab number, e.g. 01 (default: from the notebook's metadata or name)")
    ap.add_argument("--extra-tests", nargs="*", type=Path, default=[], metavar="FILE",
                    help="extra (hidden) test files written like gpucourse/labtests/labNN.py")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per notebook (default 300)")
    ap.add_argument("--out", type=Path, default=Path("grading-output"), help="folder for JSON/CSV results")
    ap.add_argument("--json", type=Path, help="for one notebook: where to write its JSON report")
    ap.add_argument("--jobs", type=int, default=2, help="submissions graded in parallel (folder mode)")
    a = ap.parse_args(argv)
    if a.lab is not None and not (a.lab.isdigit() and len(a.lab) <= 2):
        ap.error(f"--lab takes a lab number like 01, got {a.lab!r}")
    lab = a.lab.zfill(2) if a.lab else None
    for p in a.extra_tests:
        if not p.is_file():
            ap.error(f"extra test file not found: {p}")
    if a.timeout <= 0 or a.jobs < 1:
        ap.error("--timeout must be > 0 and --jobs >= 1")
    if not a.path.exists():
        ap.error(f"no such file or folder: {a.path}")

    if a.path.is_dir():
        rows = grade_batch(a.path, a.out, lab, a.extra_tests, a.timeout, a.jobs)
        print(f"\n{len(rows)} submission(s) graded; gradebook in {a.out}/gradebook.csv")
        return 0
    rep = grade_notebook(a.path, lab=lab, extra_tests=a.extra_tests, timeout=a.timeout)
    print(rep.table())
    dest = a.json or a.out / f"{a.path.stem}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    print(f"report written to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
