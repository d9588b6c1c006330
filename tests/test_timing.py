"""gpucourse.timing: warm-up, medians, interleaved comparisons and ratio tables."""

import time

import pytest

from gpucourse import timing


def test_time_fn_separates_first_call():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.005)

    t = timing.time_fn(work, warmup=1, repeats=5)
    assert len(calls) == 6 and len(t.times_s) == 5
    assert t.first_call_s > 0.04 and t.median_s < 0.03


def test_compare_ratios_and_bound():
    cmp = timing.compare({"slow": lambda: time.sleep(0.06), "fast": lambda: time.sleep(0.01)},
                         warmup=1, repeats=5, bound_s=0.01, items=10)
    assert cmp.baseline == "slow"
    assert 2.0 < cmp.speedup("fast") < 7.0  # 6x nominally; sleeps overshoot on a busy machine
    assert 0.9 < cmp.to_bound("fast") < 3.0
    table = cmp.table()
    assert "x vs slow" in table and "/ bound" in table and "(bound)" in table
    assert cmp["fast"].throughput > 0


def test_sync_forces_tensors():
    import tensorflow as tf

    class Lazy:
        synced = False

        def numpy(self):
            Lazy.synced = True

    timing.sync([Lazy(), {"a": tf.constant(1.0)}])
    assert Lazy.synced


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
