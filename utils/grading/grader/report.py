"""The outcome of grading one submission: :class:`GradeReport`, and its tables for humans.

Statuses of a submission:

* ``graded``: ran to the end; ``score`` is the sum of the items' points. ``flags`` (if any) ask a
  human to review something the grader saw; they do not change the score.
* ``tampered``: the submission changed what the grader relies on (a replaced library function or
  class method, a forged record on the grader's channel, ctypes...). All marks are withheld and
  ``tampering`` says why.
* ``timeout``, ``crashed``, ``malformed``, ``empty``, ``error``: the run could not finish; all
  items score 0 and ``reason`` says why.

An item row (a dict) has ``key``, ``title``, ``points``, ``max_points``, ``status`` (``pass``,
``fail``, ``todo``, ``error``, or ``withheld`` when the grader saw the learner's code cheat on that
item), ``message``, ``source`` (``public`` or ``hidden:<file>``) and ``trust`` (``split``: judged
by the grader, or ``inline``: an older-style item judged inside the learner's kernel).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

__all__ = ["GradeReport", "STATUSES"]

STATUSES = ("graded", "tampered", "timeout", "crashed", "malformed", "empty", "error")
_MARK = {"pass": "pass", "fail": "FAIL", "todo": "todo", "error": "ERROR", "withheld": "HELD"}


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
    tampering: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    learner: str | None = None
    timings: dict = field(default_factory=dict)  # seconds per stage (kernel start, guard, submission, checks, judging)
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
        """True when a human should look at this submission (flags or tampering)."""
        return bool(self.flags or self.tampering)

    def integrity(self) -> str:
        """One line for gradebooks: 'ok', 'flagged: ...', or 'withheld: ...' (then what was flagged)."""
        if self.tampering:
            flagged = "; ".join(self.flags)
            return "withheld: " + "; ".join(self.tampering) + (f" | flagged: {flagged}" if flagged else "")
        held = [f"{r['key']}: {r['message']}" for r in self.items if r.get("status") == "withheld"]
        flagged = "; ".join(held + self.flags)
        return f"flagged: {flagged}" if flagged else "ok"

    def table(self) -> str:
        """Human-readable report: items, total, and anything the instructor should look at."""
        head = f"Lab {self.lab or '??'}: {Path(self.submission).name}"
        if self.learner:
            head += f" ({self.learner})"
        lines = [head, f"status: {self.status}" + (f": {self.reason}" if self.reason else "")]
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
        for f in self.tampering:
            lines.append(f"  marks withheld: {f}")
        for f in self.flags:
            lines.append(f"  flagged for review: {f}")
        return "\n".join(lines)
