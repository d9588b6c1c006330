"""gpucourse.bottleneck: the step-time categories, the verdict, the profiler's step table and the columns measured from a trace."""

import json
from pathlib import Path

import pytest

from gpucourse import bottleneck, profiling


def _row(step=10.0, **ms):
    row = dict.fromkeys(bottleneck.CATEGORIES, 0.0)
    row.update(ms)
    row["stepTimeMs"] = step
    return row


def test_import_does_not_import_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import bottleneck\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_categories_and_groups():
    groups = {key: group for key, (_label, group) in bottleneck.CATEGORIES.items()}
    assert len(groups) == 9 and set(groups.values()) == set(bottleneck.GROUPS)
    assert groups["infeedTimeMs"] == "input"
    assert [k for k, g in groups.items() if g == "host"] == ["kernelLaunchTimeMs", "hostComputeTimeMs",
                                                              "compileTimeMs", "otherTimeMs"]
    assert bottleneck.CATEGORIES["kernelLaunchTimeMs"][0] == "Kernel launch"
    assert bottleneck.INPUT_BOUND_SHARE == 0.20


@pytest.mark.parametrize("row, kind", [
    (_row(infeedTimeMs=2.0, deviceComputeTimeMs=8.0), "input-bound"),            # exactly 20%: input-bound
    (_row(infeedTimeMs=1.99, deviceComputeTimeMs=8.01), "device-bound"),
    (_row(infeedTimeMs=1.0, kernelLaunchTimeMs=3.0, otherTimeMs=2.0, deviceComputeTimeMs=4.0), "host-bound"),
    (_row(hostComputeTimeMs=4.5, deviceComputeTimeMs=4.5, infeedTimeMs=1.0), "host-bound"),   # a tie: host
    (_row(compileTimeMs=3.0, deviceComputeTimeMs=2.0, outfeedTimeMs=2.0), "device-bound"),   # output is device
    (_row(otherTimeMs=6.0, deviceToDeviceTimeMs=2.0, deviceCollectivesTimeMs=2.0), "host-bound"),
])
def test_classify_one_step(row, kind):
    verdict = bottleneck.classify(row)
    assert verdict.kind == kind
    assert kind in str(verdict) and verdict.advice in str(verdict)


def test_classify_sums_steps_before_judging():
    rows = [_row(infeedTimeMs=9.0, deviceComputeTimeMs=1.0), _row(step=90.0, deviceComputeTimeMs=88.0)]
    assert [bottleneck.classify(r).kind for r in rows] == ["input-bound", "device-bound"]
    verdict = bottleneck.classify(rows)  # 9 ms of input in 100 ms: not input-bound overall
    assert verdict.kind == "device-bound"
    assert verdict.shares == pytest.approx({"input": 0.09, "host": 0.0, "device": 0.89})
    assert bottleneck.classify(rows[0], input_share=0.95).kind == "device-bound"


@pytest.mark.parametrize("bad, exc, match", [
    ({"infeedTimeMs": 1.0}, ValueError, "stepTimeMs"),
    (_row(infeedTimeMs="3"), TypeError, "infeedTimeMs"),
    (_row(otherTimeMs=-1.0), ValueError, "otherTimeMs"),
    (_row(otherTimeMs=float("nan")), ValueError, "otherTimeMs"),
    (_row(step=0.0), ValueError, "0 ms"),
    ([], ValueError, "non-empty"),
    ("steps", TypeError, "rows"),
    ([3], TypeError, r"rows\[0\]"),
])
def test_classify_bad_input(bad, exc, match):
    with pytest.raises(exc, match=match):
        bottleneck.classify(bad)


def test_classify_bad_threshold():
    with pytest.raises(ValueError, match="input_share"):
        bottleneck.classify(_row(otherTimeMs=1.0), input_share=0)
    with pytest.raises(TypeError, match="input_share"):
        bottleneck.classify(_row(otherTimeMs=1.0), input_share="20%")


