"""gpucourse.latency: percentiles per batch size, throughput, and the batch a p99 budget allows (fake clock)."""

import pytest

from gpucourse import latency, timing


@pytest.fixture
def clock(monkeypatch):
    state = {"now": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: state["now"])
    return state


def fake_server(clock, base_s=0.001, per_example_s=0.0001, spike_every=50, spike_s=0.01, first_s=0.5):
    """A batch of b takes base + b * per_example; every `spike_every`-th call stalls; the first call traces."""
    def make_call(batch):
        calls = {"n": 0}

        def call():
            calls["n"] += 1
            t = first_s if calls["n"] == 1 else base_s + batch * per_example_s
            if calls["n"] > 1 and calls["n"] % spike_every == 0:
                t += spike_s
            clock["now"] += t
        return call
    return make_call


def test_measure_latency_percentiles_and_throughput(clock):
    table = latency.measure_latency(fake_server(clock), [1, 10, 100], calls=200, warmup=2)
    assert [r.batch for r in table.rows] == [1, 10, 100]
    r = table[10]
    assert r.p50_s == pytest.approx(0.002)                 # 1 ms + 10 * 0.1 ms
    assert r.p99_s == pytest.approx(0.012)                 # 4 stalls in 200 calls reach the 99th percentile
    assert r.first_call_s == pytest.approx(0.5)            # the warm-up call is kept apart
    assert r.throughput == pytest.approx(10 * 200 / (200 * 0.002 + 4 * 0.01))
    assert table[100].throughput > table[10].throughput > table[1].throughput  # bigger batches: more examples/s
    assert table[100].p50_s > table[1].p50_s                                  # ... bought with latency
    recs = table.records()
    assert recs[0]["p99_over_p50"] == pytest.approx(0.0111 / 0.0011)
    text = table.table()
    assert "p99/p50" in text and "examples/s" in text and "500.0 ms" in text
    with pytest.raises(KeyError, match="measured"):
        table[7]


def test_best_under_a_budget(clock):
    table = latency.measure_latency(fake_server(clock, spike_s=0.0), [1, 10, 100], calls=50, warmup=1)
    assert table.best_under(0.003).batch == 10   # batch 100 takes 11 ms
    assert table.best_under(1.0).batch == 100
    assert table.best_under(0.0005) is None
    with pytest.raises(ValueError, match="p99_budget_s"):
        table.best_under(0)


def test_plot(clock):
    import matplotlib

    matplotlib.use("Agg")
    table = latency.measure_latency(fake_server(clock), [1, 4], calls=10, warmup=1)
    left, right = table.plot(budget_s=0.002)
    assert left.get_xlabel() == "batch size" and right.get_xlabel() == "p99 latency (ms)"
    from tests.test_plots import tick_labels

    assert not [t for ax in (left, right) for t in tick_labels(ax) if "$" in t]  # plain numbers, no mathtext


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"make_call": 3}, TypeError, "make_call"), ({"batch_sizes": []}, ValueError, "batch_sizes"),
    ({"batch_sizes": [1, 1]}, ValueError, "duplicates"), ({"batch_sizes": [0]}, ValueError, "batch size"),
    ({"calls": 1}, ValueError, "calls"), ({"warmup": 0}, ValueError, "warmup"),
])
def test_bad_input(clock, kwargs, exc, match):
    args = {"make_call": fake_server(clock), "batch_sizes": [1], **kwargs}
    with pytest.raises(exc, match=match):
        latency.measure_latency(args.pop("make_call"), args.pop("batch_sizes"), **args)
