"""What runs inside the untrusted graded kernel, shipped there as text (standard library only).

* :mod:`.launch`: no_new_privs, not dumpable, the seccomp filter, then ipykernel;
* :mod:`.tripwire`: an audit hook installed before the submission's cells; review flags only;
* :mod:`.agent`: after the cells, answers the observer's calls on the learner's variables.

Nothing here decides a mark: the submission runs in the same process and can change anything these files use.
"""
