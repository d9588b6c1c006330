"""Lab 04 without a kernel: how the grader's first run of q5 (a fresh process it kills) is read and judged."""

import random

import pytest

from gpucourse.grading.items import Fail, KernelLost, ProcessKilled, RaisedInKernel
from gpucourse.labtests import lab04

CASE = lab04.q5.cases(random.Random(4))[0]
CRASH = CASE["crash_at"]


class FakeFresh:
    """``ns.fresh_process()`` without a kernel: its first launch calls on_step for each step, as ``behave`` says."""

    def __init__(self, behave):
        self.behave, self.killed, self.calls = behave, False, []

    def __call__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def kill(self):
        self.killed = True

    def kernel(self, fn, case, folder, on_step, restart):
        self.calls.append((fn, folder, restart))
        for k in range(1, self.behave.get("last", case["steps"]) + 1):
            if self.behave.get("raise_at") == k:
                raise self.behave["error"]
            on_step(k)
            if self.killed:
                raise ProcessKilled("killed")
        return {"losses": [], "weights": []}


class FakeNS:
    def __init__(self, fresh):
        self.fresh_process = fresh


def first_run(behave):
    fresh, steps = FakeFresh(behave), []
    seen = lab04._first_run_killed(FakeNS(fresh), CASE, "/tmp/ckpt", steps.append)
    return seen, steps, fresh


def test_the_first_run_is_a_fresh_process_killed_at_the_crash_step():
    seen, steps, fresh = first_run({})
    assert seen == {"first": "killed", "first_error": ""} and steps == list(range(1, CRASH + 1))
    assert fresh.killed and fresh.calls == [(lab04._q5_launch, "/tmp/ckpt", False)]


@pytest.mark.parametrize("error, first, message", [
    (RaisedInKernel({"type": "NotDefined", "mro": ["NotDefined", "NotImplementedError"], "message": "x"}),
     "missing", ""),
    (RaisedInKernel({"type": "ValueError", "mro": ["ValueError", "Exception"], "message": "no such folder"}),
     "raised", "ValueError: no such folder"),
    (KernelLost("the kernel stopped answering"), "died", "the kernel stopped answering"),
])
def test_how_a_first_run_that_was_not_killed_ended(error, first, message):
    seen, _, _ = first_run({"raise_at": 1, "error": error})
    assert (seen["first"], seen["first_error"]) == (first, message)


def test_a_first_run_that_stops_before_the_crash_step_finished():
    seen, steps, fresh = first_run({"last": CRASH - 1})
    assert seen == {"first": "finished", "first_error": ""} and steps == list(range(1, CRASH)) and not fresh.killed


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
    assert "(exit 1; MemoryError)" in judged(first="died", first_error="exit 1; MemoryError")
    assert "ended normally" in judged(first="finished", first_steps=list(range(1, CASE["steps"] + 1)))
    assert "a killed worker trains no further" in judged(first="went on")  # check()'s simulated kill


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
