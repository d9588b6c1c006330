"""gpucourse.pipeline: bounds, the simulated workload, cache placement, options, benchmark rows.

Timing assertions are only made on sleep-based simulated work, where the ratios are structural,
and they are generous.
"""

import pytest

from gpucourse import pipeline
from gpucourse.pipeline import Costs, SimulatedWorkload, pipeline_bound

ZERO = Costs(read_s=0.0, decode_s=0.0, step_s=0.0, n=12, shards=3)


# --------------------------------------------------------------------------- bounds (no TensorFlow)


def test_pipeline_bound_is_fill_plus_slowest_stage():
    assert pipeline_bound(1, [(0.3, 1), (0.2, 1)]) == pytest.approx(0.5)
    assert pipeline_bound(10, [(0.03, 1), (0.01, 1)]) == pytest.approx(0.04 + 9 * 0.03)
    assert pipeline_bound(10, [(0.03, 3), (0.01, 1)]) == pytest.approx(0.04 + 9 * 0.01)
    assert pipeline_bound(5, [(0.0, 1)]) == 0.0


@pytest.mark.parametrize("n, stages, exc, match", [
    (0, [(0.1, 1)], ValueError, "n must be"),
    (2.5, [(0.1, 1)], ValueError, "n must be"),
    (3, [], TypeError, "non-empty"),
    (3, "abc", TypeError, "non-empty"),
    (3, [(0.1,)], TypeError, "pair"),
    (3, [(-0.1, 1)], ValueError, "seconds"),
    (3, [(0.1, 0)], ValueError, "parallelism"),
    (3, [(float("nan"), 1)], ValueError, "seconds"),
])
def test_pipeline_bound_bad_input(n, stages, exc, match):
    with pytest.raises(exc, match=match):
        pipeline_bound(n, stages)


def test_costs_bounds():
    c = Costs(read_s=0.02, decode_s=0.06, step_s=0.02, n=8, shards=4)
    assert c.serial_s == pytest.approx(0.8)
    assert c.bound() == pytest.approx(0.1 + 7 * 0.06)
    assert c.best_bound_s == pytest.approx(0.1 + 7 * 0.02)
    assert c.bound(read_parallelism=100, decode_parallelism=100) == pytest.approx(c.best_bound_s)
    assert c.bound(cached=True) == pytest.approx(8 * 0.02)
    v = Costs(read_s=0.0, decode_s=0.001, step_s=0.0, n=16, shards=1, call_s=0.01)
    assert v.bound(batch=8) < v.bound(batch=1)
    text = c.to_text()
    assert "bound" in text and "240 ms" in text and "800 ms" in text


@pytest.mark.parametrize("kwargs, match", [
    ({"read_s": -1}, "read_s"), ({"step_s": "fast"}, "step_s"), ({"n": 0}, "n must"),
    ({"n": 10, "shards": 4}, "evenly"), ({"shards": True}, "shards"), ({"call_s": float("inf")}, "call_s"),
])
def test_costs_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Costs(**kwargs)


def test_costs_bound_bad_input():
    with pytest.raises(TypeError, match="cached"):
        Costs().bound(cached="yes")
    with pytest.raises(ValueError, match="batch"):
        Costs().bound(batch=0)


def test_import_runs_no_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import pipeline\n"
                       "c = pipeline.Costs()\nprint(c.best_bound_s > 0, 'tensorflow' in sys.modules)")
    assert out.split() == ["True", "False"]


# --------------------------------------------------------------------------- the workload


def test_workload_elements_counts_and_timeline():
    import tensorflow as tf

    w = SimulatedWorkload(ZERO)
    for interleave in (None, 3):
        w.reset()
        ds = w.source(interleave=interleave).map(w.decode, num_parallel_calls=tf.data.AUTOTUNE)
        w.train(ds)
        assert sorted(w.delivered) == w.expected()
        assert (w.counts.reads, w.counts.decodes, w.counts.decode_calls, w.counts.steps) == (12, 12, 12, 12)
    lanes = {lane for lane, _, _ in w.timeline()}
    assert {"read #1", "decode #1", "train step #1"} <= lanes
    assert 0 < w.busy_fraction() <= 1.0
    with pytest.raises(ValueError, match="no events"):
        w.busy_fraction("nope")


def test_vectorised_decode_counts_calls_not_elements():
    w = SimulatedWorkload(ZERO)
    w.train(w.source(read=False).batch(4).map(w.decode))
    assert (w.counts.reads, w.counts.decodes, w.counts.decode_calls, w.counts.steps) == (0, 12, 3, 3)
    assert sorted(w.delivered) == w.expected()


