"""gpucourse.distribute: batch arithmetic, uneven splits, cross-device rules, input sharding, work to time."""

import pytest

from gpucourse import distribute


def test_import_does_not_start_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import distribute, multiworker, scaling\n"
                       "print('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_batch_arithmetic():
    assert distribute.global_batch_size(32, 4) == 128
    assert distribute.per_replica_batch_size(128, 4) == 32

    class FakeStrategy:
        num_replicas_in_sync = 3

    assert distribute.global_batch_size(5, FakeStrategy()) == 15
    assert distribute.per_replica_batch_size(15, FakeStrategy()) == 5


@pytest.mark.parametrize("call, exc, match", [
    (lambda: distribute.global_batch_size(0, 2), ValueError, "per_replica must be >= 1, got 0"),
    (lambda: distribute.global_batch_size(8, 0), ValueError, "num_replicas"),
    (lambda: distribute.global_batch_size(8, "4"), TypeError, "strategy"),
    (lambda: distribute.global_batch_size(2.0, 4), TypeError, "per_replica must be a whole number"),
    (lambda: distribute.per_replica_batch_size(10, 4), ValueError, "multiple of 4 such as 8 or 12"),
    (lambda: distribute.per_replica_batch_size(2, 4), ValueError, "such as 4"),
    (lambda: distribute.per_replica_batch_size(True, 1), TypeError, "global_batch"),
])
def test_batch_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("batch, replicas, want", [
    (8, 4, [2, 2, 2, 2]), (7, 4, [2, 2, 2, 1]), (13, 4, [4, 4, 4, 1]), (2, 4, [1, 1, 0, 0]),
    (1, 4, [1, 0, 0, 0]), (0, 2, [0, 0]), (5, 1, [5]),
])
def test_replica_split(batch, replicas, want):
    got = distribute.replica_split(batch, replicas)
    assert got == want and sum(got) == batch


def test_replica_split_bad_input():
    with pytest.raises(ValueError, match="batch must be >= 0"):
        distribute.replica_split(-1, 2)
    with pytest.raises(TypeError, match="replicas"):
        distribute.replica_split(4, 2.5)


@pytest.mark.parametrize("devices, phys, logical, ops, impl", [
    (["/device:CPU:0", "/device:CPU:1"], 0, None, "CollectiveAllReduce", "RING"),
    (["/device:GPU:0", "/device:GPU:1"], 2, None, "CollectiveAllReduce", "NCCL"),
    (["/device:GPU:0", "/device:GPU:1"], 1, 2, "CollectiveAllReduce", "RING"),
    (["/device:CPU:0", "/device:GPU:0"], 1, None, "ReductionToOneDevice", None),
])
def test_expected_cross_device_ops(devices, phys, logical, ops, impl):
    got = distribute.expected_cross_device_ops(devices, phys, logical)
    assert (got.ops, got.implementation) == (ops, impl)
    assert ops in str(got)


def test_expected_cross_device_ops_bad_input():
    with pytest.raises(TypeError, match="non-empty list"):
        distribute.expected_cross_device_ops("/device:CPU:0")
    with pytest.raises(TypeError, match="non-empty list"):
        distribute.expected_cross_device_ops([])
    with pytest.raises(ValueError, match="physical_gpus must be >= 0"):
        distribute.expected_cross_device_ops(["/device:GPU:0"], -1)
    with pytest.raises(TypeError, match="physical_gpus"):
        distribute.expected_cross_device_ops(["/device:GPU:0"], 1.0)


def test_live_strategies_match_the_rules_and_coexist(fresh_python):
    """One fresh process: the all-reduce rule, the uneven split and both runners, against live strategies."""
    out = fresh_python(
        "import tensorflow as tf\n"
        "from gpucourse import devices, distribute\n"
        "devices.setup_logical_devices(4, device_type='CPU')\n"
        "names = distribute.strategy_devices(device_type='CPU')\n"
        "for k in (1, 2, 4):\n"
        "    s = distribute.mirrored_strategy(names[:k])\n"
        "    assert isinstance(s, tf.distribute.MirroredStrategy)\n"
        "    live, rule = distribute.cross_device_ops_of(s), distribute.expected_cross_device_ops(names[:k])\n"
        "    run = distribute.make_step_runner(s, per_replica_batch=8, steps=2, features=4, units=8)\n"
        "    ar = distribute.make_allreduce_runner(s, run.params, steps=2)\n"
        "    print(k, s.num_replicas_in_sync, (live.ops, live.implementation) == (rule.ops, rule.implementation),\n"
        "          float(run()) > 0, run.items == 8 * k * 2, float(ar()) == 2.0 * k, ar.bytes_per_step == 4 * run.params)\n"
        "s = distribute.mirrored_strategy(names)\n"
        "x = tf.reshape(tf.range(14.0), (14, 1))\n"
        "for b in (7, 13):\n"
        "    sizes = [[int(t.shape[0]) for t in s.experimental_local_results(e)]\n"
        "             for e in s.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(x).batch(b))]\n"
        "    want = [distribute.replica_split(n, 4) for n in (b, 14 - b)]\n"
        "    print('split', b, sizes == want)\n"
        "print('params', run.params == 4 * 8 + 8 + 8 * 8 + 8 + 8 + 1, run.flops_per_replica_step == 6 * run.params * 8)\n"
        "try:\n    distribute.strategy_devices(9)\nexcept ValueError as e:\n    print('too many:', 'setup_logical_devices' in str(e))\n")
    assert out.strip().split("\n") == ["1 1 True True True True True", "2 2 True True True True True",
                                       "4 4 True True True True True", "split 7 True", "split 13 True",
                                       "params True True", "too many: True"]


