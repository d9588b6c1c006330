"""Lab 03 without a kernel: q2's cost rule against the tutorial's search, q4's blame for wrong weights and a check that
prints only its verdict, and q6's GPU path with fakes (the device it measures, the judge on a GPU allocator's log)."""

import logging
import random

import pytest

from gpucourse.labtests import _lab03_judges as judges, _lab03_reference as reference, lab03

CASE = lab03.q4.cases(random.Random(3))[0]
RIGHT = {"optimizer": "SGD", "momentum": 0.0, "lr": CASE["lr"], "loss": "mse", "first": CASE["x"][0][0]}


@pytest.mark.parametrize("change, words", [
    ({"optimizer": "Adam"}, "Your model.optimizer is Adam"),
    ({"momentum": 0.9}, "momentum=0.9"),
    ({"lr": CASE["lr"] * 4}, "averages the accumulated gradients"),
    ({"loss": "mae"}, "compiled with the loss mae"),
    ({"first": CASE["x"][1][0] + 1.0}, "model.fit shuffles by default"),
    ({}, "Train in order (shuffle=False) with plain SGD and loss 'mse'."),
])
def test_q4_names_the_mistake_behind_wrong_weights(change, words):
    """Four mistakes used to share one generic hint (Adam among them); each now gets its own."""
    assert words in judges._why_weights_differ(CASE, {**RIGHT, **change})


def test_q4_loss_names():
    import keras

    assert lab03._loss_name("mse") in judges._MSE
    assert lab03._loss_name(keras.losses.MeanSquaredError()) in judges._MSE
    assert lab03._loss_name(keras.losses.MeanSquaredError(reduction="sum")) not in judges._MSE
    assert lab03._loss_name(keras.losses.mean_absolute_error) == "mean_absolute_error"


def test_q4_keeps_tensorflows_warnings_out_of_the_check_output():
    """A fresh model per check makes TensorFlow warn about retracing after a few checks: not the learner's business."""
    logger = logging.getLogger("tensorflow")
    before = logger.level
    with lab03._quiet_tensorflow():
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    assert logger.level == before


# --------------------------------------------------------------------------- q2


