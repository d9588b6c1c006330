"""gpucourse.distribute: batch arithmetic, cross-device rules, cluster plumbing and real worker launches."""

import json
import socket
import time

import pytest

from gpucourse import distribute


def test_import_does_not_start_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import distribute\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_batch_arithmetic():
    assert distribute.global_batch_size(32, 4) == 128
    assert distribute.per_replica_batch_size(128, 4) == 32

    class FakeStrategy:
        num_replicas_in_sync = 3

    assert distribute.global_batch_size(5, FakeStrategy()) == 15
    assert distribute.per_replica_batch_size(15, FakeStrategy()) == 5


@pytest.mark.parametrize("call, exc, match", [
    (lambda: distribute.global_batch_size(0, 2), ValueError, "per_replica"),
    (lambda: distribute.global_batch_size(8, 0), ValueError, "num_replicas"),
    (lambda: distribute.global_batch_size(8, "4"), TypeError, "strategy"),
    (lambda: distribute.per_replica_batch_size(10, 4), ValueError, "multiple of 4 such as 8 or 12"),
    (lambda: distribute.per_replica_batch_size(2, 4), ValueError, "such as 4"),
    (lambda: distribute.per_replica_batch_size(True, 1), ValueError, "global_batch"),
])
def test_batch_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


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
    with pytest.raises(ValueError, match="physical_gpus"):
        distribute.expected_cross_device_ops(["/device:GPU:0"], -1)


def test_rule_matches_live_strategies_and_strategies_coexist(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\n"
        "from gpucourse import devices, distribute\n"
        "devices.setup_logical_devices(4, device_type='CPU')\n"
        "names = distribute.strategy_devices(device_type='CPU')\n"
        "losses = []\n"
        "for k in (1, 2, 4):\n"
        "    s = distribute.mirrored_strategy(names[:k])\n"
        "    assert isinstance(s, tf.distribute.MirroredStrategy)\n"
        "    live, rule = distribute.cross_device_ops_of(s), distribute.expected_cross_device_ops(names[:k])\n"
        "    print(k, s.num_replicas_in_sync, (live.ops, live.implementation) == (rule.ops, rule.implementation))\n"
        "    run = distribute.make_step_runner(s, per_replica_batch=8, steps=2, features=4, units=8)\n"
        "    losses.append(float(run()))\n"
        "    assert run.items == 8 * k * 2\n"
        "print(all(l > 0 for l in losses))\n"
        "try:\n    distribute.strategy_devices(9)\nexcept ValueError as e:\n    print('too many:', 'setup_logical_devices' in str(e))\n")
    assert out.split("\n")[:5] == ["1 1 True", "2 2 True", "4 4 True", "True", "too many: True"]


def test_step_runner_and_strategy_bad_input():
    with pytest.raises(TypeError, match="strategy"):
        distribute.make_step_runner("not a strategy")
    with pytest.raises(ValueError, match="steps"):
        distribute.make_step_runner(object(), steps=0)
    with pytest.raises(TypeError, match="devices"):
        distribute.mirrored_strategy("/device:CPU:0")
    with pytest.raises(TypeError, match="strategy"):
        distribute.cross_device_ops_of(42)
    with pytest.raises(ValueError, match="device_type"):
        distribute.strategy_devices(device_type="TPU")


def test_scaling_rows_and_table():
    rows = distribute.scaling_rows({4: 300.0, 1: 100.0, 2: 180.0})
    assert [r["replicas"] for r in rows] == [1, 2, 4]
    assert [r["ideal"] for r in rows] == [1, 2, 4]
    assert rows[1]["speedup"] == pytest.approx(1.8) and rows[2]["efficiency"] == pytest.approx(0.75)
    text = distribute.scaling_table(rows)
    assert "efficiency" in text and "75%" in text and "4.00x" in text
    for bad in ({}, {0: 1.0}, {1: -3.0}, {1: float("nan")}, [1, 2]):
        with pytest.raises(ValueError):
            distribute.scaling_rows(bad)
    with pytest.raises(ValueError, match="scaling_rows"):
        distribute.scaling_table([{"replicas": 1}])


def test_free_ports_are_distinct_and_bindable():
    ports = distribute.free_ports(3)
    assert len(set(ports)) == 3
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    with pytest.raises(ValueError, match="loopback"):
        distribute.free_ports(1, host="0.0.0.0")
    with pytest.raises(ValueError, match="n must be"):
        distribute.free_ports(0)


