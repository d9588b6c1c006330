"""The trusted half of the timing items (gpucourse.grading.timeline): callbacks that pay the costs and stamp
the observer's clock, and the readings the judges of labs 07 and 08 take from their records."""

import threading
import time

import pytest

from gpucourse.grading.timeline import Timeline, delivered, device_summary, lineage, most_at_once, ran


def test_stage_sleeps_maps_and_records_concurrent_calls():
    line = Timeline()
    decode = line.stage("decode", 0.05, lambda v: 3 * v + 1)
    out = {}
    threads = [threading.Thread(target=lambda k=k: out.__setitem__(k, decode(k))) for k in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert out == {k: 3 * k + 1 for k in range(8)}
    recs = line.records()["stages"]
    assert sorted(r[1] for r in recs) == list(range(8)) and all(r[0] == "decode" for r in recs)
    assert all(r[4] - r[3] >= 0.05 for r in recs)  # each call paid its cost, on the observer's clock
    assert wall < 8 * 0.05 * 0.75 and most_at_once(line.records(), {"decode"}) >= 4  # ... in parallel
    assert ran(line.records(), "decode") == 8


def test_stage_takes_whole_numbers_only():
    decode = Timeline().stage("decode", 0.0, lambda v: v)
    with pytest.raises(TypeError, match="decode stage takes one whole number"):
        decode(1.5)
    with pytest.raises(TypeError, match="decode stage"):
        decode(True)


def test_device_runs_one_step_at_a_time_on_a_virtual_timeline():
    line = Timeline()
    step = line.device(0.03, queued=1)
    t0 = time.perf_counter()
    for v in range(4):  # fed as fast as the host can: each call returns when its step starts
        assert step(v) is False
    wall = time.perf_counter() - t0
    steps = line.records()["steps"]
    assert [s[0] for s in steps] == [0, 1, 2, 3]
    for (_, _, s0, e0), (_, arrived, s1, e1) in zip(steps, steps[1:]):
        assert e0 - s0 == pytest.approx(0.03) and s1 == max(arrived, e0)  # a step starts when the previous ends
    assert 3 * 0.03 <= wall < 4 * 0.03  # the host waited for the device to start each step, not to end it
    assert device_summary(line.records())["utilisation"] == pytest.approx(1.0)


def test_device_queued_0_holds_the_host_until_the_step_ends():
    line = Timeline()
    step = line.device(0.03, queued=0)
    t0 = time.perf_counter()
    step(7)
    assert time.perf_counter() - t0 >= 0.03
    assert line.records()["steps"][0][0] == 7
    with pytest.raises(ValueError, match="queued"):
        line.device(0.01, queued=2)


def test_after_the_deadline_stages_stop_sleeping_and_the_device_says_stop():
    line = Timeline(deadline_s=0.05)
    slow = line.stage("read", 10.0, lambda v: v + 1)
    step = line.device(0.01)
    time.sleep(0.06)
    t0 = time.perf_counter()
    assert slow(1) == 2 and time.perf_counter() - t0 < 1.0  # no 10 s sleep once the time is up
    assert step(2) is True
    rec = line.records()
    assert rec["stopped"] is not None and rec["steps"][0][0] == 2


def test_mark_records_the_first_call():
    line = Timeline()
    built = line.mark("built")
    built()
    first = line.records()["marks"]["built"]
    time.sleep(0.01)
    built()
    assert line.records()["marks"]["built"] == first


def _records(stages, steps):
    return {"stages": stages, "steps": steps, "marks": {}, "stopped": None}


def test_lineage_follows_each_element_back_through_its_stages_in_time():
    stages = [["read", 0, 10, 0.0, 0.1], ["decode", 10, 31, 0.1, 0.2],
              ["read", 1, 11, 0.0, 0.1], ["decode", 11, 34, 0.2, 0.3]]
    got = lineage(_records(stages, [[31, 0.25, 0.25, 0.3], [34, 0.35, 0.35, 0.4]]), ["read", "decode"])
    assert got == {"sources": [0, 1], "begun": [0.0, 0.0], "missing": None}
    # an element at the device before its decode ended: late
    early = lineage(_records(stages, [[34, 0.25, 0.25, 0.3]]), ["read", "decode"])
    assert early["missing"] == {"value": 34, "stage": "decode", "late": True}
    # a value no decode produced: missing
    assert lineage(_records(stages, [[99, 1.0, 1.0, 1.1]]), ["read", "decode"])["missing"]["late"] is False
    # a decode whose input no read produced in time
    bad = [["read", 0, 10, 0.0, 0.5], ["decode", 10, 31, 0.1, 0.2]]
    assert lineage(_records(bad, [[31, 0.3, 0.3, 0.4]]), ["read", "decode"])["missing"]["stage"] == "read"
    # batches: every value of a batch; a cached read serves later epochs
    cached = [["read", 0, 10, 0.0, 0.1], ["decode", 10, 31, 0.1, 0.2], ["decode", 10, 31, 0.5, 0.6]]
    got = lineage(_records(cached, [[[31], 0.3, 0.3, 0.4], [[31], 0.7, 0.7, 0.8]]), ["read", "decode"])
    assert got["missing"] is None and got["begun"] == [0.0, 0.0]


def test_device_summary_reads_startup_and_steady_utilisation():
    stages = [["load", 5, 6, 1.0, 1.05]]
    steps = [[6, 1.1, 1.1, 1.12], [6, 1.12, 1.12, 1.14], [6, 1.16, 1.16, 1.18]]  # 20 ms idle before step 3
    got = device_summary(_records(stages, steps))
    assert got["startup"] == pytest.approx(0.1) and got["steps"] == 3 and got["elements"] == 3
    assert got["utilisation"] == pytest.approx(0.04 / 0.06)
    assert device_summary(_records([], []))["startup"] is None


def test_delivered_flattens_batches():
    assert delivered(_records([], [[[1, 2], 0, 0, 0], [3, 0, 0, 0], [[[4]], 0, 0, 0]])) == [1, 2, 3, 4]
