"""Lab 04 without a kernel: how the grader's first run of q5 (a fresh process it kills) is read and judged."""

import random

import pytest

from gpucourse.grading.items import Fail, KernelLost, ProcessKilled, RaisedInKernel
from gpucourse.labtests import _lab04_judges as judges, _lab04_reference as reference, lab04

CASE = lab04.q5.cases(random.Random(4))[0]
CRASH, NOTICE, EVERY = CASE["crash_at"], CASE["notice_at"], CASE["save_every"]


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

    def kernel(self, fn, case, folder, preempted, on_step, restart):
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
    seen = lab04._first_run_killed(FakeNS(fresh), CASE, "/tmp/ckpt", steps.append, lambda k: k == NOTICE)
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
    base = {"first": "killed", "first_steps": list(range(1, CRASH + 1)), "first_error": "", "asked": [],
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


def q3_judged(replicas, loss, weights):
    case = lab04.q3.cases(random.Random(7))[0]
    seen = {"replicas": replicas, "steps": [{"loss": loss, "weights": [w.tolist() for w in weights]}]}
    with pytest.raises(Fail) as err:
        lab04.q3.judge(case, seen)
    return str(err.value)


def test_q3_names_each_heads_mistake_from_the_weights_even_when_the_loss_is_right():
    """The heads are independent: the update of each names its divisor, whatever the reported loss says."""
    case = lab04.q3.cases(random.Random(7))[0]
    rows = list(range(case["gbs"]))
    right, _ = reference.q3_reference(case, case["weights"], rows, 4)
    _, local_main = reference.q3_reference(case, case["weights"], rows, 4, main="local")
    msg = q3_judged(4, right, local_main)
    assert "the loss is right" in msg and "divided per replica by its own share" in msg
    assert "auxiliary loss" not in msg and "regularisation" not in msg
    _, per_replica_l2 = reference.q3_reference(case, case["weights"], rows, 4, aux="examples", l2="per_replica")
    msg = q3_judged(4, right, per_replica_l2)
    assert "averaged over all examples" in msg and "counted 4 times" in msg and "own share" not in msg


def test_q3_an_empty_replica_and_a_replica_without_labels_are_in_every_split():
    """5 examples per step: TensorFlow leaves a replica empty over 4 or 8 replicas, and the replica holding the
    fifth example alone (over 4) has no label, so local divisors are 0 there."""
    case = lab04.q3.cases(random.Random(3))[0]
    assert reference.tf_split(case["gbs"], 4) == [2, 2, 1, 0] and reference.tf_split(case["gbs"], 8)[-1] == 0
    for step in range(len(case["x"]) // case["gbs"]):
        labels = case["has_aux"][step * case["gbs"]:(step + 1) * case["gbs"]]
        assert labels[0] == 1.0 and labels[4] == 0.0
    import numpy as np

    nan = [np.full(np.shape(w), np.nan) for w in lab04.q3.cases(random.Random(7))[0]["weights"]]
    assert "became NaN" in q3_judged(4, float("nan"), nan)


def test_q3_reference_matches_one_device_on_the_whole_batch():
    """The right variant does not depend on the replica count: it is one device's step."""
    import numpy as np

    case = lab04.q3.cases(random.Random(5))[0]
    rows = list(range(case["gbs"]))
    one = reference.q3_reference(case, case["weights"], rows, 1)
    for replicas in (2, 3, 4, 8):
        loss, after = reference.q3_reference(case, case["weights"], rows, replicas)
        assert np.isclose(loss, one[0]) and all(np.allclose(a, b) for a, b in zip(after, one[1]))


def test_q2_deals_each_pipelines_batches_to_its_replicas_in_turn():
    case = {"pipelines": 2, "replicas": 4}
    pipes = [{"batches": [{"x": [i]} for i in (0, 1, 4, 5)]}, {"batches": [{"x": [i]} for i in (2, 3, 6)]}]
    assert reference.q2_steps(case, pipes) == [[[0], [1], [2], [3]], [[4], [5], [6], []]]
    assert reference.array_split(10, 4) == [3, 3, 2, 2] and reference.array_split(3, 4) == [1, 1, 1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_q2_and_q5_cases_test_what_they_claim(seed):
    """q2: the uneven global batches split differently by TensorFlow's rule; q5: the notice comes after a step
    that is not due, with a periodic checkpoint before it, and the kill before the next due step."""
    from gpucourse.distribute import replica_split

    for case in lab04.q2.cases(random.Random(seed)):
        if "gbs" in case and case["gbs"] % case["replicas"] and case["replicas"] > 2:
            assert replica_split(case["gbs"], case["replicas"]) != reference.array_split(case["gbs"], case["replicas"])
        if "n" in case:
            assert case["n"] % case["gbs"] and case["n"] > case["gbs"]
    c = lab04.q5.cases(random.Random(seed))[0]
    every, notice, kill, steps = c["save_every"], c["notice_at"], c["crash_at"], c["steps"]
    assert notice % every and notice > every and notice < kill < steps
    assert all(k % every for k in range(notice, kill + 1))


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
    busy = judges.progress_text(CASE, {"first": list(range(1, CRASH + 1)), "second": [5, 6], "at": now - 2})
    assert f"The restart had reached step 6 of {CASE['steps']}" in busy and "the machine is probably busy" in busy
    stuck = judges.progress_text(CASE, {"first": [1, 2], "at": now - 100})
    assert f"The first run had reached step 2 (the check stops it after step {CRASH})" in stuck
    assert "Nothing happened for the last 100 s" in stuck and ".repeat()" in stuck
    endless = judges.progress_text(CASE, {"first": list(range(1, CRASH + 1)),
                                          "second": list(range(5, CASE["steps"] + 3)), "at": now})
    assert f"went on past step {CASE['steps']}" in endless
    assert "on_step was never called" in judges.progress_text(CASE, {"first": []})


def test_q5_the_restart_gets_no_data_of_the_first_run():
    """A restart that read the first run's initial weights and targets from its case could replay that run in
    memory instead of restoring the checkpoint: it gets only the keys it needs."""
    calls = []

    class NS:
        fresh_process = None

        def function(self, name):
            return lambda *a: None

        def kernel(self, fn, *args):
            calls.append((fn, args))
            if fn is lab04._q5_folder:
                return "/tmp/nowhere"
            if fn is lab04._first_run_simulated:
                return {"first": "killed", "first_error": ""}
            return {"losses": [], "weights": []}

    lab04.q5.observe(NS(), CASE)
    (fn, args), = [c for c in calls if c[0] is lab04._q5_launch]
    assert args[-1] is True and set(args[0]) == set(lab04._RESTART_KEYS)
    assert not {"kernel", "y", "crash_at", "notice_at"} & set(args[0])


def _lab_stub():
    """The lab notebook's own train_resumable, as an untouched lab defines it."""
    import nbformat

    from tests.conftest import ROOT

    cell = next(c.source for c in nbformat.read(ROOT / "labs" / "04_distribution.ipynb", as_version=4).cells
                if c.cell_type == "code" and "def train_resumable" in c.source)
    scope: dict = {}
    exec(cell[cell.index("def train_resumable"):], scope)
    return scope["train_resumable"]


def _written(source: str):
    scope: dict = {}
    exec(source, scope)
    return scope["train_resumable"]


class StubNS:
    def __init__(self, fn):
        self.fn, self.fresh = fn, FakeFresh({})
        self.fresh_process = self.fresh

    def function(self, name):
        return self.fn

    def kernel(self, fn, *args):
        return fn(self, *args)


@pytest.mark.parametrize("fn, refused", [
    (_lab_stub(), True),
    (_written("def train_resumable(*a):\n    '''doc'''\n    raise NotImplementedError\n"), True),
    (_written("def train_resumable(*a):\n    print('start')\n    raise NotImplementedError('TODO')\n"), False),
    (_written("def train_resumable(*a):\n    raise ValueError('TODO')\n"), False),
    (_written("def train_resumable(*a):\n    return [a[0]]\n"), False),
], ids=["lab stub", "bare raise", "works, then raises", "other error", "written"])
def test_q5_only_an_untouched_stub_is_refused_before_the_fresh_process(fn, refused):
    """An untouched lab's q5 is 'not attempted' without the killed first run's fresh process (~5 s); a function
    that does anything else before it raises is run as usual."""
    ns = StubNS(fn)
    if refused:
        with pytest.raises(NotImplementedError):
            lab04._q5_refuse_a_stub(ns)
        with pytest.raises(NotImplementedError):
            lab04.q5.observe(ns, CASE)
        assert ns.fresh.calls == []
    else:
        lab04._q5_refuse_a_stub(ns)
