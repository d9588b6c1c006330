"""gpucourse.placement: device names, log parsing, and logging/soft placement in fresh TensorFlow processes."""

import sys

import pytest

from gpucourse import placement

FULL = "/job:localhost/replica:0/task:0/device:{}"

LOG = """\
I0000 00:00:1795393191.139464    7452 placer.cc:162] input: (_Arg): /job:localhost/replica:0/task:0/device:CPU:0
_EagerConst: (_EagerConst): /job:localhost/replica:0/task:0/device:CPU:1
output_RetVal: (_Retval): /job:localhost/replica:0/task:0/device:CPU:1
some unrelated line: (with): parentheses
Executing op _EagerConst in device /job:localhost/replica:0/task:0/device:CPU:1
mul/y: (Const): /job:localhost/replica:0/task:0/device:GPU:0
I0000 00:00:1795393191.147155    7452 execute.cc:1775] Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:10
Executing op __inference_f_12 in device /job:localhost/replica:0/task:0/device:GPU:2
"""


@pytest.mark.parametrize("name, short", [
    (FULL.format("CPU:0"), "CPU:0"), ("/device:GPU:1", "GPU:1"), ("/GPU:12", "GPU:12"), ("gpu:3", "GPU:3"),
    ("/job:worker/replica:0/task:3/device:TPU:7", "TPU:7"), ("/device:XLA_CPU:0", "XLA_CPU:0"),
    ("  /cpu:01/ ", "CPU:1"),
])
def test_short_device(name, short):
    assert placement.short_device(name) == short


@pytest.mark.parametrize("bad, err", [
    ("", ValueError), ("/job:localhost/replica:0/task:0", ValueError), ("/GPU:*", ValueError),
    ("GPU0", ValueError), ("/job:localhost", ValueError), (None, TypeError), (0, TypeError),
])
def test_short_device_bad_input(bad, err):
    with pytest.raises(err, match="device"):
        placement.short_device(bad)


def test_parse_both_kinds_and_ignore_noise():
    log = placement.parse_placement_log(LOG)
    assert len(log) == 7
    assert [r.op_type for r in log.executed] == ["_EagerConst", "MatMul", "__inference_f_12"]
    assert log.executed[-1].is_function_call and not log.executed[0].is_function_call
    assert [(r.op, r.op_type, r.short) for r in log.placed if not r.is_plumbing] == [
        ("_EagerConst", "_EagerConst", "CPU:1"), ("mul/y", "Const", "GPU:0")]
    assert log.devices() == ["CPU:0", "CPU:1", "GPU:0", "GPU:2", "GPU:10"]  # numeric order
    assert log.op_devices(kind="executed") == {"_EagerConst": ["CPU:1"], "MatMul": ["GPU:10"],
                                               "__inference_f_12": ["GPU:2"]}
    assert "_Arg" in log.op_devices(plumbing=True) and "_Arg" not in log.op_devices()
    text = log.to_text(kind="placed")
    assert text.splitlines()[0].split() == ["kind", "op", "op", "type", "device"] and "mul/y" in text


def test_parse_accepts_captured_output_and_rejects_junk():
    class Captured:
        text = LOG

    assert len(placement.parse_placement_log(Captured())) == 7
    assert len(placement.parse_placement_log("")) == 0
    assert "no placement lines" in placement.parse_placement_log("hello").to_text()
    with pytest.raises(TypeError, match="string"):
        placement.parse_placement_log(42)
    with pytest.raises(ValueError, match="kind"):
        placement.parse_placement_log(LOG).rows(kind="eager")


def test_bad_arguments_without_tensorflow():
    with pytest.raises(TypeError, match="list of tensors"):
        placement.devices_of("CPU:0")
    with pytest.raises(TypeError, match=r"\.device"):
        placement.devices_of([1.0])
    with pytest.raises(TypeError):
        placement.start_logging(python_lines="yes")
    with pytest.raises(TypeError):
        with placement.capture(echo=1):
            pass
    with pytest.raises(ValueError, match="non-empty"):
        placement.probe_order({})
    with pytest.raises(TypeError):
        placement.probe_order({"x": 1})
    with pytest.raises(ValueError, match="timeout"):
        placement.probe_logging({"x": ""}, timeout=0)
    with pytest.raises(ValueError, match="kind"):
        placement.PlacementLog().rows(kind="eager")
    with pytest.raises(TypeError, match="fn"):
        placement.attempt("/CPU:0", True, fn=42)


def test_import_does_not_import_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import placement\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_the_probes_are_placement_names_and_import_on_their_own(fresh_python):
    """The fresh-process probes live in _placement_probes (placement re-exports them): each is placement.<name>,
    the same object, in placement.__all__; importing that module first works too (it reads logs with placement's
    parser, looked up on use) and starts no TensorFlow."""
    from gpucourse import _placement_probes

    for name in _placement_probes.__all__:
        assert getattr(placement, name) is getattr(_placement_probes, name) and name in placement.__all__, name
    out = fresh_python("import sys\nfrom gpucourse import _placement_probes as p\n"
                       "log = p.OrderProbe('x', '', True, False, p._parse('')).function_log\n"
                       "from gpucourse import placement\n"
                       "print(type(log) is placement.PlacementLog, len(log), 'tensorflow' in sys.modules)")
    assert out.split() == ["True", "0", "False"]


