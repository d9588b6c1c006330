"""Lab 04 q5 without a kernel: how the grader's first run (a killed worker process) is read and judged."""

import random

import pytest

from gpucourse.grading.items import Fail, items_in
from gpucourse.labtests import lab04

CASE = lab04.q5.cases(random.Random(4))[0]
CRASH = CASE["crash_at"]


def fake_worker(answer: dict, calls: list):
    def worker(entry, args, stop_at=None, timeout_s=60.0):
        calls.append((entry, args, stop_at, timeout_s))
        return answer
    return worker


def first_run(reports, ended, log=""):
    calls = []
    seen = lab04._first_run_killed(fake_worker({"reports": reports, "ended": ended, "log": log}, calls),
                                   CASE, "/tmp/ckpt")
    return seen, calls


def test_the_worker_runs_the_first_launch_and_is_killed_at_the_crash_step():
    steps = [["step", k] for k in range(1, CRASH + 1)]
    seen, calls = first_run(steps, "killed")
    assert seen == {"first": "killed", "first_steps": list(range(1, CRASH + 1)), "first_error": "",
                    "first_folders": []}
    entry, args, stop_at, _ = calls[0]
    assert entry is lab04._first_launch  # a module-level function: the worker finds it in the test file's text
    assert args == {"case": CASE, "folder": "/tmp/ckpt"} and stop_at == ["step", CRASH]


@pytest.mark.parametrize("reports, ended, log, first, error", [
    ([["missing"]], "exit 0", "", "missing", ""),
    ([["step", 1], ["raised", "ValueError: no such folder"]], "exit 0", "", "raised", "ValueError: no such folder"),
    ([["step", 1], ["returned"]], "exit 0", "", "finished", ""),
    ([["step", 1]], "timeout", "epoch 1\nstill training\n", "timeout", "still training"),
    ([], "signal 11", "", "died", "signal 11; -"),
    ([["step", 1]], "exit 1", "Traceback\nMemoryError\n", "died", "exit 1; MemoryError"),
])
def test_how_a_first_run_that_was_not_killed_ended(reports, ended, log, first, error):
    seen, _ = first_run(reports, ended, log)
    assert (seen["first"], seen["first_error"]) == (first, error)


def judged(**seen):
    base = {"first": "killed", "first_steps": list(range(1, CRASH + 1)), "first_error": "",
            "second_steps": [], "losses": [], "weights": [[[0.0]], [0.0]]}
    with pytest.raises(Fail) as err:
        lab04.q5.judge(CASE, {**base, **seen})
    return str(err.value)


def test_each_way_the_first_run_fails_has_its_message():
    assert "`train_resumable` was not defined there" in judged(first="missing")
    msg = judged(first="raised", first_error="ValueError: no such folder")
    assert f"after step {CRASH}" in msg and "train_resumable raised ValueError: no such folder" in msg
    msg = judged(first="timeout", first_error="still training")
    assert f"within {lab04.FIRST_RUN_S:.0f} s" in msg and "Its last output: still training" in msg
    assert "(exit 1; MemoryError)" in judged(first="died", first_error="exit 1; MemoryError")
    assert "ended normally" in judged(first="finished", first_steps=list(range(1, CASE["steps"] + 1)))
    assert "a killed worker trains no further" in judged(first="went on")  # check()'s simulated kill


def test_the_item_asks_the_grader_for_a_worker():
    workers = {spec.key: spec.worker for spec, _ in items_in(lab04)}
    assert workers == {"q1": False, "q2": False, "q3": False, "q4": False, "q5": True}


def test_q3_names_the_replica_mean_even_when_its_loss_matches_by_chance():
    """A mean of replica means can equal the global mean (here: identical examples); the weights then tell."""
    gbs, x, y = 7, [[0.5, -0.25]] * 7, [[1.0]] * 7
    case = {"gbs": gbs, "x": x, "y": y, "kernel": [[0.1], [0.2]], "bias": [0.0], "lr": 0.1}
    loss, w, b, _ = lab04._sgd_linear(case["kernel"], case["bias"], [(x, y)], case["lr"])
    seen = {"replicas": 4, "steps": [{"loss": loss[0], "weights": [(w * 0.5).tolist(), b.tolist()]}]}
    with pytest.raises(Fail) as err:
        lab04.q3.judge(case, seen)
    assert "the loss is right" in str(err.value) and "divided by the replica count" in str(err.value)
    seen["replicas"] = 1  # an even split: both means agree anyway, so the generic hint
    with pytest.raises(Fail) as err:
        lab04.q3.judge(case, seen)
    assert "divided by the GLOBAL batch size" in str(err.value)


def test_q5_the_checkpoint_of_a_due_step_must_be_on_disk_when_on_step_is_called():
    """on_step(k) before the save of step k: the folder has not changed since on_step(k - 1)."""
    every = CASE["save_every"]
    folders = [f"state after step {k}" for k in range(1, CRASH + 1)]  # a save at every step: in order
    late = list(folders)
    late[every - 1] = late[every - 2]  # on_step(every) saw the folder of on_step(every - 1): saved afterwards
    msg = judged(first_folders=late)
    assert f"when on_step({every}) was called, the checkpoint of step {every} was not on disk yet" in msg
    assert "was not on disk" not in judged(first_folders=folders)  # in order: judged on, by the weights
    assert "was not on disk" not in judged()  # a first run that reported no folders (older worker): not judged


def test_q5_folder_state_changes_with_every_save(tmp_path):
    first = lab04._folder_state(tmp_path)
    (tmp_path / "ckpt-2.index").write_bytes(b"a")
    second = lab04._folder_state(tmp_path)
    (tmp_path / "ckpt-2.index").write_bytes(b"b")  # the same name rewritten (Checkpoint.write to a fixed path)
    third = lab04._folder_state(tmp_path)
    assert len({first, second, third}) == 3
    assert lab04._folder_state(tmp_path) == third


def test_q5_time_up_says_how_far_the_runs_got():
    """A slow machine is not an endless loop: the message says which, from the runs' own progress."""
    import time

    now = time.monotonic()
    busy = lab04._progress_text(CASE, {"first": list(range(1, CRASH + 1)), "second": [5, 6], "at": now - 2})
    assert f"The restart had reached step 6 of {CASE['steps']}" in busy and "the machine is probably busy" in busy
    stuck = lab04._progress_text(CASE, {"first": [1, 2], "at": now - 100})
    assert f"The first run had reached step 2 (the check stops it after step {CRASH})" in stuck
    assert "Nothing happened for the last 100 s" in stuck and ".repeat()" in stuck
    endless = lab04._progress_text(CASE, {"first": list(range(1, CRASH + 1)),
                                          "second": list(range(5, CASE["steps"] + 3)), "at": now})
    assert f"went on past step {CASE['steps']}" in endless
    assert "on_step was never called" in lab04._progress_text(CASE, {"first": []})
