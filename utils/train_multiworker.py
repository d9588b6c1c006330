"""Topic 04, beyond one machine: the multi-worker training script a cluster engine starts once per worker.

The one job: ``python -m gpucourse.train_multiworker`` trains notebook 04's
model with its custom loop under ``MultiWorkerMirroredStrategy``, on whatever
cluster started it, and resumes from the last checkpoint when restarted.

* It finds its cluster with :func:`gpucourse.clusters.resolve_cluster`:
  ``TF_CONFIG`` (you, the course launcher, Vertex AI), SLURM (in SLURM's task
  order, checked against TensorFlow's ``SlurmClusterResolver``) or a Kubernetes Indexed Job
  (``JOB_COMPLETION_INDEX`` + the manifest's ``TRAIN_*`` variables), prints
  which one, and hands it to the strategy as ``TF_CONFIG``. No source, or two
  that disagree: it stops with exit code 2 and a message naming the variable.
* On SLURM it gives each task on a node its own GPUs (:func:`slurm_gpus`):
  NCCL refuses two workers on one GPU.
* Before TensorFlow starts it checks what would otherwise fail late or
  obscurely: that this worker's port is free (:func:`check_port`) and that it
  can write ``--checkpoint-dir`` (:func:`check_checkpoint_dir`). A problem stops
  it with exit code 2 and a message naming the option and the template line to
  change. ``--check`` runs only these checks (the SLURM template runs them as a
  step of their own, so that one bad task makes the whole step exit 2).
* Training, checkpoints and restart are notebook 04's worker
  (``gpucourse.multiworker``): every ``--save-every`` steps the chief saves
  model, optimizer and step into ``--checkpoint-dir`` (shared storage on a real
  cluster); a worker that starts finds the latest checkpoint there and goes on
  from it. The chief writes the final weights to ``--weights-out``. Each worker
  ends with one short summary line (:func:`summarize`), short enough that the
  lines of several workers sharing one log never run into each other. Once the
  strategy runs, SIGTERM ends the worker again (TensorFlow catches it), so an
  engine's stop signal stops it (``multiworker._restore_sigterm``).

Templates for each engine, and what each does when a worker fails, are in
``docs/clusters/``. Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import socket
import sys
from pathlib import Path
from typing import Mapping, Sequence

from . import _validate, clusters, multiworker

__all__ = ["check_checkpoint_dir", "check_port", "main", "slurm_gpus", "summarize", "train"]


def slurm_gpus(env: Mapping[str, str], tasks_on_node: int, local_rank: int, physical: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for SLURM task ``local_rank`` of ``tasks_on_node`` on this node, or None to keep it.

    ``None`` when SLURM already bound GPUs to each task (``SLURM_GPUS_PER_TASK``
    is set, as with ``--gpus-per-task``) or when the node has no GPU. Otherwise
    the GPUs this task sees (all of the node's, with ``--gres=gpu:N``) are split
    into equal disjoint slices, one per task (:func:`gpucourse.multiworker.gpu_assignments`).
    Fewer GPUs than tasks is an error: two workers would share a GPU.
    """
    _validate.whole("tasks_on_node", tasks_on_node, what="workers on this node")
    _validate.whole("local_rank", local_rank, minimum=0, maximum=tasks_on_node - 1, what="this worker on its node")
    _validate.whole("physical", physical, minimum=0, what="GPUs on this node")
    if env.get("SLURM_GPUS_PER_TASK", "").strip():
        return None
    ids = multiworker.visible_gpu_ids(env.get("CUDA_VISIBLE_DEVICES"), physical)
    if not ids:
        return None
    if len(ids) < tasks_on_node:
        raise clusters.ClusterError("SLURM_STEP_TASKS_PER_NODE", f"{tasks_on_node} tasks on this node but only "
                                                                 f"{len(ids)} GPU(s) visible ({ids}): NCCL needs one "
                                                                 "GPU per worker; use --ntasks-per-node equal to the "
                                                                 "GPUs per node (--gres=gpu:N)")
    return multiworker.gpu_assignments(tasks_on_node, ids)[local_rank]

#: Where each engine's template sets what the pre-start checks may ask the user to change.
SLURM_TEMPLATE = "docs/clusters/slurm_multiworker.sbatch"
K8S_TEMPLATE = "docs/clusters/k8s_indexed_job.yaml"


