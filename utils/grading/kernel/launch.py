"""Kernel side, first of all: lock the process down, then start the Jupyter kernel.

The grader starts a graded kernel as ``python launch.py <filter file> <ipykernel arguments...>`` (this
file's text is copied into the kernel's scratch folder). Before any other code runs, it

1. sets ``no_new_privs`` (nothing it runs can gain privileges: no setuid programs);
2. makes the process not dumpable, so no other process of the same user can read or write its memory
   through ``/proc/<pid>/mem`` or attach to it;
3. installs the seccomp filter the grader assembled (:mod:`gpucourse.grading.grader.seccomp`), which
   every process it starts inherits and none can remove;

then runs ``ipykernel_launcher`` as ``python -m`` would. If a step fails the kernel does not start
(exit status 3, and the reason on stderr): the grader then says the run could not be isolated.
Standard library only.
"""

import ctypes
import runpy
import sys

PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 38, 22, 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def lock_down(filter_path: str) -> None:
    """no_new_privs, not dumpable, then the seccomp filter read from ``filter_path`` (empty: no filter)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(filter_path, "rb") as fh:
        program = fh.read()
    for option, value in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_DUMPABLE, 0)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
    if program:
        buf = ctypes.create_string_buffer(program, len(program))
        prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "installing the seccomp filter failed")


if __name__ == "__main__":
    try:
        lock_down(sys.argv[1])
    except Exception as exc:  # noqa: BLE001
        print(f"gpucourse: the graded kernel could not be locked down: {exc}", file=sys.stderr)
        sys.exit(3)
    sys.argv = ["ipykernel_launcher", *sys.argv[2:]]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
