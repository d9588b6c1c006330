"""Lab 07's judges without a kernel: they decide from the observer's records (gpucourse.grading.timeline) alone."""

import math
import random

import pytest

from gpucourse.grading.items import Fail, make_cases
from gpucourse.labtests import _lab07_judges as judges, _lab07_reference as reference, lab07


def _step_records(elements, step_s, gap=0.0, start=1.0):
    """Steps of a synchronous device fed ``elements`` with ``gap`` seconds between a step's end and the next."""
    steps, t = [], start
    for e in elements:
        steps.append([e, t, t, t + step_s])
        t += step_s + gap
    return steps


def _q2_run(case, ahead_s):
    """A q2 run of the case's pipeline: the work for each element starts ``ahead_s`` before the previous step ends
    (negative: after it), as a serial pipeline (< 0) or a prefetching one (> 0) would record it."""
    want = reference.q2_expected(case)
    steps = _step_records(want, 0.015, gap=0.05)
    a, b, k = case["a"], case["b"], case["k"]
    stages = []
    for i, (element, (_, arrived, _, _)) in enumerate(zip(want, steps)):
        begin = (steps[i - 1][3] if i else 0.5) - ahead_s
        for v in judges._flat(element):
            raw = v // k if "scale" in case["ops"] else v
            r = (raw - b) // a
            stages.append(["decode", r, raw, begin, begin + 0.008])
            if "scale" in case["ops"]:
                stages.append(["scale", raw, v, begin + 0.009, begin + 0.012])
    return {"type": "Dataset", "options": {}, "run": {"stages": stages, "steps": steps,
                                                      "marks": {"built": 0.1}, "stopped": None}}


@pytest.mark.parametrize("seed", range(4))
def test_q2_wants_every_element_made_after_the_previous_step(seed):
    for case in make_cases(lab07.q2, seed):
        lab07.q2.judge(case, _q2_run(case, -0.001))  # serial: passes
        with pytest.raises(Fail, match="runs ahead while the step runs"):
            lab07.q2.judge(case, _q2_run(case, 0.004))  # the next element's work began during the step
    assert make_cases(lab07.q2, seed)[0]["ops"] == ["decode", "batch"]  # the fusion trap is always graded


def test_q2_hint_names_the_rewrite_that_ran_ahead():
    case = {"ops": ["decode", "batch"]}
    assert "map_and_batch_fusion" in judges._ahead_hint(case, {"inject_prefetch": False, "autotune": False})
    assert "inject_prefetch" in judges._ahead_hint(case, {"map_and_batch_fusion": False})
    assert "add no steps" in judges._ahead_hint(case, {"apply_default_optimizations": False})


def _q3_run(case, per_step_s, reads_at_once=20, structure=(("_PrefetchDataset", -1),), start_s=0.6):
    """A q3 run in which the device gets one record every ``per_step_s`` after the first at ``start_s``."""
    n, a, b, c = case["records"], case["a"], case["b"], case["c"]
    stages, steps, free = [], [], 0.0
    for r in range(n):
        arrive = start_s + r * per_step_s
        stages.append(["read", r, a * r + b, (r % reads_at_once) * 1e-4, (r % reads_at_once) * 1e-4 + 0.3])
        stages.append(["decode", a * r + b, c * (a * r + b), arrive - 0.26, arrive - 0.01])
        begin = max(arrive, free)
        free = begin + case["step_s"]
        steps.append([c * (a * r + b), arrive, begin, free])
    return {"type": "Dataset", "runs": [{"stages": stages, "steps": steps, "marks": {}, "stopped": None,
                                         "structure": [list(s) for s in structure]}]}


def test_q3_grades_steady_utilisation_startup_and_the_final_prefetch():
    case = make_cases(lab07.q3, 3)[0]
    lab07.q3.judge(case, _q3_run(case, case["step_s"]))  # one record per step: 100%
    with pytest.raises(Fail, match="busy 67% of the time") as err:
        lab07.q3.judge(case, _q3_run(case, 1.5 * case["step_s"]))
    assert "must be in flight" in str(err.value) and "one thread per core" in str(err.value)
    with pytest.raises(Fail, match="first record took"):
        lab07.q3.judge(case, _q3_run(case, case["step_s"], start_s=2.5 * (case["read_s"] + case["decode_s"])))
    with pytest.raises(Fail, match="end it with .prefetch"):
        lab07.q3.judge(case, _q3_run(case, case["step_s"], structure=[("_ParallelMapDataset", None)]))


