"""Public tests of each lab, one file per lab: ``labNN.py``.

A lab too long for one file keeps its judges in ``_labNN_judges.py`` and its reference answers in
``_labNN_reference.py``: grader-side modules that ``labNN.py`` imports at its top. The graded kernel gets neither
(its copy of the course has no ``labtests``, and ``grading.grader.judge.kernel_source`` leaves those imports
out), so an ``@in_kernel`` function uses only what ``labNN.py`` itself defines.

Conventions (see :mod:`gpucourse.grading.items`):

* each graded item is a function ``fn(ns)`` decorated with ``@item("qN", points=..., title=...)``;
* tests feed *fresh* inputs (random, or built on the spot) and check behaviour,
  never the learner's source text;
* import TensorFlow and other heavy libraries inside the item functions, so that
  the grader can read the items' points without importing TensorFlow.
"""
