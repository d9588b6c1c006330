"""python -m gpucourse.train_multiworker on three cluster sources, 2 workers on 127.0.0.1, and the templates.

One reference run with TF_CONFIG (module fixture); then the same job as SLURM would start it (the
variables srun sets for a 2-task step on one node, a stub scontrol on PATH, the real
SlurmClusterResolver) -- first with worker 1 killed after step 2, then restarted from the checkpoint
-- and as a Kubernetes Indexed Job would (the environment read from docs/clusters/k8s_indexed_job.yaml,
JOB_COMPLETION_INDEX per pod, the pod names pointed at 127.0.0.1 ports with TRAIN_HOST_MAP). All end
with the chief's final weights file equal to the reference's. Every launch has a timeout. Then the checks
before TensorFlow (a port in use, a checkpoint folder it cannot write), a finished worker (SIGTERM not caught,
its iterator kept until exit), and the templates: the batch script's retry loop with a stub srun, its port
blocks, the manifest against Kubernetes' schema. The same batch script on a real SLURM: test_slurm_real.py.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpucourse import clusters, multiworker

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "docs" / "clusters" / "k8s_indexed_job.yaml"
SBATCH = ROOT / "docs" / "clusters" / "slurm_multiworker.sbatch"
ARGS = ["--steps", "4", "--per-replica-batch", "8", "--seed", "3", "--save-every", "1"]
TIMEOUT = 120
_CLUSTER_VARS = re.compile(r"^(TF_CONFIG|SLURM.*|JOB_COMPLETION_INDEX|TRAIN_.*|CUDA_VISIBLE_DEVICES)$")


def _base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not _CLUSTER_VARS.match(k)}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}


def _launch(envs, ckpt: Path, weights: Path, logs: Path, extra=None, more=(), timeout=TIMEOUT):
    """Start one worker per env; wait for all. Like srun --kill-on-bad-exit: one failing kills the rest.

    Returns ({index: exit code}, {index: log text}).
    """
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = {}, []
    try:
        for i, env in enumerate(envs):
            f = open(logs / f"worker{i}.log", "w")
            files.append(f)
            cmd = [sys.executable, "-m", "gpucourse.train_multiworker", *ARGS, "--checkpoint-dir", str(ckpt),
                   "--weights-out", str(weights), *more, *((extra or {}).get(i, []))]
            procs[i] = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs.values()):
            if any(p.poll() not in (None, 0) for p in procs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for f in files:
            f.close()
    return ({i: p.returncode for i, p in procs.items()},
            {i: (logs / f"worker{i}.log").read_text(errors="replace") for i in procs})


SUMMARY = re.compile(r"^worker (\d+) of (\d+)( \(chief\))?: resumed from step (\d+), trained to step (\d+) in [\d.]+ s "
                     r"\((\d+) replicas in sync\); checkpoints at steps ([^;]+); weights sha256 ([0-9a-f]{16}); "
                     r"final weights: (.+)$", flags=re.M)


def _results(logs: dict) -> list[dict]:
    """Each worker's one-line summary (train_multiworker.summarize), read back."""
    out = []
    for i, text in sorted(logs.items()):
        found = SUMMARY.findall(text)
        assert len(found) == 1, f"worker {i} printed {len(found)} summary lines:\n{text[-3000:]}"
        index, n, chief, start, end, replicas, saved, digest, weights = found[0]
        out.append({"index": int(index), "num_workers": int(n), "chief": bool(chief), "start_step": int(start),
                    "steps": int(end), "num_replicas": int(replicas), "saved": saved, "digest": digest,
                    "weights_file": weights})
    return out


def _ok(codes, logs):
    assert all(c == 0 for c in codes.values()), "\n".join(f"worker {i} exit {c}:\n{logs[i][-2500:]}"
                                                           for i, c in codes.items() if c != 0)
    return _results(logs)


