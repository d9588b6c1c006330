"""Lab 08 q4's judge without a kernel: it decides from the observer's records (gpucourse.grading.timeline)."""

import pytest

from gpucourse.grading.items import Fail, make_cases
from gpucourse.labtests import lab08


def _run(case, per_element_s, built=0.0, late=False, first_s=0.06):
    """Records of a run whose augment finishes one element every ``per_element_s`` (the device: 20 ms steps)."""
    a, b, c = case["a"], case["b"], case["c"]
    stages, steps, free = [], [], 0.0
    for i, v in enumerate(case["values"]):
        done = first_s + i * per_element_s
        stages.append(["load", v, a * v + b, done - 0.055, done - 0.05])
        stages.append(["augment", a * v + b, c * (a * v + b), done - 0.05, done + (1.0 if late and i == 3 else 0)])
        arrive = done + 0.001
        start = max(arrive, free)
        free = start + case["step_s"]
        steps.append([c * (a * v + b), arrive, start, free])
    return {"stages": stages, "steps": steps, "marks": {"built": built}, "stopped": None}


def test_q4_judges_utilisation_startup_and_causality_from_the_records():
    case = make_cases(lab08.q4, seed=3)[0]
    lab08.q4.judge(case, {"type": "Dataset", "runs": [_run(case, 0.015)]})
    with pytest.raises(Fail, match="needs >= 90%"):
        lab08.q4.judge(case, {"type": "Dataset", "runs": [_run(case, 0.025)]})
    slow_first = _run(case, 0.015, first_s=1.0)
    slow_first["stages"][0][3] = 0.0  # work began at once, the first element came a second later (held back)
    with pytest.raises(Fail, match="the first element took"):
        lab08.q4.judge(case, {"type": "Dataset", "runs": [slow_first]})
    with pytest.raises(Fail, match="before returning"):
        lab08.q4.judge(case, {"type": "Dataset", "runs": [_run(case, 0.015, built=0.5)]})
    with pytest.raises(Fail, match="before its augment had finished"):
        lab08.q4.judge(case, {"type": "Dataset", "runs": [_run(case, 0.015, late=True)]})
    # the better of two runs counts (a noisy machine)
    lab08.q4.judge(case, {"type": "Dataset", "runs": [_run(case, 0.025), _run(case, 0.015)]})
    stopped = dict(_run(case, 0.015), stopped=4.0)
    stopped["steps"] = stopped["steps"][:5]
    with pytest.raises(Fail, match="delivered only 5 of 24"):
        lab08.q4.judge(case, {"type": "Dataset", "runs": [stopped]})
