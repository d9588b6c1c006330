"""Topic 04, several processes: run a real ``MultiWorkerMirroredStrategy`` job on 127.0.0.1, and survive a failure.

The one job: start N worker processes on this machine, each running
``python -m gpucourse.multiworker worker`` (a custom training loop under
``MultiWorkerMirroredStrategy``), collect what each reports, and never hang.

* **Cluster plumbing.** :func:`free_ports`, :func:`tf_config` (each worker's
  ``TF_CONFIG``), :func:`visible_gpu_ids` and :func:`gpu_assignments` (each
  worker's own ``CUDA_VISIBLE_DEVICES``: NCCL refuses two ranks on one GPU).
* **Launching.** :func:`launch_workers` starts the workers, waits with a timeout,
  and on an error or a timeout kills every worker it started and raises a
  :class:`WorkerError` that names the worker and quotes its last lines.
* **Fault tolerance by checkpoint and restart.** With ``checkpoint_dir`` the
  workers save a ``tf.train.Checkpoint`` of the model, the optimizer (its
  momentum too) and the step every ``save_every`` steps: the chief (worker 0)
  into ``checkpoint_dir``, the others into temporary folders they delete, as
  TensorFlow's multi-worker tutorial prescribes. On start they restore the
  latest checkpoint and skip the batches already trained on.
  ``fail_worker=(i, k)`` makes worker ``i`` kill itself with ``SIGKILL`` right
  after step ``k``: an abrupt failure, with no chance to clean up. Launch again
  with the same ``checkpoint_dir`` and training resumes and ends with the same
  weights as a run that never failed.

Keras 3 ``model.fit`` fails under this strategy (keras-team/keras#20585), so the
worker uses a custom loop; ``mode="fit"`` reproduces the failure. Importing
this module never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from . import _tf, _validate
from ._labrules import answers

__all__ = [
    "LOOPBACK",
    "WorkerError",
    "WorkerResult",
    "WorkerTimeout",
    "find_resume_step",
    "free_ports",
    "gpu_assignments",
    "launch_workers",
    "list_checkpoints",
    "main",
    "tf_config",
    "visible_gpu_ids",
]

#: The only address the course binds to or connects to.
LOOPBACK = "127.0.0.1"
#: Marker in a worker's stdout in front of its JSON result.
RESULT_MARK = "GPUCOURSE_RESULT "
#: Default seconds :func:`launch_workers` waits for all workers to finish.
DEFAULT_TIMEOUT_S = 90.0
#: Features of the worker's tiny regression model (8 -> 16 -> 1).
FEATURES, HIDDEN = 8, 16
#: What a finished worker keeps until its process ends (:func:`_run_worker`).
_KEEP_UNTIL_EXIT: list = []


# --------------------------------------------------------------------------- cluster plumbing


def _loopback(host: str) -> str:
    if host not in (LOOPBACK, "localhost"):
        raise ValueError(f"host must be a loopback address: the course only listens on {LOOPBACK}; "
                         f"got host={host!r}, use {LOOPBACK!r}")
    return host


def free_ports(n: int = 1, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports that are free right now on ``host`` (the OS picks them: bind to port 0).

    All sockets stay open until every port is chosen, so the ports differ.
    Another program could still take one before a worker binds it; on a
    shared machine that is rare, and :func:`launch_workers` then fails with a
    clear error instead of hanging.
    """
    _validate.whole("n", n, what="how many ports")
    _loopback(host)
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@answers('04', 'q4')
def tf_config(ports: Sequence[int], index: int, host: str = LOOPBACK) -> str:
    """The ``TF_CONFIG`` JSON for worker ``index`` of a cluster of workers on ``host``.

    ``{"cluster": {"worker": ["127.0.0.1:p0", "127.0.0.1:p1", ...]},
    "task": {"type": "worker", "index": index}}``. Every worker gets the same
    cluster and its own index; worker 0 is the chief (it writes checkpoints).
    """
    if isinstance(ports, (str, bytes)) or not isinstance(ports, Sequence) or not ports:
        raise TypeError(f"ports must be a non-empty list of port numbers, got {ports!r}")
    for p in ports:
        _validate.whole("port", p, minimum=1, maximum=65535, what="every entry of ports")
    if len(set(ports)) != len(ports):
        raise ValueError(f"ports must be distinct (each worker listens on its own), got {list(ports)}")
    _validate.whole("index", index, minimum=0, maximum=len(ports) - 1, what="this worker's position in ports")
    _loopback(host)
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


