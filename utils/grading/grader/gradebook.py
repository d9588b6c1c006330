"""Gradebooks: the per-lab CSV/JSON with feedback, and a Canvas-style CSV an LMS imports.

Per lab (:func:`write_gradebook`, what ``gpucourse-grade <folder>`` writes into ``--out``):

* ``gradebook.csv``: one row per learner: status, mode (``summative``, or ``practice`` when the kernel
  was not isolated enough for a mark to upload), score, points per item, integrity (``ok`` or
  ``flagged: ...``), reason, flags;
* ``gradebook.json``: the same rows with every detail (timings left out, so re-running gives the
  same file); ``reports/<learner>.json`` one report each; ``feedback/<learner>.txt`` the
  learner-facing table (flags included, with their reasons);
* ``canvas.csv``: this lab as one Canvas gradebook column (see below);
* ``MANIFEST.json``, written last: the digest of every file above (:mod:`.manifest`;
  ``gpucourse-grade verify OUT/`` names any file changed since, and every practice grade).

Across labs (:func:`canvas_csv`, ``gpucourse-grade lms``): Canvas imports a CSV whose first columns
are ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``, ``Section``, followed by one column per
assignment named ``Assignment name (assignment id)`` (a column without an id creates a new
assignment), and an optional ``Points Possible`` row under the header. Give a Canvas gradebook
export as ``roster`` to fill the identity columns and keep learners who submitted nothing. Nobody
is dropped: a learner missing from a lab gets an empty cell; any submission that was found scores
its points (0 for a malformed, empty or ``error`` one, whose status and reason stay in the lab's own
gradebook), except a *practice* grade, whose cell stays empty: it is not a mark to upload.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .report import GradeReport, is_practice
from .manifest import seal

__all__ = ["CANVAS_IDENTITY", "canvas_csv", "read_gradebook", "write_canvas", "write_gradebook"]

CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")


def _safe(name: str) -> str:
    """A learner id usable as a file name."""
    out = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in str(name)).strip(".")
    return out or "learner"


def write_gradebook(rows: list[dict], out: Path, column: str | None = None) -> None:
    """gradebook.csv / gradebook.json / canvas.csv, plus per-learner feedback text and JSON report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    (out / "reports").mkdir(exist_ok=True)
    reports = [GradeReport.from_dict(r) for r in rows]
    keys = list(dict.fromkeys(i["key"] for r in rows for i in r["items"]))
    with open(out / "gradebook.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["learner", "lab", "status", "mode", "score", "max_score", *keys, "integrity", "reason", "flags",
                    "isolation"])
        for r, rep in zip(rows, reports):
            per = {i["key"]: i["points"] for i in r["items"]}
            w.writerow([r["learner"], r["lab"], r["status"], r.get("mode", ""), r["score"], r["max_score"],
                        *[per.get(k, "") for k in keys], rep.integrity(), r["reason"],
                        "; ".join(r["flags"]), r.get("isolation", "")])
    stable = [{k: v for k, v in r.items() if k not in ("duration_s", "timings")} for r in rows]
    (out / "gradebook.json").write_text(json.dumps(stable, indent=2) + "\n")
    for r, rep in zip(rows, reports):
        name = _safe(r["learner"])
        (out / "feedback" / f"{name}.txt").write_text(rep.table() + "\n")
        (out / "reports" / f"{name}.json").write_text(json.dumps(r, indent=2) + "\n")
    write_canvas(canvas_csv([rows], columns={rows[0]["lab"]: column} if rows and column else None),
                 out / "canvas.csv")
    seal(out)  # last: the digest of every file written above (``gpucourse-grade verify``)


def read_gradebook(folder: Path) -> list[dict]:
    """The rows of ``folder/gradebook.json`` (a folder the batch grader wrote)."""
    path = Path(folder) / "gradebook.json"
    if not path.is_file():
        raise FileNotFoundError(f"no gradebook.json in {folder}: pass folders written by gpucourse-grade")
    rows = json.loads(path.read_text())
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "learner" in r for r in rows):
        raise ValueError(f"{path} is not a gradebook written by gpucourse-grade")
    return rows


def _read_roster(path: Path) -> list[dict]:
    """Rows of a Canvas gradebook export (the 'Points Possible' and test-student rows dropped)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    missing = [c for c in ("Student", "SIS Login ID") if c not in (rows[0] if rows else {})]
    if missing:
        raise ValueError(f"{path} is not a Canvas gradebook export: it lacks the column(s) {', '.join(missing)}")
    return [r for r in rows if r.get("Student", "").strip() and "Points Possible" not in r.get("Student", "")
            and r.get("Student", "").strip() != "Student, Test"]


def canvas_csv(gradebooks: list[list[dict]], roster: Path | None = None,
               columns: dict[str, str] | None = None) -> list[list[str]]:
    """Canvas import rows: header, ``Points Possible``, then one row per learner, one column per lab.

    ``gradebooks`` are the rows of each lab's gradebook; ``columns`` maps a lab ('01') to its Canvas
    column name (e.g. ``'Lab 01 (4321)'``; default ``'Lab 01'``). A learner matches a roster row by
    SIS Login ID, SIS User ID, ID or Student name.
    """
    columns = dict(columns or {})
    labs: dict[str, dict[str, dict]] = {}
    order: list[str] = []
    for rows in gradebooks:
        for r in rows:
            lab = str(r.get("lab") or "??")
            labs.setdefault(lab, {})[str(r["learner"])] = r
            order.append(str(r["learner"]))
    lab_ids = sorted(labs)
    names = [columns.get(lab) or f"Lab {lab}" for lab in lab_ids]
    points = []
    for lab in lab_ids:
        maxes = [r.get("max_score") or 0 for r in labs[lab].values()]
        points.append(str(max(maxes) if maxes else ""))
    people: list[dict] = []
    index: dict[str, dict] = {}
    if roster is not None:
        for r in _read_roster(Path(roster)):
            person = {c: r.get(c, "") for c in CANVAS_IDENTITY}
            people.append(person)
            for c in ("SIS Login ID", "SIS User ID", "ID", "Student"):
                if person[c].strip():
                    index.setdefault(person[c].strip(), person)
    for learner in dict.fromkeys(order):
        if learner not in index:  # never drop a learner the roster does not know
            person = {"Student": learner, "ID": "", "SIS User ID": "", "SIS Login ID": learner, "Section": ""}
            people.append(person)
            index[learner] = person
        index[learner].setdefault("_learner", learner)
    table = [list(CANVAS_IDENTITY) + names, ["Points Possible", "", "", "", ""] + points]
    for person in people:
        learner = person.get("_learner")
        cells = []
        for lab in lab_ids:
            r = labs[lab].get(learner) if learner else None
            if r is not None and is_practice(r):
                cells.append("")  # not a mark to upload (the gradebook keeps it, with the reason)
            else:
                cells.append("" if r is None else str(r.get("score", 0) if r.get("status") == "graded" else 0))
        table.append([person[c] for c in CANVAS_IDENTITY] + cells)
    return table


def write_canvas(table: list[list[str]], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(table)
