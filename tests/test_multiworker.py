"""gpucourse.multiworker: cluster plumbing, and real worker launches (few, each bounded by a timeout).

The full fault-tolerance run (an uninterrupted job, a worker SIGKILLed mid-training, the restart from the
chief's last checkpoint with the same final weights, the temporary folders cleaned up) is notebook 04's
section on fault tolerance, whose checked cells nbval compares on every run: it is not launched a second
time here.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from gpucourse import multiworker


def test_free_ports_are_distinct_and_bindable():
    ports = multiworker.free_ports(3)
    assert len(set(ports)) == 3
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    with pytest.raises(ValueError, match="loopback"):
        multiworker.free_ports(1, host="0.0.0.0")
    with pytest.raises(ValueError, match="n must be >= 1"):
        multiworker.free_ports(0)


def test_tf_config_is_read_by_tensorflow():
    text = multiworker.tf_config([2222, 3333], 1)
    assert json.loads(text) == {"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:3333"]},
                                "task": {"type": "worker", "index": 1}}
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
    ([2222, 3333], 2, ValueError, "index must be <= 1"),
    ([2222, 3333], -1, ValueError, "index must be >= 0"),
    ([0, 3333], 0, ValueError, "port must be >= 1"),
    ([2222.0, 3333], 0, TypeError, "port must be a whole number"),
    ("2222", 0, TypeError, "ports"),
    ([], 0, TypeError, "ports"),
])
def test_tf_config_bad_input(ports, index, exc, match):
    with pytest.raises(exc, match=match):
        multiworker.tf_config(ports, index)


@pytest.mark.parametrize("value, physical, want", [
    (None, 3, [0, 1, 2]), ("", 3, []), ("-1", 3, []), ("2,0", 4, [2, 0]), ("0,7,1", 4, [0]), ("GPU-abc", 2, []),
])
def test_visible_gpu_ids(value, physical, want):
    assert multiworker.visible_gpu_ids(value, physical) == want


@pytest.mark.parametrize("workers, gpus, want", [
    (2, [0, 1, 2, 3], ["0,1", "2,3"]), (2, [0, 1, 2], ["0", "1"]), (2, [0], ["-1", "-1"]),
    (3, [], ["-1"] * 3), (1, [2, 3], ["2,3"]), (2, [3, 1], ["3", "1"]),
])
def test_gpu_assignments_never_share_a_gpu(workers, gpus, want):
    got = multiworker.gpu_assignments(workers, gpus)
    assert got == want
    used = [g for s in got if s != "-1" for g in s.split(",")]
    assert len(used) == len(set(used))


def test_gpu_helpers_bad_input():
    with pytest.raises(ValueError, match="distinct"):
        multiworker.gpu_assignments(2, [0, 0])
    with pytest.raises(TypeError, match="gpu_ids"):
        multiworker.gpu_assignments(2, "0,1")
    with pytest.raises(ValueError, match="num_workers"):
        multiworker.gpu_assignments(0, [0])
    with pytest.raises(TypeError):
        multiworker.visible_gpu_ids(0, 2)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"num_workers": 0}, ValueError, "num_workers"), ({"timeout": 0}, ValueError, "timeout"),
    ({"mode": "keras"}, ValueError, "mode"), ({"only": [2]}, ValueError, "only"), ({"only": []}, ValueError, "only"),
    ({"steps": 0}, ValueError, "steps"), ({"steps": 1.5}, TypeError, "steps"),
    ({"fail_worker": (2, 1)}, ValueError, r"fail_worker\[0\] must be <= 1"),
    ({"fail_worker": (0, 9), "steps": 5}, ValueError, r"fail_worker\[1\] must be <= 5"),
    ({"fail_worker": 1}, TypeError, "pair"),
    ({"checkpoint_dir": 3}, TypeError, "checkpoint_dir"),
    ({"checkpoint_dir": "/tmp/x", "mode": "fit"}, ValueError, "mode='loop'"),
    ({"save_every": 0}, ValueError, "save_every"),
])
def test_launch_bad_input_starts_nothing(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        multiworker.launch_workers(**kwargs)


def test_list_checkpoints(tmp_path):
    assert multiworker.list_checkpoints(tmp_path / "missing") == []
    for name in ("ckpt-6.index", "ckpt-6.data-00000-of-00001", "ckpt-12.index", "checkpoint", "ckpt-x.index"):
        (tmp_path / name).write_text("")
    assert multiworker.list_checkpoints(tmp_path) == [6, 12]
    with pytest.raises(TypeError, match="checkpoint_dir"):
        multiworker.list_checkpoints(3)


def test_find_resume_step_reads_the_managers_state_file_not_the_files_on_disk(tmp_path):
    assert multiworker.find_resume_step(tmp_path / "missing") is None
    assert multiworker.find_resume_step(tmp_path) is None
    for name in ("ckpt-250.index", "ckpt-300.index"):
        (tmp_path / name).write_text("")
    # what CheckpointManager(max_to_keep=2) wrote after step 250, while step 300's files were already there
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-250"\nall_model_checkpoint_paths: "ckpt-200"\n'
                                         'all_model_checkpoint_paths: "ckpt-250"\n'
                                         'all_model_checkpoint_timestamps: 1795907974.5556386\n')
    assert multiworker.list_checkpoints(tmp_path) == [250, 300] and multiworker.find_resume_step(tmp_path) == 250
    (tmp_path / "checkpoint").write_text(f'model_checkpoint_path: "{tmp_path}/ckpt-300"\n')  # an absolute path
    assert multiworker.find_resume_step(str(tmp_path)) == 300
    with pytest.raises(TypeError, match="checkpoint_dir"):
        multiworker.find_resume_step(3)


def test_missing_peer_is_killed_after_timeout():
    t0 = time.monotonic()
    with pytest.raises(multiworker.WorkerTimeout,
                       match=r"worker\(s\) \[0\] still running .* \[1\] were never started") as err:
        multiworker.launch_workers(2, only=[0], timeout=4, gpu_ids=[])
    assert err.value.worker == 0 and err.value.stopped == [0]
    assert time.monotonic() - t0 < 4 + 15  # killed, not left waiting for its peer


def test_worker_error_names_the_failing_worker():
    # A TF_CONFIG that is not JSON makes every worker exit with code 2 before importing TensorFlow.
    with pytest.raises(multiworker.WorkerError, match=r"worker \d failed with exit code 2") as err:
        multiworker.launch_workers(2, steps=2, timeout=150, gpu_ids=[], extra_env={"TF_CONFIG": "{not json"})
    assert err.value.worker in (0, 1) and "bad TF_CONFIG" in err.value.log and err.value.exit_code == 2


def test_worker_cli_without_tf_config():
    proc = subprocess.run([sys.executable, "-m", "gpucourse.multiworker", "worker"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 2 and "TF_CONFIG is not set" in proc.stderr