def _solution_and_tutorial():
    """The solution's largest_batch (from the solution notebook) and the tutorial's search (its fixture)."""
    import json
    from pathlib import Path

    import tensorflow as tf

    root = Path(__file__).resolve().parents[2]
    cells = json.loads((root / "solutions" / "03_memory.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("def largest_batch("))
    mine, tutorial = {"tf": tf}, {"tf": tf}
    exec(source, mine)
    exec((root / "tests/labtests/fixtures/lab03/q2_tutorial_search.py").read_text(), tutorial)
    return mine["largest_batch"], tutorial["largest_batch"]


def _search_cost(fn, case):
    import tensorflow as tf

    calls = []

    def peak_bytes(n):
        calls.append(n)
        used = reference.need(case, n)
        if case["capacity"] is not None and used > case["capacity"]:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM")
        return used

    return fn(peak_bytes, case["budget"], case["max_batch"]), sum(calls)


def test_q2_cost_rule_passes_an_aimed_search_and_fails_the_tutorials():
    """8 x the answer + 64 (_lab03_reference.allowed_cost): the solution stays within it on every case, and the
    tutorial's double-then-bisect exceeds it on the case where no batch over the budget has a number, in every draw
    (so its fixture fails whatever the seed)."""
    solution, tutorial = _solution_and_tutorial()
    rng = random.Random(0)
    for _ in range(150):
        cases = lab03.q2.cases(rng)[:-1]  # the last one: not even a batch of 1 fits
        for case in cases:
            want = reference.largest(case)
            got, cost = _search_cost(solution, case)
            assert got == want and cost <= reference.allowed_cost(want), (case, got, want, cost)
        at_budget = cases[0]
        assert at_budget["capacity"] == at_budget["budget"]
        got, cost = _search_cost(tutorial, at_budget)
        assert got == reference.largest(at_budget) and cost > reference.allowed_cost(got), (at_budget, cost)


def test_q2_cases_hold_the_regimes_the_text_promises():
    """Flat at batches 1 and 2 where small tensors are not counted, a bend upwards in some, out of memory at the
    budget in one, everything fitting in one, and the answers large enough for the cost rule to tell searches apart."""
    rng = random.Random(1)
    for _ in range(50):
        cases = lab03.q2.cases(rng)
        hidden = [c for c in cases if c["hidden"]]
        assert hidden and all(reference.need(c, 1) == reference.need(c, 2) < reference.need(c, 64) for c in hidden)
        assert cases[0]["capacity"] == cases[0]["budget"] and cases[0]["quad"] == 0
        assert reference.largest(cases[1]) == cases[1]["max_batch"]
        assert reference.largest(cases[-1]) is None
        assert all(reference.largest(c) >= 75 for c in cases[:-1])


# --------------------------------------------------------------------------- q6


class _FakeConfig:
    def __init__(self, gpus):
        self.gpus = gpus

    def list_logical_devices(self, kind):
        return [f"/device:{kind}:{i}" for i in range(self.gpus)] if kind == "GPU" else ["/device:CPU:0"]


class _FakeTF:
    def __init__(self, gpus):
        self.config = _FakeConfig(gpus)


@pytest.mark.parametrize("gpus, device", [(0, "CPU:0"), (1, "GPU:0"), (2, "GPU:0")])
def test_q6_measures_on_the_device_the_step_runs_on(gpus, device):
    assert lab03._q6_device(_FakeTF(gpus)) == device


def _gpu_seen(case, learner_read):
    """What _q6_observe returns on a GPU: a warm-up call, then one call per batch size right after a reset; the
    allocator counts every tensor (no 256 KiB floor) and cuBLAS takes a 32 MiB workspace from it."""
    MiB = 2**20
    state = 200 * MiB + case["ballast"]
    log = [[case["batches"][0], state, state + 5 * MiB, state + 2 * MiB, state + 90 * MiB]]  # the first call
    peaks = []
    for n in case["batches"]:
        lo, _ = reference.q6_window(case, n, "GPU:0")
        extra = int(1.6 * lo) + 32 * MiB
        log.append([n, state, state, state + 1024, state + extra])
        peaks.append(learner_read(extra))
    fitting = [n for n, p in zip(case["batches"], peaks) if p <= case["budget"]]
    return {"device": "GPU:0", "result": {"value": [peaks, max(fitting, default=None)]}, "log": log}


def test_q6_judge_on_a_gpu_allocators_log():
    case = lab03.q6.cases(random.Random(2))[0]
    lab03.q6.judge(case, _gpu_seen(case, lambda extra: extra))  # right: passes, workspace and all
    with pytest.raises(AssertionError, match=r"less than this step needs.*on the device the step runs on \(GPU:0\)"):
        lab03.q6.judge(case, _gpu_seen(case, lambda extra: 0))  # counters read on CPU:0 while the step ran on GPU:0
    # The 64 MiB for cuBLAS's workspace widen a GPU's window only.
    n = case["batches"][0]
    assert reference.q6_window(case, n, "GPU:0")[1] - reference.q6_window(case, n, "CPU:0")[1] == 64 * 2**20


def test_q6_candidates():
    """A call measured right after a reset counts, so does a worst of two calls under one reset; the step's first
    call (tracing, the optimizer's state) and a call without a reset before it do not."""
    MiB = 2**20
    log = [[512, 10 * MiB, 10 * MiB, 12 * MiB, 40 * MiB],  # the first call
           [512, 10 * MiB, 10 * MiB, 10 * MiB, 30 * MiB],  # reset, then step(512)
           [512, 10 * MiB, 30 * MiB, 10 * MiB, 31 * MiB],  # again without a reset: worst of two = 21 MiB
           [256, 10 * MiB, 31 * MiB, 10 * MiB, 31 * MiB]]  # no reset before step(256): its own peak is unknown
    assert reference.q6_candidates(log, 512, warmup=True) == [20 * MiB, 21 * MiB]
    assert reference.q6_candidates(log, 256, warmup=True) == []
    assert 30 * MiB in reference.q6_candidates(log, 512, warmup=False)
