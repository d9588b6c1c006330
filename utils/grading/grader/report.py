"""The outcome of grading one submission: :class:`GradeReport`, and its tables for humans.

Statuses of a submission:

* ``graded``: ran to the end; ``score`` is the sum of the items' points. ``flags`` (if any) ask a
  human to review something the grader or the kernel's tripwire saw; they never change the score.
  ``mode`` is ``summative`` (a mark to upload) or ``practice`` (the kernel was not isolated enough:
  see :func:`.runner.summative`).
* ``malformed``, ``empty``, ``error``: there was nothing to grade, or the grader could not start the
  kernel; all items score 0 and ``reason`` says why. (A cell, an item or a kernel that hangs or dies
  only costs the items it touches: see :mod:`.observer`.)

An item row (a dict) has ``key``, ``title``, ``points``, ``max_points``, ``status`` (``pass``,
``fail``, ``todo`` or ``error``), ``message``, ``source`` (``public`` or ``hidden:<file>``) and
``trust`` (``split``: judged by the grader, or ``inline``: an older-style item judged in one go).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

__all__ = ["GradeReport", "STATUSES", "is_practice"]

STATUSES = ("graded", "malformed", "empty", "error")
_MARK = {"pass": "pass", "fail": "FAIL", "todo": "todo", "error": "ERROR"}


def is_practice(report: dict) -> bool:
    """Whether a report (as a dict, e.g. a gradebook row) is a *practice* grade: graded, but not a mark to upload."""
    return isinstance(report, dict) and report.get("status") == "graded" and report.get("mode") == "practice"


@dataclass
class GradeReport:
    """The outcome of grading one submission (see the module docstring)."""

    submission: str
    lab: str | None
    status: str  # one of STATUSES
    reason: str = ""
    score: int = 0
    max_score: int = 0
    items: list[dict] = field(default_factory=list)
    cell_errors: list[dict] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    learner: str | None = None
    timings: dict = field(default_factory=dict)  # seconds per stage (kernel start, submission, checks, judging)
    isolation: str = ""  # how the kernel was isolated: "bubblewrap: ...", "user: ...", "none: ..." (see .sandbox)
    mode: str = ""  # "summative": a mark to upload; "practice": the kernel was not isolated enough (see .runner)

    @classmethod
    def from_dict(cls, d: dict) -> "GradeReport":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def review(self) -> bool:
        """True when a human should look at this submission (it has flags)."""
        return bool(self.flags)

    def integrity(self) -> str:
        """One line for gradebooks: 'ok' or 'flagged: ...'."""
        return "flagged: " + "; ".join(self.flags) if self.flags else "ok"

    def table(self) -> str:
        """Human-readable report: items, total, and anything the instructor should look at."""
        head = f"Lab {self.lab or '??'}: {Path(self.submission).name}"
        if self.learner:
            head += f" ({self.learner})"
        mode = f" ({self.mode})" if self.mode else ""
        lines = [head, f"status: {self.status}{mode}" + (f": {self.reason}" if self.reason else "")]
        width = max([len(r["key"]) for r in self.items] + [4])
        pad = " " * (width + 17)
        for r in self.items:
            mark = _MARK.get(r["status"], r["status"])
            src = "" if r.get("source", "public") == "public" else f" [{r['source']}]"
            lines.append(f"  {r['key']:<{width}}  {r['points']:>2}/{r['max_points']:<2}  {mark:<5}  {r['title']}{src}")
            if r.get("message"):
                lines.append(pad + r["message"].replace("\n", "\n" + pad))
        lines.append(f"  {'total':<{width}}  {self.score:>2}/{self.max_score:<2}")
        for e in self.cell_errors:
            lines.append(f"  cell {e['cell']} raised {e['ename']}: {e['evalue']}")
        for f in self.flags:
            lines.append(f"  flagged for review: {f}")
        return "\n".join(lines)
