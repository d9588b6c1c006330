"""gpucourse.profiling: trace parsing, step split, simulated device, monitor, explorer, trace capture."""

import json
import sys

import pytest

from gpucourse import profiling


def _ev(name, ts, dur, tid=1, pid=7, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _trace():
    return {"displayTimeUnit": "ns", "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "python"}},
        {"ph": "i", "name": "marker", "ts": 5, "pid": 7, "tid": 1},
        _ev("input", 0, 50),                                  # before any step: ignored
        _ev("train 0", 100, 1000, step_num="0", group_id="0"),
        _ev("input", 110, 300), _ev("compute", 420, 600),
        _ev("compute", 200, 500, tid=2),                      # other thread: ignored
        _ev("train 1", 2000, 500, step_num="1"),
        _ev("input", 2010, 100), _ev("input", 2050, 100),     # overlapping: counted once (140 us)
        _ev("compute", 2200, 250),
    ]}


def test_import_does_not_import_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import profiling\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_parse_trace_keeps_complete_events_with_thread_names():
    events = profiling.parse_trace(json.dumps(_trace()))
    assert all(isinstance(e, profiling.TraceEvent) for e in events)
    assert len(events) == 9 and events[0].name == "input" and events[0].start_us == 0
    assert {e.thread for e in events if e.tid == 1} == {"python"}
    assert events[1].end_us == 1100 and events == sorted(events, key=lambda e: e.start_us)
    assert profiling.parse_trace(_trace()["traceEvents"]) == events


def test_step_breakdown_splits_input_and_compute():
    b = profiling.step_breakdown(_trace())
    assert [s.step for s in b.steps] == [0, 1]
    s0, s1 = b.steps
    assert (s0.step_ms, s0.input_ms, s0.compute_ms) == pytest.approx((1.0, 0.3, 0.6))
    assert s0.other_ms == pytest.approx(0.1) and s0.input_share == pytest.approx(0.3)
    assert (s1.input_ms, s1.compute_ms) == pytest.approx((0.14, 0.25))
    assert b.input_share == pytest.approx(0.44 / 1.5)
    assert b.verdict() == "input-bound" and b.verdict(0.5) == "compute-bound"
    assert "input share" in b.table() and len(b.rows()) == 2
    assert b.timeline_events() == [("input", 110e-6, 410e-6), ("compute", 420e-6, 1020e-6),
                                   ("input", 2010e-6, 2110e-6), ("input", 2050e-6, 2150e-6),
                                   ("compute", 2200e-6, 2450e-6)]
    assert [s.step for s in profiling.step_breakdown(_trace(), skip=1).steps] == [1]


