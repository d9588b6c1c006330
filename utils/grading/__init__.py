"""Grading: the in-notebook ``check()`` and the command-line grader.

* :class:`Checker` gives instant feedback inside a lab notebook.
* :func:`gpucourse.grading.runner.grade_notebook` executes a submission in a
  fresh kernel with a time limit and runs the lab's tests (public and hidden).
* ``python -m gpucourse.grading.cli`` (or ``gpucourse-grade``) grades one
  notebook or a folder of submissions and writes JSON / CSV gradebooks.
"""

from .checker import Checker
from .items import Fail, ItemResult, Namespace, item

__all__ = ["Checker", "Fail", "ItemResult", "Namespace", "item"]