@answers('01', 'q4')
def visible_gpu_ids(cuda_visible_devices: str | None, physical: int) -> list[int]:
    """The physical GPU ids this process may hand out, reading ``CUDA_VISIBLE_DEVICES`` like CUDA does.

    ``None`` means all ``physical`` GPUs; otherwise indices are read in order
    up to the first invalid one. (UUID forms like ``GPU-...`` are treated as
    invalid here: they cannot be split by index.)
    """
    _validate.whole("physical", physical, minimum=0, what="GPUs on this machine")
    if cuda_visible_devices is None:
        return list(range(physical))
    if not isinstance(cuda_visible_devices, str):
        raise TypeError(f"cuda_visible_devices must be a string or None, got {cuda_visible_devices!r}")
    ids: list[int] = []
    for token in cuda_visible_devices.split(","):
        token = token.strip()
        if not token.isdigit() or int(token) >= physical or int(token) in ids:
            break
        ids.append(int(token))
    return ids


def gpu_assignments(num_workers: int, gpu_ids: Sequence[int]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``num_workers`` processes, so that no GPU is seen twice.

    With at least one GPU per worker each worker gets an equal, disjoint,
    contiguous slice (``MultiWorkerMirroredStrategy`` wants the same number of
    devices on every worker; leftover GPUs stay unused). With fewer GPUs than
    workers every worker gets ``"-1"`` and runs on its CPU: NCCL refuses two
    ranks on one GPU (``ncclInvalidUsage``, "Duplicate GPU detected"), and two
    processes that share a GPU would each try to reserve most of its memory.
    """
    _validate.whole("num_workers", num_workers)
    if isinstance(gpu_ids, (str, bytes)) or not isinstance(gpu_ids, Sequence):
        raise TypeError(f"gpu_ids must be a list of GPU indices like [0, 1], got {gpu_ids!r}")
    for g in gpu_ids:
        _validate.whole("gpu id", g, minimum=0, what="every entry of gpu_ids")
    if len(set(gpu_ids)) != len(gpu_ids):
        raise ValueError(f"gpu_ids must be distinct, got {list(gpu_ids)}")
    per = len(gpu_ids) // num_workers
    if per == 0:
        return ["-1"] * num_workers
    return [",".join(str(g) for g in gpu_ids[i * per:(i + 1) * per]) for i in range(num_workers)]


# --------------------------------------------------------------------------- launching workers


class WorkerError(RuntimeError):
    """A worker process failed or hung.

    ``worker`` is its index, ``log`` the end of its output, ``exit_code`` its exit
    code (negative: killed by that signal) and ``stopped`` the other workers that
    were still running, and were killed by the launcher.
    """

    def __init__(self, message: str, worker: int | None = None, log: str = "", exit_code: int | None = None,
                 stopped: Sequence[int] = ()):
        super().__init__(message)
        self.worker = worker
        self.log = log
        self.exit_code = exit_code
        self.stopped = list(stopped)


class WorkerTimeout(WorkerError):
    """Workers were still running when the timeout expired and were killed."""


@dataclass
class WorkerResult:
    """What one worker reported.

    ``losses`` are the global losses of the steps this run trained
    (``start_step + 1`` .. ``steps``); ``weights`` the final weights, flattened;
    ``start_step`` the step restored from a checkpoint (0 for a fresh start);
    ``saved`` the checkpoint steps this worker saved (into the shared folder if
    it is the chief, else into a temporary folder it deleted).
    """

    index: int
    num_replicas: int
    losses: list[float]
    weights: list[float] = field(default_factory=list)
    start_step: int = 0
    saved: list[int] = field(default_factory=list)
    chief: bool = False
    communication: str = ""
    devices: list[str] = field(default_factory=list)
    cuda_visible_devices: str | None = None
    seconds: float = 0.0

    @property
    def weights_checksum(self) -> float:
        return float(sum(abs(w) for w in self.weights))

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerResult":
        keys = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in keys})


_TF_LOG = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages|To enable the following instructions)")
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)\b:?")


def _tail(path: Path, lines: int = 8) -> str:
    """The end of a worker's log without TensorFlow's C++ log lines, its error line first if any."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip() and not _TF_LOG.match(ln) and not ln.startswith(RESULT_MARK)]
    errors = [ln for ln in keep if _ERROR_LINE.match(ln)]
    head = [errors[-1][:200] + (" ..." if len(errors[-1]) > 200 else "")] if errors else []
    return "\n".join(head + [ln[:200] for ln in keep[-lines:] if not head or ln != errors[-1]])


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"failed with exit code {code}"


def _kill(procs: Mapping[int, subprocess.Popen]) -> None:
    """Kill every still-running worker we started (by its own Popen handle) and reap it."""
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for p in procs.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def _worker_command(steps: int, batch: int, seed: int, mode: str, checkpoint_dir: str | None, save_every: int,
                    fail_at: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "gpucourse.multiworker", "worker", "--steps", str(steps),
           "--per-replica-batch", str(batch), "--seed", str(seed), "--mode", mode]
    if checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", checkpoint_dir, "--save-every", str(save_every)]
    if fail_at is not None:
        cmd += ["--fail-at-step", str(fail_at)]
    return cmd


def _check_launch(num_workers, steps, per_replica_batch, seed, timeout, mode, only, extra_env, checkpoint_dir,
                  save_every, fail_worker) -> list[int]:
    _validate.whole("num_workers", num_workers)
    _validate.whole("steps", steps, what="training steps")
    _validate.whole("per_replica_batch", per_replica_batch)
    _validate.whole("seed", seed, minimum=None)
    _validate.seconds("timeout", timeout, allow_zero=False)
    _validate.one_of("mode", mode, ("loop", "fit"))
    _validate.env_vars("extra_env", extra_env)
    _validate.whole("save_every", save_every, what="steps between checkpoints")
    indices = list(range(num_workers)) if only is None else _validate.sequence("only", only, "worker indices")
    for i in indices:
        _validate.whole("only index", i, 0, num_workers - 1)
    if len(set(indices)) != len(indices):
        raise ValueError(f"only must list distinct worker indices in 0..{num_workers - 1}, got {only!r}")
    if checkpoint_dir is not None:
        _checkpoint_folder(checkpoint_dir)
        if mode != "loop":
            raise ValueError("checkpoint_dir works with mode='loop' only (fit fails under this strategy in Keras 3)")
    if fail_worker is not None:
        if (isinstance(fail_worker, (str, bytes)) or not isinstance(fail_worker, Sequence) or len(fail_worker) != 2):
            raise TypeError(f"fail_worker must be a pair (worker index, step), got {fail_worker!r}")
        _validate.whole("fail_worker[0]", fail_worker[0], minimum=0, maximum=num_workers - 1, what="the worker to kill")
        _validate.whole("fail_worker[1]", fail_worker[1], minimum=1, maximum=steps,
                        what="the step after which it dies")
    return indices


def _checkpoint_folder(checkpoint_dir) -> Path:
    """``checkpoint_dir`` as a Path; TypeError unless it is a folder path (str or Path)."""
    if not isinstance(checkpoint_dir, (str, os.PathLike)):
        raise TypeError(f"checkpoint_dir must be a folder path (str or Path), got {checkpoint_dir!r}")
    return Path(checkpoint_dir)


def list_checkpoints(checkpoint_dir: str | os.PathLike) -> list[int]:
    """Step numbers of the checkpoints in ``checkpoint_dir`` (from their ``ckpt-<step>.index`` files), sorted."""
    path = _checkpoint_folder(checkpoint_dir)
    if not path.is_dir():
        return []
    return sorted(int(m.group(1)) for p in path.iterdir() if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name)))