def _consecutive_free_ports() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 (SlurmClusterResolver gives task k of a node base + k)."""
    for _ in range(50):
        base = multiworker.free_ports(1)[0]
        if base >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    pytest.skip("no two consecutive free ports on 127.0.0.1")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The TF_CONFIG run: 2 workers, 4 steps. Returns (final weights, results)."""
    tmp = tmp_path_factory.mktemp("tf_config")
    ports = multiworker.free_ports(2)
    envs = [{**_base_env(), "TF_CONFIG": multiworker.tf_config(ports, i)} for i in range(2)]
    codes, logs = _launch(envs, tmp / "ckpt", tmp / "final.npy", tmp / "logs")
    results = _ok(codes, logs)
    assert all("cluster source: TF_CONFIG (task worker" in logs[i] for i in range(2))
    assert [r["start_step"] for r in results] == [0, 0] and results[0]["chief"] and not results[1]["chief"]
    assert results[0]["digest"] == results[1]["digest"], "the two workers must end with the same weights"
    assert results[0]["weights_file"] == str(tmp / "final.npy") and results[1]["weights_file"] == "saved by the chief"
    return np.load(tmp / "final.npy"), results


def test_slurm_step_trains_to_the_same_weights_and_restarts_from_its_checkpoint(reference, tmp_path):
    want, _ = reference
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol-calls\necho localhost\n")
    (stub / "scontrol").chmod(0o755)
    base = _consecutive_free_ports()
    step = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURMD_NODENAME": "localhost",
            "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2"}
    envs = [{**_base_env(), **step, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i),
             "PATH": f"{stub}:{os.environ['PATH']}"} for i in range(2)]
    ckpt, weights = tmp_path / "ckpt", tmp_path / "final.npy"
    # Attempt 1: worker 1 dies (SIGKILL) after step 2; the launcher then stops worker 0, as srun -K does.
    port = ["--slurm-port-base", str(base)]
    codes, logs = _launch(envs, ckpt, weights, tmp_path / "logs1", extra={1: ["--fail-at-step", "2"]}, more=port)
    assert codes[1] == -signal.SIGKILL, logs[1][-2000:]
    saved = multiworker.find_resume_step(ckpt)
    assert saved and saved <= 2 and not weights.exists(), saved  # step 3 needs worker 1: never reached
    # Attempt 2: the same step again; both workers resume from the chief's last checkpoint (step 2, or 1 if
    # the chief was stopped while still writing step 2's: the manager's state file says which).
    codes, logs = _launch(envs, ckpt, weights, tmp_path / "logs2", more=port)
    results = _ok(codes, logs)
    for i in range(2):
        assert f"cluster source: SLURM (SlurmClusterResolver, SLURM's order: SLURM_PROCID={i}" in logs[i]
        assert f'TF_CONFIG={{"cluster": {{"worker": ["localhost:{base}", "localhost:{base + 1}"]}}' in logs[i]
    assert [r["start_step"] for r in results] == [saved] * 2
    assert results[0]["digest"] == results[1]["digest"]
    np.testing.assert_allclose(np.load(weights), want, rtol=1e-5, atol=1e-6)
    calls = (tmp_path / "scontrol-calls").read_text().split("\n") if (tmp_path / "scontrol-calls").exists() else []
    assert all(c in ("", "show hostnames localhost") for c in calls), calls


def _manifest():
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    by_kind = {d["kind"]: d for d in docs if d}
    return by_kind["Service"], by_kind["Job"]


