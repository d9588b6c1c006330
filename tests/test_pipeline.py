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
    assert {r["case"] for r in rows} >= {"naive", "tuned", "cache: epoch 2", "vectorised decode",
                                        "map that sleeps, 4 threads", "map that computes in Python, 4 threads"}
    for r in rows:
        assert set(r) == {"topic", "case", "median_s", "bound_s", "ratio_to_bound", "speedup", "note"}
        assert r["topic"] == "07 tf.data" and r["median_s"] > 0 and r["bound_s"] > 0 and r["ratio_to_bound"] > 0
    with pytest.raises(TypeError, match="quick"):
        pipeline.benchmark(quick="yes")
    with pytest.raises(TypeError, match="Pipeline"):
        pipeline.benchmark(workload={"n": 8})


# --------------------------------------------------------------------------- the pipeline builder (explorer)

FAST = pipeline.EXPLORER_WORKLOAD.replace(stages=(("decode", 0.0005),), per_call_s=0.001, read_s=0.0005,
                                          step_s=0.002)


def test_build_and_describe_pipeline():
    p = pipeline.build_pipeline()
    assert (p.prefetch, p.parallel_of("decode"), p.interleave, p.vectorise, p.batch, p.threads) == (
        False, None, None, False, 4, None)
    assert pipeline.describe_pipeline(p) == "shards.flat_map(read).map(decode).batch(4)"
    tuned = pipeline.build_pipeline(True, "AUTOTUNE", "4", True, True, 8, "8")
    assert tuned.step_s == pytest.approx(2 * pipeline.EXPLORER_WORKLOAD.step_s)  # the same cost per record
    assert pipeline.describe_pipeline(tuned) == (
        "shards.interleave(read, cycle_length=4, num_parallel_calls=4).batch(8)"
        ".map(decode, num_parallel_calls=AUTOTUNE).cache().prefetch(AUTOTUNE)  # private_threadpool_size=8")
    assert pipeline.describe_pipeline(Pipeline(parallel=2)) == (
        "records.map(load, num_parallel_calls=2).map(augment, num_parallel_calls=2)  # private_threadpool_size=16")
    for kwargs, exc, match in [({"parallel": "3"}, ValueError, "parallel must be one of"),
                               ({"interleave": 4}, ValueError, "interleave"), ({"batch": 3}, ValueError, "batch"),
                               ({"batch": True}, TypeError, "batch"), ({"threads": "32"}, ValueError, "threads"),
                               ({"prefetch": "yes"}, TypeError, "prefetch"),
                               ({"workload": {"n": 4}}, TypeError, "Pipeline")]:
        with pytest.raises(exc, match=match):
            pipeline.build_pipeline(**kwargs)
    with pytest.raises(TypeError, match="Pipeline"):
        pipeline.describe_pipeline("ds.map(f)")


def test_explore_pipeline_measures_against_both_bounds():
    naive = pipeline.explore_pipeline(workload=FAST)
    assert naive.figure is not None and naive.figure.axes[0].get_title().startswith("epoch: ")
    first = naive.text.splitlines()[0]
    assert "the bound of this pipeline" in first and "the best bound at this batch size" in first
    assert "decode ran 16 calls on 16 records; 4 steps" in naive.text
    view = pipeline.explore_pipeline(vectorise=True, cache=True, batch=8, workload=FAST, plot=False)
    assert view.figure is None and view.text.startswith("epoch 2 (from the cache)")
    assert "batch(8).map(decode).cache()" in view.text and "decode ran 2 calls on 16 records; 2 steps" in view.text
    best = pipeline._best_bound(pipeline.build_pipeline(workload=FAST))
    assert best == min(_bound_s(pipeline.build_pipeline(True, "AUTOTUNE", "4", False, v, workload=FAST))
                       for v in (False, True))


def test_pipeline_explorer_keeps_its_state_and_falls_back_to_text(monkeypatch, capsys):
    from gpucourse import explore

    ex = pipeline.pipeline_explorer(workload=FAST)
    assert [c.name for c in ex.controls] == ["prefetch", "parallel", "interleave", "cache", "vectorise", "batch",
                                             "threads"]
    view = ex.render({"prefetch": True, "parallel": "2"})
    assert "map(decode, num_parallel_calls=2).batch(4).prefetch(AUTOTUNE)" in view.text
    again = pipeline.pipeline_explorer(workload=FAST)  # the cell re-run: the same values come back
    assert again.values["prefetch"] is True and again.values["parallel"] == "2"
    assert explore.state_of("pipeline builder")["parallel"] == "2"
    monkeypatch.setenv("GPUCOURSE_STATIC", "1")
    assert again.show() is None
    out = capsys.readouterr().out
    assert out.count("Pipeline builder [") == 3 and "vectorise=True" in out  # current values, naive, tuned
    with pytest.raises(ValueError, match="parallel"):
        again.render({"parallel": "many"})


def test_read_autotune_budgets_from_tensorflow():
    """TensorFlow's own defaults (root_dataset.cc): cpu_budget = schedulable cores, ram_budget = free RAM / 2."""
    import tensorflow as tf

    got = pipeline.read_autotune_budgets()
    assert got["cpu_budget"] == got["schedulable_cores"] >= 1
    assert 0.3 < got["ram_budget_mb"] / got["free_ram_mb"] < 0.7  # free RAM moves a little in between
    opts = tf.data.Options()
    opts.autotune.cpu_budget, opts.autotune.ram_budget = 3, 10**9
    set_ = pipeline.read_autotune_budgets(tf.data.Dataset.range(4).with_options(opts))
    assert (set_["cpu_budget"], set_["ram_budget_mb"]) == (3, 1000)
    opts = tf.data.Options()
    opts.autotune.enabled = False
    off = pipeline.read_autotune_budgets(tf.data.Dataset.range(4).with_options(opts))
    assert off["cpu_budget"] is None and off["ram_budget_mb"] is None
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        pipeline.read_autotune_budgets([1, 2])


def test_keras_auto_jit_compile_is_true_on_a_gpu_only(monkeypatch):
    """The notebook pins jit_compile=False because Keras's "auto" turns XLA on wherever a GPU is visible."""
    import keras
    import tensorflow as tf

    def model():
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")  # jit_compile="auto"
        return m

    assert model().jit_compile is False  # this machine has no GPU
    real = tf.config.list_physical_devices
    fake_gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: real(kind) + ([fake_gpu] if kind in (None, "GPU") else []))
    assert model().jit_compile is True
