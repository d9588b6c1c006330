"""gpucourse.memory and gpucourse.memory_explorer: measurement, the GPU allocator's rules, probes, estimates."""

import json
import math
import os

import pytest

from gpucourse import _memory_log, colab, memory, memory_explorer
from gpucourse.explore import Explorer

MiB = 2**20


def test_import_does_not_load_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import memory, memory_explorer\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_tensorflows_words_are_memory_names():
    """_memory_log holds part of topic 03: each of its names is memory.<name>, the same object, in memory.__all__."""
    for name in _memory_log.__all__:
        assert getattr(memory, name) is getattr(_memory_log, name) and name in memory.__all__, name


@pytest.mark.parametrize("n, text", [(0, "0 B"), (512, "512 B"), (1536, "1.50 KiB"), (3 * 2**20, "3.00 MiB"),
                                     (5 * 2**30, "5.00 GiB"), (-2048, "-2.00 KiB")])
def test_format_bytes(n, text):
    assert memory.format_bytes(n) == text


def test_format_bytes_bad_input():
    for bad in ("12", None, True):
        with pytest.raises(TypeError, match="number of bytes"):
            memory.format_bytes(bad)
    with pytest.raises(ValueError, match="finite"):
        memory.format_bytes(float("nan"))


def test_normalize_device_bad_type_needs_no_tensorflow():
    with pytest.raises(TypeError, match="device"):
        memory.normalize_device(0)


#: normalize_device's cases, checked in the fresh TensorFlow process below: it validates with TensorFlow's
#: parser and never shortens a full name (that is lab 02 q1's exercise, so no course helper answers it).
DEVICE_NAMES = {"GPU:0": "GPU:0", "CPU:3": "CPU:3", "/device:GPU:1": "/device:GPU:1", "/GPU:2": "/device:GPU:2",
                "cpu:0": "/device:CPU:0", "/job:localhost/replica:0/task:0/device:cpu:3":
                "/job:localhost/replica:0/task:0/device:CPU:3"}
BAD_DEVICE_NAMES = ["TPU:0", "GPU", "XLA_GPU:0", "", "/job:localhost/replica:0/task:0"]


def test_measure_peak_bad_input():
    with pytest.raises(TypeError, match="fn must be callable"):
        memory.measure_peak("not a function")
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        memory.measure_peak(lambda: None, warmup=-1, device="CPU:0")
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        memory.measure_peak(lambda: None, repeats=0, device="CPU:0")
    with pytest.raises(TypeError, match="repeats"):
        memory.measure_peak(lambda: None, repeats=1.5, device="CPU:0")


def test_is_oom_error():
    class ResourceExhaustedError(Exception):  # stands in for tf.errors.ResourceExhaustedError
        pass

    assert memory.is_oom_error(ResourceExhaustedError("OOM")) and memory.is_oom_error(MemoryError())
    assert not memory.is_oom_error(KeyError("x"))
    with pytest.raises(TypeError, match="exception"):
        memory.is_oom_error("OOM")


def test_linear_fit():
    fixed, per = memory.linear_fit([(1, 110), (2, 120), (10, 200)])
    assert fixed == pytest.approx(100) and per == pytest.approx(10)
    with pytest.raises(ValueError, match="at least 2"):
        memory.linear_fit([(1, 2)])
    with pytest.raises(ValueError, match="different"):
        memory.linear_fit([(1, 2), (1, 3)])
    with pytest.raises(TypeError, match="pairs of numbers"):
        memory.linear_fit([("a", 2), (1, 3)])


# --------------------------------------------------------------------------- the GPU allocator's rules


@pytest.mark.parametrize("env, configured, want", [
    (None, None, False), (None, True, True), (None, False, False),
    ("true", None, True), ("true", False, True),  # the variable wins over set_memory_growth(False)
    ("false", True, False), ("false", None, False),  # ... and over set_memory_growth(True)
    ("1", None, False), ("True", None, False), ("yes", True, True), ("", True, True),  # not parsed: config kept
])
def test_resolve_growth_mirrors_get_allow_growth_value(env, configured, want):
    assert memory.resolve_growth(env, configured) is want


