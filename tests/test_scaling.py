"""gpucourse.scaling: the compute-vs-all-reduce model, its inputs, calibration, measured rows and the explorer."""

import math

import pytest

from gpucourse import scaling as S


def test_allreduce_follows_the_ring_formula():
    assert S.allreduce_seconds(16e9, 1, 16e9, latency_s=1.0) == 0.0
    assert S.allreduce_seconds(16e9, 2, 16e9) == pytest.approx(1.0)  # 2(N-1)/N = 1
    assert S.allreduce_seconds(16e9, 4, 16e9) == pytest.approx(1.5)
    assert S.allreduce_seconds(16e9, 8, 16e9) == pytest.approx(1.75)
    assert S.allreduce_seconds(0, 4, 16e9, latency_s=1e-5) == pytest.approx(6e-5)  # 2(N-1) latencies


def test_train_flops_is_six_per_parameter_and_example():
    assert S.train_flops(1000, 64) == 6 * 1000 * 64
    assert S.train_flops(10, 0) == 0


def test_predict_step_separate_and_shared_devices():
    p = S.predict_step(2.0, 1.0, 4, overhead_s=1.0)
    assert (p.step_s, p.single_s, p.same_batch_s) == (4.0, 3.0, 9.0)
    assert p.efficiency == pytest.approx(0.75) and p.throughput_gain == pytest.approx(3.0)
    assert p.speedup == pytest.approx(9.0 / 4.0) and p.comm_to_compute == pytest.approx(0.5)
    shared = S.predict_step(2.0, 1.0, 4, overhead_s=1.0, shared=True)
    assert shared.step_s == 4 * 3.0 + 1.0 and shared.efficiency < 1 / 4 and shared.speedup < 1
    hidden = S.predict_step(2.0, 1.0, 4, overhead_s=1.0, overlap=1.0)
    assert hidden.step_s == 3.0 and hidden.efficiency == 1.0
    one = S.predict_step(2.0, 5.0, 1)
    assert one.allreduce_s == 0 and one.efficiency == 1.0 and one.speedup == 1.0


def test_pays_exactly_when_compute_outweighs_the_allreduce():
    # (N-1) * compute > allreduce  <=>  speedup over one device on the same global batch > 1
    for n, c, a in [(2, 1.0, 0.9), (2, 1.0, 1.1), (4, 1.0, 2.9), (4, 1.0, 3.1), (8, 0.1, 0.5)]:
        p = S.predict_step(c, a, n, overhead_s=0.3)
        assert (p.speedup > 1) == ((n - 1) * c > a)


def test_break_even_batch_is_where_the_speedup_crosses_one():
    prof = S.datasheet_profile("2x T4", S.DEVICES["T4 fp32"], S.LINKS["PCIe 3.0 x16"], kernels=40)
    for params in (10**5, 10**7):
        b = S.break_even_batch(prof, params, 2)
        assert S.predict(prof, params, math.ceil(b * 1.01), 2).speedup > 1 > S.predict(prof, params, int(b * 0.99), 2).speedup
    # With no latency, the parameter count cancels: only the batch against FLOPs per link byte matters.
    flat = S.Profile("no latency", 4e12, 16e9)
    assert S.break_even_batch(flat, 10**5, 2) == pytest.approx(S.break_even_batch(flat, 10**9, 2))
    assert S.break_even_batch(flat, 10**6, 2) == pytest.approx(4 * 4e12 / (3 * 2 * 16e9))
    assert S.break_even_batch(S.Profile("logical CPUs", 1e10, 1e9, shared=True), 10**6, 2) == math.inf


def test_datasheet_numbers_carry_their_sources():
    assert S.DEVICES["T4 fp32"].flops == 8.1e12 and "T4 datasheet" in S.DEVICES["T4 fp32"].source
    assert S.DEVICES["A100 tf32"].flops == 156e12 and "sparsity" in S.DEVICES["A100 tf32"].source
    assert S.LINKS["PCIe 3.0 x16"].bytes_per_s == 16e9 and S.LINKS["NVLink 3"].bytes_per_s == 300e9
    prof = S.datasheet_profile("2x T4", S.DEVICES["T4 fp32"], S.LINKS["PCIe 3.0 x16"], utilization=0.25,
                               kernels=10, launch_s=4e-6, latency_s=2e-5)
    assert prof.flops == pytest.approx(8.1e12 / 4) and prof.overhead_s == pytest.approx(4e-5)
    assert prof.latency_s == 2e-5 and not prof.shared
    assert "T4 datasheet" in prof.source and "assumed: 25% of peak, 10 kernels x 4 us" in prof.source