def find_resume_step(checkpoint_dir: str | os.PathLike) -> int | None:
    """The step a restart resumes from: the checkpoint ``tf.train.latest_checkpoint`` picks, the one named in
    ``CheckpointManager``'s state file (``checkpoint``); None before the first.

    The manager names a checkpoint there only after writing its files: for a moment (for good, after a ``kill -9``
    in that moment) :func:`list_checkpoints` shows one more step than a restart uses.
    """
    try:
        text = (_checkpoint_folder(checkpoint_dir) / "checkpoint").read_text()
    except OSError:
        return None
    m = re.search(r'^model_checkpoint_path: "(?:.*[/\\])?ckpt-(\d+)"$', text, flags=re.M)
    return int(m.group(1)) if m else None


def launch_workers(num_workers: int = 2, *, steps: int = 5, per_replica_batch: int = 16, seed: int = 0,
                   timeout: float = DEFAULT_TIMEOUT_S, only: Sequence[int] | None = None, mode: str = "loop",
                   checkpoint_dir: str | os.PathLike | None = None, save_every: int = 1,
                   fail_worker: tuple[int, int] | None = None, gpu_ids: Sequence[int] | None = None,
                   extra_env: Mapping[str, str] | None = None, poll_s: float = 0.05) -> list[WorkerResult]:
    """Run a ``MultiWorkerMirroredStrategy`` job as ``num_workers`` processes on 127.0.0.1.

    Each worker runs ``python -m gpucourse.multiworker worker`` with its own
    ``TF_CONFIG`` (free ports chosen here) and its own ``CUDA_VISIBLE_DEVICES``
    (see :func:`gpu_assignments`), trains a tiny regression model with a custom
    loop for ``steps`` steps (SGD with momentum) and prints a JSON result, which
    is returned as a :class:`WorkerResult` per worker, in index order. The data
    of step ``k`` depends only on ``seed`` and ``k``, so runs are reproducible.

    Args:
        num_workers: size of the cluster written into ``TF_CONFIG``.
        steps, per_replica_batch, seed: passed to every worker.
        timeout: seconds for the whole job. Workers still running then are
            killed and :class:`WorkerTimeout` is raised.
        only: start just these worker indices (the others never come up), to
            see what a missing peer does: the started ones wait for it until the timeout.
        mode: ``"loop"`` (custom training loop) or ``"fit"`` (``model.fit``, which
            fails under this strategy with Keras 3).
        checkpoint_dir: save a checkpoint every ``save_every`` steps (the chief
            here, the others in temporary folders), and resume from the latest one.
        fail_worker: ``(i, k)``: worker ``i`` kills itself with SIGKILL right after step ``k``.
        gpu_ids: physical GPUs to share out; default: what this process may see.
        extra_env: more environment variables for every worker.

    Raises:
        WorkerError: a worker exited with an error or was killed (the others are
            then killed too); the message names it and quotes the end of its output.
        WorkerTimeout: the timeout expired; the message names the workers killed.
    """
    indices = _check_launch(num_workers, steps, per_replica_batch, seed, timeout, mode, only, extra_env,
                            checkpoint_dir, save_every, fail_worker)
    if gpu_ids is None:
        from .devices import nvml_gpus

        gpu_ids = visible_gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), len(nvml_gpus()))
    cuda = gpu_assignments(num_workers, list(gpu_ids))
    ckpt = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve())

    ports = free_ports(num_workers)
    logdir = Path(tempfile.mkdtemp(prefix="gpucourse-workers-"))
    procs: dict[int, subprocess.Popen] = {}
    files = []
    try:
        for i in indices:
            env = {**os.environ, "TF_CONFIG": tf_config(ports, i), "CUDA_VISIBLE_DEVICES": cuda[i],
                   "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                   "TF_FORCE_GPU_ALLOW_GROWTH": "true", **(extra_env or {})}
            fail_at = fail_worker[1] if fail_worker is not None and fail_worker[0] == i else None
            out = open(logdir / f"worker{i}.log", "w")
            files.append(out)
            procs[i] = subprocess.Popen(_worker_command(steps, per_replica_batch, seed, mode, ckpt, save_every,
                                                        fail_at),
                                        env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            failed = [i for i, p in procs.items() if p.poll() not in (None, 0)]
            if failed:
                i = failed[0]
                log = _tail(logdir / f"worker{i}.log")
                running = [j for j, p in procs.items() if p.poll() is None]
                _kill(procs)
                code = procs[i].returncode
                asked = fail_worker is not None and fail_worker[0] == i and code == -signal.SIGKILL
                why = f" after step {fail_worker[1]}, as asked with fail_worker" if asked else ""
                others = (f"worker(s) {running} were still running (waiting for it) and were stopped"
                          if running else "no other worker was running")
                raise WorkerError(f"worker {i} {_exit_text(code)}{why}; {others}. "
                                  f"End of its output:\n{log or '(nothing)'}", worker=i, log=log, exit_code=code,
                                  stopped=running)
            if all(p.poll() == 0 for p in procs.values()):
                break
            if time.monotonic() > deadline:
                hung = [i for i, p in procs.items() if p.poll() is None]
                _kill(procs)
                missing = sorted(set(range(num_workers)) - set(indices))
                why = (f" worker(s) {missing} were never started, and a worker waits for every peer in "
                       "TF_CONFIG" if missing else " a worker waits for every peer in TF_CONFIG")
                raise WorkerTimeout(f"worker(s) {hung} still running after {timeout:g} s and were killed:{why}. "
                                    "Check that every worker started and can reach the others' ports.",
                                    worker=hung[0], log=_tail(logdir / f"worker{hung[0]}.log"), stopped=hung)
            time.sleep(poll_s)
        results = []
        for i in indices:
            text = (logdir / f"worker{i}.log").read_text(errors="replace")
            lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARK)]
            if not lines:
                raise WorkerError(f"worker {i} exited without printing a result. End of its output:\n"
                                  f"{_tail(logdir / f'worker{i}.log')}", worker=i)
            results.append(WorkerResult.from_dict(json.loads(lines[-1][len(RESULT_MARK):])))
        return results
    finally:
        _kill(procs)
        for f in files:
            f.close()
        shutil.rmtree(logdir, ignore_errors=True)


