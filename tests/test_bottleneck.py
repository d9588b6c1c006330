"""gpucourse.bottleneck: the step-time categories, the verdict, the profiler's step table and the CPU stand-in."""

import json
from pathlib import Path

import pytest

from gpucourse import bottleneck


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
    """One fresh process: the profiler's own step table and the CPU stand-in on real traces."""
    out = fresh_python(
        "import json, tensorflow as tf\n"
        "from gpucourse import bottleneck, profiling\n"
        "from xprof.convert import raw_to_tool_data\n"
        "x = tf.ones((64,))\n"
        "def tiny(x):\n    for _ in range(40):\n        x = x * 0.999 + 0.001\n    return x\n"
        "big = tf.random.stateless_normal((640, 640), seed=[1, 2])\n"
        "heavy = tf.function(lambda x: tf.reduce_sum(tf.matmul(big, big)) + tf.reduce_sum(x))\n"
        "heavy(x)\n"
        "kinds = []\n"
        "for f in (tiny, heavy):\n"
        "    with profiling.capture_trace() as cap:\n"
        "        for i in range(3):\n"
        "            with profiling.step_marker(i):\n"
        "                float(tf.reduce_sum(f(x)))\n"
        "    kinds.append(bottleneck.classify(bottleneck.trace_step_table(cap.events(), skip=1)).kind)\n"
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