def test_logging_capture_attempt_and_too_late(fresh_python):
    out = fresh_python(r"""
import tensorflow as tf
from gpucourse import devices, placement
print(placement.effective_soft_placement(), devices.runtime_initialized())  # the setting; starts nothing
print(placement.start_logging(), placement.start_logging())   # on, then already on
devices.setup_logical_devices(3, device_type="CPU")           # allowed *after* logging is on
with placement.capture() as log:
    with tf.device("/CPU:2"):
        a = tf.random.uniform((4, 4))
    b = tf.matmul(a, a)
    @tf.function
    def f(x):
        return tf.reduce_sum(tf.nn.relu(x))
    f(b); f(b)
ex = log.op_devices(kind="executed")
print("RandomUniform", ex["RandomUniform"])
print("calls", sum(r.is_function_call for r in log.executed))
print("relu placed", log.op_devices(kind="placed")["Relu"])
print("devices_of", placement.devices_of([a, b]))
tf.config.set_soft_device_placement(True)
with placement.capture():
    soft = placement.attempt("/CPU:9", soft=True)
    hard = placement.attempt("/CPU:9", soft=False)
    here = placement.attempt("/CPU:1", soft=False)
    junk = placement.attempt("GPU0", soft=True)
print("soft", soft.ran_on, "| hard", hard.ok, hard.error)
print("here", here.ran_on, "| junk", junk.error.split(":")[0])
print("restored", tf.config.get_soft_device_placement())
tf.config.set_soft_device_placement(False)
print("effective when off", placement.effective_soft_placement())
tf.config.set_soft_device_placement(True)
print("effective when on", placement.effective_soft_placement())
""", env={"CUDA_VISIBLE_DEVICES": "-1"})  # logical CPUs only: on a GPU machine the default device is GPU:0
    lines = out.splitlines()
    assert lines[0] == "True False"
    lines = lines[1:]
    assert lines[0] == "True False"
    assert "RandomUniform ['CPU:2']" in lines
    assert "calls 2" in lines
    assert "relu placed ['CPU:0']" in lines
    assert "devices_of ['CPU:2', 'CPU:0']" in lines
    assert "soft CPU:0 | hard False InvalidArgumentError: Could not satisfy device specification" in out
    assert "here CPU:1 | junk ValueError" in lines
    assert lines[-3:] == ["restored True", "effective when off False", "effective when on True"]


def test_start_logging_refuses_after_the_runtime_started(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse import placement\n"
        "tf.constant(1.0) + 1.0\n"
        "try:\n    placement.start_logging()\nexcept placement.TooLateError as e:\n    print('TOO LATE', e)\n"
        "print(placement.logging_enabled())\n")
    assert "TOO LATE" in out and "Restart the kernel" in out
    assert out.split()[-1] == "False"


def test_probes_measure_what_is_too_late_and_the_switch_off_trap(monkeypatch):
    probes, off = placement.probe_logging({
        "physical": "tf.config.list_physical_devices()",
        "logical": "tf.config.list_logical_devices()",
    })
    got = {p.label: (p.flag, p.runtime_started, p.logged, p.config_flag, p.function_logged) for p in probes}
    assert got["physical"] == (True, False, True, True, True)
    # the flag claims True, and so does the ConfigProto new tf.functions get, yet nothing is logged:
    # neither the eager op nor the nodes of a tf.function traced after the late call
    assert got["logical"] == (True, True, False, True, False)
    # set_log_device_placement(False) after the first op: the log goes on, for eager ops and for newly
    # traced tf.functions (placer lines and call lines), and soft placement goes off unseen
    assert (off.log_flag, off.config_flag, off.still_logging, off.function_placed, off.function_called) == (
        False, False, True, True, True)
    assert (off.soft_flag, off.effective_soft) == (True, False)
    assert off.device == "/GPU:0" and "enable_soft_placement=0" in off.error and off.repaired
    assert "soft placement really on" in off.to_text()
    monkeypatch.setattr(sys, "executable", "false")  # a probe process that fails at once
    with pytest.raises(RuntimeError, match="failed"):
        placement.probe_order({"broken": ""})


@pytest.mark.gpu
def test_gpu_placement(fresh_python):
    from gpucourse import devices

    if not devices.nvml_gpus():
        pytest.skip("no NVIDIA GPU on this machine")
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse import placement\nplacement.start_logging()\n"
        "with placement.capture() as log:\n    x = tf.ones((8, 8)) @ tf.ones((8, 8))\n"
        "print(placement.devices_of([x]), log.op_devices(kind='executed'))\n"
        "with placement.capture():\n    strict = placement.attempt('/GPU:0', soft=False)\n"
        "print(strict.ran_on)\n")  # print outside capture(): it captures (and hides) prints too
    assert "GPU:0" in out.splitlines()[0] and out.split()[-1] == "GPU:0"


def test_module_has_no_tensorflow_at_import():
    assert "gpucourse.placement" in sys.modules
    assert all(hasattr(placement, name) for name in placement.__all__)