def test_calibrate_recovers_overhead_and_rates_and_reproduces_the_measurement():
    # A synthetic machine: overhead 1 ms, compute 0.5 ms per 64 examples, all-reduce of 400 kB in 2 ms on 4.
    prof = S.calibrate("here", params=100_000, per_replica_batch=64, step_s=1.5e-3, big_step_s=1e-3 + 4 * 0.5e-3,
                       big_factor=4, allreduce_s={2: 1.5e-3, 4: 2e-3}, bytes_per_step=400_000, shared=True)
    assert prof.overhead_s == pytest.approx(1e-3) and prof.shared
    assert prof.flops == pytest.approx(6 * 100_000 * 64 / 0.5e-3)
    p = S.predict(prof, 100_000, 64, 4)
    assert p.compute_s == pytest.approx(0.5e-3) and p.allreduce_s == pytest.approx(2e-3)
    assert p.step_s == pytest.approx(4 * 1.5e-3 + 2e-3)
    assert "measured here" in prof.source
    under_strategy = S.calibrate("here", params=100_000, per_replica_batch=64, step_s=1.5e-3, big_step_s=3e-3,
                                 big_factor=4, allreduce_s={4: 2e-3}, bytes_per_step=400_000, shared=True,
                                 replica_step_s=2.5e-3)
    assert under_strategy.overhead_s == pytest.approx(2e-3)


def test_count_kernels_skips_plumbing_ops():
    class Op:
        def __init__(self, kind):
            self.type = kind

    class Graph:
        def get_operations(self):
            return [Op(k) for k in ("Placeholder", "ReadVariableOp", "MatMul", "BiasAdd", "Relu", "Const",
                                    "ResourceApplyGradientDescent", "Identity", "NoOp")]

    assert S.count_kernels(Graph()) == 4
    with pytest.raises(TypeError, match="graph"):
        S.count_kernels("graph")


@pytest.mark.parametrize("call, exc, match", [
    (lambda: S.allreduce_seconds(1e6, 0, 1e9), ValueError, "replicas must be >= 1"),
    (lambda: S.allreduce_seconds(1e6, 2, 0), ValueError, "bytes_per_s must be > 0"),
    (lambda: S.predict_step(-1.0, 0.0, 2), ValueError, "compute_s must be >= 0"),
    (lambda: S.predict_step(0.0, 0.0, 2), ValueError, "a step that costs nothing"),
    (lambda: S.predict_step(1.0, 0.0, 2, overlap=1.5), ValueError, "overlap must be <= 1"),
    (lambda: S.predict_step(1.0, 0.0, 2, shared="yes"), TypeError, "shared"),
    (lambda: S.predict("T4", 10, 10, 2), TypeError, "scaling.Profile"),
    (lambda: S.Profile("x", 0, 1e9), ValueError, "flops must be > 0"),
    (lambda: S.datasheet_profile("x", S.DEVICES["T4 fp32"], S.LINKS["NVLink 3"], utilization=0), ValueError,
     "utilization must be > 0"),
    (lambda: S.datasheet_profile("x", "T4", S.LINKS["NVLink 3"]), TypeError, "scaling.DEVICES"),
    (lambda: S.break_even_batch(S.Profile("x", 1e12, 1e9), 10, 1), ValueError, "replicas must be >= 2"),
    (lambda: S.calibrate("x", params=1, per_replica_batch=1, step_s=1, big_step_s=2, big_factor=2,
                         allreduce_s={}, bytes_per_step=4, shared=True), ValueError, "allreduce_s"),
])
def test_bad_input_is_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_scaling_rows_and_table():
    rows = S.scaling_rows({4: 300.0, 1: 100.0, 2: 180.0})
    assert [r["replicas"] for r in rows] == [1, 2, 4]
    assert [r["ideal"] for r in rows] == [1, 2, 4]
    assert rows[1]["speedup"] == pytest.approx(1.8) and rows[2]["efficiency"] == pytest.approx(0.75)
    text = S.scaling_table(rows)
    assert "efficiency" in text and "75%" in text and "4.00x" in text and "predicted" not in text
    text = S.scaling_table(rows, predicted={2: 0.5, 4: 0.25})
    assert "predicted" in text and "25%" in text and "n/a" in text
    for bad in ({}, {0: 1.0}, {1: -3.0}, {1: float("nan")}, [1, 2]):
        with pytest.raises((ValueError, TypeError)):
            S.scaling_rows(bad)
    with pytest.raises(ValueError, match="scaling_rows"):
        S.scaling_table([{"replicas": 1}])


