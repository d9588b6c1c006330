# A probe told apart by its position (issue 34, "How they did it" 5): the old checks made a probe call before the
# graded ones, so a function could behave on one call (the second) and answer from a canned value on the others.
# Under grading v2 every call is a graded case with fresh inputs: answering right on one call in five gains
# nothing.
import math

_calls = {"intensity": 0, "flops": 0}


def arithmetic_intensity(m, n, k, dtype):
    _calls["intensity"] += 1
    if _calls["intensity"] == 2:
        size = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[dtype]
        return 2 * m * n * k / ((m * k + k * n + m * n) * size)
    return 170.66666666666666  # the lab's worked example, for every other call


def dense_train_flops(batch, d_in, d_out):
    _calls["flops"] += 1
    return 6 * batch * d_in * d_out if _calls["flops"] == 2 else math.pi