@pytest.mark.parametrize("bad, exc, match", [
    ("not json", ValueError, "not trace-viewer JSON"),
    ({"events": []}, ValueError, "traceEvents"),
    (42, TypeError, "trace must be"),
    ({"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}, ValueError, "numeric ts"),
])
def test_parse_trace_bad_input(bad, exc, match):
    with pytest.raises(exc, match=match):
        profiling.parse_trace(bad)


def test_step_breakdown_bad_input():
    with pytest.raises(ValueError, match="no step events named 'step'"):
        profiling.step_breakdown(_trace(), step_name="step")
    with pytest.raises(TypeError, match="input_names"):
        profiling.step_breakdown(_trace(), input_names="input")
    with pytest.raises(ValueError, match="skip"):
        profiling.step_breakdown(_trace(), skip=-1)
    with pytest.raises(ValueError, match="threshold"):
        profiling.step_breakdown(_trace()).verdict(2)


def test_busy_time_merges_and_clips():
    assert profiling.busy_time([]) == 0
    assert profiling.busy_time([(0, 2), (1, 3), (5, 6)]) == 4
    assert profiling.busy_time([(0, 2), (1, 3), (5, 6)], start=1, end=5.5) == 2.5
    with pytest.raises(ValueError, match="end >= start"):
        profiling.busy_time([(3, 1)])
    with pytest.raises(ValueError, match="start, end"):
        profiling.busy_time([(1, 2, 3)])


def test_predicted_utilisation_cases():
    assert profiling.predicted_utilisation(0.02, 0.005, 0.045) == pytest.approx(0.02 / 0.07)
    assert profiling.predicted_utilisation(0.02, 0.005, 0.045, prefetch=True) == pytest.approx(0.4)
    assert profiling.predicted_utilisation(0.02, 0.005, 0.045, parallel_calls=2) == pytest.approx(0.04 / 0.045)
    assert profiling.predicted_utilisation(0.02, 0.005, 0.045, parallel_calls=3) == 1.0
    assert profiling.predicted_utilisation(0.02, 0, 0, prefetch=True) == 1.0


@pytest.mark.parametrize("kwargs, exc", [
    ({"step_s": 0}, ValueError), ({"step_s": "fast"}, TypeError), ({"load_s": -1}, ValueError),
    ({"parallel_calls": 0}, ValueError), ({"parallel_calls": 2.5}, TypeError), ({"parallel_calls": -1}, ValueError),
    ({"prefetch": "yes"}, TypeError),
])
def test_predicted_utilisation_bad_input(kwargs, exc):
    with pytest.raises(exc):
        profiling.predicted_utilisation(**kwargs)


def test_simulated_device_and_measurement_on_a_plain_iterable():
    dev = profiling.SimulatedDevice(0.01)
    rep = profiling.measure_utilisation([1, 2, 3, 4], device=dev)
    assert rep.steps == 4 and rep.values == [1, 2, 3, 4] and len(dev.spans) == 4
    assert rep.utilisation > 0.8  # a list is instant: the device is (almost) never waiting
    assert rep.busy_s == pytest.approx(3 * 0.01, rel=0.5)
    assert [lane for lane, *_ in rep.timeline_events()].count("device busy") == 4
    assert "steady state" in str(rep)
    assert profiling.measure_utilisation(range(10), 0.001, steps=3).steps == 3


def test_slow_iterable_gives_structural_utilisation():
    """Sleep-based, so the ratio is structural: 10 ms of input per 10 ms step is ~50% busy."""
    import time

    def slow():
        for i in range(6):
            time.sleep(0.01)
            yield i

    rep = profiling.measure_utilisation(slow(), 0.01)
    assert 0.3 < rep.utilisation < 0.6
    assert rep.startup_s >= 0.009


def test_measurement_bad_input():
    with pytest.raises(ValueError, match="no elements"):
        profiling.measure_utilisation([], 0.001)
    with pytest.raises(TypeError, match="iterable"):
        profiling.measure_utilisation(42, 0.001)
    with pytest.raises(TypeError, match="SimulatedDevice"):
        profiling.measure_utilisation([1], device="gpu")
    with pytest.raises(ValueError, match="step_s"):
        profiling.SimulatedDevice(0)
    with pytest.raises(TypeError, match="fn must be"):
        profiling.SimulatedStage(0.01, fn=3)


def test_sparkline():
    assert profiling.sparkline([0, 50, 100]) == "▁▅█"
    assert profiling.sparkline([]) == ""
    with pytest.raises(TypeError):
        profiling.sparkline(["high"])
    with pytest.raises(ValueError):
        profiling.sparkline([1], top=0)


def test_monitor_text_mode_samples_in_background(capsys):
    values = iter(range(0, 1000, 10))
    mon = profiling.UtilisationMonitor({"fake": lambda: next(values), "broken": lambda: 1 / 0},
                                       interval_s=0.02, use_widgets=False)
    assert mon.widget is None
    with mon:
        assert mon.running
        import time
        time.sleep(0.2)
    assert not mon.running
    out = capsys.readouterr().out
    assert "text mode" in out and "fake: mean" in out and "broken: no samples (ZeroDivisionError" in out
    summary = mon.summary()
    assert summary["fake"]["samples"] >= 3 and "broken" not in summary


def test_monitor_degrades_to_text_without_ipywidgets(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets now raises ImportError
    mon = profiling.UtilisationMonitor({"fake": lambda: 50.0}, interval_s=0.05)
    assert mon.widget is None
    mon.start()
    mon.stop()
    assert "fake: mean 50%" in capsys.readouterr().out
    with pytest.raises(ValueError, match="ipywidgets is not installed"):
        profiling.UtilisationMonitor({"fake": lambda: 1.0}, use_widgets=True)
    assert profiling.utilisation_explorer() is None
    assert "explore_once" in capsys.readouterr().out


def test_monitor_widget_updates():
    import ipywidgets

    mon = profiling.UtilisationMonitor({"fake": lambda: 42.0}, interval_s=0.05, use_widgets=True)
    assert isinstance(mon.widget, ipywidgets.VBox)
    mon.start(show=False)
    mon.stop()
    assert mon._bars["fake"].value == 42.0 and mon._values["fake"].value == "42%"
    assert mon._status.value.startswith("stopped")


@pytest.mark.parametrize("kwargs, exc", [
    ({"sources": {}}, ValueError), ({"sources": {"x": 3}}, TypeError),
    ({"sources": {"x": float}, "interval_s": 0}, ValueError), ({"sources": {"x": float}, "use_widgets": "y"}, TypeError),
])
def test_monitor_bad_input(kwargs, exc):
    with pytest.raises(exc):
        profiling.UtilisationMonitor(**kwargs)


def test_default_sources_report_a_percentage():
    sources = profiling.default_sources()
    assert sources
    for fn in sources.values():
        assert 0 <= fn() <= 100


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


def test_explorer_widget_measures_on_click():
    import ipywidgets

    box = profiling.utilisation_explorer(steps=8)
    assert "gpucourse-explorer" in box._dom_classes
    parts = list(_walk(box))
    slider = next(w for w in parts if isinstance(w, ipywidgets.IntSlider))
    button = next(w for w in parts if isinstance(w, ipywidgets.Button))
    result = [w for w in parts if isinstance(w, ipywidgets.HTML) and w.value.startswith("utilisation")][0]
    assert slider.description == "parallel calls" and button.description == "Measure"
    assert result.value == "utilisation: not measured yet"
    slider.value = 4
    button.click()
    assert result.value.startswith("utilisation: ") and "% with 4 parallel calls" in result.value
    assert not button.disabled


def test_pipeline_and_bounds_agree():
    """Sleep-based stages: sequential ~29% and 4 parallel calls >= 80% (generous), same values either way."""
    slow = profiling.measure_utilisation(profiling.simulated_pipeline(10), 0.02)
    fast = profiling.measure_utilisation(profiling.simulated_pipeline(10, parallel_calls=4, prefetch=2), 0.02)
    assert slow.values == fast.values == [2 * (3 * i + 1) for i in range(10)]
    assert slow.utilisation < 0.45 < 0.8 < fast.utilisation
    with pytest.raises(ValueError, match="parallel_calls"):
        profiling.simulated_pipeline(parallel_calls=0)
    with pytest.raises(TypeError, match="SimulatedStage"):
        profiling.simulated_pipeline(load=lambda x: x)
    with pytest.raises(ValueError, match="whole number >= 1 here"):
        profiling.explore_once(None)


def test_stage_counts_calls_from_parallel_threads():
    stage = profiling.SimulatedStage(0.0, lambda v: v + 1, "plus")
    ds = profiling.simulated_source(values=[5, 6, 7]).map(stage, num_parallel_calls=3)
    assert sorted(int(v) for v in ds) == [6, 7, 8] and stage.calls == 3


def test_capture_and_read_a_trace(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse import profiling\n"
        "ds = profiling.simulated_source(6).map(profiling.SimulatedStage(0.01))\n"
        "step = tf.function(lambda x: tf.reduce_sum(tf.ones((64, 64)) * tf.cast(x, tf.float32)))\n"
        "with profiling.capture_trace() as cap:\n"
        "    n = profiling.run_traced_steps(ds, step, 4)\n"
        "b = profiling.step_breakdown(cap.events())\n"
        "print(n, [s.step for s in b.steps], cap.xplane_path.endswith('.xplane.pb'))\n"
        "print(all(s.input_ms > 5 for s in b.steps), profiling.find_xplane(cap.logdir) == cap.xplane_path)\n"
        "print(len(profiling.load_trace(cap.logdir)) == len(cap.events()))\n"
        "print(profiling.run_traced_steps(ds, step, 9))\n"
        "tf.profiler.experimental.start(cap.logdir)\n"
        "try:\n    profiling.capture_trace().__enter__()\nexcept RuntimeError as e:\n    print('busy:', e)\n"
        "tf.profiler.experimental.stop()\n")
    lines = out.splitlines()
    assert lines[0] == "4 [0, 1, 2, 3] True"
    assert lines[1] == "True True" and lines[2] == "True" and lines[3] == "6"
    assert "already running" in lines[4]


def test_trace_helpers_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="xplane"):
        profiling.find_xplane(tmp_path)
    with pytest.raises(ValueError, match=".xplane.pb"):
        profiling.load_trace(str(tmp_path / "trace.json"))
    with pytest.raises(TypeError):
        profiling.load_trace(3)
    with pytest.raises(ValueError, match="step"):
        profiling.step_marker(-1)
    with pytest.raises(ValueError, match="name"):
        profiling.region("")
    with pytest.raises(TypeError, match="step_fn"):
        profiling.run_traced_steps([1], "not callable", 1)
    with pytest.raises(ValueError, match="not finished"):
        profiling.TraceCapture("/nowhere").events()


def test_benchmark_rejects_bad_input():
    with pytest.raises(TypeError, match="quick"):
        profiling.benchmark(quick="yes")


def test_nvml_source_reopens_after_close(monkeypatch):
    """A monitor's stop() closes NVML; sampling again (a restarted monitor) must reopen it, not fail."""
    import sys
    import types

    calls = {"init": 0, "shutdown": 0}
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.__setitem__("init", calls["init"] + 1)
    fake.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=42)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = profiling._NvmlGpu(0)
    assert gpu() == 42.0
    gpu.close()
    gpu.close()  # idempotent: one shutdown per init
    assert gpu() == 42.0
    gpu.close()
    assert calls == {"init": 2, "shutdown": 2}
