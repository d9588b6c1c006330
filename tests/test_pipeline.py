"""gpucourse.pipeline: the notebook's workload and variants, options, epoch orders, benchmark rows.

The simulated parts themselves are tested in test_simulate.py. Timing assertions are only made on
sleep-based simulated work, where the ratios are structural, and they are generous.
"""

import pytest

from gpucourse import pipeline
from gpucourse.simulate import Pipeline, _bound_s

ZERO = pipeline.WORKLOAD.replace(stages=(("decode", 0.0),), read_s=0.0, step_s=0.0, n=12, shards=3)


def test_import_runs_no_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import pipeline\n"
                       "print(len(pipeline.VARIANTS), 'tensorflow' in sys.modules)")
    assert out.split() == ["6", "False"]


def test_workload_and_variants_have_the_notebook_bounds():
    w = pipeline.WORKLOAD
    assert (w.n, w.shards, w.read_s, w.step_s, w.stages) == (8, 4, 0.02, 0.02, (("decode", 0.06),))
    bounds = {name: _bound_s(w.replace(**t)) for name, t in pipeline.VARIANTS.items()}
    assert bounds["naive"] == pytest.approx(0.8)
    assert bounds["TF default"] == bounds["+ prefetch"] == pytest.approx(0.66)
    assert bounds["+ parallel decode"] == bounds["tuned"] == pytest.approx(0.24)
    assert set(pipeline.NOTES) == set(pipeline.VARIANTS)
    assert pipeline.VARIANTS["tuned"]["threads"] == pipeline.TUNED_POOL_THREADS


def test_variants_deliver_the_same_elements():
    w = ZERO.workload()
    for name, toggles in pipeline.VARIANTS.items():
        w.run(**{**toggles, "interleave": 3} if "interleave" in toggles else toggles)
        assert sorted(w.delivered) == w.expected(), name
    assert pipeline.describe_options(w.build(**pipeline.VARIANTS["tuned"]))["private_threadpool_size"] == 8


def test_cache_placement_by_counter_and_order():
    w = ZERO.workload()
    decode = w.stage("decode")
    cases = {
        "no cache": (w.source().map(decode).shuffle(12), 24, False),
        "cache before shuffle": (w.source().map(decode).cache().shuffle(12), 12, False),
        "cache before decode": (w.source().cache().map(decode).shuffle(12), 24, False),
        "cache last": (w.source().map(decode).shuffle(12).batch(4).prefetch(1).cache(), 12, True),
    }
    for name, (ds, decodes, frozen) in cases.items():
        w.reset()
        orders = pipeline.epoch_orders(ds, epochs=2)
        assert w.counts["decode"] == decodes, name
        assert all(sorted(o) == w.expected() for o in orders), name
        if frozen:
            assert orders[0] == orders[1], name
    # shuffling after the cache gives a new order each epoch (12! orders: a repeat is practically impossible)
    ds = w.source().map(decode).cache().shuffle(12)
    assert len({tuple(o) for o in pipeline.epoch_orders(ds, epochs=3)}) > 1
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        pipeline.epoch_orders([1, 2])
    with pytest.raises(ValueError, match="epochs"):
        pipeline.epoch_orders(ds, epochs=0)
    with pytest.raises(TypeError, match="epochs"):
        pipeline.epoch_orders(ds, epochs=1.5)


def test_describe_options():
    import tensorflow as tf

    opts = tf.data.Options()
    opts.autotune.enabled = False
    d = pipeline.describe_options(tf.data.Dataset.range(3).with_options(opts))
    assert d["autotune"] is False and d["inject_prefetch"] is None and d["private_threadpool_size"] is None
    with pytest.raises(TypeError, match="Dataset or tf.data.Options"):
        pipeline.describe_options({"autotune": False})


def test_naive_pipeline_does_not_overlap_and_prefetch_does():
    """Sleep-based: 10 x (30 ms decode + 30 ms step). Naive ~ 600 ms, overlapped ~ 330 ms."""
    w = Pipeline(stages=(("decode", 0.03),), step_s=0.03, n=10, threads=None).workload()
    w.run(), w.run(prefetch=True)  # warm up
    naive = w.run()
    fast = min((w.run(prefetch=True) for _ in range(2)), key=lambda r: r.seconds)
    assert naive.bound_s == pytest.approx(0.6) and naive.seconds >= 0.95 * naive.bound_s
    assert fast.ratio <= 1.6 and naive.seconds / fast.seconds > 1.3


def test_benchmark_rows(monkeypatch):
    from gpucourse import timing

    real = timing.compare
    monkeypatch.setattr(timing, "compare", lambda c, **kw: real(c, **{**kw, "warmup": 0, "repeats": 1}))
    small = Pipeline(stages=(("decode", 0.002),), read_s=0.001, step_s=0.001, n=4, shards=4, threads=None)
    rows = pipeline.benchmark(quick=True, workload=small)
    assert {r["case"] for r in rows} >= {"naive", "tuned", "cache: epoch 2", "vectorised decode"}
    for r in rows:
        assert set(r) == {"topic", "case", "median_s", "bound_s", "ratio_to_bound", "speedup", "note"}
        assert r["topic"] == "07 tf.data" and r["median_s"] > 0 and r["bound_s"] > 0 and r["ratio_to_bound"] > 0
    with pytest.raises(TypeError, match="quick"):
        pipeline.benchmark(quick="yes")
    with pytest.raises(TypeError, match="Pipeline"):
        pipeline.benchmark(workload={"n": 8})
