# A fresh copy of a course module (made moot by grading v2): runpy runs gpucourse.multiworker's code again,
# else importlib builds a new module from its spec, so its visible_gpu_ids would be a new, unwrapped function
# that answers q4. The graded kernel's copy of that module is the one that exists: its code raises too.
import importlib.util
import runpy


def _fresh():
    try:
        return runpy.run_module("gpucourse.multiworker")["visible_gpu_ids"]
    except Exception:
        copy = importlib.util.module_from_spec(importlib.util.find_spec("gpucourse.multiworker"))
        copy.__spec__.loader.exec_module(copy)
        return copy.visible_gpu_ids


def visible_gpu_count(value, physical):
    return len(_fresh()(value, physical))
