"""Lab 07's reference answers and bars: the numbers each item's judge compares the learner's pipeline with.

The bound of a pipeline (fill plus the slowest stage), what q2's pipelines deliver, the utilisation and start-up q3
asks for and how many reads and decodes must be in flight to reach it, how far a full shuffle moves a record (q4),
when a stream's batches were shuffled whole, the noise of q5's augmentation, and how long the check lets each run
go. Used by :mod:`gpucourse.labtests.lab07` (its observations) and :mod:`gpucourse.labtests._lab07_judges`; never
sent to the graded kernel.
"""

from __future__ import annotations

import math

from ..grading.timeline import device_summary

__all__ = ["MIX", "NOISE", "Q3_DEADLINE_S", "Q3_STARTUP", "Q3_UTILISATION", "Q4_DEADLINE_S", "bound", "pair_bound",
           "q2_expected", "q3_needs", "q3_summary", "whole_batches_shuffled"]


# --------------------------------------------------------------------------- q1


def bound(n, stages):
    """Reference: fill + (n - 1) x the slowest stage, for ``(seconds, parallelism)`` stages."""
    return sum(t for t, _ in stages) + (n - 1) * max(t / k for t, k in stages)


def pair_bound(n, produce_s, step_s, parallelism=1):
    return bound(n, [(produce_s, parallelism), (step_s, 1)])


# --------------------------------------------------------------------------- q2


def q2_expected(case) -> list:
    """Reference: what the case's pipeline delivers, element by element (batches as lists)."""
    a, b, k = case["a"], case["b"], case["k"]
    fns = {"decode": lambda v: a * v + b, "scale": lambda v: k * v}
    out = list(range(case["n"]))

    def each(x, fn):
        return [each(v, fn) for v in x] if isinstance(x, list) else fn(x)

    for op in case["ops"]:
        if op in fns:
            out = [each(x, fns[op]) for x in out]
        elif op == "batch":
            out = [out[i:i + case["batch"]] for i in range(0, len(out), case["batch"])]
        else:  # unbatch
            out = [v for x in out for v in x]
    return out


# --------------------------------------------------------------------------- q3


#: Steady-state utilisation q3 wants, and how long the first element may take, as a multiple of read + decode.
#: A pipeline sized to the bound reaches 0.9-1.0 through the grader even on a 2-core machine at load 7
#: (measured); tf.data's default pool on a 16-core machine reaches at most 2/3 (the cases make sure), the
#: tutorial's sizes about 0.3. A first element needs read + decode plus thread start-up (measured 1.1-1.2x).
Q3_UTILISATION, Q3_STARTUP = 0.8, 2.0


#: A run stops here: a pipeline that keeps up needs about read + decode + records x step (1.6 s).
Q3_DEADLINE_S = 5.0


def q3_summary(run, case) -> tuple[float, float]:
    got = device_summary(run)
    if run["stopped"] is not None or got["startup"] is None:
        return math.inf, 0.0
    return got["startup"], got["utilisation"]


def q3_needs(case) -> tuple[int, int]:
    """Reads and decodes that must be in flight at once to deliver one element per step."""
    return math.ceil(case["read_s"] / case["step_s"]), math.ceil(case["decode_s"] / case["step_s"])


# --------------------------------------------------------------------------- q4


#: A full shuffle moves some record at least this share of the data ahead of where it was read, in one of 3
#: epochs: it fails to with chance below exp(-3 * 0.5 * (1 - MIX)**2 * n) < 1e-9 for n >= 320; a buffer of
#: k records moves none more than k - 1 places ahead.
MIX = 0.75


#: A stream of q4 stops here: 3 epochs of a few hundred records take well under a second.
Q4_DEADLINE_S = 6.0


def whole_batches_shuffled(batches, record, n) -> bool:
    """True when every batch holds records read one after another (r, r + 1, ... modulo n: whole batches
    moved, their insides did not) and yet the batches are not in reading order: a shuffle placed after
    batch. (A full shuffle before batch makes a batch of 5+ neighbours with chance < 1e-9.)"""
    if any(v not in record for batch in batches for v in batch):
        return False
    ids = [[record[v] for v in batch] for batch in batches]
    if not all(all((q - p) % n == 1 for p, q in zip(b, b[1:])) for b in ids):
        return False
    flat = [r for b in ids for r in b]
    return any((q - p) % n != 1 for p, q in zip(flat, flat[1:]))


# --------------------------------------------------------------------------- q5


NOISE = 1000  # augment(v) = NOISE * v + a random offset in [0, NOISE), drawn by the check at every call