def test_format_rows():
    text = bottleneck.format_rows([{**_row(infeedTimeMs=5.0, otherTimeMs=5.0), "stepnum": "train 3"},
                                   {**_row(deviceComputeTimeMs=9.0), "stepnum": "train 4"}], title="t")
    lines = text.splitlines()
    assert lines[0] == "t" and "verdict" in lines[1]
    assert lines[2].split()[0:2] == ["train", "3"] and lines[2].endswith("input-bound")
    assert lines[3].endswith("device-bound") and lines[4].split()[0] == "all"
    assert bottleneck.format_rows([]).endswith("(no steps)")


def _datatable(rows):
    """The analyzer's JSON output: a list of DataTables, the step table second, columns shuffled."""
    cols = ["stepTimeMs", "tooltip", *reversed(bottleneck.CATEGORIES), "stepnum"]
    table = {"cols": [{"id": c, "label": c, "type": "number"} for c in cols],
             "p": {"hardware_type": "GPU", "input_conclusion": "Your program is NOT input-bound because ..."},
             "rows": [{"c": [{"v": r.get(c, "tip" if c == "tooltip" else 0.0)} for c in cols]} for r in rows]}
    return json.dumps([{"cols": [], "rows": []}, table, {"cols": [{"id": "opName"}], "rows": []}]).encode()


def test_step_table_is_read_by_column_id():
    rows = [{**_row(kernelLaunchTimeMs=6.0, deviceComputeTimeMs=4.0), "stepnum": "7"}]
    table = bottleneck._step_table(_datatable(rows))
    assert table.rows == rows and table.hardware == "GPU" and table.conclusion.startswith("Your program")
    assert bottleneck.classify(table.rows).kind == "host-bound"
    with pytest.raises(ValueError, match="no step table"):
        bottleneck._step_table(json.dumps([{"cols": [{"id": "opName"}], "rows": []}]))


def _x(name, ts, dur, tid=1, thread="python", **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid, "args": args}


def _trace():
    threads = {1: "python", 2: "tf_Compute/123", 3: "tf_data_private_threadpool/9"}
    events = [{"ph": "M", "name": "thread_name", "pid": 7, "tid": t, "args": {"name": n}} for t, n in threads.items()]
    events += [
        _x("train 0", 0, 1000, step_num="0"),
        _x("input", 0, 200),
        _x("IteratorGetNext", 100, 100, tid=2, long_name="IteratorGetNext:IteratorGetNext"),  # inside input: once
        _x("MatMul", 300, 300, tid=2, long_name="dense/MatMul:MatMul"),
        _x("Relu", 500, 200, tid=2, long_name="dense/Relu:Relu"),                  # overlaps MatMul: union
        _x("py_func", 600, 300, tid=3, long_name="EagerPyFunc:EagerPyFunc"),       # tf.data thread: ignored
        _x("__inference_f_9", 720, 110, tid=2, long_name="__inference_f_9:__inference_f_9"),  # an XLA launch:
        _x("fusion", 750, 50, tid=2, hlo_op="fusion.1"),                           # only its kernel counts
        _x("train 1", 2000, 1000, step_num="1"),
        _x("EagerExecute", 2000, 400, eager_op="Mul", is_func="0"),
        _x("KernelAndDeviceFunc::Run", 2100, 100),                                 # an eager op's kernel
        _x("EagerExecute", 2500, 400, eager_op="__inference_f_1", is_func="1"),
        _x("KernelAndDeviceFunc::Run", 2550, 300),                                 # a function call: not a kernel
        _x("AddV2", 2600, 100, tid=2, long_name="add:AddV2"),
        _x("MatMul", 2950, 100, tid=2, long_name="late:MatMul"),                   # ends after the step: ignored
        _x("eval 0", 4000, 100, step_num="0"),
    ]
    return {"traceEvents": events}


