"""gpucourse.clusters and the script's pure parts: every cluster source, and every bad input named by its variable.

TF_CONFIG and Kubernetes are pure (no TensorFlow). The SLURM cases go through TensorFlow's real
SlurmClusterResolver in this process (it only reads the environment; no runtime starts). The real
2-worker trainings are in test_train_multiworker.py.
"""

import json
import os

import pytest

from gpucourse import clusters
from gpucourse.train_multiworker import slurm_gpus

K8S = {"JOB_COMPLETION_INDEX": "1", "TRAIN_NUM_WORKERS": "2", "TRAIN_JOB_NAME": "train",
       "TRAIN_SERVICE": "train-workers", "TRAIN_PORT": "2222"}
SLURM = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
         "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


def test_tf_config_is_read_as_it_is():
    text = json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})
    c = clusters.read_tf_config(text)
    assert (c.source, c.cluster, c.task_type, c.task_index, c.num_workers) == (
        "TF_CONFIG", {"worker": ["a:1", "b:2"]}, "worker", 1, 2)
    assert json.loads(c.tf_config()) == json.loads(text)


def test_vertex_style_tf_config_with_a_chief_is_accepted():
    text = json.dumps({"cluster": {"chief": ["cmle-training-workerpool0-ab-0:2222"],
                                   "worker": ["cmle-training-workerpool1-ab-0:2222"]},
                       "environment": "cloud", "task": {"type": "chief", "index": 0}, "job": {}})
    c = clusters.read_tf_config(text)
    assert (c.task_type, c.task_index, c.num_workers) == ("chief", 0, 2)


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ('{"cluster": {"worker": ["a:1"]}}', "must look like"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}}', "ps"),
    ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}', r"0\.\.1"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "not in the cluster"),
])
def test_bad_tf_config_names_the_variable(text, match):
    with pytest.raises(clusters.ClusterError, match=match) as err:
        clusters.read_tf_config(text)
    assert err.value.variable == "TF_CONFIG" and str(err.value).startswith("TF_CONFIG: ")


def test_kubernetes_index_gives_the_pod_names_of_the_headless_service():
    c = clusters.read_kubernetes(K8S)
    assert c.cluster == {"worker": ["train-0.train-workers:2222", "train-1.train-workers:2222"]}
    assert (c.source, c.task_index) == ("Kubernetes", 1)
    mapped = clusters.read_kubernetes({**K8S, "TRAIN_HOST_MAP": "train-0.train-workers=127.0.0.1:4100, "
                                                                "train-1.train-workers=10.1.2.3"})
    assert mapped.cluster == {"worker": ["127.0.0.1:4100", "10.1.2.3:2222"]}


@pytest.mark.parametrize("change, variable, match", [
    ({"TRAIN_NUM_WORKERS": None}, "TRAIN_NUM_WORKERS", "is not set"),
    ({"TRAIN_NUM_WORKERS": "two"}, "TRAIN_NUM_WORKERS", "whole number"),
    ({"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX", r"0\.\.1, got 2.*completions"),
    ({"TRAIN_JOB_NAME": None}, "TRAIN_JOB_NAME", "metadata.name"),
    ({"TRAIN_SERVICE": "Train_Workers"}, "TRAIN_SERVICE", "DNS name"),
    ({"TRAIN_PORT": "70000"}, "TRAIN_PORT", "65535"),
    ({"TRAIN_HOST_MAP": "train-9.train-workers=127.0.0.1"}, "TRAIN_HOST_MAP", "not worker hostnames"),
    ({"TRAIN_HOST_MAP": "train-0.train-workers"}, "TRAIN_HOST_MAP", "entries must look like"),
])
def test_bad_kubernetes_env_names_the_variable(change, variable, match):
    env = {k: v for k, v in {**K8S, **change}.items() if v is not None}
    with pytest.raises(clusters.ClusterError, match=match) as err:
        clusters.read_kubernetes(env)
    assert err.value.variable == variable


def test_no_source_names_all_three_and_a_half_set_job_is_pointed_out():
    with pytest.raises(clusters.ClusterError, match="TF_CONFIG.*SLURM_PROCID.*JOB_COMPLETION_INDEX"):
        clusters.resolve_cluster({"HOME": "/root"})
    with pytest.raises(clusters.ClusterError, match="TRAIN_NUM_WORKERS is set.*completionMode: Indexed"):
        clusters.resolve_cluster({"TRAIN_NUM_WORKERS": "2"})
    with pytest.raises(TypeError, match="env must be"):
        clusters.resolve_cluster(["TF_CONFIG"])
    assert clusters.resolve_cluster({**K8S, "TF_CONFIG": " "}).source == "Kubernetes"  # empty: as if unset


def test_importing_the_script_does_not_import_tensorflow(fresh_python):
    out = fresh_python("import sys, gpucourse.train_multiworker, gpucourse.clusters; print('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_two_sources_are_used_only_when_they_agree():
    k8s = clusters.read_kubernetes(K8S)
    both = clusters.resolve_cluster({**K8S, "TF_CONFIG": k8s.tf_config()})
    assert both.source == "TF_CONFIG = Kubernetes" and both.same_cluster(k8s)
    other = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}})
    with pytest.raises(clusters.ClusterError, match="TF_CONFIG and Kubernetes describe different clusters") as err:
        clusters.resolve_cluster({**K8S, "TF_CONFIG": other})
    assert err.value.variable == "JOB_COMPLETION_INDEX"


