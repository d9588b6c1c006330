"""Public tests of each lab, one file per lab: ``labNN.py``.

Conventions (see :mod:`gpucourse.grading.items`):

* each graded item is a function ``fn(ns)`` decorated with ``@item("qN", points=..., title=...)``;
* tests feed *fresh* inputs (random, or built on the spot) and check behaviour,
  never the learner's source text;
* import TensorFlow and other heavy libraries inside the item functions, so that
  the grader can read the items' points without importing TensorFlow.
"""