def test_trace_step_table_measures_input_kernels_and_the_rest():
    rows = bottleneck.trace_step_table(_trace())
    assert [r["stepnum"] for r in rows] == ["0", "1"]
    assert set(rows[0]) == {"stepnum", "stepTimeMs", *bottleneck.CATEGORIES}
    r0, r1 = rows
    assert (r0["stepTimeMs"], r0["infeedTimeMs"], r0["deviceComputeTimeMs"], r0["otherTimeMs"]) == \
        pytest.approx((1.0, 0.2, 0.45, 0.35))
    assert (r1["infeedTimeMs"], r1["deviceComputeTimeMs"], r1["otherTimeMs"]) == pytest.approx((0.0, 0.2, 0.8))
    assert all(r[k] == 0.0 for r in rows for k in ("kernelLaunchTimeMs", "hostComputeTimeMs", "outfeedTimeMs"))
    assert [r["stepnum"] for r in bottleneck.trace_step_table(_trace(), skip=1)] == ["1"]
    assert bottleneck.trace_step_table(_trace(), step_name="eval")[0]["stepTimeMs"] == pytest.approx(0.1)
    assert bottleneck.classify(rows).kind == "host-bound"


def _gpu_trace(kernel_us):
    """A GPU trace as the trace viewer's converter writes it: the host on "/host:CPU" (pid 701, its op spans
    are the launches, 600 of every 1000 µs), the GPU on "/device:GPU:0" (pid 2) with its stream lines, and a
    line derived from the ops ("TensorFlow Ops") that spans the whole op and must not be read."""
    meta = [{"ph": "M", "name": "process_name", "pid": 701, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}}]
    lines = {(701, 1): "python", (701, 2): "tf_Compute/5", (2, 1): "Stream #7(Compute)",
             (2, 8): "Stream #14(MemcpyH2D,MemcpyD2H)", (2, 9): "Stream #15(MemcpyD2D)", (2, 15): "TensorFlow Ops"}
    meta += [{"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": n}} for (p, t), n in lines.items()]

    def ev(name, ts, dur, pid=701, tid=1, **args):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}

    events = []
    for i in range(2):
        t0 = 1000 * i
        events += [
            ev(f"train {i}", t0, 1000, step_num=str(i)),
            ev("input", t0, 100),
            ev("MatMul", t0 + 150, 600, tid=2, long_name="dense/MatMul:MatMul"),      # the host launching it
            ev("MemcpyH2D", t0 + 50, 100, pid=2, tid=8),                                  # half inside input
            ev("volta_sgemm_128x64_nn", t0 + 200, kernel_us, pid=2, tid=1, long_name="volta_sgemm", hlo_op="dot"),
            ev("MemcpyD2D", t0 + 200, 10, pid=2, tid=9),                                  # under the kernel
            ev("MemcpyD2H", t0 + 960, 20, pid=2, tid=8),
            ev("dense/MatMul", t0 + 150, 800, pid=2, tid=15, long_name="dense/MatMul:MatMul"),  # derived: not read
        ]
    events.append(ev("volta_sgemm_128x64_nn", 1990, 50, pid=2, tid=1))  # runs on past step 1: 10 µs count
    return {"traceEvents": meta + events}


def test_trace_step_table_reads_a_gpu_trace_from_its_streams():
    short = bottleneck.trace_step_table(_gpu_trace(kernel_us=50))
    r0, r1 = short
    assert r0["stepTimeMs"] == pytest.approx(1.0)
    assert r0["deviceComputeTimeMs"] == pytest.approx(0.05)   # the kernel, not the 0.6 ms the host spent on it
    assert r0["deviceToDeviceTimeMs"] == 0.0                  # the copy ran under the kernel: the kernel has it
    assert r0["outfeedTimeMs"] == pytest.approx(0.02)
    assert r0["infeedTimeMs"] == pytest.approx(0.15)          # the input range and the rest of the H2D copy
    assert r0["kernelLaunchTimeMs"] == pytest.approx(0.6 - 0.05)
    assert r0["otherTimeMs"] == pytest.approx(1.0 - 0.05 - 0.02 - 0.15 - 0.55)
    assert r1["deviceComputeTimeMs"] == pytest.approx(0.05 + 0.01)
    assert r0["hostComputeTimeMs"] == r0["compileTimeMs"] == r0["deviceCollectivesTimeMs"] == 0.0
    assert bottleneck.classify(short).kind == "host-bound"    # long launches, short kernels
    long_ = bottleneck.trace_step_table(_gpu_trace(kernel_us=700))
    assert long_[0]["deviceComputeTimeMs"] == pytest.approx(0.7)
    assert long_[0]["kernelLaunchTimeMs"] == pytest.approx(0.05)  # 150-200 µs: launching, the GPU idle
    assert bottleneck.classify(long_).kind == "device-bound"
    # Read as a CPU trace (the GPU's lines dropped), the same host spans are called device compute: the
    # reading the GPU trace must not fall back to.
    host_only = _gpu_trace(kernel_us=50)
    host_only["traceEvents"] = [e for e in host_only["traceEvents"] if e["pid"] == 701]
    assert bottleneck.classify(bottleneck.trace_step_table(host_only)).kind == "device-bound"


