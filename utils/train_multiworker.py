"""Topic 04, beyond one machine: the multi-worker training script a cluster engine starts once per worker.

The one job: ``python -m gpucourse.train_multiworker`` trains notebook 04's
model with its custom loop under ``MultiWorkerMirroredStrategy``, on whatever
cluster started it, and resumes from the last checkpoint when restarted.

* It finds its cluster with :func:`gpucourse.clusters.resolve_cluster`:
  ``TF_CONFIG`` (you, the course launcher, Vertex AI), SLURM (through
  TensorFlow's ``SlurmClusterResolver``) or a Kubernetes Indexed Job
  (``JOB_COMPLETION_INDEX`` + the manifest's ``TRAIN_*`` variables), prints
  which one, and hands it to the strategy as ``TF_CONFIG``. No source, or two
  that disagree: it stops with exit code 2 and a message naming the variable.
* On SLURM it gives each task on a node its own GPUs (:func:`slurm_gpus`):
  NCCL refuses two workers on one GPU.
* Training, checkpoints and restart are notebook 04's worker
  (``gpucourse.multiworker``): every ``--save-every`` steps the chief saves
  model, optimizer and step into ``--checkpoint-dir`` (shared storage on a real
  cluster); a worker that starts finds the latest checkpoint there and goes on
  from it. The chief writes the final weights to ``--weights-out``.

Templates for each engine, and what each does when a worker fails, are in
``docs/clusters/``. Importing this module never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from . import _validate, clusters, multiworker

__all__ = ["main", "slurm_gpus", "train"]


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
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run one worker. Returns 2 for a bad cluster description or bad arguments; after training it prints
    its JSON result and ends the process itself (``os._exit(0)``, as notebook 04's worker does)."""
    a = _parser().parse_args(argv)
    try:
        for name in ("steps", "per_replica_batch", "save_every"):
            _validate.whole(f"--{name.replace('_', '-')}", getattr(a, name))
        if a.fail_at_step is not None:
            _validate.whole("--fail-at-step", a.fail_at_step, maximum=a.steps, what="a step of this run")
        cluster = clusters.resolve_cluster(os.environ, slurm_port_base=a.slurm_port_base)
    except (TypeError, ValueError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 2
    print(cluster.describe(), flush=True)
    print(f"TF_CONFIG={cluster.tf_config()}", flush=True)
    weights_out = a.weights_out or os.path.join(a.checkpoint_dir, "final_weights.npy")
    try:
        result = train(cluster, steps=a.steps, per_replica_batch=a.per_replica_batch, seed=a.seed,
                       checkpoint_dir=a.checkpoint_dir, save_every=a.save_every, weights_out=weights_out,
                       fail_at_step=a.fail_at_step)
    except clusters.ClusterError as err:
        print(f"ClusterError: {err}", file=sys.stderr)
        return 2
    print(f"resumed from step {result['start_step']}, trained to step {a.steps}; checkpoints saved at "
          f"{result['saved']}; final weights: {result['weights_file'] or '(saved by the chief)'}", flush=True)
    print(multiworker.RESULT_MARK + json.dumps(result), flush=True)
    sys.stderr.flush()
    # Leave at once, as notebook 04's worker does: at a normal exit TensorFlow's coordination service holds
    # every task at a shutdown barrier for several seconds; training is over and every file is written.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
