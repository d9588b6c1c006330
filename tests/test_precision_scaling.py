"""gpucourse.precision_scaling: flush fractions, the dynamic rule against a real optimizer, explorers, replicas.

The 2-replica behaviour itself (replica 0's verdict decides) is measured by
notebook 05's checked cell through ``replica_overflow_probe``.
"""

import math
import random

import numpy as np
import pytest

from gpucourse import precision_scaling as ps


@pytest.fixture(autouse=True)
def _agg(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("GPUCOURSE_STATIC", "1")
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_flush_fractions():
    g = np.array([1e-9, 1e-9, 1e-3, 0.0, 10.0])
    assert ps.flush_fractions(g, 1.0) == {"underflow": 0.5, "overflow": 0.0}
    assert ps.flush_fractions(g, 2.0 ** 15) == {"underflow": 0.0, "overflow": 0.2}
    assert ps.flush_fractions(g, 1.0, "bfloat16")["underflow"] == 0.0
    with pytest.raises(ValueError, match="scale"):
        ps.flush_fractions(g, 0)
    with pytest.raises(TypeError, match="scale"):
        ps.flush_fractions(g, "1")
    with pytest.raises(ValueError, match="finite"):
        ps.flush_fractions([1.0, np.inf])
    with pytest.raises(ValueError, match="empty"):
        ps.flush_fractions([])


def test_flatten_gradients():
    import tensorflow as tf

    grads = [tf.ones((2, 3)), None, np.zeros(4), tf.IndexedSlices(tf.constant([[5.0, 6.0]]), tf.constant([1]),
                                                                    tf.constant([3, 2]))]
    flat = ps.flatten_gradients(grads)
    assert flat.dtype == np.float64 and flat.size == 6 + 4 + 2 and flat.sum() == 6 + 11
    with pytest.raises(ValueError, match="no gradient entries"):
        ps.flatten_gradients([None])
    with pytest.raises(ValueError, match="finite"):
        ps.flatten_gradients([np.array([np.nan])])
    with pytest.raises(TypeError, match="list"):
        ps.flatten_gradients(3.0)


# --------------------------------------------------------------------------- the rule


def test_simulated_rule():
    steps = ps.simulate_loss_scale([True, True, True, False, True], initial_scale=8.0, growth_steps=3)
    assert [s.scale_after for s in steps] == [8.0, 8.0, 16.0, 8.0, 8.0]
    assert [s.applied for s in steps] == [True, True, True, False, True]
    assert [s.good_steps for s in steps] == [1, 2, 0, 0, 1]


def test_simulation_matches_real_optimizer():
    rnd = random.Random(5)
    for growth in (1, 2, 4):
        flags = [rnd.random() < 0.75 for _ in range(20)]
        sim = ps.simulate_loss_scale(flags, 2.0 ** 10, growth)
        real = ps.loss_scale_trace(flags, 2.0 ** 10, growth)
        assert sim == real, (growth, flags)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"finite": "TTF"}, TypeError, "list of booleans"),
    ({"finite": [1, 0]}, TypeError, "True/False"),
    ({"finite": [True], "initial_scale": 0}, ValueError, "initial_scale"),
    ({"finite": [True], "initial_scale": float("inf")}, ValueError, "initial_scale"),
    ({"finite": [True], "growth_steps": 0}, ValueError, "growth_steps"),
    ({"finite": [True], "growth_steps": 2.0}, TypeError, "growth_steps"),
])
def test_loss_scale_bad_input(kwargs, exc, match):
    for fn in (ps.simulate_loss_scale, ps.loss_scale_trace):
        with pytest.raises(exc, match=match):
            fn(**kwargs)


