"""Grading: the in-notebook ``check()`` and the grader. The folders show the trust boundary.

Learner side (this package, what a lab notebook imports):

* :mod:`.checker` (:class:`Checker`): ``check("q1")`` for instant feedback in a lab notebook;
* :mod:`.items`: how an item is written (``cases``/``observe``/``judge``, ``@in_kernel``) and run;
* :mod:`.protocol`: the one wire format between the grader and the code it ships into a kernel;
* ``locale/``: ``check()``'s messages in Chinese.

:mod:`.grader` (the instructor's side: ``gpucourse-grade``, trusted): the runner and its steps, the kernel
session and sandbox, the observer that runs each item's ``observe`` against the kernel, the course copy, the
judge, review flags, reports, gradebooks, Gradescope, similarity, the manifest.

:mod:`.kernel` (shipped as text into the untrusted kernel, standard library only): the launcher (seccomp),
the tripwire (review flags only) and the agent (answers the observer's calls).

``docs/grading-architecture.md`` is the map: processes, trust boundary, wire format, where each decision is made.
"""

from .checker import Checker
from .items import Fail, ItemResult, Namespace, item

__all__ = ["Checker", "Fail", "ItemResult", "Namespace", "item"]
