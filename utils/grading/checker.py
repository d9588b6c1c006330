"""The in-notebook ``check("q1")`` learners call for instant feedback.

``check()`` runs entirely in the learner's kernel (a learner who fools it only fools themselves).
While the grader runs a submission (``GPUCOURSE_GRADING=1`` in the kernel's environment) it does
nothing but say so: the grader checks every item itself, on its own cases, out of the kernel.
What it prints is in the notebook's language (:func:`.items.language`: Chinese in a ``zh-CN``
folder or with ``GPUCOURSE_LANG=zh_CN``); the verdicts and points are the same in every language.

It also says what the grader will do with a call of a course helper that computes an item's answer (marked
``@answers(lab, ...)`` where it is defined, see :mod:`gpucourse._labrules`): in the graded kernel the course's
copy of such a helper does not run, so an item whose run called one scores 0 here too, with that reason.
"""

from __future__ import annotations

import inspect
import os

from .._labrules import watching
from .items import ItemResult, Namespace, items_in, lab_test_path, load_test_file, run_item, score_table, tr

__all__ = ["Checker"]


class Checker:
    """Runs a lab's public tests against the notebook's own variables.

    In the lab's setup cell::

        from gpucourse.grading import Checker
        check = Checker("01")

    and after each exercise ``check("q1")``. A check prints a result and
    never raises, whatever the learner's code does (only an interrupt from the
    Stop button gets through). ``check.summary()`` prints the score so far.
    """

    def __init__(self, lab: str):
        if not isinstance(lab, str):
            raise TypeError(f"lab must be a string like '01', got {lab!r}")
        self.lab = lab.zfill(2)
        # While the grader runs, the tests are not in the kernel (its copy of the course has none): the grader
        # checks every item itself.
        self._items, self._forbidden = {}, ()
        if not _grading():
            module = load_test_file(lab_test_path(self.lab))  # (a clear error for a lab that does not exist)
            self._items = {spec.key: (spec, fn) for spec, fn in items_in(module)}
            self._forbidden = tuple(getattr(module, "FORBIDDEN_MODULES", ()))
        self.results: dict[str, ItemResult] = {}

    @property
    def keys(self) -> list[str]:
        return list(self._items)

    def __call__(self, key: str, namespace: dict | None = None) -> None:
        """Check item ``key`` against the caller's variables (or ``namespace``) and print the result.

        The result is kept in ``self.results[key]``.
        """
        if _grading():
            print(tr("📝 {key}: checked by the grader", key=key))
            return
        if key not in self._items:
            print(tr("⚠️ Lab {lab} has no item {key}; its items are {keys}.", lab=self.lab, key=repr(key),
                     keys=", ".join(self._items)))
            return
        if namespace is None:
            namespace = inspect.currentframe().f_back.f_globals
        spec, fn = self._items[key]
        self.results[key] = _run(spec, fn, namespace, self.lab)
        print(self.results[key].line())
        used = _forbidden_in(namespace, self._forbidden)
        if used:
            print(tr("⚠️ Your notebook uses {used}, which lab {lab} forbids: in the graded kernel it cannot be "
                     "imported, so the cell that imports it fails there (and what that cell defines is missing).",
                     used=", ".join(f"`{m}`" for m in used), lab=self.lab))

    def run_all(self, namespace: dict | None = None) -> None:
        """Check every item (quietly), then print the summary."""
        if _grading():
            print(tr("📝 checked by the grader"))
            return
        if namespace is None:
            namespace = inspect.currentframe().f_back.f_globals
        for key, (spec, fn) in self._items.items():
            self.results[key] = _run(spec, fn, namespace, self.lab)
        self.summary()

    def rows(self) -> list[ItemResult]:
        """One result per item in lab order; items not checked yet count as 0."""
        return [self.results.get(key) or ItemResult(key, tr(spec.title), 0, spec.points, "todo",
                                                     tr("not checked yet: run check({key})", key=repr(key)))
                for key, (spec, _) in self._items.items()]

    def score(self) -> tuple[int, int]:
        """(points so far, maximum points)."""
        rows = self.rows()
        return sum(r.points for r in rows), sum(r.max_points for r in rows)

    def summary(self) -> None:
        """Print the score over all items; unchecked items count as 0."""
        if _grading():
            print(tr("📝 Lab {lab}: scored by the grader", lab=self.lab))
            return
        print(score_table(self.rows(), title=tr("Lab {lab}", lab=self.lab)))

    def __repr__(self) -> str:
        return f"Checker(lab={self.lab!r}, items={self.keys})"


def _forbidden_in(namespace: dict, forbidden) -> list[str]:
    """The forbidden modules the notebook's variables lead to: the module itself, or something defined in it."""
    if not forbidden:
        return []
    used = set()
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        module = value.__name__ if isinstance(value, type(os)) else getattr(value, "__module__", None)
        used |= {m for m in forbidden if isinstance(module, str) and (module == m or module.startswith(m + "."))}
    return sorted(used)


def _grading() -> bool:
    """True inside a kernel the grader started (check() then leaves the checking to the grader)."""
    return os.environ.get("GPUCOURSE_GRADING") == "1"


def _run(spec, fn, namespace, lab: str):
    """Run one item over the learner's public (non-underscore) variables; 0 points if it called a helper that the
    graded kernel's copy of the course does not run for this lab."""
    with watching() as calls:
        result = run_item(spec, fn, Namespace({k: v for k, v in namespace.items() if not k.startswith("_")}))
    called = [name for name, marks in calls if any(m_lab == lab for m_lab, _ in marks)]
    if not called:
        return result
    names = ", ".join(f"`{name.removeprefix('gpucourse.')}`" for name in dict.fromkeys(called))
    message = tr("Under the grader this item fails: your code called {names}, a course helper that computes this "
                 "item's answer (the lab's text says so), and in the graded kernel the course's copy of it does not "
                 "run. Write that part yourself. The check's own verdict:", names=names)
    verdict = result.message or tr("the answer is right.")
    return ItemResult(result.key, result.title, 0, result.max_points, "fail" if result.passed else result.status,
                      f"{message}\n{verdict}")