def test_only_gpu_stream_lines_are_device_time():
    on = [profiling.TraceEvent("k", 0, 1, 2, 1, "Stream #7(Compute)", {}, "/device:GPU:0"),
          profiling.TraceEvent("k", 0, 1, 2, 1, "Stream #3", {}, "host7 /device:GPU:3")]
    off = [profiling.TraceEvent("k", 0, 1, 2, 15, "XLA Ops", {}, "/device:GPU:0"),
           profiling.TraceEvent("k", 0, 1, 701, 1, "Stream #7", {}, "/host:CPU"),
           profiling.TraceEvent("k", 0, 1, 701, 1, "python", {"long_name": "a:MatMul"}, "/host:CPU")]
    assert [bottleneck._is_device_stream(e) for e in on + off] == [True, True, False, False, False]
    assert bottleneck.GPU_PLANE == "/device:GPU:" and bottleneck.STREAM_LINE == "Stream #"


def test_trace_step_table_on_a_recorded_trace_with_a_gpu_plane(fresh_python):
    """A real trace recorded on this CPU, with the GPU's plane added to its XSpace as TensorFlow's CUPTI
    collector writes it ("/device:GPU:0", "Stream #7(Compute)"), read through the installed converter: the
    CPU's long op spans become launches, and the verdict follows the kernels."""
    out = fresh_python(
        "import os, tempfile, tensorflow as tf\n"
        "from tensorflow.tsl.profiler.protobuf import xplane_pb2\n"
        "from gpucourse import bottleneck, profiling\n"
        "big = tf.random.stateless_normal((1024, 1024), seed=[1, 2])\n"
        "heavy = tf.function(lambda: tf.reduce_sum(tf.matmul(big, big)))\n"
        "heavy()\n"
        "with profiling.capture_trace() as cap:\n"
        "    for i in range(3):\n"
        "        with profiling.step_marker(i):\n"
        "            float(heavy())\n"
        "print(bottleneck.classify(bottleneck.trace_step_table(cap.events(), skip=1)).kind)\n"
        "space = xplane_pb2.XSpace()\n"
        "space.ParseFromString(open(cap.xplane_path, 'rb').read())\n"
        "host = next(p for p in space.planes if p.name == '/host:CPU')\n"
        "steps = [(ln.timestamp_ns * 1000 + e.offset_ps, e.duration_ps) for ln in host.lines for e in ln.events\n"
        "         if host.event_metadata[e.metadata_id].name == 'train']\n"
        "for share in (0.02, 0.9):\n"
        "    gpu = xplane_pb2.XSpace()\n"
        "    gpu.CopyFrom(space)\n"
        "    plane = gpu.planes.add(id=1, name='/device:GPU:0')\n"
        "    plane.event_metadata[1].CopyFrom(xplane_pb2.XEventMetadata(id=1, name='sgemm_128x64_nn'))\n"
        "    line = plane.lines.add(id=7, display_id=7, name='Stream #7(Compute)', timestamp_ns=0)\n"
        "    for start_ps, dur_ps in steps:\n"
        "        line.events.add(metadata_id=1, offset_ps=start_ps + dur_ps // 20, duration_ps=int(dur_ps * share))\n"
        "    path = os.path.join(tempfile.mkdtemp(), 'gpu.xplane.pb')\n"
        "    open(path, 'wb').write(gpu.SerializeToString())\n"
        "    events = profiling.load_trace(path)\n"
        "    rows = bottleneck.trace_step_table(events, skip=1)\n"
        "    print(sorted({e.process for e in events}), bottleneck.classify(rows).kind,\n"
        "          all(r['kernelLaunchTimeMs'] > 0 for r in rows) if share < 0.5 else '-',\n"
        "          [round(r['deviceComputeTimeMs'] / r['stepTimeMs'], 2) for r in rows])\n")
    lines = out.splitlines()
    assert lines[0] == "device-bound"  # on the CPU the matmul is the device's work
    assert lines[1] == "['/device:GPU:0', '/host:CPU'] host-bound True [0.02, 0.02]"
    # with the stream busy for 90% of each step the host's op spans may fall wholly inside the device's time,
    # which claims it first, so a step can show no launch time (it did under load): not checked there
    assert lines[2] == "['/device:GPU:0', '/host:CPU'] device-bound - [0.9, 0.9]"


