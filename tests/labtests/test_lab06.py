"""Lab 06's item logic without a kernel: the generated HLO modules, the reference parser and the hints."""

import random

import pytest

from gpucourse.grading.items import Fail, make_cases
from gpucourse.labtests import lab06


@pytest.mark.parametrize("seed", range(40))
def test_generated_modules_agree_with_the_reference_parser(seed):
    text, counts = lab06._random_module(random.Random(seed))
    assert lab06._ref_counts(text) == counts
    inst = lab06._instructions(text)
    assert {c for c, *_ in inst} > {"ENTRY"}                   # several computations
    assert any(tup for _, _, tup, _ in inst)                   # tuple shapes
    assert sum(root for _, root, _, _ in inst) >= 3            # a ROOT per computation
    assert "op_name=" in text and "(logits=y)" in text and "fusion" in text


def test_q1_hints_name_the_mistake():
    text, want = lab06._random_module(random.Random(3))
    case = {"text": text}

    def message(got):
        with pytest.raises(Fail) as err:
            lab06.q1.judge(case, {"got": got, "is_dict": True, "type": "dict"})
        return str(err.value)

    assert "only the ENTRY computation" in message(lab06._counts(text, lambda c, r, t: c == "ENTRY"))
    assert "ROOT lines" in message(lab06._counts(text, lambda c, r, t: not r))
    assert "shape is a tuple" in message(lab06._counts(text, lambda c, r, t: not t))
    assert "is not the opcode" in message({**want, "mean": 1})
    lab06.q1.judge(case, {"got": want, "is_dict": True, "type": "dict"})
    with pytest.raises(Fail, match="should return a dict"):
        lab06.q1.judge(case, {"got": [], "is_dict": False, "type": "list"})


def test_q2_blames_count_ops_when_it_is_the_culprit():
    case = make_cases(lab06.q2, seed=1)[0]  # softmax: several fusions
    want = lab06._ref_counts(lab06._cpu_hlo(case["fn"], case, "optimized_hlo"))["fusion"]
    lab06.q2.judge(case, {"got": want, "type": "int", "count_ops_fusions": 0})  # right answer, broken q1: pass
    with pytest.raises(Fail, match=r"Your count_ops \(q1\) also finds 0"):
        lab06.q2.judge(case, {"got": 0, "type": "int", "count_ops_fusions": 0})
    with pytest.raises(Fail, match="optimized_hlo"):
        lab06.q2.judge(case, {"got": 0, "type": "int", "count_ops_fusions": want})
    with pytest.raises(Fail, match="not mentions of the word"):
        lab06.q2.judge(case, {"got": want + 3, "type": "int", "count_ops_fusions": None})
    with pytest.raises(Fail, match="whole number"):
        lab06.q2.judge(case, {"got": float(want), "type": "float", "count_ops_fusions": None})


def test_cases_are_json_and_carry_no_answers():
    for item in (lab06.q1, lab06.q2, lab06.q3, lab06.q4):
        cases = make_cases(item, seed=0)
        assert cases and all(isinstance(c, dict) for c in cases)
        assert not any(k in c for c in cases for k in ("want", "expected", "counts"))
    q4 = make_cases(lab06.q4, seed=5)
    buckets = q4[0]["buckets"]
    assert buckets[0] == max(buckets) and q4[0]["shape"][0] <= min(buckets)  # the first fit is not the smallest
    assert q4[-1]["too_long"] > max(buckets)


def _q3_seen(case, traces, outputs=True):
    out = [lab06._q3_want(case, i).tolist() for i in range(len(case["lengths"]))] if outputs else []
    return {"type": "callable", "outputs": out, "traces": traces}


def test_q3_counts_traces_per_mode_and_names_the_cause():
    case = make_cases(lab06.q3, seed=4)[0]
    modes = case["modes"]
    once = [["train", True, False], ["eval", True, False]]
    lab06.q3.judge(case, _q3_seen(case, once))
    per_call = [[m, True, False] for m in modes]
    with pytest.raises(Fail, match="Pass scale as a tensor"):
        lab06.q3.judge(case, _q3_seen(case, per_call))
    with pytest.raises(Fail, match="not traced at all"):
        lab06.q3.judge(case, _q3_seen(case, [[m, False, True] for m in modes]))
    with pytest.raises(Fail, match="reduce_retracing=True still traces twice"):
        lab06.q3.judge(case, _q3_seen(case, once + [["train", True, False]]))
    with pytest.raises(Fail, match="not for XLA"):
        lab06.q3.judge(case, _q3_seen(case, [["train", False, False], ["eval", False, False]]))
    with pytest.raises(Fail, match="should equal fn"):
        wrong = _q3_seen(case, once)
        wrong["outputs"][0] = [v + 1 for v in wrong["outputs"][0]]
        lab06.q3.judge(case, wrong)
    with pytest.raises(Fail, match="mode to fn as a tensor"):
        lab06.q3.judge(case, {"type": "callable", "mode_error": "mode must be a Python str", "traces": []})
    assert modes.count("train") == modes.count("eval") == 3
