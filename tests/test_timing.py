"""gpucourse.timing: warm-up, medians, interleaved comparisons and ratio tables."""

import pytest

from gpucourse import timing


class FakeClock:
    """time.perf_counter stand-in: only the work advances it, by the seconds each call says."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def work(self, seconds):
        def fn():
            self.now += seconds() if callable(seconds) else seconds
        return fn


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_time_fn_separates_first_call(clock):
    durations = iter([0.5] + [0.01, 0.02, 0.03, 0.02, 0.01])
    t = timing.time_fn(clock.work(lambda: next(durations)), warmup=1, repeats=5, name="f", items=4)
    assert t.first_call_s == pytest.approx(0.5)
    assert t.times_s == pytest.approx([0.01, 0.02, 0.03, 0.02, 0.01])
    assert t.median_s == pytest.approx(0.02) and t.min_s == pytest.approx(0.01)
    assert t.spread == pytest.approx(1.0) and t.throughput == pytest.approx(200)
    assert "median 20.0 ms over 5 runs (first call 500.0 ms)" in str(t)


def test_compare_interleaves_and_gives_ratios(clock):
    order = []

    def work(name, seconds):
        def fn():
            order.append(name)
            clock.now += seconds
        return fn

    cmp = timing.compare({"slow": work("slow", 0.06), "fast": work("fast", 0.01)},
                         warmup=1, repeats=3, bound_s=0.005, items=10)
    assert order == ["slow", "fast"] * 4  # round-robin: noise hits both alike
    assert cmp.baseline == "slow"
    assert cmp.speedup("fast") == pytest.approx(6.0)
    assert cmp.to_bound("fast") == pytest.approx(2.0)
    table = cmp.table()
    assert "x vs slow" in table and "/ bound" in table and "(bound)" in table and "6.00x" in table
    assert cmp["fast"].throughput == pytest.approx(1000)
    assert [r["name"] for r in cmp.rows()] == ["slow", "fast"]


def test_sync_materialises_lazy_objects_and_returns_result():
    class Lazy:
        synced = False

        def numpy(self):
            Lazy.synced = True

    result = [Lazy(), {"a": 1.0}]
    assert timing.sync(result, "one_element") is result
    assert Lazy.synced


@pytest.mark.parametrize("types, synchronous, has_api, want", [
    (["CPU"], True, True, "one_element"),           # CPU, default mode: an op is done when it returns
    (["CPU", "GPU"], True, True, "sync_devices"),   # GPU kernels are queued on a stream
    (("CPU", "TPU"), True, True, "sync_devices"),
    (["CPU"], False, True, "sync_devices"),         # eager async mode queues every op
    (["CPU", "GPU"], True, False, "one_element"),   # TF without sync_devices: fetch one element
    (["CPU"], False, False, "one_element"),
])
def test_choose_sync(types, synchronous, has_api, want):
    assert timing.choose_sync(types, synchronous, has_api) == want


@pytest.mark.parametrize("args, exc", [(("GPU", True, True), TypeError), ((["CPU"], 1, True), TypeError),
                                       ((["CPU"], True, None), TypeError)])
def test_choose_sync_bad_input(args, exc):
    with pytest.raises(exc):
        timing.choose_sync(*args)


def test_sync_on_this_cpu_fetches_one_element_not_the_result(monkeypatch):
    import tensorflow as tf

    assert timing.sync_method() == "one_element"  # no GPU here, synchronous mode
    fetched = []
    real = timing._one_element
    monkeypatch.setattr(timing, "_one_element", lambda t: fetched.append(real(t).size))
    big = tf.ones((256, 1024))
    timing.sync({"a": big, "b": [tf.zeros((0,)), tf.ones((4, 4)), 3.0]})
    assert fetched == [1, 0, 16]  # 4 bytes copied for a 1 MiB result; small results whole


def test_sync_with_an_asynchronous_device_calls_sync_devices_once(monkeypatch):
    import tensorflow as tf

    calls = []
    monkeypatch.setattr(timing, "_device_types", lambda: ("CPU", "GPU"))  # a fake GPU machine
    monkeypatch.setattr(tf.test.experimental, "sync_devices", lambda: calls.append("sync"))
    monkeypatch.setattr(timing, "_one_element", lambda t: calls.append("copy"))
    assert timing.sync_method() == "sync_devices"
    timing.sync([tf.ones((4,)), tf.ones((4,))])
    timing.sync(None)  # work launched without a result is waited for too
    assert calls == ["sync", "sync"]
    t = timing.time_fn(lambda: tf.ones((4,)), warmup=1, repeats=3)
    assert calls.count("sync") == 6 and "copy" not in calls and len(t.times_s) == 3


def test_sync_bad_method():
    with pytest.raises(ValueError, match="method"):
        timing.sync(1.0, "numpy")


def test_percentile_matches_numpy():
    import numpy as np

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 301):
        values = list(rng.exponential(size=n))
        for q in (0, 1, 50, 90, 99, 100):
            assert timing.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert timing.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert timing.percentile([1.0, 2.0], 25) == 1.25


def test_timing_percentiles():
    t = timing.Timing("f", [float(i) for i in range(1, 101)])  # 1..100 s
    assert t.p50_s == pytest.approx(50.5) == t.median_s
    assert t.p99_s == pytest.approx(99.01)
    assert t.percentile(100) == 100.0


@pytest.mark.parametrize("values, q, exc", [([], 50, ValueError), ([1.0], 101, ValueError),
                                            ([1.0], -1, ValueError), ("12", 50, TypeError),
                                            ([1.0], "p99", TypeError), ({"a": 1.0}, 50, TypeError),
                                            ([1.0, "2"], 50, TypeError), ([1.0, float("nan")], 50, ValueError)])
def test_percentile_bad_input(values, q, exc):
    with pytest.raises(exc):
        timing.percentile(values, q)


@pytest.mark.parametrize("bad", [
    lambda: timing.time_fn(42),
    lambda: timing.time_fn(lambda: None, repeats=0),
    lambda: timing.time_fn(lambda: None, warmup=-1),
    lambda: timing.compare({}),
    lambda: timing.compare({"a": 1}),
    lambda: timing.compare({"a": lambda: None}, baseline="b"),
    lambda: timing.compare({"a": lambda: None}, bound_s=0),
])
def test_bad_input_is_a_clear_error(bad):
    with pytest.raises((TypeError, ValueError)):
        bad()


def test_format_seconds():
    assert timing.format_seconds(1.2e-5) == "12.0 µs"
    assert timing.format_seconds(0.0123) == "12.3 ms"
    assert timing.format_seconds(2.5) == "2.50 s"
    assert timing.format_seconds(float("nan")) == "n/a"


def test_missing_baseline_or_bound():
    cmp = timing.Comparison([timing.Timing("a", [1.0])])
    with pytest.raises(ValueError):
        cmp.speedup("a")
    with pytest.raises(ValueError):
        cmp.to_bound("a")
    with pytest.raises(KeyError):
        cmp["nope"]