def _pod_env(job: dict, index: int) -> dict:
    """The environment Kubernetes gives pod ``index`` of the Job: the manifest's env (fieldRefs resolved) + the index."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    labels = {"job-name": job["metadata"]["name"], "batch.kubernetes.io/job-name": job["metadata"]["name"]}
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
            assert m and m.group(1) in labels, f"unexpected fieldRef {path}"
            env[e["name"]] = labels[m.group(1)]
    return {**env, "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{job['metadata']['name']}-{index}"}


def test_kubernetes_indexed_job_trains_to_the_same_weights(reference, tmp_path):
    want, _ = reference
    _, job = _manifest()
    n = int(job["spec"]["completions"])
    ports = multiworker.free_ports(n)
    pods = [_pod_env(job, i) for i in range(n)]
    names = clusters.read_kubernetes(pods[0]).cluster["worker"]  # <job>-<i>.<service>:<port>, as in the cluster
    host_map = ",".join(f"{addr.rsplit(':', 1)[0]}=127.0.0.1:{p}" for addr, p in zip(names, ports))
    envs = [{**_base_env(), **pod, "TRAIN_HOST_MAP": host_map} for pod in pods]
    codes, logs = _launch(envs, tmp_path / "ckpt", tmp_path / "final.npy", tmp_path / "logs")
    results = _ok(codes, logs)
    for i in range(n):
        assert f"cluster source: Kubernetes (Indexed Job: JOB_COMPLETION_INDEX={i}, TRAIN_NUM_WORKERS={n}" in logs[i]
    assert [r["index"] for r in results] == list(range(n))
    np.testing.assert_allclose(np.load(tmp_path / "final.npy"), want, rtol=1e-5, atol=1e-6)


def test_no_cluster_description_stops_before_tensorflow(tmp_path):
    env = {**_base_env(), "TRAIN_NUM_WORKERS": "2"}
    out = subprocess.run([sys.executable, "-m", "gpucourse.train_multiworker", "--checkpoint-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "ClusterError: TF_CONFIG: no cluster description found" in out.stderr
    assert "TRAIN_NUM_WORKERS is set" in out.stderr and not list(tmp_path.iterdir())


def _main_in_a_fresh_process(args: list[str], env: dict) -> tuple[int, str, bool]:
    """train_multiworker.main(args) in a fresh interpreter: (its return value, its output, TensorFlow imported?)."""
    code = ("import sys; from gpucourse import train_multiworker as t; rc = t.main(sys.argv[1:]); "
            "print('RESULT', rc, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60)
    m = re.search(r"^RESULT (\d+) (True|False)$", out.stdout, flags=re.M)
    assert m, out.stdout + out.stderr
    return int(m.group(1)), out.stdout + out.stderr, m.group(2) == "True"


def test_a_port_in_use_stops_before_tensorflow_naming_what_chose_it(tmp_path):
    ports = multiworker.free_ports(2)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", ports[1]))
        holder.listen()
        env = {**_base_env(), "TF_CONFIG": multiworker.tf_config(ports, 1)}
        rc, text, tf_imported = _main_in_a_fresh_process(["--checkpoint-dir", str(tmp_path / "ckpt")], env)
        assert (rc, tf_imported) == (2, False), text
        assert (f"ClusterError: TF_CONFIG: port {ports[1]} of this worker's address 127.0.0.1:{ports[1]} is already "
                "in use") in text
        step = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
                "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2"}
        rc, text, tf_imported = _main_in_a_fresh_process(
            ["--check", "--checkpoint-dir", str(tmp_path / "ckpt"), "--slurm-port-base", str(ports[1] - 1)],
            {**_base_env(), **step})
        assert (rc, tf_imported) == (2, False), text
        assert (f"ClusterError: --slurm-port-base: port {ports[1]} (--slurm-port-base {ports[1] - 1} + 1, task 1 of "
                "this node) is already in use") in text and "PORT_BASE=" in text and "slurm_multiworker.sbatch" in text
    # The same worker, the port free again: the checks pass (and still no TensorFlow).
    rc, text, tf_imported = _main_in_a_fresh_process(["--check", "--checkpoint-dir", str(tmp_path / "ckpt")], env)
    assert (rc, tf_imported) == (0, False) and "checks passed" in text, text


def test_a_checkpoint_folder_it_cannot_write_stops_before_tensorflow(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    bad = tmp_path / "a-file" / "ckpt"
    env = {**_base_env(), "TF_CONFIG": multiworker.tf_config(multiworker.free_ports(2), 0)}
    rc, text, tf_imported = _main_in_a_fresh_process(["--checkpoint-dir", str(bad)], env)
    assert (rc, tf_imported) == (2, False), text
    assert f"ClusterError: --checkpoint-dir: cannot write to '{bad}'" in text and "Not a directory" in text
    if os.geteuid() != 0:  # root writes anywhere: the real-SLURM test uses a read-only mount instead
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        rc, text, _ = _main_in_a_fresh_process(["--checkpoint-dir", str(ro)], env)
        assert rc == 2 and "Permission denied" in text, text
    for name in ("ckpt", "gs://bucket/run1"):  # a URL is TensorFlow's to write
        rc, text, _ = _main_in_a_fresh_process(["--check", "--checkpoint-dir", str(tmp_path / name) if name == "ckpt"
                                                else name], env)
        assert rc == 0, text
    assert not [p for p in (tmp_path / "ckpt").iterdir()], "the write check leaves nothing behind"


def test_a_finished_worker_ends_on_sigterm_and_keeps_its_iterator_until_it_exits(tmp_path):
    """Two things the real-SLURM runs showed (docs/clusters/README.md), checked in one worker of a 1-worker cluster:
    once the strategy runs, SIGTERM is not caught (TensorFlow catches it; the worker restores the default, so
    srun's SIGTERM ends a survivor at once), and the distributed iterator is still alive when the worker's
    function has returned (deleting it can wait for a peer that has already left)."""
    code = """if True:
        import re, sys
        from gpucourse import multiworker
        result = multiworker._run_worker(3, 8, 0, "loop", sys.argv[1], 1, None)
        status = open("/proc/self/status").read()
        caught = int(re.search(r"^SigCgt:\\s+([0-9a-f]+)", status, flags=re.M).group(1), 16)
        kept = [type(o).__name__ for o in multiworker._KEEP_UNTIL_EXIT[-1] if o is not None]
        print("RESULT", bool(caught & (1 << 14)), kept, result["saved"], flush=True)
        import os; os._exit(0)
    """
    env = {**_base_env(), "TF_CONFIG": multiworker.tf_config(multiworker.free_ports(1), 0)}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ckpt")], env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    m = re.search(r"^RESULT (True|False) (\[.*\]) \[1, 2, 3\]$", out.stdout, flags=re.M)
    assert m, out.stdout + out.stderr[-3000:]
    assert m.group(1) == "False", "SIGTERM is caught: a survivor would ignore srun's / Kubernetes' SIGTERM"
    assert "DistributedIterator" in m.group(2) and "CollectiveAllReduceStrategy" in m.group(2), m.group(2)


# --------------------------------------------------------------------------- the templates


def test_manifest_has_the_fields_kubernetes_requires_and_agrees_with_itself():
    service, job = _manifest()
    for obj, api in ((service, "v1"), (job, "batch/v1")):
        assert obj["apiVersion"] == api and obj["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] >= 2
    assert isinstance(spec["backoffLimit"], int) and spec["backoffLimit"] >= 0
    assert spec["podReplacementPolicy"] == "Failed", "one pod per index at a time (Duplicate task registration)"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")  # a Job's pods may not use Always
    containers = pod["containers"]
    assert containers and all(c["name"] and c["image"] for c in containers)
    worker = containers[0]
    assert worker["command"][-2:] == ["-m", "gpucourse.train_multiworker"]
    env = _pod_env(job, 0)
    assert int(env["TRAIN_NUM_WORKERS"]) == spec["completions"]
    assert service["spec"]["clusterIP"] == "None", "headless: clusterIP must be the string None"
    assert pod["subdomain"] == service["metadata"]["name"] == env["TRAIN_SERVICE"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]} and env["TRAIN_JOB_NAME"] == \
        job["metadata"]["name"]
    port = int(env["TRAIN_PORT"])
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    assert [p["containerPort"] for p in worker["ports"]] == [port]
    gpu = worker["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == gpu["requests"]["nvidia.com/gpu"] == 1
    mounts = {m["name"] for m in worker["volumeMounts"]}
    assert mounts <= {v["name"] for v in pod["volumes"]}
    ckpt = worker["args"][worker["args"].index("--checkpoint-dir") + 1]
    assert any(ckpt.startswith(m["mountPath"]) for m in worker["volumeMounts"]), "checkpoints must be on the volume"
    c = clusters.read_kubernetes(env)
    assert c.cluster["worker"] == [f"{job['metadata']['name']}-{i}.{service['metadata']['name']}:{port}"
                                   for i in range(spec["completions"])]


def test_sbatch_asks_for_one_task_per_gpu_and_starts_the_script_with_srun():
    text = SBATCH.read_text()
    opts = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, flags=re.M))
    assert int(opts["ntasks-per-node"]) == int(opts["gres"].rsplit(":", 1)[1]), "one task per GPU"
    assert int(opts["nodes"]) >= 2
    srun = re.search(r"^SRUN=\((.*?)\)$", text, flags=re.M).group(1).split()
    # Since SLURM 22.05 srun does not take --cpus-per-task from sbatch (sbatch's man page): pass it on.
    assert srun[0] == "srun" and '--cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"' in srun
    assert {"--distribution=block", "--label"} <= set(srun)
    args = re.search(r"^ARGS=\((.*?)\)$", text, flags=re.M | re.S).group(1)
    assert "--slurm-port-base" in args and "--checkpoint-dir" in args
    assert re.search(r'^"\$\{SRUN\[@\]\}" python -m gpucourse\.train_multiworker --check "\$\{ARGS\[@\]\}"', text,
                     flags=re.M), "a step that only checks, before the training"
    train = r'^  "\$\{SRUN\[@\]\}" --kill-on-bad-exit=1 python -m gpucourse\.train_multiworker "\$\{ARGS\[@\]\}"'
    assert re.search(train, text, flags=re.M), "the training step: one failing task ends it"
    assert "sbatch --gres=none --nodes=1 --ntasks-per-node=2 --cpus-per-task=1" in text, "the CPU form, documented"
    assert "PartitionConfig" in text
    out = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def _run_template(tmp_path: Path, codes: list[int], job_id: int = 7) -> tuple[subprocess.CompletedProcess, list]:
    """Run the batch script with bash, a stub srun that records its arguments and exits with ``codes`` in turn."""
    stub, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    stub.mkdir()
    (tmp_path / "codes").write_text("\n".join(map(str, codes)) + "\n")
    (stub / "srun").write_text(f"""#!/bin/bash
printf '%s\\n' "$*" >> {tmp_path}/calls
code=$(head -n 1 {tmp_path}/codes); sed -i 1d {tmp_path}/codes; exit "${{code:-99}}"
""")
    (stub / "srun").chmod(0o755)
    env = {**_base_env(), "PATH": f"{stub}:{os.environ['PATH']}", "SLURM_JOB_ID": str(job_id),
           "SLURM_JOB_NAME": "tf-multiworker", "SLURM_CPUS_PER_TASK": "8", "CKPT_DIR": str(tmp_path / "ckpt"),
           "VENV": str(venv), "HOME": str(tmp_path)}
    out = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=30)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return out, calls


@pytest.mark.parametrize("codes, exit_code, trainings, restarts, says", [
    ([0, 0], 0, 1, 0, ["training finished (attempt 1 of 3)"]),
    ([0, 137, 0], 0, 2, 1, ["step failed with exit code 137 (attempt 1 of 3); restarting from the last checkpoint",
                            "training finished (attempt 2 of 3)"]),
    ([0, 137, 143, 1], 1, 3, 2, ["(attempt 1 of 3); restarting", "(attempt 2 of 3); restarting",
                                 "step failed 3 times; giving up"]),
    ([0, 2], 2, 1, 0, ["exit code 2 (attempt 1 of 3): a configuration error, named above; not retrying"]),
    ([0, 137, 2], 2, 2, 1, ["exit code 2 (attempt 2 of 3): a configuration error"]),
    ([2], 2, 0, 0, ["checks failed (exit code 2)"]),
])
def test_the_retry_loop_runs_the_step_at_most_3_times_and_never_retries_exit_2(tmp_path, codes, exit_code, trainings,
                                                                                 restarts, says):
    """The template's loop with a stub srun: exit codes in turn for the check step, then each training step."""
    out, calls = _run_template(tmp_path, codes)
    assert out.returncode == exit_code, out.stdout + out.stderr
    assert len(calls) == 1 + trainings and "--check" in calls[0].split()
    for call in calls:
        assert call.startswith("--cpus-per-task=8 --distribution=block --label"), call
        assert "--slurm-port-base 20056 " in call + " "  # job 7: 20000 + 7 % 1500 * 8
    assert all("--kill-on-bad-exit=1" in c and "--check" not in c.split() for c in calls[1:])
    for line in says:
        assert line in out.stdout, out.stdout
    assert out.stdout.count("restarting") == restarts, out.stdout  # never after the last attempt


def test_port_blocks_of_jobs_sharing_a_node_do_not_overlap():
    """The template's PORT_BASE line, run by bash: 8 ports per job, below Linux's ephemeral ports (32768+)."""
    line = re.search(r"^PORT_BASE=.*$", SBATCH.read_text(), flags=re.M).group(0)
    script = f"for SLURM_JOB_ID in $(seq 1000 4100) 4294967294; do unset PORT_BASE; {line}; echo $PORT_BASE; done"
    bases = [int(v) for v in subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                                            env={"PATH": os.environ["PATH"]}).stdout.split()]
    assert len(bases) == 3102 and all(20000 <= b and b + 7 <= 32767 for b in bases)
    window = bases[:1500]  # 1500 consecutive job ids: no two blocks of 8 overlap
    assert all(abs(a - b) >= 8 for i, a in enumerate(window) for b in window[i + 1:i + 1500])
    assert subprocess.run(["bash", "-c", f"SLURM_JOB_ID=7 PORT_BASE=4000; {line}; echo $PORT_BASE"],
                          capture_output=True, text=True, timeout=30).stdout.strip() == "4000", "PORT_BASE overrides"


