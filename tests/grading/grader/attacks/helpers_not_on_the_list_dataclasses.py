# Answers from helpers not on the list, another route (issue 34, "How they did it" 7): lab 06 q2's answer is
# what gpucourse.xla's _HloCounts counts, a dataclass marked as answering it. The old guard watched calls of
# the class; dataclasses.replace made one through the class from inside a library, unseen. Here: its
# classmethod, then an instance made without calling the class (object.__new__) and copied by
# dataclasses.replace, then the instance's own counting property. In the graded kernel every method of the
# class, and making one, raises LabRuleError.
import dataclasses

from gpucourse import xla


def fusion_count(fn, x):
    try:
        return xla._HloCounts.of(fn, x, "optimized_hlo").fusions
    except Exception:
        pass
    blank = object.__new__(xla._HloCounts)
    blank.entry, blank.computations, blank.fusion_kinds = "", {}, {}
    counts = dataclasses.replace(blank, entry="main")
    return counts.fusions