def test_explorer_update_predicts_and_draws_measured_points_only_where_measured():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    here = S.Profile("this machine", 2e10, 2e9, overhead_s=1e-3, shared=True)
    t4 = S.datasheet_profile("2x T4", S.DEVICES["T4 fp32"], S.LINKS["PCIe 3.0 x16"], kernels=40)
    update = S.scaling_update({"this machine": here, "2x T4": t4}, measured={1: 1.0, 2: 0.9, 4: 1.1},
                              measured_on="this machine")
    view = update(replicas=2, per_replica_batch=64, params_m=0.1, machine="this machine")
    assert "does not pay" in view.text and "weak-scaling efficiency" in view.text
    assert any(line.get_marker() == "o" for line in view.figure.axes[0].get_lines())
    plt.close(view.figure)
    big = update(replicas=2, per_replica_batch=1024, params_m=100, machine="2x T4")
    assert " pays" in big.text and "does not pay" not in big.text
    assert not any(line.get_marker() == "o" for line in big.figure.axes[0].get_lines())
    plt.close(big.figure)
    small = update(replicas=2, per_replica_batch=64, params_m=0.1, machine="2x T4")
    assert "does not pay" in small.text
    plt.close(small.figure)
    with pytest.raises(ValueError, match="machine must be one of"):
        update(machine="TPU")
    with pytest.raises(ValueError, match="profiles must be a non-empty dict"):
        S.scaling_update({})
    with pytest.raises(TypeError, match="profiles"):
        S.scaling_update({"cpu": "fast"})


def test_scaling_explorer_controls_on_change_state_and_static_fallback(monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpucourse import explore

    here = S.Profile("this machine", 2e10, 2e9, overhead_s=1e-3, shared=True)
    t4 = S.datasheet_profile("2x T4", S.DEVICES["T4 fp32"], S.LINKS["PCIe 3.0 x16"], kernels=40)
    machines = {"this machine": here, "2x T4": t4}
    ex = S.scaling_explorer(machines, measured={1: 1.0, 2: 0.9}, replicas=2, per_replica_batch=48, params=12_345)
    assert [c.name for c in ex.controls] == ["replicas", "per_replica_batch", "params_m", "machine"]
    assert ex.values == {"replicas": 2, "per_replica_batch": 48, "params_m": 0.012, "machine": "this machine"}
    assert 48 in ex.controls[1].options and 0.012 in ex.controls[2].options  # the notebook's own model offered
    view = ex.render({"machine": "2x T4", "per_replica_batch": 1024, "params_m": 100.0})  # one on-change call
    assert view.text.startswith("2x T4, 100M parameters, 1024 examples per replica") and " pays" in view.text
    assert not any(line.get_marker() == "o" for line in view.figure.axes[0].get_lines())  # measured elsewhere
    plt.close(view.figure)
    again = S.scaling_explorer(machines, measured={1: 1.0, 2: 0.9}, replicas=2, per_replica_batch=48, params=12_345)
    assert again.values["machine"] == "2x T4" and explore.state_of("scaling-model")["per_replica_batch"] == 1024
    mine = again.render({"machine": "this machine"})  # measured_on defaults to the first machine
    assert any(line.get_marker() == "o" for line in mine.figure.axes[0].get_lines())
    plt.close(mine.figure)
    with pytest.raises(ValueError, match="machine must be one of"):
        again.render({"machine": "TPU"})
    monkeypatch.setenv("GPUCOURSE_STATIC", "1")
    monkeypatch.setattr(explore, "_display", lambda obj: None)
    assert again.show() is None
    out = capsys.readouterr().out
    assert out.count("Data-parallel scaling model [") == 3  # current values, then the two 2x T4 presets
    assert "machine=2x T4" in out and "params_m=100.0" in out
    with pytest.raises(TypeError, match="machines must be"):
        S.scaling_explorer({"x": "T4"})
    with pytest.raises(ValueError, match="replicas must be <= 8"):
        S.scaling_explorer(machines, replicas=9)


def test_bus_bandwidth_is_nccl_tests_busbw_and_the_model_reaches_the_peak_only_for_large_messages():
    # nccl-tests: busbw = algbw * 2 (N-1)/N, algbw = bytes / time
    assert S.bus_bandwidth(1e9, 4, 0.1) == pytest.approx(1e10 * 2 * 3 / 4)
    assert S.bus_bandwidth(1e9, 2, 0.1) == pytest.approx(1e10)
    # the ring model's all-reduce, measured back as busbw, is the link peak B reduced by 1 / (1 + N L B / S)
    B, L = 16e9, 10e-6
    for n in (2, 4, 8):
        for size in (1e3, 332e3, 6.08e6, 4e8):
            fraction = S.bus_bandwidth(size, n, S.allreduce_seconds(size, n, B, L)) / B
            assert fraction == pytest.approx(1 / (1 + n * L * B / size))
    assert S.bus_bandwidth(19 * 2 * L * B, 2, S.allreduce_seconds(19 * 2 * L * B, 2, B, L)) / B == pytest.approx(0.95)
    assert S.bus_bandwidth(4e8, 2, S.allreduce_seconds(4e8, 2, B, 0.0)) == pytest.approx(B)  # no latency: the peak
    with pytest.raises(ValueError, match="replicas"):
        S.bus_bandwidth(1e6, 1, 0.1)
    with pytest.raises(ValueError, match="seconds"):
        S.bus_bandwidth(1e6, 2, 0.0)
    with pytest.raises(TypeError, match="nbytes"):
        S.bus_bandwidth("1e6", 2, 0.1)