@pytest.mark.gpu
def test_trace_step_table_on_a_real_gpu(fresh_python):
    """On a GPU: the trace has stream lines, tiny ops are host-bound and a big matmul device-bound."""
    out = fresh_python(
        "import tensorflow as tf\n"
        "from gpucourse import bottleneck, profiling\n"
        "x = tf.ones((256,))\n"
        "def tiny(x):\n    for _ in range(50):\n        x = x * 0.999 + 0.001\n    return tf.reduce_sum(x)\n"
        "big = tf.random.stateless_normal((8192, 8192), seed=[1, 2])\n"
        "heavy = tf.function(lambda x: tf.reduce_sum(tf.matmul(big, big)) + tf.reduce_sum(x))\n"
        "for f in (tiny, heavy):\n"
        "    with profiling.capture_trace() as cap:\n"
        "        for i in range(4):\n"
        "            with profiling.step_marker(i):\n"
        "                float(f(x))\n"
        "    events = cap.events()\n"
        "    rows = bottleneck.trace_step_table(events, skip=1)\n"
        "    print(any(bottleneck._is_device_stream(e) for e in events), bottleneck.classify(rows).kind)\n")
    assert out.splitlines() == ["True host-bound", "True device-bound"]


def test_trace_step_table_bad_input():
    with pytest.raises(ValueError, match="no step events named 'Profiled batch'.*'eval', 'train'"):
        bottleneck.trace_step_table(_trace(), step_name="Profiled batch")
    with pytest.raises(TypeError, match="input_names"):
        bottleneck.trace_step_table(_trace(), input_names="input")
    with pytest.raises(ValueError, match="skip"):
        bottleneck.trace_step_table(_trace(), skip=-1)
    with pytest.raises(TypeError, match="path"):
        bottleneck.profiler_step_table(3)
    with pytest.raises(FileNotFoundError):
        bottleneck.profiler_step_table("/nowhere/trace.xplane.pb")


def _plugin_binary() -> bytes:
    from gpucourse.profiling import _converter

    return Path(_converter().__file__).with_name("profiler_plugin_c_api.so").read_bytes()


def test_the_installed_profiler_says_what_the_notebook_quotes():
    """Facts read from the installed profiler plugin (the sentences behind its recommendations)."""
    pytest.importorskip("xprof")
    binary = _plugin_binary()
    for text in (b"Your program is HIGHLY input-bound because ", b"Your program is MODERATELY input-bound because ",
                 b"spent on 'Kernel Launch'.", b"This could be due to Python execution overhead.",
                 b"It could be due to CPU contention with tf.data. In this case, you may try to set the "
                 b"environment variable TF_GPU_THREAD_MODE=gpu_private."):
        assert text in binary, text
    for key, (label, _group) in bottleneck.CATEGORIES.items():
        assert key.encode() in binary and label.encode() in binary, key