# --------------------------------------------------------------------------- SLURM, through the real resolver


def test_slurm_step_through_slurm_cluster_resolver():
    saved = {k: v for k, v in os.environ.items() if k.startswith("SLURM")}
    c = clusters.read_slurm(SLURM, port_base=5000)
    assert {k: v for k, v in os.environ.items() if k.startswith("SLURM")} == saved, "os.environ must be restored"
    assert c.cluster == {"worker": ["gpu07:5000", "gpu07:5001", "gpu08:5000", "gpu08:5001"]}
    assert (c.source, c.task_index, c.tasks_on_node, c.local_rank) == ("SLURM", 1, 2, 1)
    assert "SlurmClusterResolver, SLURM's order" in c.describe()


def test_tensorflow_2_21_resolver_sorts_host_names_as_strings(monkeypatch):
    """Why the worker list is not the resolver's: its cluster_spec() sorts the hosts, node10 before node9."""
    import tensorflow as tf

    for k, v in {**SLURM, "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "node[9-10]"}.items():
        monkeypatch.setenv(k, v)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=5000, gpus_per_node=4, gpus_per_task=1,
                                                                   auto_set_gpu=False)
    assert resolver.cluster_spec().as_dict()["worker"][0] == "node10:5000"
    assert resolver.task_id == 0  # rank 0 runs on node9, but would be told it is node10:5000


@pytest.mark.parametrize("nodelist, per_node, want", [
    ("node[9-10]", "2(x2)", ["node9:5000", "node9:5001", "node10:5000", "node10:5001"]),
    ("n[1-2,10]", "1(x3)", ["n1:5000", "n2:5000", "n10:5000"]),
    ("node[098-101]", "1(x4)", ["node098:5000", "node099:5000", "node100:5000", "node101:5000"]),
    ("gpu9,gpu10,cpu1", "2,1,1", ["gpu9:5000", "gpu9:5001", "gpu10:5000", "cpu1:5000"]),
    ("b[8-9],a10", "1,2,1", ["b8:5000", "b9:5000", "b9:5001", "a10:5000"]),
])
def test_slurm_workers_follow_slurms_order_through_the_real_resolver(nodelist, per_node, want):
    """Worker k is SLURM task k (block distribution fills the nodes in the node list's order), whatever the
    host names sort to; TensorFlow's SlurmClusterResolver (real, with this environment) must find the same set."""
    for rank, addr in enumerate(want):
        host = addr.split(":")[0]
        local = sum(1 for a in want[:rank] if a.split(":")[0] == host)
        env = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_STEP_NUM_TASKS": str(len(want)),
               "SLURM_NTASKS": str(len(want)), "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": per_node,
               "SLURMD_NODENAME": host}
        c = clusters.resolve_cluster(env, slurm_port_base=5000)
        assert c.cluster == {"worker": want} and c.task_index == rank and c.local_rank == local
        assert c.tasks_on_node == sum(1 for a in want if a.split(":")[0] == host)
        assert clusters.resolve_cluster(env, slurm_port_base=5000, tensorflow=False).same_cluster(c)


def test_a_task_on_another_node_than_its_rank_says_stops():
    env = {**SLURM, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "gpu08"}
    with pytest.raises(clusters.ClusterError, match="gpu08.*places task 0 on 'gpu07'.*distribution=block") as err:
        clusters.resolve_cluster(env)
    assert err.value.variable == "SLURMD_NODENAME"


def test_a_resolver_that_finds_other_workers_stops():
    class Other:  # stands in for a resolver that reads the node list differently
        task_type, task_id = "worker", 1

        def __init__(self, **kwargs):
            pass

        def cluster_spec(self):
            import types

            return types.SimpleNamespace(as_dict=lambda: {"worker": ["gpu07:5000", "gpu07:5001", "gpu09:5000",
                                                                     "gpu09:5001"]})

    with pytest.raises(clusters.ClusterError, match="must be the same workers") as err:
        clusters.read_slurm(SLURM, port_base=5000, resolver_class=Other)
    assert err.value.variable == "SLURM_STEP_NODELIST"