# --------------------------------------------------------------------------- the worker itself


def _write_dir(checkpoint_dir: str, task_id: int, is_chief: bool) -> str:
    """Where this worker writes: the shared folder for the chief, a private temporary folder for the others."""
    return checkpoint_dir if is_chief else os.path.join(checkpoint_dir, f".worker{task_id}-tmp")


def _restore_sigterm() -> None:
    """Let SIGTERM end this worker again, as SLURM and Kubernetes expect.

    Creating ``MultiWorkerMirroredStrategy`` makes TensorFlow 2.21 catch SIGTERM (``SigCgt`` in
    ``/proc/<pid>/status`` shows it caught after the strategy starts, not before) without ending the
    process. A worker whose peer died then ignores ``srun --kill-on-bad-exit``'s SIGTERM and a pod's
    termination signal, and lives until it fails by itself or the engine's SIGKILL comes (SLURM's
    ``KillWait``, Kubernetes' grace period). This worker has nothing to save on SIGTERM (its
    checkpoints are already written), so the default action, ending the process, is right.
    """
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_worker(steps: int, per_replica_batch: int, seed: int, mode: str, checkpoint_dir: str | None,
                save_every: int, fail_at: int | None) -> dict:
    """Train a tiny regression model under MultiWorkerMirroredStrategy with a custom loop (and checkpoints)."""
    from .distribute import _mse_replica_step, global_batch_size

    t0 = time.perf_counter()
    tf, keras = _tf.tf(), _tf.keras()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _restore_sigterm()
    resolver = strategy.cluster_resolver
    task_id = int(resolver.task_id)
    is_chief = bool(strategy.extended.should_checkpoint)  # the chief: worker 0 when there is no "chief" job
    gbs = global_batch_size(per_replica_batch, strategy)

    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        # Create the momentum slots now, under the scope: created lazily inside the tf.function step they
        # fail under a strategy, and a checkpoint restores into existing slots only.
        optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)

    saved: list[int] = []
    manager = None
    if checkpoint_dir is not None:
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
        latest = tf.train.latest_checkpoint(checkpoint_dir)  # every worker restores the chief's latest
        if latest:
            ckpt.restore(latest).assert_existing_objects_matched()
        manager = tf.train.CheckpointManager(ckpt, _write_dir(checkpoint_dir, task_id, is_chief), max_to_keep=2)
    start = int(step.numpy())

    def dataset_fn(ctx: "tf.distribute.InputContext"):
        # Same data on every worker (same seed), each input pipeline keeps its own shard; step k always
        # reads batch k, so a restarted run skips exactly the batches it already trained on.
        rng = tf.random.Generator.from_seed(seed)
        x = rng.normal((gbs * steps, FEATURES))
        y = tf.reduce_sum(x * tf.range(1.0, FEATURES + 1.0), axis=1, keepdims=True) / FEATURES
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.batch(ctx.get_per_replica_batch_size(gbs), drop_remainder=True).skip(start)

    if mode == "fit":  # Keras 3 fit under MultiWorkerMirroredStrategy: fails (keras-team/keras#20585)
        model.compile(optimizer=optimizer, loss="mse")
        hist = model.fit(strategy.distribute_datasets_from_function(dataset_fn), steps_per_epoch=steps, epochs=1,
                         shuffle=False, verbose=0)  # shuffle: fit's default, ignored for a dataset, warns
        losses = [float(v) for v in hist.history["loss"]]
    else:
        dist = iter(strategy.distribute_datasets_from_function(dataset_fn))
        replica_step = _mse_replica_step(model, optimizer, gbs)

        @tf.function
        def train_step(iterator):
            return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)

        losses = []
        for k in range(start + 1, steps + 1):
            losses.append(float(train_step(dist)))
            step.assign(k)
            if manager is not None and (k % save_every == 0 or k == steps):
                manager.save(checkpoint_number=k)  # every worker saves: saving may run collectives
                saved.append(k)
            if fail_at == k:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)  # an abrupt failure: no cleanup, no exception handler
        if manager is not None and not is_chief:
            shutil.rmtree(_write_dir(checkpoint_dir, task_id, is_chief), ignore_errors=True)
    # Keep the strategy's objects until the process ends (the callers leave with os._exit): deleting the
    # distributed iterator can wait for the peers (measured up to 1.3 s), and a peer that has already left is
    # declared gone only by the coordination service's next heartbeat, seconds later, with an alarming
    # "UNAVAILABLE ... tasks are unhealthy" / "Failed to send RPC to coordination service" after a good run.
    _KEEP_UNTIL_EXIT.append((strategy, model, optimizer, manager, locals().get("dist"), locals().get("train_step")))
    opts = getattr(strategy.extended, "_communication_options", None)
    return {"index": task_id, "num_replicas": int(strategy.num_replicas_in_sync), "losses": losses,
            "weights": [float(v) for w in model.get_weights() for v in w.ravel()],
            "start_step": start, "saved": saved, "chief": bool(is_chief),
            "communication": getattr(getattr(opts, "implementation", None), "name", ""),
            "devices": list(strategy.extended.worker_devices),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "seconds": time.perf_counter() - t0}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpucourse.multiworker worker ...``: run one worker (reads ``TF_CONFIG``).

    Returns 2 for bad arguments or environment; after a run it prints its JSON
    result and ends the process itself (``os._exit(0)``), see below.
    """
    ap = argparse.ArgumentParser(prog="python -m gpucourse.multiworker",
                                 description="Run one MultiWorkerMirroredStrategy worker (needs TF_CONFIG).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="train under MultiWorkerMirroredStrategy and print a JSON result")
    w.add_argument("--steps", type=int, default=5)
    w.add_argument("--per-replica-batch", type=int, default=16)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--mode", choices=("loop", "fit"), default="loop")
    w.add_argument("--checkpoint-dir", default=None)
    w.add_argument("--save-every", type=int, default=1)
    w.add_argument("--fail-at-step", type=int, default=None)
    a = ap.parse_args(argv)
    if "TF_CONFIG" not in os.environ:
        print("TF_CONFIG is not set: start workers with gpucourse.multiworker.launch_workers()", file=sys.stderr)
        return 2
    try:  # fail fast, before the slow TensorFlow import, on a TF_CONFIG that cannot work
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        if task.get("type") != "worker" or not isinstance(task.get("index"), int):
            raise ValueError(f"task must be {{'type': 'worker', 'index': <int>}}, got {task!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        print(f"ValueError: bad TF_CONFIG ({type(err).__name__}: {err}); build it with "
              "gpucourse.multiworker.tf_config()", file=sys.stderr)
        return 2
    result = _run_worker(a.steps, a.per_replica_batch, a.seed, a.mode, a.checkpoint_dir, a.save_every,
                         a.fail_at_step)
    print(RESULT_MARK + json.dumps(result), flush=True)
    sys.stderr.flush()
    # Leave at once. At a normal exit TensorFlow's coordination service (started by the strategy) holds
    # every task at a shutdown barrier for several seconds; training is over and every file is written.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