def test_resolve_growth_bad_input():
    with pytest.raises(TypeError, match="env_value"):
        memory.resolve_growth(1)
    with pytest.raises(TypeError, match="configured"):
        memory.resolve_growth("true", "yes")


def test_default_gpu_limit_mirrors_min_system_memory():
    t4_free = 14_900 * MiB
    assert memory.default_gpu_limit(t4_free, 7) == t4_free - 1050 * MiB
    assert memory.default_gpu_limit(40_000 * MiB, 8) == 40_000 * MiB - 1536 * MiB
    assert memory.default_gpu_limit(80_000 * MiB, 9) == 80_000 * MiB - 1800 * MiB
    assert memory.default_gpu_limit(80_000 * MiB, 12) == 80_000 * MiB - 1800 * MiB  # newer: as 9.x
    assert memory.default_gpu_limit(8_000 * MiB, 5) == 8_000 * MiB - 500 * MiB  # older: as 6.x
    # Under 2 GiB free (a second process on a busy GPU): a 225 MiB reserve; all of it when even less is free.
    assert memory.default_gpu_limit(750 * MiB, 7) == 525 * MiB
    assert memory.default_gpu_limit(200 * MiB, 7) == 200 * MiB
    # TF_DEVICE_MIN_SYS_MEMORY_IN_MB replaces the reserve, unless it is larger than what is free.
    assert memory.default_gpu_limit(t4_free, 7, reserve_mib=100) == t4_free - 100 * MiB
    assert memory.default_gpu_limit(t4_free, 7, reserve_mib=20_000) == t4_free - 1050 * MiB


def test_default_gpu_limit_bad_input():
    with pytest.raises(ValueError, match="free_bytes must be >= 0"):
        memory.default_gpu_limit(-1, 7)
    with pytest.raises(TypeError, match="compute_capability_major"):
        memory.default_gpu_limit(MiB, 7.5)
    with pytest.raises(ValueError, match="reserve_mib"):
        memory.default_gpu_limit(MiB, 7, reserve_mib=-5)


def test_allocator_messages_are_in_the_installed_tensorflow():
    """The GPU allocator's own messages back the tutorial's GPU statements, even in the CPU-only wheel: whole."""
    found = memory.allocator_messages()
    if not found and not _memory_log._tf_library_paths():
        pytest.skip("this TensorFlow packaging has no libtensorflow_framework to read")
    assert set(found) == set(_memory_log._MESSAGES), f"missing: {set(_memory_log._MESSAGES) - set(found)}"
    assert found["growth overridden"] == ("Overriding allow_growth setting because the TF_FORCE_GPU_ALLOW_GROWTH "
                                          "environment variable is set. Original config value was <0 or 1>.")
    assert found["growth value not parsed"].endswith(
        'could not be parsed: "<value>". Valid values are "true" or "false". Using original config value of <0 or 1>.')
    assert "cuda_malloc_async' will improve the situation." in found["out of memory"]
    assert found["garbage collection"].endswith("if you'd like to disable this feature.")
    for message in found.values():  # whole sentences: no piece ends in the middle of one
        assert message.rstrip().endswith("."), message
    with pytest.raises(ValueError, match="existing file"):
        memory.allocator_messages("/no/such/libtensorflow_framework.so")