def test_scale_trajectory_climbs_to_the_ceiling_and_spikes_knock_it_down():
    peak = 1e-2  # ceiling: 65504 / 1e-2 ~ 2^22.6
    calm = ps.scale_trajectory(peak, initial_scale=2.0 ** 15, growth_steps=5, steps=200)
    scales = [s.scale_after for s in calm]
    # it doubles past the ceiling once (2^23), that step overflows and halves it back: never higher
    assert max(scales) == 2.0 ** 23 and scales[-1] in (2.0 ** 22, 2.0 ** 23)
    run_at = [2.0 ** 15] + scales[:-1]  # the scale each step ran with
    assert all(s.finite == (scale * peak <= 65504) for s, scale in zip(calm, run_at))
    assert all(s.finite == s.applied for s in calm) and sum(not s.finite for s in calm) >= 10
    # from too high a start, the first steps are skipped until the scale fits
    high = ps.scale_trajectory(peak, initial_scale=2.0 ** 30, growth_steps=5, steps=20)
    assert [s.finite for s in high[:8]] == [False] * 8 and high[7].scale_after == 2.0 ** 22
    spiky = ps.scale_trajectory(peak, 2.0 ** 10, growth_steps=1000, steps=100, spike_every=25, spike_factor=1e8)
    assert [s.step for s in spiky if not s.finite][:4] == [25, 50, 75, 100][:4]
    assert spiky[-1].scale_after == 2.0 ** 10 / 2 ** 4
    # the same flags give the same scales as the pure rule
    flags = [s.finite for s in spiky]
    assert [s.scale_after for s in ps.simulate_loss_scale(flags, 2.0 ** 10, 1000)] == [s.scale_after for s in spiky]
    with pytest.raises(ValueError, match="max_abs_grad"):
        ps.scale_trajectory(0.0)
    with pytest.raises(ValueError, match="spike_every"):
        ps.scale_trajectory(1.0, spike_every=-1)


# --------------------------------------------------------------------------- explorers (no browser needed)


def test_scale_view():
    sample = np.concatenate([np.full(90, 1e-9), np.full(10, 1.0)])
    low = ps.scale_view(sample, 0)
    assert "90.0% of the 100 non-zero" in low.text and "0.0% overflow" in low.text and low.figure is not None
    high = ps.scale_view(sample, 20)
    assert "0.0% of the 100" in high.text and "10.0% overflow" in high.text
    with pytest.raises(ValueError, match="log2_scale"):
        ps.scale_view(sample, 200)


def test_trajectory_view():
    view = ps.trajectory_view(1e-2, initial_log2=30, growth_steps=5, spike_every=0, steps=50)
    assert view.text.startswith("15 of 50 steps skipped (0 injected spikes)")  # 8 to come down, then 1 per 6
    assert "ceiling 2^22.6" in view.text and view.figure is not None
    spiky = ps.trajectory_view(1, initial_log2=14, growth_steps=100, spike_every=10, steps=50)
    assert spiky.text.startswith("5 of 50 steps skipped (5 injected spikes); final scale 2^9")


def test_explorers_render_and_remember(capsys):
    from gpucourse.explore import state_of

    sample = [np.full((4, 4), 1e-9), np.full(3, 1e-3)]
    ex = ps.loss_scale_explorer(sample)
    view = ex.render({"log2_scale": 30})
    assert "scale 2^30" in view.text and state_of("loss-scale")["log2_scale"] == 30
    assert ps.loss_scale_explorer(sample).values["log2_scale"] == 30  # re-running the cell keeps the state
    dyn = ps.dynamic_scale_explorer(sample, steps=60)
    assert "steps skipped" in dyn.render({"spike_every": 20}).text
    views = dyn.show_static()  # the fallback without widgets: current values plus presets
    assert len(views) >= 2 and "Dynamic loss scale" in capsys.readouterr().out
    with pytest.raises(ValueError, match="all zeros"):
        ps.dynamic_scale_explorer(np.zeros(3))


# --------------------------------------------------------------------------- replicas


def test_share_overflow_verdict_poisons_every_gradient_when_one_is_not_finite():
    import tensorflow as tf

    g_ok = [tf.ones(3), None, tf.constant([[2.0]])]
    out = ps.share_overflow_verdict(g_ok)  # the default strategy's replica context
    assert out[1] is None and np.array_equal(out[0].numpy(), np.ones(3)) and out[2].numpy()[0, 0] == 2.0
    bad = ps.share_overflow_verdict([tf.ones(3), tf.constant([np.inf, 1.0]),
                                     tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), tf.constant([4, 2]))])
    assert all(math.isinf(v) for v in bad[0].numpy()) and np.all(np.isinf(bad[2].values.numpy()))


def test_replica_overflow_probe_bad_input():
    """The probe itself runs in notebook 05's checked cell; here only its argument checks (no process started)."""
    with pytest.raises(ValueError, match="timeout"):
        ps.replica_overflow_probe(timeout=0)
    with pytest.raises(TypeError, match="background"):
        ps.replica_overflow_probe(background="yes")
