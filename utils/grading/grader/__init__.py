"""The grader (``gpucourse-grade``): the instructor's side of grading, trusted. One job per module.

* :mod:`.cli`: the command line (a notebook, a folder, ``gradescope``, ``lms``, ``verify``);
* :mod:`.runner`: :func:`~.runner.grade_notebook`, the steps of grading one submission;
* :mod:`.course_copy`: the course package as the graded kernel sees it (no tests, no answers);
* :mod:`.sandbox` and :mod:`.seccomp`: where the kernel runs, what it can reach, and the sweep that kills it;
* :mod:`.session`: one kernel's life (start, cells, agent, interrupt, restart, kill) and the grader's socket;
* :mod:`.link` and :mod:`.observer`: each item's ``observe`` run here against the kernel, with deadlines;
* :mod:`.judge`: tests loaded once per process, secret cases, verdicts, what the kernel gets of a test file;
* :mod:`.flags`: review flags (static scan, tripwire records) and the lab rules;
* :mod:`.report`, :mod:`.gradebook`, :mod:`.gradescope`, :mod:`.manifest`, :mod:`.similarity`: the outputs;
* :mod:`.benchmark`: seconds per submission.
"""