def test_allocator_messages_leave_out_a_message_whose_piece_is_missing(tmp_path):
    lib = tmp_path / "libtensorflow_framework.so.2"
    pieces = [p for p in _memory_log._MESSAGES["growth overridden"] if not p.startswith("<")]
    lib.write_bytes(b"\0".join(p.encode() for p in pieces) + b"\0Garbage collection: deallocate\0")
    whole = "".join(_memory_log._MESSAGES["growth overridden"])
    assert memory.allocator_messages(str(lib)) == {"growth overridden": whole}


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def test_split_log_records_joins_continuation_lines():
    """A recorded stderr of TensorFlow 2.21 running out of memory on a CPU (RLIMIT_DATA, oneDNN's BFC allocator)."""
    with open(os.path.join(FIXTURES, "tf_log_oom_cpu.txt")) as fh:
        records = memory.split_log_records(fh.read())
    assert [r.severity for r in records[:3]] == ["WARNING", "I", "I"]
    assert records[0].message == "All log messages before absl::InitializeLog() is called are written to STDERR"
    assert records[2].source == "cpu_feature_guard.cc:227" and records[2].message.endswith("compiler flags.")
    assert "\nTo enable the following instructions" in records[2].message  # its second line, joined
    oom = [r for r in records if "ran out of memory" in r.message]
    assert len(oom) == 1 and oom[0].severity == "W" and oom[0].source == "bfc_allocator.cc:502"
    assert oom[0].message.splitlines() == [
        "Allocator (mklcpu) ran out of memory trying to allocate 1.00GiB (rounded to 1073741824)requested by op Fill",
        "If the cause is memory fragmentation maybe the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' "
        "will improve the situation. ", "Current allocation summary follows.", "Current allocation summary follows."]
    stats = [r for r in records if r.message.startswith("Stats:")][0]
    assert "LargestFreeBlock:" in stats.message and stats.severity == "I"
    assert records[-1].source == "local_rendezvous.cc:412" and "RESOURCE_EXHAUSTED" in records[-1].message
    # The message TensorFlow wrote is the one allocator_messages assembles from the library's pieces.
    template = "".join(p for p in _memory_log._MESSAGES["out of memory"])
    assert oom[0].message.startswith(template.replace("<allocator>", "mklcpu").replace("<size>", "1.00GiB")
                                     .replace("<bytes>", "1073741824").replace("<op>", "Fill"))


def test_split_log_records_bad_input_and_plain_text():
    assert memory.split_log_records("") == []
    assert memory.split_log_records("hello\nworld") == [memory.LogRecord("", "", "hello\nworld")]
    with pytest.raises(TypeError, match="text"):
        memory.split_log_records(b"W0000 ...")


def test_estimate_state():
    est = memory.estimate_state(1000, 2)
    assert [est[k] for k in ("weights", "gradients", "optimizer slots", "gradient accumulators")] == [4000, 4000,
                                                                                                      8000, 0]
    assert est.total_bytes == 16000 and "total" in est.table()
    assert memory.estimate_state(10, 0, bytes_per_value=2, accumulate=True).total_bytes == 60
    frozen = memory.estimate_state(100, 1, trainable=60)  # e.g. BatchNormalization's moving statistics
    assert frozen.total_bytes == 4 * (100 + 60 + 60)


def test_estimate_state_bad_input():
    with pytest.raises(TypeError, match="params"):
        memory.estimate_state("big", 2)
    with pytest.raises(ValueError, match="params must be >= 0"):
        memory.estimate_state(-1, 2)
    with pytest.raises(ValueError, match="trainable must be <= 10"):
        memory.estimate_state(10, 2, trainable=11)
    with pytest.raises(TypeError, match="accumulate"):
        memory.estimate_state(10, 2, accumulate="yes")


# --------------------------------------------------------------------------- fresh processes


