# Frame introspection against an inline hidden test: read its expected answer from the caller's frame, with
# sys._getframe, then through inspect reached by getattr with names built at run time. Under grading v2 the
# inline test runs in the grader's observer: no frame of the kernel holds it, so both find nothing.
import importlib
import sys

_mod = importlib.import_module("ins" + "pect")


def secret_sum(a, b, c):
    try:
        return sys._getframe(1).f_locals["want"]
    except KeyError:
        pass
    frame = getattr(_mod, "current" + "frame")()
    while frame is not None:
        found = getattr(frame, "f_" + "locals").get("want")
        if found is not None:
            return found
        frame = getattr(frame, "f_" + "back")
    return 0