def check_port(cluster: clusters.Cluster, slurm_port_base: int | None = None) -> int:
    """This worker's port, after checking that nothing on this machine listens on it (before TensorFlow starts).

    TensorFlow's server listens on the port of this worker's own address, on
    every interface. Taken, it would fail only after the import with ``Could
    not start gRPC server`` / ``Failed to add port to server``, which names
    neither the cause nor the fix; its peers would wait for it meanwhile. This
    binds the port the same way (``SO_REUSEADDR``: a port left in TIME_WAIT by
    a previous run is free, a listening one is not) and raises
    :class:`~gpucourse.clusters.ClusterError` naming the option or variable
    that chose the port and the template line to change.
    """
    address = cluster.cluster[cluster.task_type][cluster.task_index]
    port = int(address.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
            return port
        except OSError as err:
            if err.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            why = "is already in use" if err.errno == errno.EADDRINUSE else "may not be used (below 1024?)"
    host = socket.gethostname()
    if "SLURM" in cluster.source:
        base = slurm_port_base if slurm_port_base is not None else port - cluster.local_rank
        raise clusters.ClusterError("--slurm-port-base",
                                    f"port {port} (--slurm-port-base {base} + {cluster.local_rank}, task "
                                    f"{cluster.local_rank} of this node) {why} on {host}: another program or job "
                                    f"listens there. Choose other ports: change the line PORT_BASE=... in "
                                    f"{SLURM_TEMPLATE} (or submit with PORT_BASE=<free port> sbatch ...), or pass "
                                    "another --slurm-port-base")
    if "Kubernetes" in cluster.source:
        raise clusters.ClusterError("TRAIN_PORT", f"port {port} {why} in this pod ({host}): change TRAIN_PORT, the "
                                                  f"containerPort and the Service's port together in {K8S_TEMPLATE}")
    raise clusters.ClusterError("TF_CONFIG", f"port {port} of this worker's address {address} {why} on {host}: give "
                                             "this worker a free port in TF_CONFIG")


def check_checkpoint_dir(path: str, cluster: clusters.Cluster) -> str:
    """Create ``path`` if needed and check that this worker can write there (before TensorFlow starts).

    Every worker writes into the checkpoint folder (the chief its checkpoints,
    the others a temporary copy they delete), so an unwritable folder would
    otherwise surface only at the first save, ``--save-every`` steps in, as a
    raw ``PermissionDeniedError``. Raises
    :class:`~gpucourse.clusters.ClusterError` naming ``--checkpoint-dir`` and
    the template line that sets it. A URL (``gs://...``) is left to TensorFlow.
    """
    if "://" in path:
        return "not checked here (a URL: TensorFlow writes it)"
    probe = os.path.join(path, f".write-check-{socket.gethostname()}-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
        return "writable"
    except OSError as err:
        reason = f"{type(err).__name__}: {err.strerror or err}"
    if "SLURM" in cluster.source:
        where = f"change the line CKPT_DIR=... in {SLURM_TEMPLATE} (or submit with CKPT_DIR=<folder> sbatch ...)"
    elif "Kubernetes" in cluster.source:
        where = f"change --checkpoint-dir in the container's args and its volume in {K8S_TEMPLATE}"
    else:
        where = "pass another --checkpoint-dir"
    raise clusters.ClusterError("--checkpoint-dir", f"cannot write to {path!r} on {socket.gethostname()} ({reason}). "
                                                    "Every worker writes there, so it must be a folder on storage "
                                                    f"that every node shares and every worker may write: {where}")


def summarize(result: dict, num_workers: int, steps: int) -> str:
    """One line for the log: where this worker started and stopped, its checkpoints, a digest of its weights.

    Short on purpose (a few hundred characters): SLURM passes each task's output
    on in pieces of about a kilobyte, and two workers' long lines in one log
    ran into each other. Equal digests mean equal weights.
    """
    import numpy as np

    saved = result["saved"]
    marks = ("none" if not saved else ", ".join(map(str, saved)) if len(saved) <= 4
             else f"{saved[0]}, {saved[1]}, ..., {saved[-1]} ({len(saved)})")
    digest = hashlib.sha256(np.asarray(result["weights"], dtype=np.float32).tobytes()).hexdigest()[:16]
    role = " (chief)" if result["chief"] else ""
    where = result["weights_file"] or "saved by the chief"
    return (f"worker {result['index']} of {num_workers}{role}: resumed from step {result['start_step']}, trained to "
            f"step {steps} in {result['seconds']:.1f} s ({result['num_replicas']} replicas in sync); checkpoints at "
            f"steps {marks}; weights sha256 {digest}; final weights: {where}")


def train(cluster: clusters.Cluster, *, steps: int, per_replica_batch: int, seed: int, checkpoint_dir: str,
          save_every: int, weights_out: str | None, fail_at_step: int | None = None) -> dict:
    """Train as this worker of ``cluster``: sets ``TF_CONFIG``, runs notebook 04's worker, saves the final weights.

    Returns the worker's result (see :class:`gpucourse.multiworker.WorkerResult`)
    with ``weights_file`` added (the chief's ``weights_out``, else None).
    """
    if not cluster.source.startswith("TF_CONFIG"):
        os.environ["TF_CONFIG"] = cluster.tf_config()
    if "SLURM" in cluster.source:
        from .devices import nvml_gpus

        share = slurm_gpus(os.environ, cluster.tasks_on_node, cluster.local_rank, len(nvml_gpus()))
        if share is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = share
            print(f"CUDA_VISIBLE_DEVICES={share} (task {cluster.local_rank} of {cluster.tasks_on_node} on this node)",
                  flush=True)
    result = multiworker._run_worker(steps, per_replica_batch, seed, "loop", checkpoint_dir, save_every, fail_at_step)
    result["weights_file"] = None
    if result["chief"] and weights_out:
        import numpy as np

        Path(weights_out).parent.mkdir(parents=True, exist_ok=True)
        np.save(weights_out, np.asarray(result["weights"], dtype=np.float32))
        result["weights_file"] = str(weights_out)
    return result


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m gpucourse.train_multiworker",
        description="Train notebook 04's model under MultiWorkerMirroredStrategy on the cluster described by "
                    "TF_CONFIG, SLURM (srun) or a Kubernetes Indexed Job; resume from the last checkpoint.")
    ap.add_argument("--steps", type=int, default=5, help="training steps in all (default 5)")
    ap.add_argument("--per-replica-batch", type=int, default=16, help="examples per replica per step (default 16)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model and the data (default 0)")
    ap.add_argument("--checkpoint-dir", default="checkpoints",
                    help="folder every worker can read (shared storage): the chief saves there, all restore from it")
    ap.add_argument("--save-every", type=int, default=1, help="steps between checkpoints (default 1)")
    ap.add_argument("--weights-out", default=None,
                    help="where the chief saves the final weights (.npy); default <checkpoint-dir>/final_weights.npy")
    ap.add_argument("--slurm-port-base", type=int, default=clusters.SLURM_PORT_BASE,
                    help="SLURM only: task k on a node listens on this port + k (default 8888, TensorFlow's)")
    ap.add_argument("--fail-at-step", type=int, default=None,
                    help="fault drill: this worker kills itself with SIGKILL right after this step")
    ap.add_argument("--check", action="store_true",
                    help="only check the cluster description, this worker's port and the checkpoint folder, without "
                         "TensorFlow; exit 0, or 2 with a message naming what to change")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run one worker. Returns 2 for a bad cluster description, bad arguments, a port in use or a checkpoint
    folder it cannot write, all found before TensorFlow starts (``--check``: returns 0 after those checks).
    After training it prints a one-line summary and ends the process itself (``os._exit(0)``)."""
    a = _parser().parse_args(argv)
    try:
        for name in ("steps", "per_replica_batch", "save_every"):
            _validate.whole(f"--{name.replace('_', '-')}", getattr(a, name))
        if a.fail_at_step is not None:
            _validate.whole("--fail-at-step", a.fail_at_step, maximum=a.steps, what="a step of this run")
        # Everything that can be checked without TensorFlow, first: a mistake then costs a second, not an import,
        # a strategy that waits for its peers and a retry loop (docs/clusters/README.md).
        cluster = clusters.resolve_cluster(os.environ, slurm_port_base=a.slurm_port_base, tensorflow=False)
        folder = check_checkpoint_dir(a.checkpoint_dir, cluster)
        port = check_port(cluster, a.slurm_port_base)
        if a.check:
            print(f"checks passed: {cluster.describe()}; port {port} free; checkpoint folder {a.checkpoint_dir} "
                  f"{folder}", flush=True)
            return 0
        cluster = clusters.resolve_cluster(os.environ, slurm_port_base=a.slurm_port_base)
    except (TypeError, ValueError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 2
    print(cluster.describe(), flush=True)
    print(f"TF_CONFIG={cluster.tf_config()}", flush=True)
    weights_out = a.weights_out or os.path.join(a.checkpoint_dir, "final_weights.npy")
    try:
        result = train(cluster, steps=a.steps, per_replica_batch=a.per_replica_batch, seed=a.seed,
                       checkpoint_dir=a.checkpoint_dir, save_every=a.save_every, weights_out=weights_out,
                       fail_at_step=a.fail_at_step)
    except clusters.ClusterError as err:
        print(f"ClusterError: {err}", file=sys.stderr, flush=True)
        return 2
    print(summarize(result, cluster.num_workers, a.steps), flush=True)
    sys.stderr.flush()
    # Leave at once, as notebook 04's worker does: at a normal exit TensorFlow's coordination service holds
    # every task at a shutdown barrier for several seconds; training is over and every file is written.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