def test_tf_config_is_read_by_tensorflow():
    text = distribute.tf_config([2222, 3333], 1)
    assert json.loads(text) == {"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:3333"]},
                                "task": {"type": "worker", "index": 1}}
    import os

    import tensorflow as tf  # only parses TF_CONFIG: does not start the runtime

    saved = os.environ.get("TF_CONFIG")
    os.environ["TF_CONFIG"] = text
    try:
        r = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert (r.cluster_spec().as_dict()["worker"], r.task_type, r.task_id) == (
            ["127.0.0.1:2222", "127.0.0.1:3333"], "worker", 1)
    finally:
        os.environ.pop("TF_CONFIG") if saved is None else os.environ.__setitem__("TF_CONFIG", saved)


@pytest.mark.parametrize("ports, index, exc, match", [
    ([2222, 2222], 0, ValueError, "distinct"),
    ([2222, 3333], 2, ValueError, "index"),
    ([2222, 3333], -1, ValueError, "index"),
    ([0, 3333], 0, ValueError, "port"),
    ("2222", 0, TypeError, "ports"),
    ([], 0, TypeError, "ports"),
])
def test_tf_config_bad_input(ports, index, exc, match):
    with pytest.raises(exc, match=match):
        distribute.tf_config(ports, index)


@pytest.mark.parametrize("value, physical, want", [
    (None, 3, [0, 1, 2]), ("", 3, []), ("-1", 3, []), ("2,0", 4, [2, 0]), ("0,7,1", 4, [0]), ("GPU-abc", 2, []),
])
def test_visible_gpu_ids(value, physical, want):
    assert distribute.visible_gpu_ids(value, physical) == want


@pytest.mark.parametrize("workers, gpus, want", [
    (2, [0, 1, 2, 3], ["0,1", "2,3"]), (2, [0, 1, 2], ["0", "1"]), (2, [0], ["-1", "-1"]),
    (3, [], ["-1"] * 3), (1, [2, 3], ["2,3"]), (2, [3, 1], ["3", "1"]),
])
def test_gpu_assignments_never_share_a_gpu(workers, gpus, want):
    got = distribute.gpu_assignments(workers, gpus)
    assert got == want
    used = [g for s in got if s != "-1" for g in s.split(",")]
    assert len(used) == len(set(used))


def test_gpu_helpers_bad_input():
    with pytest.raises(ValueError, match="distinct"):
        distribute.gpu_assignments(2, [0, 0])
    with pytest.raises(TypeError, match="gpu_ids"):
        distribute.gpu_assignments(2, "0,1")
    with pytest.raises(ValueError, match="num_workers"):
        distribute.gpu_assignments(0, [0])
    with pytest.raises(TypeError):
        distribute.visible_gpu_ids(0, 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_workers": 0}, "num_workers"), ({"timeout": 0}, "timeout"), ({"mode": "keras"}, "mode"),
    ({"only": [2]}, "only"), ({"only": []}, "only"), ({"steps": 0}, "steps"),
])
def test_launch_bad_input_starts_nothing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        distribute.launch_workers(**kwargs)


def test_two_workers_train_in_lockstep():
    results = distribute.launch_workers(2, steps=3, per_replica_batch=8, timeout=150, gpu_ids=[])
    assert [r.index for r in results] == [0, 1]
    a, b = results
    assert a.num_replicas == b.num_replicas == 2
    assert len(a.losses) == 3 and a.losses == b.losses
    assert a.weights_checksum == pytest.approx(b.weights_checksum)
    assert a.cuda_visible_devices == "-1"


def test_missing_peer_is_killed_after_timeout():
    t0 = time.monotonic()
    with pytest.raises(distribute.WorkerTimeout, match=r"worker\(s\) \[0\] still running .* \[1\] were never started") as err:
        distribute.launch_workers(2, only=[0], timeout=4, gpu_ids=[])
    assert err.value.worker == 0
    assert time.monotonic() - t0 < 4 + 15  # killed, not left waiting for its peer


def test_worker_error_names_the_failing_worker():
    # A TF_CONFIG that is not JSON makes MultiWorkerMirroredStrategy() raise in every worker.
    with pytest.raises(distribute.WorkerError, match=r"worker \d failed with exit code 2") as err:
        distribute.launch_workers(2, steps=2, timeout=150, gpu_ids=[], extra_env={"TF_CONFIG": "{not json"})
    assert err.value.worker in (0, 1) and "bad TF_CONFIG" in err.value.log


def test_worker_cli_without_tf_config():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "gpucourse.distribute", "worker"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 2 and "TF_CONFIG is not set" in proc.stderr