def test_fresh_probe_runs_without_the_course_variables(monkeypatch):
    """A probe shows TensorFlow's default: the setup cell's TF_FORCE_GPU_ALLOW_GROWTH is not passed on."""
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    monkeypatch.setenv(colab.SET_BY_COURSE, "TF_FORCE_GPU_ALLOW_GROWTH")
    r = memory.fresh_process_probe({"TF_GPU_ALLOCATOR": "cuda_malloc_async"},
                                   "tf.config.experimental.set_memory_growth("
                                   "tf.config.list_physical_devices('CPU')[0], True)")
    assert r.env["TF_FORCE_GPU_ALLOW_GROWTH"] is None and r.env["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"
    assert r.setup_error == ("ValueError", "Cannot set memory growth on non-GPU and non-Pluggable devices")
    assert any(name.endswith("CPU:0") for name in r.logical)
    assert "setup error" in str(r)
    if not r.memory_growth:  # no GPU: nothing about GPUs to report
        assert r.growth is None and r.gpu_limit_bytes == [] and "none visible" in str(r)


def test_provoke_oom_fails_for_real_and_recovers():
    """The notebook's out-of-memory demonstration: a capped fresh process, a real ResourceExhaustedError."""
    r = memory.provoke_oom(cap_mib=256, sizes_mib=[128, 1024, 128])
    assert [err for _, err, _ in r.attempts] == [None, "ResourceExhaustedError", None]
    assert "OOM when allocating tensor" in r.attempts[1][2]
    if "by allocator cpu " in r.attempts[1][2]:  # oneDNN off: TensorFlow's plain CPU allocator logs no warning
        assert r.allocator_warning is None
    else:  # the BFC allocator (a GPU's, or oneDNN's mklcpu) warns first, in three lines
        assert r.allocator_warning.startswith("Allocator (") and "ran out of memory trying to allocate 1.00GiB" in (
            r.allocator_warning) and "cuda_malloc_async" in r.allocator_warning.splitlines()[1]
    assert ("memory_limit=256" if r.device == "GPU:0" else "RLIMIT_DATA") in r.mechanism
    assert "a 1024 MiB tensor" in str(r) and "ResourceExhaustedError: " in str(r)


def test_provoke_oom_bad_input():
    with pytest.raises(ValueError, match="cap_mib must be >= 64"):
        memory.provoke_oom(cap_mib=1)
    with pytest.raises(TypeError, match="sizes_mib must be a list"):
        memory.provoke_oom(sizes_mib=512)
    with pytest.raises(ValueError, match="at least one"):
        memory.provoke_oom(sizes_mib=[])
    with pytest.raises(TypeError, match="sizes_mib"):
        memory.provoke_oom(sizes_mib=[1.5])


def test_fresh_probe_bad_input():
    with pytest.raises(TypeError, match="env"):
        memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": True})
    with pytest.raises(TypeError, match="setup"):
        memory.fresh_process_probe(setup=42)
    with pytest.raises(ValueError, match="timeout"):
        memory.fresh_process_probe(timeout=0)


# --------------------------------------------------------------------------- the explorer


def test_estimate_update_arithmetic():
    params = 128 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    e = memory_explorer.estimate_update(256)
    assert e["weights"] == e["gradients"] == 4 * params and e["optimizer slots"] == 8 * params
    assert e["gradient accumulators"] == 0 and e["low-precision weight copies"] == 0
    assert e["activations"] == 256 * 4 * (128 + 2 * 512 + 2 * 512 + 10)
    acc = memory_explorer.estimate_update(256, steps=4)  # 4 micro-batches of 64
    assert acc["gradient accumulators"] == 4 * params and acc["activations"] == e["activations"] // 4
    mixed = memory_explorer.estimate_update(256, "mixed_float16")
    assert mixed["weights"] == e["weights"] and mixed["low-precision weight copies"] == 2 * params
    assert mixed["activations"] == 256 * (128 * 4 + 128 * 2 + 2 * 512 * 2 * 2 + 10 * 2 + 10 * 4)


def test_explorer_bad_input_fails_before_measuring():
    with pytest.raises(ValueError, match="steps must be <= batch"):
        memory_explorer.update(batch=4, steps=8)
    with pytest.raises(ValueError, match="policy must be one of"):
        memory_explorer.update(batch=64, policy="float16")
    with pytest.raises(ValueError, match="budget_mib must be >= 1"):
        memory_explorer.update(batch=64, budget_mib=0)
    with pytest.raises(TypeError, match="batch"):
        memory_explorer.estimate_update(64.0)
    ex = memory_explorer.memory_explorer()
    assert isinstance(ex, Explorer) and ex.manual and {c.name for c in ex.controls} == {
        "batch", "policy", "steps", "budget_mib"}


def test_measurement_and_explorer_on_this_machine(fresh_python):
    """One fresh TensorFlow process: measure_peak, the CPU counters' blind spot, and the explorer end to end."""
    out = fresh_python(
        "import json, os, tensorflow as tf\n"
        "from gpucourse import memory, memory_explorer as mx\n"
        "x = tf.random.normal((1000, 1000))\n"
        "f = tf.function(lambda: tf.reduce_sum(x @ x))\n"
        "p = memory.measure_peak(f, device='/device:CPU:0', repeats=3)\n"
        "r = {'peak': [p.device, p.extra_bytes >= 4_000_000, p.after_bytes <= p.peak_bytes, 'peak' in str(p)]}\n"
        "r['current'] = memory.memory_info()['current'] >= 4_000_000\n"
        "try:\n    memory.measure_peak(f, device='GPU:0')\nexcept ValueError as e:\n    r['nogpu'] = str(e)\n"
        "before = memory.memory_info('CPU:0')['current']\n"
        "small = tf.zeros(16 * 1024)\n"
        "r['small'] = memory.memory_info('CPU:0')['current'] - before\n"
        "v = mx.update(batch=512, steps=2, budget_mib=1)\n"
        "r['text'] = v.text\nr['figure'] = v.figure is not None\n"
        "r['measured'] = mx.measure_update(512, steps=2)\n"
        "ex = mx.memory_explorer()\nex.render({'batch': 256})\n"
        "r['remembered'] = mx.memory_explorer().values['batch']\n"
        f"r['names'] = {{n: memory.normalize_device(n) for n in {list(DEVICE_NAMES)!r}}}\n"
        "r['logical'] = memory.normalize_device(tf.config.list_logical_devices('CPU')[0])\n"
        "r['physical'] = memory.normalize_device(tf.config.list_physical_devices('CPU')[0])\n"
        f"r['bad'] = {{}}\nfor n in {BAD_DEVICE_NAMES!r}:\n"
        "    try:\n        r['bad'][n] = memory.normalize_device(n)\n"
        "    except ValueError as e:\n        r['bad'][n] = str(e)\n"
        "opts = lambda: tf.config.optimizer.get_experimental_options().get('remapping', 'default')\n"
        "seen = []\n"
        "for policy, dev, preset in [('mixed_float16', 'CPU:0', None), ('float32', 'CPU:0', None),\n"
        "                            ('mixed_float16', 'GPU:0', None), ('mixed_float16', 'CPU:0', True)]:\n"
        "    tf.config.optimizer.set_experimental_options({'remapping': preset})\n"
        "    with mx._unfused_on_cpu(policy, dev):\n"
        "        seen.append(opts())\n"
        "    seen.append(opts())\n"
        "tf.config.optimizer.set_experimental_options({'remapping': None})\n"
        "r['remapping'] = seen\n"
        "spied, real_peak = [], mx.measure_peak\n"
        "mx.measure_peak = lambda *a, **k: spied.append(opts()) or real_peak(*a, **k)\n"
        "mx.measure_update(64, 'mixed_float16'); mx.measure_update(64, 'float32')\n"
        "mx.measure_peak = real_peak\n"
        "r['spied'] = spied\n"
        "os.environ['GPUCOURSE_STATIC'] = '1'\n"
        "r['static'] = ex.show() is None\n"
        "print('RESULT ' + json.dumps(r))\n",
        env={"CUDA_VISIBLE_DEVICES": "-1", "MPLBACKEND": "Agg"})  # the CPU path, also on a GPU machine
    r = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert r["peak"] == ["/device:CPU:0", True, True, True] and r["current"]
    assert r["names"] == DEVICE_NAMES and r["logical"] == r["physical"] == "CPU:0"
    for name, message in r["bad"].items():
        assert message.startswith("device must name one CPU or GPU") and repr(name) in message, (name, message)
    assert "No matching devices found for 'GPU:0'" in r["nogpu"]
    assert r["small"] == 0, "with oneDNN, CPU allocations under 256 KiB are not counted (see CPU_UNCOUNTED_BELOW)"
    first, *rest = r["text"].splitlines()
    assert first.startswith("measured ") and "does NOT fit the 1 MiB budget" in first
    assert "2 x micro-batch 256 = 512 examples" in rest[0] and "no XLA" in rest[0] and r["figure"]
    m = r["measured"]
    assert m["total_bytes"] == m["state_bytes"] + m["step_bytes"]
    params_bytes = 4 * (128 * 512 + 512 * 512)  # the two big kernels, counted even on a CPU
    assert m["state_bytes"] >= 4 * params_bytes  # weights, Adam's 2 slots, the accumulator
    assert m["step_bytes"] >= 256 * 512 * 4  # at least one hidden layer's output of one micro-batch
    assert r["remembered"] == 256, "the explorer keeps its values when the cell is re-run"
    assert r["static"] and "Memory explorer [batch=2048, policy=mixed_float16" in out
    # float16 on a CPU is measured with the remapper off (with TensorFlow's fused float16 MatMul + BiasAdd, one
    # measurement took 12 s on an AVX512-FP16 Xeon), and the learner's setting is back afterwards; nothing else
    # changes
    assert r["remapping"] == [False, "default", "default", "default", "default", "default", False, True]
    assert r["spied"] == [False, "default"], "measure_update must run a float16 CPU step inside _unfused_on_cpu"
    fp16 = out.split("Memory explorer [batch=2048, policy=mixed_float16", 1)[1].split("Memory explorer [", 1)[0]
    assert "remapping off" in fp16 and "remapping off" not in r["text"]


def test_explorer_legend_clears_the_axis_label():
    """The legend sits beside the bars: it overlaps neither the "MiB" label nor the bars, and stays in the figure."""
    import matplotlib

    matplotlib.use("Agg")
    est = memory_explorer.estimate_update(2048, "mixed_float16", 4)  # every part of the estimate is drawn
    fig = memory_explorer._figure(est, {"state_bytes": 5 * MiB, "step_bytes": 9 * MiB, "total_bytes": 14 * MiB},
                                  16 * MiB)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,), (legend,) = fig.axes, fig.legends
    box, label, axes = (legend.get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer),
                        ax.get_window_extent(renderer))
    assert ax.get_xlabel() == "MiB" and len(legend.get_texts()) == 9
    assert not box.overlaps(label) and not box.overlaps(axes)
    for b in (box, label):
        assert fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 and fig.bbox.y0 <= b.y0 and b.y1 <= fig.bbox.y1
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.gpu
def test_growth_keeps_gpu_memory_small_and_the_limit_follows_the_rule():
    unset = "import os\nos.environ.pop('TF_FORCE_GPU_ALLOW_GROWTH', None)"
    greedy = memory.fresh_process_probe(setup=unset)
    grow = memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    forced_off = memory.fresh_process_probe({"TF_FORCE_GPU_ALLOW_GROWTH": "false"},
                                            "for g in tf.config.list_physical_devices('GPU'):\n"
                                            "    tf.config.experimental.set_memory_growth(g, True)")
    assert greedy.growth is False and grow.growth is True and forced_off.growth is False
    assert grow.setup_error is None and grow.memory_growth[0] is None  # the variable is not a Python flag
    if grow.gpu_process_mib is None or greedy.gpu_process_mib is None:
        pytest.skip("NVML gave no memory figures")
    # Summed over GPUs: NVML numbers every GPU, CUDA_VISIBLE_DEVICES may have given TensorFlow another one than 0.
    assert sum(grow.gpu_process_mib) < sum(greedy.gpu_process_mib)
    assert sum(forced_off.gpu_process_mib) > sum(grow.gpu_process_mib)
    if len(greedy.gpu_free_mib_before) == 1 and greedy.compute_capability:
        # TensorFlow asks for the free memory after creating its CUDA context: a little less than NVML saw.
        rule = memory.default_gpu_limit(greedy.gpu_free_mib_before[0] * MiB, greedy.compute_capability[0][0])
        assert rule - 1536 * MiB <= greedy.gpu_limit_bytes[0] <= rule
    assert math.isclose(sum(greedy.gpu_limit_bytes), sum(grow.gpu_limit_bytes), rel_tol=0.1)
