"""Grading: the in-notebook ``check()`` and the grader, one module per job.

Learner side:

* :mod:`.checker` (:class:`Checker`): ``check("q1")`` for instant feedback in a lab notebook.
* :mod:`.items`: how an item is written (``cases``/``observe``/``judge``) and run.

Grader side (``gpucourse-grade``, :mod:`.cli`), modelled on nbgrader's and otter-grader's split:

* :mod:`.runner`: :func:`~.runner.grade_notebook`, the steps of grading one submission;
* :mod:`.execute`: run cells in a fresh kernel with a time limit, then kill it and its children;
* :mod:`.sandbox`: the kernel as an unprivileged user in bubblewrap, and the sweep that kills every
  process of a run before any result is written;
* :mod:`.seal`: the results' manifest (digests, HMAC), written last; ``gpucourse-grade verify``;
* :mod:`.kernel_guard`, :mod:`.kernel_observe` and :mod:`.kernel_standby`: the code that runs *inside*
  the kernel (the guard before the submission, the observation driver after it, and the standby that
  starts worker processes a check kills for real), real files read as text;
* :mod:`.channel`: the grader's end of the guard's authenticated socket;
* :mod:`.judge`: tests loaded once per process, secret cases, verdicts;
* :mod:`.integrity`: what the guard watches, the static scan, the verdict on the guard's records;
* :mod:`.report` (:class:`~.report.GradeReport`) and :mod:`.gradebook` (CSV/JSON/feedback, Canvas);
* :mod:`.similarity`: similar submissions in a batch (copydetect's winnowing fingerprints), written to
  ``similarity.csv`` and ``similarity.html`` for a human; never a score;
* :mod:`.gradescope`: the Gradescope bundle and ``results.json``;
* :mod:`.benchmark`: seconds per submission (``python -m gpucourse.grading.grader.benchmark``).
"""

from .checker import Checker
from .items import Fail, ItemResult, Namespace, item

__all__ = ["Checker", "Fail", "ItemResult", "Namespace", "item"]
