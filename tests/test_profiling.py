"""gpucourse.profiling: trace capture, trace parsing and the step split (the capstone benchmark is in simulate)."""

import json
import sys

import pytest

from gpucourse import profiling
from gpucourse.simulate import TimelineEvent


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
    assert {e.process for e in events} == {""}  # no process_name metadata


def test_parse_trace_names_processes():
    trace = _trace()
    trace["traceEvents"] += [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}},
                             {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
                             {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "Stream #7"}},
                             _ev("sgemm", 150, 10, pid=2)]
    events = profiling.parse_trace(trace)
    assert {(e.process, e.thread) for e in events if e.pid == 2} == {("/device:GPU:0", "Stream #7")}
    assert {e.process for e in events if e.pid == 7} == {"/host:CPU"}


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
    assert all(isinstance(e, TimelineEvent) for e in b.timeline_events())
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
    with pytest.raises(TypeError, match="skip"):
        profiling.step_breakdown(_trace(), skip=1.5)
    with pytest.raises(ValueError, match="threshold"):
        profiling.step_breakdown(_trace()).verdict(2)
    with pytest.raises(TypeError, match="threshold"):
        profiling.step_breakdown(_trace()).verdict("high")


def test_capture_and_read_a_trace(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse import profiling\n"
        "from gpucourse import simulate\n"
        "ds = simulate.source(6).map(simulate.Stage(0.01))\n"
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
    with pytest.raises(TypeError, match="path"):
        profiling.convert_trace(3)
    with pytest.raises(ValueError, match=".xplane.pb"):
        profiling.convert_trace(str(tmp_path / "trace.json"))
    with pytest.raises(FileNotFoundError, match="no trace file"):
        profiling.convert_trace(str(tmp_path / "gone.xplane.pb"))
    with pytest.raises(ValueError, match="tool"):
        profiling.convert_trace(str(tmp_path / "gone.xplane.pb"), "")
    with pytest.raises(TypeError, match="params"):
        profiling.convert_trace(str(tmp_path / "gone.xplane.pb"), "trace_viewer", "use_saved_result")
    with pytest.raises(ValueError, match="step"):
        profiling.step_marker(-1)
    with pytest.raises(ValueError, match="name"):
        profiling.region("")
    with pytest.raises(TypeError, match="name"):
        profiling.region(3)
    with pytest.raises(TypeError, match="step"):
        profiling.step_marker("1")
    with pytest.raises(TypeError, match="step_fn"):
        profiling.run_traced_steps([1], "not callable", 1)
    with pytest.raises(ValueError, match="not finished"):
        profiling.TraceCapture("/nowhere").events()


def test_module_does_one_job():
    """Traces and step breakdowns only: the simulator and the monitor live in their own modules."""
    for gone in ("SimulatedDevice", "measure_utilisation", "predicted_utilisation", "busy_time",
                 "UtilisationMonitor", "utilisation_explorer", "benchmark"):
        assert not hasattr(profiling, gone), gone


def test_drop_profiler_noise_keeps_every_other_line():
    noise = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
             "I0000 00:00:1795635660.151558    5329 xplane_to_tools_data_with_profile_processor.cc:214] serving tool\n"
             "E0000 00:00:1795635660.151618    5329 unified_profile_processor_factory.cc:65] "
             "No UnifiedProfileProcessor registered for tool: trace_viewer\n"
             "W0000 00:00:1795635660.151621    5329 xplane_to_tools_data_with_profile_processor.cc:229] Unified "
             "processor not found for tool: trace_viewer, falling back to legacy.\n\n")
    assert profiling.drop_profiler_noise(noise) == ""
    real = "E0000 00:00:1795635660.1 5329 xplane_to_tools_data.cc:10] Can not find tool: nope"
    other_warning = "W0000 00:00:1.2 7 profiler_session.cc:9] Profiler is already running"
    assert profiling.drop_profiler_noise(noise + real + "\n" + other_warning) == real + "\n" + other_warning
    assert profiling.drop_profiler_noise("Traceback (most recent call last):") == "Traceback (most recent call last):"
    with pytest.raises(TypeError, match="text"):
        profiling.drop_profiler_noise(b"bytes")


def test_profiler_calls_write_no_noise_to_stderr(tmp_path):
    """With TF_CPP_MIN_LOG_LEVEL=0 (unset, as on Colab) capture_trace and convert_trace leave stderr empty,
    while the plugin called directly prints only lines that PROFILER_NOISE covers (issue 21)."""
    from importlib.metadata import version

    from tests.conftest import run_python

    code = ("import sys\nimport tensorflow as tf\nfrom gpucourse import profiling\n"
            "print('START', file=sys.stderr, flush=True)\n"
            "with profiling.capture_trace() as cap:\n    float(tf.reduce_sum(tf.ones((8, 8))))\n"
            "for tool in ('trace_viewer', 'kernel_stats', 'input_pipeline_analyzer', 'framework_op_stats'):\n"
            "    data, content_type = profiling.convert_trace(cap.logdir, tool)\n    print(tool, bool(data))\n"
            "print(len(profiling.load_trace(cap.xplane_path)) > 0)\n"
            "print('RAW', file=sys.stderr, flush=True)\n"
            "from xprof.convert import raw_to_tool_data\n"
            "for tool in ('trace_viewer', 'kernel_stats'):\n"
            "    raw_to_tool_data.xspace_to_tool_data([cap.xplane_path], tool, {})\n")
    proc = run_python(code, {"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["trace_viewer", "True", "kernel_stats", "True", "input_pipeline_analyzer", "True",
                                   "framework_op_stats", "True", "True"]
    ours, raw = proc.stderr.split("START\n", 1)[1].split("RAW\n", 1)
    assert ours.strip() == "", f"capture_trace/convert_trace wrote to stderr:\n{ours}"
    assert profiling.drop_profiler_noise(raw) == "", "the plugin printed a line PROFILER_NOISE does not cover"
    if version("xprof").startswith("2.24."):  # the version the notebook's text describes
        assert "No UnifiedProfileProcessor registered for tool: trace_viewer" in raw
        assert "No UnifiedProfileProcessor registered for tool: kernel_stats" in raw
