"""The observer's end of the agent's connection (gpucourse.grading.grader.link): deadlines, a lost or killed kernel,
frames it cannot use, callbacks served in threads of their own."""

import socket
import threading
import time

import pytest

from gpucourse.grading import protocol
from gpucourse.grading.grader.link import CallTimeout, KernelLost, Link, ProcessKilled

from ..kernel.agent_harness import serve_in_process, serve_in_thread

KEY = b"a" * 32


def _soon(seconds=10.0):
    return time.monotonic() + seconds


def _call(link, name, *args, deadline=None):
    return link.call({"op": "call", "name": name, "args": link.pack(list(args)), "kwargs": {}},
                     deadline or _soon())


class FakeAgent:
    """The kernel's end written by hand: frames the real agent would never send."""

    def __init__(self):
        self.ours, self.theirs = socket.socketpair()
        reader = protocol.Reader({protocol.Role.AGENT: KEY})
        assert reader.feed(protocol.encode(KEY, 0, "hello", {"role": "agent", "token": "t"}))
        self.seq = 1
        self.link = Link(self.ours, reader, [], KEY)
        self.inbox = protocol.Reader({protocol.Role.AGENT: KEY}, role="agent")

    def send(self, kind, body, key=KEY):
        self.theirs.sendall(protocol.encode(key, self.seq, kind, body))
        self.seq += 1

    def receive(self):
        self.theirs.settimeout(10)
        while True:
            got = self.inbox.feed(self.theirs.recv(1 << 16))
            if got:
                return got

    def close(self):
        self.link.close()
        self.theirs.close()


@pytest.fixture
def fake():
    agent = FakeAgent()
    yield agent
    agent.close()


def test_a_call_past_its_deadline_raises_call_timeout():
    release = threading.Event()
    with serve_in_thread({"slow": lambda: release.wait(10)}) as (link, _, _):
        start = time.monotonic()
        with pytest.raises(CallTimeout):
            _call(link, "slow", deadline=time.monotonic() + 0.3)
        assert time.monotonic() - start < 3
        release.set()


def test_a_call_that_times_out_can_still_be_waited_for():
    release = threading.Event()
    with serve_in_thread({"slow": lambda: release.wait(10) and "done"}) as (link, _, _):
        with pytest.raises(CallTimeout) as timeout:
            _call(link, "slow", deadline=time.monotonic() + 0.2)
        release.set()
        assert link.wait(timeout.value.args[0], _soon())["ok"] == "done"


def test_a_kernel_that_dies_during_a_call_raises_kernel_lost_before_the_deadline():
    with serve_in_process() as (link, proc):
        start = time.monotonic()
        with pytest.raises(KernelLost) as lost:
            _call(link, "call_then_hang", proc.kill, deadline=_soon(30))  # it dies while the call runs
        assert type(lost.value) is KernelLost
        assert time.monotonic() - start < 10


def test_a_kernel_the_check_killed_from_its_callback_raises_process_killed():
    """As lab 04 q5 does: on_step, in the grader, kills the process that called it."""
    with serve_in_process() as (link, proc):
        def on_step():
            link.killed = True
            proc.kill()

        with pytest.raises(ProcessKilled):
            _call(link, "call_then_hang", on_step, deadline=_soon(30))


def test_a_call_to_a_kernel_the_check_killed_raises_process_killed():
    with serve_in_process() as (link, proc):
        link.killed = True
        proc.kill()
        proc.wait(10)
        assert link.closed.wait(10)
        with pytest.raises(ProcessKilled):
            _call(link, "answer")


def test_a_call_after_the_agent_stopped_raises_kernel_lost():
    with serve_in_thread({"f": lambda: 1}) as (link, thread, _):
        link.stop()
        thread.join(5)
        assert link.closed.wait(5)
        with pytest.raises(KernelLost):
            _call(link, "f")


def test_a_frame_with_a_wrong_mac_from_the_agent_raises_kernel_lost_naming_it(fake):
    fake.send("result", {"id": 1, "ok": 1}, key=b"x" * 32)
    with pytest.raises(KernelLost, match="broken frame.*wrong MAC"):
        _call(fake.link, "f", deadline=_soon(5))


def test_a_result_frame_the_grader_cannot_use_raises_kernel_lost_naming_it(fake):
    fake.send("result", {"id": [1], "ok": 1})  # signed, but an id that is not a number
    with pytest.raises(KernelLost, match="cannot use"):
        _call(fake.link, "f", deadline=_soon(5))


def test_the_first_result_for_a_call_is_its_answer(fake):
    answer = {}
    caller = threading.Thread(target=lambda: answer.update(_call(fake.link, "f")))
    caller.start()
    (kind, body), = fake.receive()
    fake.send("result", {"id": body["id"], "ok": "first"})
    fake.send("result", {"id": body["id"], "ok": "second"})
    caller.join(10)
    assert answer["ok"] == "first"


def test_a_callback_the_grader_never_handed_over_is_refused(fake):
    fake.send("callback", {"cb": 7, "fn": 99, "args": [], "kwargs": {}})
    (kind, body), = fake.receive()
    assert (kind, body["cb"], body["raise"]["type"]) == ("reply", 7, "RuntimeError")


def test_callbacks_are_served_concurrently_each_in_a_thread_of_its_own():
    barrier = threading.Barrier(3, timeout=5)

    def stage(i):
        barrier.wait()  # returns only when three calls are in the observer at once
        return i * 10

    def learner(cb):
        out = [None] * 3
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, cb(i))) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    with serve_in_thread({"learner": learner}) as (link, _, _):
        assert _call(link, "learner", stage)["ok"] == [0, 10, 20]


def test_a_callback_runs_in_the_observers_process_with_the_learners_arguments():
    seen = []

    def on_step(*args, **kwargs):
        seen.append((threading.current_thread().name, args, kwargs))

    with serve_in_thread({"learner": lambda cb: cb(1, "two", three=[3])}) as (link, _, _):
        _call(link, "learner", on_step)
    assert seen == [("gpucourse-callback", (1, "two"), {"three": [3]})]


def test_pack_turns_functions_into_callback_ids_and_leaves_classes_as_data(fake):
    def f():
        pass

    packed = fake.link.pack({"fn": f, "nested": [(f, 1)], 2: int})
    assert packed["fn"] == {"__callback__": packed["fn"]["__callback__"]}
    assert packed["nested"] == [[{"__callback__": packed["nested"][0][0]["__callback__"]}, 1]]
    assert packed["2"]["__type__"] == "builtins.type"
    assert fake.link._callbacks[packed["fn"]["__callback__"]] is f


def test_calls_counts_each_call_answered_and_not_one_that_timed_out():
    """The tripwire's looks are checked against this count (two per answered call): a call that timed out may
    lack its second look, and must not make an honest kernel look silenced."""
    import time

    with serve_in_thread({"f": lambda: 1, "slow": lambda: time.sleep(2)}) as (link, _, _):
        for _ in range(3):
            _call(link, "f")
        with pytest.raises(CallTimeout):
            link.call({"op": "call", "name": "slow", "args": [], "kwargs": {}}, time.monotonic() + 0.2)
        assert link.calls == 3
