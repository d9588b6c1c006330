"""Lab 03's reference answers: what each item's judge compares the learner's answer with (grader side).

The bytes of a list of variables (q1), the memory model of q2 (a step's peak at each batch size, the largest
batch within budget, what a search may spend), plain SGD in NumPy (q4), and what an allocator's log of q6's step
can read (the measurements a right answer may give, and the window the step's shapes allow). Used by
:mod:`gpucourse.labtests.lab03` (its cases and observations) and :mod:`gpucourse.labtests._lab03_judges`; never
sent to the graded kernel.
"""

from __future__ import annotations

__all__ = ["MiB", "RESET_SLACK", "allowed_cost", "largest", "nbytes", "need", "q6_candidates", "q6_close",
           "q6_weights", "q6_window", "reference_sgd", "stop_cost"]


MiB = 2**20


# --------------------------------------------------------------------------- q1


def nbytes(variables, itemsize: int | None = None) -> int:
    """Bytes of ``variables``, each value at its dtype's size (or at ``itemsize`` bytes)."""
    import numpy as np

    return sum(int(np.prod(v.shape)) * (itemsize or np.dtype(v.dtype).itemsize) for v in variables)


# --------------------------------------------------------------------------- q2


def need(params: dict, n: int) -> int:
    """The peak of one step at batch ``n`` as an allocator reports it: the state, plus activations that grow a
    little faster than a line (``quad``), counted only from 256 KiB on when ``hidden`` (a CPU with oneDNN leaves
    smaller tensors out), rounded up to 256 bytes (the allocators' granularity)."""
    act = params["per"] * n + params["quad"] * n * n
    if act < params["hidden"]:
        act = 0
    return -(-(params["fixed"] + act) // 256) * 256


def largest(case: dict) -> int | None:
    """The answer, by bisection on the (never decreasing) memory model; None if not even a batch of 1 fits."""
    if need(case, 1) > case["budget"]:
        return None
    lo, hi = 1, case["max_batch"]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(case, mid) <= case["budget"] else (lo, mid - 1)
    return lo


def allowed_cost(answer: int | None) -> int:
    """Examples the search may spend: 8 x the answer + 64.

    Why 8: a search that predicts the next size from the bytes it measured (a line through its two nearest
    measurements, checked against the budget) spends 2 to 6 x the answer on these models (measured on 48,000
    random cases: the answer itself, the size above it, and one or two predictions that overshoot when the
    model bends upwards). Doubling then bisecting spends the doubling (2 to 4 x the answer) plus about
    log2(answer) bisection steps of about the answer each: more than 10 x on every case here with an answer of
    300 or more. The + 64 leaves room for a few cheap small measurements.
    """
    return 8 * (answer or 1) + 64


#: The check stops a search that spends this much (a search one size at a time would run for minutes).
def stop_cost(answer: int | None) -> int:
    return 40 * (answer or 1) + 4096


# --------------------------------------------------------------------------- q4


def reference_sgd(w, b, x, y, lr, batch):
    """Plain mini-batch SGD on a linear model with mean-squared-error loss, in NumPy (float64)."""
    import numpy as np

    w, b = np.array(w, "float64"), np.array(b, "float64")
    x, y = np.array(x, "float64"), np.array(y, "float64")
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        err = xb @ w + b - yb
        w -= lr * 2 * xb.T @ err / err.size
        b -= lr * 2 * err.sum(axis=0) / err.size
    return w, b


# --------------------------------------------------------------------------- q6


#: A call of step that started within this of a reset counts as measured from a reset (the learner's code may
#: allocate a little between the reset and the call; on a CPU tensors under 256 KiB are not counted anyway).
RESET_SLACK = 256 * 1024


def q6_candidates(log: list, n: int, warmup: bool) -> list[int]:
    """What a right measurement of step(n) reads: for each call of step(n) that started right after a reset (and,
    with ``warmup``, was not the step's first call ever, which traces it and creates the optimizer's state), the
    allocator's peak after it (or after the calls of step(n) that follow it at once: a worst of several) minus what
    was in use when it started."""
    out = []
    for i, (k, current, peak, _, _) in enumerate(log):
        if k != n or (warmup and i == 0) or peak - current > RESET_SLACK:
            continue
        top = 0
        for j in range(i, len(log)):
            if log[j][0] != n:
                break
            top = max(top, log[j][4])
            out.append(top - current)
    return out


def q6_close(value: float, target: float) -> bool:
    """Equal up to what the learner's own code may allocate between reading the counters and calling step."""
    return abs(value - target) <= 64 * 1024 + 0.01 * abs(target)


def q6_window(case: dict, n: int, device: str) -> tuple[int, int]:
    """The least and the most one call of step(n) can need above what was in use, from the step's shapes alone.

    ``activations``: one tensor of n * width * 4 bytes. A BFC allocator (oneDNN's on a CPU, TensorFlow's on a GPU)
    may hand out a free chunk of up to twice the size asked for without splitting it, and counts the whole chunk:
    so from 1x to under 2x the tensor (measured here: 1.0x to 1.94x), plus 1 MiB for the scalar and rounding.

    ``mlp`` (a training step of Dense layers with Adam): at the start of the backward pass the batch and every hidden
    layer's output are alive together (each layer's weight gradient needs its input), so at least 4n(d + sum of
    the hidden widths) bytes; the cases make each of them at least 256 KiB, the size from which a CPU with oneDNN
    counts a tensor. At most twice (chunks, as above) every activation, its gradient, the inputs and the labels,
    4n(2d + 2 x sum(hidden) + 3 classes + 1), plus 4 x the weights (their gradients, Adam's temporaries) and 8 MiB
    (small tensors and rounding); on a GPU 64 MiB more (cuBLAS may take its workspace from TensorFlow's allocator).
    Measured here with oneDNN and with TF_CPU_ALLOCATOR_USE_BFC=true (batches 256 to 2048, widths 256 to 768):
    1.5x to 4.8x the floor, and under half the ceiling.
    """
    m = case["model"]
    if m["kind"] == "activations":
        size = 4 * n * m["width"]
        return size, 2 * size + MiB
    hidden, d, c, weights = sum(m["hidden"]), m["d"], m["classes"], q6_weights(m)
    core = 4 * n * (2 * d + 2 * hidden + 3 * c + 1)
    return 4 * n * (d + hidden), 2 * core + 4 * weights + 8 * MiB + (64 * MiB if device.startswith("GPU") else 0)


def q6_weights(m: dict) -> int:
    """Bytes of the MLP's weights and biases (float32)."""
    widths = [m["d"]] + m["hidden"] + [m["classes"]]
    return 4 * sum(a * b + b for a, b in zip(widths, widths[1:]))