def test_q3_needs_more_threads_than_a_16_core_default_pool():
    for seed in range(20):
        case = make_cases(lab07.q3, seed)[0]
        reads, decodes = reference.q3_needs(case)
        # tf.data's default pool has one thread per core: 16 threads feed at most 16 / (read + decode) records
        # per second, which is at most 2/3 of the pace the step needs (the 80% bar fails it)
        assert 16 / (case["read_s"] + case["decode_s"]) <= (2 / 3) / case["step_s"]
        assert reads + decodes >= 24 and case["records"] == case["shards"]


def test_q4_mixing_statistic_passes_full_shuffles_and_fails_small_buffers():
    rng = random.Random(0)

    def ahead(orders):
        return max(r - i for order in orders for i, r in enumerate(order))

    def buffered(n, k):
        buf, out, it = [], [], iter(range(n))
        for r in it:
            buf.append(r)
            if len(buf) == k:
                out.append(buf.pop(rng.randrange(k)))
        while buf:
            out.append(buf.pop(rng.randrange(len(buf))))
        return out

    for _ in range(500):
        n = rng.randint(320, 400)
        assert ahead([rng.sample(range(n), n) for _ in range(3)]) >= reference.MIX * n
        assert ahead([buffered(n, 240) for _ in range(3)]) < reference.MIX * n


def test_q4_whole_batches_shuffled_is_told_apart_from_a_record_shuffle():
    n, record = 12, {v: v for v in range(12)}
    assert reference.whole_batches_shuffled([[4, 5, 6], [10, 11, 0], [1, 2, 3], [7, 8, 9]], record, n)
    assert not reference.whole_batches_shuffled([[0, 1, 2], [3, 4, 5]], record, n)  # in reading order
    assert not reference.whole_batches_shuffled([[4, 9, 6], [1, 2, 3]], record, n)  # records mixed
    assert not reference.whole_batches_shuffled([[99, 1]], record, n)  # a value that is no record


def _q5_run(case, reads=1, decodes=3, augments=3, orders=None):
    n, p, q, a, b = case["n"], case["p"], case["q"], case["a"], case["b"]
    raw = {r: p * r + q for r in range(n)}
    stages, steps, t = [], [], 0.0
    for r in range(n):
        stages += [["read", r, raw[r], 0.0, 0.001]] * (3 if reads == 3 else 1)
    for e in range(3):
        order = (orders or [rng_order(n, e) for e in range(3)])[e]
        for i in range(0, n, case["batch"]):
            batch = []
            for r in order[i:i + case["batch"]]:
                dec = a * raw[r] + b
                aug = reference.NOISE * dec + ((e if augments == 3 else 0) * 7 + r) % reference.NOISE
                if decodes == 3 or e == 0:
                    stages.append(["decode", raw[r], dec, t + 0.002, t + 0.003])
                if augments == 3 or e == 0:
                    stages.append(["augment", dec, aug, t + 0.004, t + 0.005])
                batch.append(aug)
            t += 0.01
            steps.append([batch, t, t, t])
    marks = {f"epoch {e + 1}": e * 100.0 for e in range(3)}
    for s in steps:  # put each epoch's steps after its mark
        s[1] += 100.0 * (steps.index(s) // -(-n // case["batch"]))
    return {"type": "Dataset", "structure": [["_PrefetchDataset", -1]], "reshuffles": [True],
            "run": {"stages": stages, "steps": steps, "marks": marks, "stopped": None}}


def rng_order(n, seed):
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def test_q5_counts_say_where_the_cache_went():
    case = make_cases(lab07.q5, 2)[0]
    lab07.q5.judge(case, _q5_run(case))
    with pytest.raises(Fail, match="do not fit in memory"):
        lab07.q5.judge(case, _q5_run(case, decodes=1))
    with pytest.raises(Fail, match="read ran"):
        lab07.q5.judge(case, _q5_run(case, reads=3))
    with pytest.raises(Fail, match="augmentation is frozen"):
        lab07.q5.judge(case, _q5_run(case, decodes=1, augments=1))
    same = [rng_order(case["n"], 0)] * 3
    with pytest.raises(Fail, match="same order"):
        lab07.q5.judge(case, _q5_run(case, orders=same))


def test_cases_are_fresh_and_carry_no_answers():
    for item in (lab07.q2, lab07.q3, lab07.q4, lab07.q5):
        a, b = make_cases(item, 1), make_cases(item, 2)
        assert a != b
        assert not any(k in c for c in a for k in ("want", "expected", "delivered"))
    assert math.isclose(make_cases(lab07.q3, 0)[0]["step_s"], 0.02)