def test_real_traces_on_this_cpu(fresh_python):
    """One fresh process: the profiler's own step table and the trace reading on real CPU traces."""
    out = fresh_python(
        "import json, tensorflow as tf\n"
        "from gpucourse import bottleneck, profiling\n"
        "from xprof.convert import raw_to_tool_data\n"
        "x = tf.ones((64,))\n"
        "def tiny(x):\n    for _ in range(40):\n        x = x * 0.999 + 0.001\n    return x\n"
        "big = tf.random.stateless_normal((1024, 1024), seed=[1, 2])\n"
        "heavy = tf.function(lambda x: tf.reduce_sum(tf.matmul(big, big)) + tf.reduce_sum(x))\n"
        "heavy(x)\n"
        "kinds = []\n"
        "for f in (tiny, heavy):\n"
        "    with profiling.capture_trace() as cap:\n"
        "        for i in range(5):\n"
        "            with profiling.step_marker(i):\n"
        "                float(tf.reduce_sum(f(x)))\n"
        # each column's minimum over the steps: another process taking the CPU mid-step only adds time
        "    steps = bottleneck.trace_step_table(cap.events(), skip=1)\n"
        "    kinds.append(bottleneck.classify(bottleneck.take_minimum(steps)).kind)\n"
        "print(kinds)\n"
        "table = bottleneck.profiler_step_table(cap.logdir)\n"
        "print(table.hardware, len(table.rows) >= 1, table.conclusion.startswith('Your program ') and 'input-bound' in table.conclusion)\n"
        "print(sorted(table.rows[0]) == sorted(['stepnum', 'stepTimeMs', *bottleneck.CATEGORIES]))\n"
        "raw, _ = raw_to_tool_data.xspace_to_tool_data([cap.xplane_path], 'input_pipeline_analyzer', {})\n"
        "cols = {c['id']: c['label'] for t in json.loads(raw) for c in t.get('cols', [])}\n"
        "print(all(cols.get(k) == label for k, (label, _g) in bottleneck.CATEGORIES.items()))\n")
    lines = out.splitlines()
    assert lines[0] == "['host-bound', 'device-bound']"
    assert lines[1] == "CPU_ONLY True True"
    assert lines[2] == "True" and lines[3] == "True"


def test_take_minimum_keeps_each_columns_least_interrupted_time():
    """One interrupted op (40 ms in a device span) makes the summed steps device-bound; the minimum is not."""
    clean = {"stepTimeMs": 12.0, "deviceComputeTimeMs": 2.4, "otherTimeMs": 9.6}
    hit = {"stepTimeMs": 52.0, "deviceComputeTimeMs": 42.4, "otherTimeMs": 9.6}
    slow_host = {"stepTimeMs": 20.0, "deviceComputeTimeMs": 2.6, "otherTimeMs": 17.4}
    rows = [hit, clean, slow_host]
    assert bottleneck.classify(rows).kind == "device-bound"
    least = bottleneck.take_minimum(rows)
    assert least["stepTimeMs"] == 12.0 and least["deviceComputeTimeMs"] == 2.4 and least["otherTimeMs"] == 9.6
    assert least["infeedTimeMs"] == 0.0
    assert bottleneck.classify(least).kind == "host-bound"
    big = [{"stepTimeMs": 10.0, "deviceComputeTimeMs": 8.0, "otherTimeMs": 2.0},
           {"stepTimeMs": 30.0, "deviceComputeTimeMs": 8.5, "otherTimeMs": 21.5}]  # a truly device-bound step
    assert bottleneck.classify(bottleneck.take_minimum(big)).kind == "device-bound"


def test_take_minimum_bad_input():
    with pytest.raises(TypeError, match="list of step-table rows"):
        bottleneck.take_minimum({"stepTimeMs": 1.0})
    with pytest.raises(ValueError, match="rows is empty"):
        bottleneck.take_minimum([])
    with pytest.raises(ValueError, match="stepTimeMs"):
        bottleneck.take_minimum([{"otherTimeMs": 1.0}])