@pytest.mark.parametrize("version", ["1.34", "latest"])
def test_manifest_validates_against_the_kubernetes_schema(version):
    """The Kubernetes OpenAPI schema (strict: unknown fields are errors), bundled by kubernetes-validate: offline.
    1.34: podReplacementPolicy is GA there (schemas before 1.28 do not know the field)."""
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (bundles the schemas)")
    import copy

    version = kv.latest_version() if version == "latest" else version
    service, job = _manifest()
    for obj in (service, job):
        kv.validate(obj, version, strict=True)
    typo = copy.deepcopy(job)
    typo["spec"]["completionMod"] = typo["spec"].pop("completionMode")
    with pytest.raises(kv.ValidationError, match="completionMod"):
        kv.validate(typo, version, strict=True)


def test_vertex_spec_has_one_chief_and_the_same_machines_in_both_pools():
    text = (ROOT / "docs" / "clusters" / "vertex_ai.md").read_text()
    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, flags=re.S).group(1))
    chief, workers = spec["workerPoolSpecs"][:2]
    assert chief["replicaCount"] == 1 and workers["replicaCount"] >= 1
    assert chief["machineSpec"] == workers["machineSpec"], "MultiWorkerMirroredStrategy: same devices per worker"
    for pool in (chief, workers):
        args = pool["containerSpec"]["args"]
        assert args[args.index("--checkpoint-dir") + 1].startswith("gs://"), "checkpoints on shared storage"
    assert spec["scheduling"]["restartJobOnWorkerRestart"] is True
