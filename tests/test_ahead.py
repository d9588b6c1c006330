"""tests/ahead.py: one job ahead, in the tests' order, each job once, a job's error in its own test."""

import threading
import time
from types import SimpleNamespace

import pytest

from tests.ahead import Ahead


def fake_requests(params, name="test_x"):
    """The request object of each test of one parametrised function, as pytest gives them (the fields used)."""
    module = object()
    items = [SimpleNamespace(module=module, originalname=name, callspec=SimpleNamespace(params={"path": p}))
             for p in params]
    other = SimpleNamespace(module=module, originalname="test_other", callspec=SimpleNamespace(params={"path": 99}))
    notebook_cell = SimpleNamespace(name="Cell 3")  # an nbval item: no module, no originalname, no callspec
    session = SimpleNamespace(items=[notebook_cell, other, *items])
    return [SimpleNamespace(session=session, module=module, node=item) for item in items]


def settle(started, n, timeout=10.0):
    """``started`` once it has ``n`` entries (a submitted job's thread may take a moment to pick it up)."""
    deadline = time.monotonic() + timeout
    while len(started) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # and a moment more, in which a job too many would have started
    return list(started)


def test_the_next_job_runs_while_a_test_waits_for_its_own_and_no_further():
    started, running, most = [], [0], [0]
    lock = threading.Lock()

    def job(k):
        with lock:
            started.append(k)
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return k * 10

    ahead = Ahead(job, "path")
    requests = fake_requests([1, 2, 3, 4])
    try:
        assert ahead.result(requests[0]) == 10
        assert settle(started, 2) == [1, 2]  # the second test's job started with the first's, not the third's
        assert ahead.result(requests[1]) == 20 and settle(started, 3) == [1, 2, 3]
        assert [ahead.result(r) for r in requests[2:]] == [30, 40]
    finally:
        ahead.close()
    assert started == [1, 2, 3, 4] and most[0] == 2  # each job once; two at a time, never more


def test_a_shared_key_is_one_job_and_an_error_stays_in_its_test():
    calls = []

    def job(lab):
        calls.append(lab)
        if lab == "02":
            raise RuntimeError("lab 02's kernel died")
        return lab

    ahead = Ahead(job, "path", key=lambda p: p[:2])
    requests = fake_requests(["01a", "01b", "02a", "03a"])
    try:
        assert [ahead.result(r) for r in requests[:2]] == ["01", "01"]
        with pytest.raises(RuntimeError, match="lab 02's kernel died"):
            ahead.result(requests[2])
        assert ahead.result(requests[3]) == "03"
    finally:
        ahead.close()
    assert calls == ["01", "02", "03"]


def test_close_drops_the_jobs_not_started():
    started = []
    ahead = Ahead(lambda k: started.append(k) or k, "path")
    requests = fake_requests([1, 2, 3, 4])
    assert ahead.result(requests[0]) == 1
    ahead.close()  # as after `pytest -x` stops: job 2 may have run, 3 and 4 never start
    assert started[:1] == [1] and set(started) <= {1, 2}