def test_workload_bad_input():
    with pytest.raises(TypeError, match="Costs"):
        SimulatedWorkload({"read_s": 1})
    w = SimulatedWorkload(ZERO)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        w.train([1, 2, 3])
    with pytest.raises(ValueError, match="epochs"):
        w.train(w.source(), epochs=0)
    with pytest.raises(ValueError, match="interleave"):
        w.source(interleave=0)
    with pytest.raises(TypeError, match="read"):
        w.source(read="no")
    with pytest.raises(ValueError, match="nothing recorded"):
        SimulatedWorkload(ZERO).busy_fraction()


def test_cache_placement_by_counter_and_order():
    w = SimulatedWorkload(ZERO)
    cases = {
        "no cache": (w.source().map(w.decode).shuffle(12), 24, False),
        "cache before shuffle": (w.source().map(w.decode).cache().shuffle(12), 12, False),
        "cache before decode": (w.source().cache().map(w.decode).shuffle(12), 24, False),
        "cache last": (w.source().map(w.decode).shuffle(12).batch(4).prefetch(1).cache(), 12, True),
    }
    for name, (ds, decodes, frozen) in cases.items():
        w.reset()
        orders = pipeline.epoch_orders(ds, epochs=2)
        assert w.counts.decodes == decodes, name
        assert all(sorted(o) == w.expected() for o in orders), name
        if frozen:
            assert orders[0] == orders[1], name
    # shuffling after the cache gives a new order each epoch (12! orders: a repeat is practically impossible)
    ds = w.source().map(w.decode).cache().shuffle(12)
    orders = pipeline.epoch_orders(ds, epochs=3)
    assert len({tuple(o) for o in orders}) > 1
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        pipeline.epoch_orders([1, 2])
    with pytest.raises(ValueError, match="epochs"):
        pipeline.epoch_orders(ds, epochs=0)


def test_options():
    import tensorflow as tf

    opts = pipeline.naive_options()
    d = pipeline.describe_options(opts)
    assert d["inject_prefetch"] is False and d["autotune"] is False
    default = pipeline.describe_options(tf.data.Dataset.range(3))
    assert default["inject_prefetch"] is None and default["private_threadpool_size"] is None
    with pytest.raises(TypeError, match="Dataset or tf.data.Options"):
        pipeline.describe_options({"autotune": False})


def test_build_pipelines_deliver_the_same_elements():
    w = SimulatedWorkload(ZERO)
    pipes = pipeline.build_pipelines(w)
    assert list(pipes)[0] == "naive" and "tuned" in pipes
    for name, ds in pipes.items():
        w.train(ds)
        assert sorted(w.delivered) == w.expected(), name
    assert pipeline.describe_options(pipes["tuned"])["private_threadpool_size"] == pipeline.TUNED_POOL_THREADS
    assert pipeline.describe_options(pipes["naive"])["inject_prefetch"] is False
    with pytest.raises(TypeError, match="SimulatedWorkload"):
        pipeline.build_pipelines("w")


# --------------------------------------------------------------------------- structural timing (sleeps)


def test_prefetch_overlaps_and_naive_does_not():
    """Sleep-based: 10 x (30 ms produce + 30 ms step). Naive ~ 600 ms, overlapped ~ 330 ms."""
    import tensorflow as tf

    w = SimulatedWorkload(Costs(read_s=0.0, decode_s=0.03, step_s=0.03, n=10, shards=1))
    naive = w.source(read=False).map(w.decode).with_options(pipeline.naive_options())
    fast = w.source(read=False).map(w.decode).prefetch(tf.data.AUTOTUNE)
    w.train(naive), w.train(fast)  # warm up
    t_naive = w.train(naive)
    t_fast = min(w.train(fast) for _ in range(2))
    assert t_naive >= 0.9 * w.costs.serial_s
    assert t_fast <= 1.4 * w.costs.bound(decode_parallelism=1)
    assert t_naive / t_fast > 1.3


def test_benchmark_rows(monkeypatch):
    from gpucourse import timing

    real = timing.compare
    monkeypatch.setattr(timing, "compare", lambda c, **kw: real(c, **{**kw, "warmup": 0, "repeats": 1}))
    rows = pipeline.benchmark(quick=True, costs=Costs(read_s=0.001, decode_s=0.002, step_s=0.001))
    assert {r["case"] for r in rows} >= {"naive", "tuned", "cache: epoch 2", "vectorised decode"}
    for r in rows:
        assert set(r) == {"topic", "case", "median_s", "bound_s", "ratio_to_bound", "speedup", "note"}
        assert r["topic"] == "07 tf.data" and r["median_s"] > 0 and r["bound_s"] > 0 and r["ratio_to_bound"] > 0
    with pytest.raises(TypeError, match="quick"):
        pipeline.benchmark(quick="yes")
    with pytest.raises(TypeError, match="Costs"):
        pipeline.benchmark(costs={"n": 8})