@pytest.mark.parametrize("change, variable, match", [
    ({"SLURM_STEP_NODELIST": None}, "SLURM_STEP_NODELIST", "srun"),
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID", r"0\.\.3"),
    ({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, "SLURM_STEP_NUM_TASKS", "batch step.*srun"),
    ({"SLURM_STEP_NODELIST": "gpu[07-"}, "SLURM_STEP_NODELIST", "cannot read 'gpu\\[07-' as a SLURM host list"),
    ({"SLURM_STEP_NODELIST": "gpu[08-07]"}, "SLURM_STEP_NODELIST", "cannot read the range '08-07'"),
    ({"SLURM_STEP_NODELIST": "gpu07,gpu07"}, "SLURM_STEP_TASKS_PER_NODE", "names 2 \\(1 different\\)"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "SLURM_STEP_TASKS_PER_NODE", "gives 3 node\\(s\\)"),
    ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE", "cannot read 'two'"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3(x2)"}, "SLURM_STEP_TASKS_PER_NODE", "places 6 tasks but SLURM_STEP_NUM_TASKS=4"),
    ({"SLURM_LOCALID": "0"}, "SLURM_LOCALID", "distribution=block"),
])
def test_bad_slurm_env_names_the_variable(change, variable, match):
    env = {k: v for k, v in {**SLURM, **change}.items() if v is not None}
    with pytest.raises(clusters.ClusterError, match=match) as err:
        clusters.resolve_cluster(env)
    assert err.value.variable == variable


def test_slurm_and_tf_config_disagreeing_stop_the_script():
    stale = json.dumps({"cluster": {"worker": ["gpu07:8888", "gpu07:8889"]}, "task": {"type": "worker", "index": 1}})
    with pytest.raises(clusters.ClusterError, match="TF_CONFIG and SLURM describe different clusters") as err:
        clusters.resolve_cluster({**SLURM, "TF_CONFIG": stale})
    assert err.value.variable == "SLURM_PROCID"


def test_slurm_resolver_facts_of_tensorflow_2_21(tmp_path, monkeypatch):
    """What docs/clusters/README.md says about the resolver: its GPU split needs a GPU per task, and it expands
    the node list itself (a stub scontrol on PATH is never run)."""
    import tensorflow as tf

    (tmp_path / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\necho gpu07\necho gpu08\n")
    (tmp_path / "scontrol").chmod(0o755)
    path = os.environ["PATH"]
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # scontrol only: no nvidia-smi to count the GPUs with
    with pytest.raises(FileNotFoundError, match="nvidia-smi"):
        resolver(port_base=5000)
    monkeypatch.setenv("PATH", f"{tmp_path}:{path}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # counted as one GPU for four tasks
    with pytest.raises(ValueError, match="range\\(\\) arg 3 must not be zero"):
        resolver(port_base=5000).cluster_spec()
    spec = resolver(port_base=5000, gpus_per_node=4, gpus_per_task=1, auto_set_gpu=False).cluster_spec()
    assert spec.as_dict() == {"worker": ["gpu07:5000", "gpu07:5001", "gpu08:5000", "gpu08:5001"]}
    assert not (tmp_path / "calls").exists(), "SlurmClusterResolver ran scontrol: update docs/clusters/README.md"


# --------------------------------------------------------------------------- one GPU per worker on a SLURM node


@pytest.mark.parametrize("env, tasks, rank, physical, want", [
    ({}, 4, 2, 4, "2"),                                        # --gres=gpu:4, 4 tasks: task 2 gets GPU 2
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 2, 1, 8, "6,7"),     # 2 tasks share out the 4 GPUs they see
    ({}, 1, 0, 4, "0,1,2,3"),                                  # one task per node drives all GPUs
    ({"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "0"}, 4, 3, 4, None),  # SLURM bound them already
    ({}, 2, 0, 0, None),                                       # CPU node: nothing to split
])
def test_slurm_gpus_give_each_task_its_own(env, tasks, rank, physical, want):
    assert slurm_gpus(env, tasks, rank, physical) == want


def test_fewer_gpus_than_tasks_stops():
    with pytest.raises(clusters.ClusterError, match="NCCL needs one GPU per worker") as err:
        slurm_gpus({"CUDA_VISIBLE_DEVICES": "0"}, 2, 0, 4)
    assert err.value.variable == "SLURM_STEP_TASKS_PER_NODE"