def test_auto_shard_policies(tmp_path):
    import tensorflow as tf  # tf.data only: no device configuration in this test file

    def write(name, values):
        path = str(tmp_path / name)
        with tf.io.TFRecordWriter(path) as w:
            for v in values:
                w.write(str(v).encode())
        return path

    def reader(files):
        return tf.data.Dataset.from_tensor_slices(files).interleave(tf.data.TFRecordDataset, cycle_length=1)

    four = [write(f"part{i}", range(10 * i, 10 * i + 2)) for i in range(4)]
    got = {p: [sorted(int(v) for v in distribute.auto_shard(reader(four), 2, w, p)) for w in range(2)]
           for p in ("FILE", "DATA", "OFF", "AUTO")}
    assert got["FILE"] == got["AUTO"] == [[0, 1, 20, 21], [10, 11, 30, 31]]  # whole files per worker
    assert got["DATA"] == [[0, 10, 20, 30], [1, 11, 21, 31]]  # every other record of every file
    assert got["OFF"] == [[0, 1, 10, 11, 20, 21, 30, 31]] * 2  # duplicates
    one = [write("all", range(6))]
    with pytest.raises(tf.errors.InvalidArgumentError, match="Could not apply FILE based sharding"):
        distribute.auto_shard(reader(one), 2, 0, "AUTO")
    assert sorted(int(v) for v in distribute.auto_shard(reader(one), 2, 1, "DATA")) == [1, 3, 5]
    assert distribute.auto_shard(tf.data.Dataset.range(6), 3, 2, "AUTO") == [2, 5]  # no reader: DATA


def test_auto_shard_bad_input():
    with pytest.raises(ValueError, match="policy must be one of"):
        distribute.auto_shard(None, 2, 0, "FILES")
    with pytest.raises(ValueError, match="index must be <= 1"):
        distribute.auto_shard(None, 2, 2)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        distribute.auto_shard([1, 2], 2, 0)


def test_runners_and_strategy_bad_input():
    with pytest.raises(TypeError, match="strategy"):
        distribute.make_step_runner("not a strategy")
    with pytest.raises(ValueError, match="steps"):
        distribute.make_step_runner(object(), steps=0)
    with pytest.raises(TypeError, match="strategy"):
        distribute.make_allreduce_runner(object(), 10)
    with pytest.raises(TypeError, match="devices"):
        distribute.mirrored_strategy("/device:CPU:0")
    with pytest.raises(TypeError, match="strategy"):
        distribute.cross_device_ops_of(42)
    with pytest.raises(ValueError, match="device_type must be one of"):
        distribute.strategy_devices(device_type="TPU")


def test_auto_shard_drops_tensorflows_log_lines_and_passes_on_the_rest(tmp_path):
    """With every C++ log level shown (as on Colab, where TF_CPP_MIN_LOG_LEVEL is unset), a failed FILE shard
    makes TensorFlow log a W line repeating the error, and reading a TFRecordDataset an I line: both dropped."""
    import os
    import subprocess
    import sys

    code = f"""
import os, tensorflow as tf
from gpucourse import distribute
path = os.path.join({str(tmp_path)!r}, "all")
with tf.io.TFRecordWriter(path) as w:
    for v in range(4):
        w.write(str(v).encode())
one = tf.data.Dataset.from_tensor_slices([path]).interleave(tf.data.TFRecordDataset, cycle_length=1)
print("DATA", [int(v) for v in distribute.auto_shard(one, 2, 1, "DATA")])
try:
    distribute.auto_shard(one, 2, 0, "AUTO")
except tf.errors.InvalidArgumentError as err:
    print("AUTO raises:", "Could not apply FILE based sharding" in err.message)
def noisy(v):
    os.write(2, b"a line of the learner's own\\n")
    return v
ds = tf.data.Dataset.range(2).map(lambda x: tf.py_function(noisy, [x], tf.int64))
print("own", [int(v) for v in distribute.auto_shard(ds, 2, 0, "OFF")])
"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-4:] == ["DATA [1, 3]", "AUTO raises: True", "own [0, 1]", ""]
    assert "Local rendezvous" not in proc.stderr and "TFRecordDataset `buffer_size`" not in proc.stderr
    assert proc.stderr.count("a line of the learner's own") == 2
