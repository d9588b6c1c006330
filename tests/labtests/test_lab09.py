"""Lab 09 q5 without TensorFlow: the check's device queue, and its judge on a fake device whose run() returns before
the op has finished, as a GPU's does (the GPU path with fakes: the device it picks, the sizes, the wait for
kernels)."""

import random
import time

import pytest

from gpucourse.labtests import lab09


class _FakeExperimental:
    def __init__(self, log):
        self.log = log

    def sync_devices(self):
        self.log.append("sync_devices")


class _FakeTF:
    """The few TensorFlow calls q5 makes outside its ops, recorded."""

    def __init__(self, gpus=0):
        self.log, self.gpus = [], gpus
        self.test = type("test", (), {"experimental": _FakeExperimental(self.log)})()
        self.config = type("config", (), {"list_logical_devices": lambda _, kind: ["GPU"] * self.gpus
                                          if kind == "GPU" else ["CPU"]})()

    def device(self, name):
        log = self.log

        class Scope:
            def __enter__(self):
                log.append(f"on {name}")

            def __exit__(self, *exc):
                return False

        return Scope()


@pytest.mark.parametrize("gpus, device", [(0, "CPU:0"), (1, "GPU:0")])
def test_q5_runs_on_the_first_gpu_when_there_is_one(gpus, device):
    assert lab09._q5_device(_FakeTF(gpus)) == device
    sizes = lab09._q5_sizes(bool(gpus))
    spec = lab09._q5_spec({"kind": "matmul", "u": [0.0, 0.5, 1.0]}, device)
    assert sizes["matmul"][0] <= min(spec["m"], spec["n"], spec["k"]) <= max(spec["m"], spec["n"], spec["k"]) \
        <= sizes["matmul"][1]


@pytest.mark.parametrize("device, waits", [("CPU:0", False), ("GPU:0", True)])
def test_q5_a_call_on_a_gpu_ends_when_its_kernels_have_finished(device, waits):
    tf = _FakeTF(device.startswith("GPU"))
    lab09._q5_runner(tf, lambda: tf.log.append("op"), device)()
    assert tf.log == [f"on {device}", "op"] + (["sync_devices"] if waits else [])


def _fake_op(seconds):
    return lambda: time.sleep(seconds)


def test_q5_queue_runs_calls_in_order_after_run_returns():
    queue = lab09._DeviceQueue(_fake_op(0.05), 0.2, time.sleep, time.perf_counter)
    start = time.perf_counter()
    for _ in range(3):
        queue.run()
    launched = time.perf_counter() - start
    queue.sync()
    waited = time.perf_counter() - start
    queue.close()
    assert launched < 0.05 and waited >= 0.2 + 3 * 0.05  # run() returns at once; sync() waits for all three
    (s0, e0), (s1, e1), (s2, e2) = queue.done
    assert e0 <= s1 and e1 <= s2 and e0 - s0 >= 0.25 and e2 - s2 >= 0.05  # in order; the first call is slow


def _learner(warmup=True, sync_after=True, repeats=5):
    def measure_roof(run, sync, flops, nbytes, peak_tflops, bandwidth_gbs):
        if warmup:
            run()
            sync()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        if sync_after:
            sync()
        seconds = (time.perf_counter() - start) / repeats
        if not sync_after:
            sync()
        tflops, gbs = flops / seconds / 1e12, nbytes / seconds / 1e9
        shares = {"compute": tflops / peak_tflops, "memory": gbs / bandwidth_gbs}
        top = max(shares, key=shares.get)
        return {"seconds": seconds, "tflops": tflops, "gbs": gbs,
                "bound": top if shares[top] >= lab09.OVERHEAD_SHARE else "overhead"}

    return measure_roof


def _judge(learner, op_s=0.02, flops=2.5e9, nbytes=4e7):
    roof = {"peak_tflops": 0.25, "bandwidth_gbs": 10.0}  # the fake op reaches half the compute roof
    seen = lab09._q5_time_learner(learner, _fake_op(op_s), 0.1, flops, nbytes, roof)
    case = {"kind": "matmul", "u": [0.5] * 3, "first_call_s": 0.1}
    lab09.q5.judge(case, {"device": "GPU:0", "op": {"kind": "matmul", "m": 1, "n": 1, "k": 1}, **seen})


def test_q5_judge_on_a_fake_asynchronous_device():
    _judge(_learner())  # warm-up, repeats, then sync(): passes
    with pytest.raises(AssertionError, match="shorter than any call of the op took"):
        _judge(_learner(sync_after=False))  # the clock stopped before sync(): it timed the launches
    with pytest.raises(AssertionError, match="longer than any call after the first"):
        _judge(_learner(warmup=False))  # the first call, which prepares the op, in the mean


def test_q5_a_fabricated_time_fails():
    def roofline_time(run, sync, flops, nbytes, peak_tflops, bandwidth_gbs):
        run(), run(), sync()
        seconds = max(flops / peak_tflops / 1e12, nbytes / bandwidth_gbs / 1e9)  # the roofline's time
        return {"seconds": seconds, "tflops": flops / seconds / 1e12, "gbs": nbytes / seconds / 1e9,
                "bound": "compute"}

    with pytest.raises(AssertionError, match="shorter than any call of the op took"):
        _judge(roofline_time)


def test_q5_cases_cover_the_three_bounds():
    for seed in range(20):
        cases = lab09.q5.cases(random.Random(seed))
        assert sorted(c["kind"] for c in cases) == ["copy", "matmul", "tiny"]
        assert all(lab09.FIRST_CALL_S[0] <= c["first_call_s"] <= lab09.FIRST_CALL_S[1] for c in cases)


def test_q5_queue_abort_waits_for_nothing():
    """When the item's time is up the check drops the queued calls: the thread ends after the one it runs."""
    queue = lab09._DeviceQueue(_fake_op(0.1), 0.0, time.sleep, time.perf_counter)
    for _ in range(20):
        queue.run()
    start = time.perf_counter()
    queue.abort()
    queue.thread.join(5)
    assert not queue.thread.is_alive() and time.perf_counter() - start < 0.5 and len(queue.done) <= 2
