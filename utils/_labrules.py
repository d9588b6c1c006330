"""Which course helpers compute a lab item's answer: the mark, and what using one costs.

The tutorials teach with the course's helpers, so a few of them compute (part of) a lab item's answer. A
topic module marks each such function or class where it is defined::

    @answers("08", "q5")
    def classify(table): ...

Three places read the mark:

* the grader builds, for each lab, a copy of the course package in which every helper marked for that lab
  raises :class:`LabRuleError` instead of running (:mod:`gpucourse.grading.grader.course_copy`): in the
  graded kernel it cannot be called, whatever path leads to it;
* ``check()`` watches the marked helpers while it checks an item (:func:`watching`) and says which were
  called, and that the grader will not run them (:mod:`gpucourse.grading.checker`);
* the labs' texts name them (``tests/grading/test_labrules.py`` checks that each lab's text does).

Outside ``check()`` a marked helper is an ordinary function: the tutorials call them freely.
"""

from __future__ import annotations

import functools
import threading

__all__ = ["LabRuleError", "answers", "answers_of", "watching"]

_STATE = threading.local()


class LabRuleError(RuntimeError):
    """A course helper that answers a lab item was called where the lab's rules forbid it (the graded kernel)."""


def answers(lab: str, *items: str):
    """Mark a function or class as computing the answer of ``items`` (``"q5"``...) of ``lab`` (``"08"``)."""
    if not (isinstance(lab, str) and len(lab) == 2 and lab.isdigit()):
        raise ValueError(f"lab must be two digits like '08', got {lab!r}")
    if not items or not all(isinstance(i, str) and i.isidentifier() for i in items):
        raise ValueError(f"items must be item keys like 'q5', got {items!r}")

    def mark(obj):
        marks = list(getattr(obj, "__gpucourse_answers__", ())) + [(lab, tuple(items))]
        if isinstance(obj, type):
            obj.__gpucourse_answers__ = tuple(marks)
            return obj

        @functools.wraps(obj)
        def helper(*args, **kwargs):
            seen = getattr(_STATE, "seen", None)
            if seen is not None:
                seen.append((f"{obj.__module__}.{obj.__qualname__}", tuple(marks)))
            return obj(*args, **kwargs)

        helper.__gpucourse_answers__ = tuple(marks)
        return helper

    return mark


def answers_of(obj) -> tuple:
    """The ``(lab, items)`` marks of a helper, ``()`` for anything unmarked."""
    return tuple(getattr(obj, "__gpucourse_answers__", ()))


class watching:
    """``with watching() as calls:`` collects ``(helper name, marks)`` of the marked helpers called inside."""

    def __enter__(self) -> list:
        self._before = getattr(_STATE, "seen", None)
        _STATE.seen = []
        return _STATE.seen

    def __exit__(self, *exc) -> bool:
        _STATE.seen = self._before
        return False
