"""The in-notebook ``check("q1")`` learners call for instant feedback.

``check()`` runs entirely in the learner's kernel (a learner who fools it only fools themselves).
While the grader runs a submission (``GPUCOURSE_GRADING=1`` in the kernel's environment) it does
nothing but say so: the grader checks every item itself, on its own cases, out of the kernel.
What it prints is in the notebook's language (:func:`.items.language`: Chinese in a ``zh-CN``
folder or with ``GPUCOURSE_LANG=zh_CN``); the verdicts and points are the same in every language.

It also says what the grader will do with a call of an answer-bearing course helper
(:func:`.integrity.helper_items`): while an item runs, each such helper (its binding in its module and
any name in the notebook bound to it) is wrapped to note calls made by the learner's own code, and an
item that made one scores 0 here too, with the grader's reason.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import types

from .items import (_NOT_LEARNER, ItemResult, Namespace, items_in, lab_test_path, load_test_file, run_item,
                    score_table, tr)

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
        lab_test_path(self.lab)  # a clear error for a lab that does not exist
        # While the grader runs, the tests stay out of the kernel: the grader checks every item itself.
        self._items, self._helpers = {}, ()
        if not _grading():
            from .integrity import helper_items

            module = load_test_file(lab_test_path(self.lab))
            self._items = {spec.key: (spec, fn) for spec, fn in items_in(module)}
            self._helpers = tuple(helper_items(self.lab, [module]))
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
        self.results[key] = _run(spec, fn, namespace, self._helpers)
        print(self.results[key].line())

    def run_all(self, namespace: dict | None = None) -> None:
        """Check every item (quietly), then print the summary."""
        if _grading():
            print(tr("📝 checked by the grader"))
            return
        if namespace is None:
            namespace = inspect.currentframe().f_back.f_globals
        for key, (spec, fn) in self._items.items():
            self.results[key] = _run(spec, fn, namespace, self._helpers)
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


def _grading() -> bool:
    """True inside a kernel the grader started (check() then leaves the checking to the grader)."""
    return os.environ.get("GPUCOURSE_GRADING") == "1"


def _run(spec, fn, namespace, helpers=()):
    """Run one item over the learner's public (non-underscore) variables; 0 points if it called a helper."""
    with _watching(helpers, namespace) as called:
        result = run_item(spec, fn, Namespace({k: v for k, v in namespace.items() if not k.startswith("_")}))
    if not called:
        return result
    names = ", ".join(f"`{name}`" for name in dict.fromkeys(called))
    message = tr("The grader withholds this item's marks: your code called {names}, a course helper that computes "
                 "this item's answer (the lab's text says so). Write the function yourself. The check's own "
                 "verdict:", names=names)
    verdict = result.message or tr("the answer is right.")
    return ItemResult(result.key, result.title, 0, result.max_points, "fail" if result.passed else result.status,
                      f"{message}\n{verdict}")


def _learner_called() -> bool:
    """True when the code that called the helper's wrapper is the learner's (not the course's, a library's or
    Python's own): the grader's guard counts the same calls."""
    frame = sys._getframe(2)  # 0 here, 1 the wrapper, 2 its caller
    name = frame.f_code.co_filename if frame is not None else ""
    return isinstance(name, str) and not name.startswith(_NOT_LEARNER)


@contextlib.contextmanager
def _watching(helpers, namespace):
    """While inside: each answer-bearing helper notes the learner's calls in the list it yields."""
    called: list[str] = []
    swapped = []  # (where: module or dict, name, original, wrapper)
    wrappers = {}
    for dotted in helpers:
        module_name, _, attr = dotted.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, attr, None)
        if not isinstance(original, types.FunctionType):  # classes are for the grader's static scan
            continue

        def wrapper(*args, _original=original, _dotted=dotted, **kwargs):
            if _learner_called():
                called.append(_dotted)
            return _original(*args, **kwargs)

        for name in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(wrapper, name, getattr(original, name, None))
        wrappers.setdefault(id(original), wrapper)
        swapped.append((module, attr, original, wrapper))
    for name, value in list(namespace.items()):  # from gpucourse.bottleneck import classify: that name too
        if id(value) in wrappers and any(value is original for _, _, original, _ in swapped):
            swapped.append((namespace, name, value, wrappers[id(value)]))
    try:
        for where, name, _, wrapper in swapped:
            _put(where, name, wrapper)
        yield called
    finally:
        for where, name, original, wrapper in reversed(swapped):
            if _get(where, name) is wrapper:  # the learner's code may have rebound it: leave that alone
                _put(where, name, original)


def _get(where, name):
    return where.get(name) if isinstance(where, dict) else getattr(where, name, None)


def _put(where, name, value) -> None:
    if isinstance(where, dict):
        where[name] = value
    else:
        setattr(where, name, value)
