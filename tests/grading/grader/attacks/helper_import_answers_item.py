# Helper import: a course helper computes q4's answer.
from gpucourse.multiworker import visible_gpu_ids


def visible_gpu_count(value, physical):
    return len(visible_gpu_ids(value, physical))
