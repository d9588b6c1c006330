"""Topic 04, beyond one machine: find out which cluster this worker belongs to, from whichever engine started it.

The one job: turn the environment a cluster engine gives a worker process into
one answer -- the workers' addresses and this worker's place among them -- and
write it as the ``TF_CONFIG`` that ``MultiWorkerMirroredStrategy`` reads.

Three sources, tried on the variables that are present (never guessed):

* **TF_CONFIG** (set by you, by the course's launcher, or by Vertex AI custom
  training): read as it is. :func:`read_tf_config`.
* **SLURM** (``SLURM_PROCID`` is set by ``srun`` in every task): the workers in
  SLURM's task order, read from the step's node list, and confirmed by
  TensorFlow's own ``tf.distribute.cluster_resolver.SlurmClusterResolver``
  (which finds the same addresses but sorts host names as strings: ``node10``
  before ``node9``). :func:`read_slurm`. In TensorFlow 2.21 the resolver
  expands ``SLURM_STEP_NODELIST`` itself (its docstring still says it asks
  ``scontrol``; the code does not).
* **Kubernetes Indexed Job** (``JOB_COMPLETION_INDEX`` is set by the Job
  controller in every pod; the manifest sets ``TRAIN_NUM_WORKERS``,
  ``TRAIN_JOB_NAME``, ``TRAIN_SERVICE`` and optionally ``TRAIN_PORT``): worker
  ``i`` is the pod ``<job>-<i>``, reachable through the headless Service as
  ``<job>-<i>.<service>``. :func:`read_kubernetes`.

:func:`resolve_cluster` picks the source present; with two present it uses
them only if they agree. Every problem raises :class:`ClusterError` (a
``ValueError``) naming the variable, its value and the fix. Only
:func:`read_slurm` imports TensorFlow (lazily, when called, unless told not to).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from . import _tf, _validate

__all__ = [
    "ClusterError",
    "Cluster",
    "DEFAULT_PORT",
    "SLURM_PORT_BASE",
    "read_tf_config",
    "read_slurm",
    "read_kubernetes",
    "resolve_cluster",
]

#: Port every Kubernetes worker listens on unless ``TRAIN_PORT`` says otherwise.
DEFAULT_PORT = 2222
#: TensorFlow's default first port for the tasks on a SLURM node (task k on a node gets base + k).
SLURM_PORT_BASE = 8888
_K8S_VARS = ("TRAIN_NUM_WORKERS", "TRAIN_JOB_NAME", "TRAIN_SERVICE")
_SLURM_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ClusterError(ValueError):
    """The environment does not describe a usable cluster; ``variable`` names the variable at fault."""

    def __init__(self, variable: str, message: str):
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True)
class Cluster:
    """Who the workers are and which one this process is.

    ``cluster`` maps task types (``"worker"``, and ``"chief"`` on Vertex AI) to
    ``host:port`` lists, ``task_type``/``task_index`` say which task this
    process is, ``source`` which variables said so, ``detail`` the values read.
    ``tasks_on_node``/``local_rank`` (SLURM only) say how many workers share this
    node and which of them this one is, to give each its own GPU.
    """

    source: str
    cluster: dict
    task_type: str
    task_index: int
    detail: str = ""
    tasks_on_node: int = 1
    local_rank: int = 0

    @property
    def num_workers(self) -> int:
        return sum(len(v) for v in self.cluster.values())

    def same_cluster(self, other: "Cluster") -> bool:
        return (self.cluster, self.task_type, self.task_index) == (other.cluster, other.task_type, other.task_index)

    def tf_config(self) -> str:
        """This worker's ``TF_CONFIG`` (JSON with sorted keys: the same cluster gives the same text)."""
        return json.dumps({"cluster": self.cluster, "task": {"type": self.task_type, "index": self.task_index}},
                          sort_keys=True)

    def describe(self) -> str:
        """One line for the log: the source, what was read, and this worker's place."""
        return (f"cluster source: {self.source} ({self.detail}) -> {self.task_type} {self.task_index}, "
                f"{self.num_workers} workers: {', '.join(a for v in self.cluster.values() for a in v)}")


def _whole_var(env: Mapping[str, str], name: str, minimum: int = 0, maximum: int | None = None,
               fix: str = "") -> int:
    if name not in env:
        raise ClusterError(name, f"is not set{'; ' + fix if fix else ''}")
    raw = env[name]
    if not raw.strip().isdigit():
        raise ClusterError(name, f"must be a whole number, got {raw!r}{'; ' + fix if fix else ''}")
    value = int(raw)
    if value < minimum or (maximum is not None and value > maximum):
        span = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ClusterError(name, f"must be {span}, got {value}{'; ' + fix if fix else ''}")
    return value


# --------------------------------------------------------------------------- TF_CONFIG


def read_tf_config(text: str) -> Cluster:
    """The cluster a ``TF_CONFIG`` JSON text describes, checked the way the strategy needs it.

    Accepts ``worker`` and ``chief`` tasks (Vertex AI's first worker pool is the
    ``chief``); a ``ps`` or ``evaluator`` task is for other strategies.
    """
    _validate.text("TF_CONFIG", text, what="a JSON object with 'cluster' and 'task'")
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError("TF_CONFIG", f"is not valid JSON ({err.msg} at character {err.pos}): {text[:80]!r}")
    if not isinstance(conf, dict) or not isinstance(conf.get("cluster"), dict) or not isinstance(conf.get("task"),
                                                                                                 dict):
        raise ClusterError("TF_CONFIG", 'must look like {"cluster": {"worker": ["host:port", ...]}, '
                                        f'"task": {{"type": "worker", "index": 0}}}}, got {text[:120]!r}')
    cluster = {k: v for k, v in conf["cluster"].items() if k in ("chief", "worker")}
    other = sorted(set(conf["cluster"]) - {"chief", "worker"})
    if other:
        raise ClusterError("TF_CONFIG", f"has task types {other}: MultiWorkerMirroredStrategy trains with 'chief' "
                                        "and 'worker' tasks only (ps/evaluator are for other strategies)")
    for kind, addrs in cluster.items():
        if (not isinstance(addrs, list) or not addrs
                or not all(isinstance(a, str) and re.fullmatch(r"[^:\s]+:\d{1,5}", a) for a in addrs)):
            raise ClusterError("TF_CONFIG", f"cluster[{kind!r}] must be a non-empty list of 'host:port', got {addrs!r}")
    if "worker" not in cluster and "chief" not in cluster:
        raise ClusterError("TF_CONFIG", "cluster has no 'worker' list")
    if len(cluster.get("chief", [])) > 1:
        raise ClusterError("TF_CONFIG", f"cluster['chief'] must hold one address, got {cluster['chief']!r}")
    task = conf["task"]
    kind, index = task.get("type"), task.get("index")
    if kind not in cluster:
        raise ClusterError("TF_CONFIG", f"task type {kind!r} is not in the cluster (it has {sorted(cluster)})")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise ClusterError("TF_CONFIG", f"task index must be a whole number in 0..{len(cluster[kind]) - 1} "
                                        f"(one per {kind!r} address), got {index!r}")
    return Cluster("TF_CONFIG", cluster, kind, index, detail=f"task {kind} {index}")


# --------------------------------------------------------------------------- SLURM


def _check_slurm_env(env: Mapping[str, str]) -> tuple[int, int]:
    """Checks that need no TensorFlow: the step's variables exist and fit together."""
    fix = "run the script under srun inside an allocation (see docs/clusters/slurm_multiworker.sbatch)"
    for name in _SLURM_VARS:
        if name not in env or not env[name].strip():
            raise ClusterError(name, f"is not set: SLURM sets it for each task of a job step; {fix}")
    ntasks = _whole_var(env, "SLURM_STEP_NUM_TASKS", minimum=1)
    rank = _whole_var(env, "SLURM_PROCID", maximum=ntasks - 1,
                      fix=f"a task's rank is below the step's SLURM_STEP_NUM_TASKS={ntasks}")
    if "SLURM_NTASKS" in env and env["SLURM_NTASKS"].strip().isdigit():
        job = int(env["SLURM_NTASKS"])
        if ntasks == 1 and job > 1:
            raise ClusterError("SLURM_STEP_NUM_TASKS", f"is 1 but the job has SLURM_NTASKS={job}: the script runs in "
                                                       "the batch step itself; start it with srun so that every "
                                                       "task runs one worker")
    return rank, ntasks


def _expand_hostlist(text: str) -> list[str]:
    """SLURM's host list (``node[9-10],gpu07``) as names, in SLURM's order, nothing sorted or dropped.

    The grammar TensorFlow's resolver reads: comma-separated names, each a prefix with at most one
    ``[...]`` of numbers and ranges (``07-08`` keeps its zero padding).
    """
    bad = ClusterError("SLURM_STEP_NODELIST", f"cannot read {text!r} as a SLURM host list (like "
                                              "'node[1-4,7],gpu07', one [...] per name)")
    parts = re.findall(r"(?:[^,\[\]]|\[[^\[\]]*\])+", text.strip())
    if ",".join(parts) != text.strip():  # unbalanced or nested brackets, empty names
        raise bad
    hosts: list[str] = []
    for part in parts:
        m = re.fullmatch(r"([^,\[\]\s]*)(?:\[([0-9,\-]+)\])?", part)
        if m is None:
            raise bad
        if m.group(2) is None:
            hosts.append(m.group(1))
            continue
        for rng in m.group(2).split(","):
            lo, _, hi = rng.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
                raise ClusterError("SLURM_STEP_NODELIST", f"cannot read the range {rng!r} in {text!r} "
                                                          "(like '1-4' or '07')")
            hosts.extend(m.group(1) + str(i).zfill(len(lo)) for i in range(int(lo), int(hi or lo) + 1))
    return hosts


def _expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks per node (``2(x3),1``) as one count per node: ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ClusterError("SLURM_STEP_TASKS_PER_NODE", f"cannot read {text!r} (like '4' or '2(x3),1')")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _slurm_workers(env: Mapping[str, str], port_base: int) -> tuple[list[str], int, int]:
    """The step's workers in SLURM's order (task ``k`` is ``workers[k]``), this task's rank and the step size.

    With ``--distribution=block`` SLURM places tasks 0, 1, ... on the nodes in the order of its node list;
    task ``j`` of a node listens on ``port_base + j``. Pure: no TensorFlow.
    """
    rank, ntasks = _check_slurm_env(env)
    nodelist, per_node = env["SLURM_STEP_NODELIST"], env["SLURM_STEP_TASKS_PER_NODE"]
    hosts, counts = _expand_hostlist(nodelist), _expand_tasks_per_node(per_node)
    if len(hosts) != len(counts) or len(set(hosts)) != len(hosts):
        raise ClusterError("SLURM_STEP_TASKS_PER_NODE", f"{per_node!r} gives {len(counts)} node(s) but "
                                                        f"SLURM_STEP_NODELIST={nodelist!r} names {len(hosts)} "
                                                        f"({len(set(hosts))} different): the two must describe "
                                                        "the same step")
    workers = [f"{h}:{port_base + j}" for h, n in zip(hosts, counts) for j in range(n)]
    if len(workers) != ntasks:
        raise ClusterError("SLURM_STEP_TASKS_PER_NODE", f"places {len(workers)} tasks but SLURM_STEP_NUM_TASKS="
                                                        f"{ntasks}: the two must describe the same step")
    if max(port_base + n - 1 for n in counts) > 65535:
        raise ClusterError("SLURM_STEP_TASKS_PER_NODE", f"{max(counts)} tasks on a node from port {port_base} "
                                                        "go past 65535; choose a lower --slurm-port-base")
    return workers, rank, ntasks


def _slurm_order(resolver_workers: list[str], workers: list[str], env: Mapping[str, str]) -> None:
    """Stop unless the resolver found the same addresses as SLURM's own node list (in whatever order)."""
    if sorted(resolver_workers) != sorted(workers):
        raise ClusterError("SLURM_STEP_NODELIST", f"SlurmClusterResolver read SLURM_STEP_NODELIST="
                                                  f"{env['SLURM_STEP_NODELIST']!r} and SLURM_STEP_TASKS_PER_NODE="
                                                  f"{env['SLURM_STEP_TASKS_PER_NODE']!r} as {resolver_workers}, "
                                                  f"SLURM's order gives {workers}: they must be the same workers")


def read_slurm(env: Mapping[str, str], port_base: int = SLURM_PORT_BASE, resolver_class: Callable | None = None,
               *, tensorflow: bool = True) -> Cluster:
    """The cluster of this SLURM job step, in SLURM's task order, confirmed by ``SlurmClusterResolver``.

    Worker ``k`` is SLURM task ``k``: with ``srun --distribution=block`` the tasks fill the nodes of
    ``SLURM_STEP_NODELIST`` in its order, and task ``j`` of a node listens on ``port_base + j``.
    TensorFlow 2.21's resolver finds the same addresses but sorts the host names as strings, so for
    ``node[9-10]`` it would list ``node10`` first and give rank 0 (on node9) node10's address; the
    worker list here keeps SLURM's order. ``SLURMD_NODENAME`` (set by slurmd in every task) must be
    the node this rank is placed on, and ``SLURM_LOCALID`` its place there; otherwise the tasks are
    not laid out in node-list order and this stops.

    With ``tensorflow=True`` (the default) the resolver (imported lazily) must find the same
    addresses; ``tensorflow=False`` reads SLURM's variables alone, without importing TensorFlow.
    The resolver's own GPU split is switched off (``auto_set_gpu=False``): it needs at least one GPU
    per task (with none, or ``CUDA_VISIBLE_DEVICES=-1``, its ``cluster_spec()`` raises ``range() arg 3
    must not be zero``; without ``nvidia-smi`` its constructor raises ``FileNotFoundError``), so the
    caller splits the node's GPUs itself with ``tasks_on_node`` and ``local_rank``.

    ``env`` must be the process environment the resolver reads (``os.environ``),
    or, to preview another step, a mapping applied to ``os.environ`` for the
    duration of the call.
    """
    _validate.whole("port_base", port_base, minimum=1, maximum=65535, what="the first port on each node")
    workers, rank, ntasks = _slurm_workers(env, port_base)
    if tensorflow:
        resolver_class = resolver_class or _tf.tf().distribute.cluster_resolver.SlurmClusterResolver
        with _environ(env, [*_SLURM_VARS, "SLURM_NTASKS"]):
            try:
                # gpus_per_node/gpus_per_task only satisfy the resolver's arithmetic (one slot per task, at most
                # ntasks tasks on a node); GPUs are given out by the caller, so no CUDA_VISIBLE_DEVICES is written.
                resolver = resolver_class(port_base=port_base, gpus_per_node=ntasks, gpus_per_task=1,
                                          auto_set_gpu=False)
                spec = resolver.cluster_spec().as_dict()
            except (ValueError, RuntimeError, AssertionError) as err:
                raise ClusterError("SLURM_STEP_NODELIST", f"SlurmClusterResolver could not build the cluster from "
                                                          f"SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']!r} and "
                                                          "SLURM_STEP_TASKS_PER_NODE="
                                                          f"{env['SLURM_STEP_TASKS_PER_NODE']!r}: {err}") from None
        if resolver.task_type != "worker" or resolver.task_id != rank:
            raise ClusterError("SLURM_PROCID", f"is {rank} but SlurmClusterResolver made this task "
                                               f"{resolver.task_type} {resolver.task_id}")
        _slurm_order(list(spec.get("worker", [])), workers, env)
    host = workers[rank].rsplit(":", 1)[0]
    local = sum(1 for a in workers[:rank] if a.rsplit(":", 1)[0] == host)
    on_node = sum(1 for a in workers if a.rsplit(":", 1)[0] == host)
    node = env.get("SLURMD_NODENAME", "").strip()
    if node and node != host:
        raise ClusterError("SLURMD_NODENAME", f"is {node!r} but SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']!r} "
                                              f"with SLURM_STEP_TASKS_PER_NODE={env['SLURM_STEP_TASKS_PER_NODE']!r} "
                                              f"places task {rank} on {host!r}: the tasks are not laid out in "
                                              "node-list order; use srun --distribution=block")
    if "SLURM_LOCALID" in env and env["SLURM_LOCALID"].strip().isdigit() and int(env["SLURM_LOCALID"]) != local:
        raise ClusterError("SLURM_LOCALID", f"is {env['SLURM_LOCALID']} but SLURM's node list places task "
                                            f"{rank} as task {local} of {host}: the worker list assumes block "
                                            "distribution; use srun --distribution=block")
    detail = (f"{'SlurmClusterResolver, ' if tensorflow else ''}SLURM's order: SLURM_PROCID={rank}, "
              f"SLURM_STEP_NUM_TASKS={ntasks}, SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']}, "
              f"SLURM_STEP_TASKS_PER_NODE={env['SLURM_STEP_TASKS_PER_NODE']}, port base {port_base}")
    return Cluster("SLURM", {"worker": workers}, "worker", rank, detail=detail, tasks_on_node=on_node,
                   local_rank=local)


class _environ:
    """Make ``os.environ`` hold ``env``'s values of ``names`` for a while (the resolver reads os.environ)."""

    def __init__(self, env: Mapping[str, str], names):
        import os

        self.os, self.env, self.names, self.saved = os, env, list(names), {}

    def __enter__(self):
        if self.env is self.os.environ:
            return self
        for n in self.names:
            self.saved[n] = self.os.environ.get(n)
            if n in self.env:
                self.os.environ[n] = self.env[n]
            else:
                self.os.environ.pop(n, None)
        return self

    def __exit__(self, *exc):
        for n, v in self.saved.items():
            if v is None:
                self.os.environ.pop(n, None)
            else:
                self.os.environ[n] = v
        return False


# --------------------------------------------------------------------------- Kubernetes Indexed Job


def _host_map(env: Mapping[str, str], hosts: list[str], port: int) -> list[str]:
    """Addresses of ``hosts``; ``TRAIN_HOST_MAP`` ("name=ip[:port],...") replaces some, like hostAliases."""
    raw = env.get("TRAIN_HOST_MAP", "").strip()
    mapping: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        name, sep, addr = entry.partition("=")
        if not sep or not re.fullmatch(r"[^:\s]+(:\d{1,5})?", addr.strip()):
            raise ClusterError("TRAIN_HOST_MAP", f"entries must look like 'train-0.train-workers=10.0.0.5' or "
                                                 f"'...=127.0.0.1:40001', got {entry!r}")
        mapping[name.strip()] = addr.strip()
    unknown = sorted(set(mapping) - set(hosts))
    if unknown:
        raise ClusterError("TRAIN_HOST_MAP", f"names {unknown} are not worker hostnames; the workers are {hosts}")
    return [mapping[h] if ":" in mapping.get(h, "") else f"{mapping.get(h, h)}:{port}" for h in hosts]


def read_kubernetes(env: Mapping[str, str]) -> Cluster:
    """The cluster of a Kubernetes Indexed Job, from the pod's environment (pure: no TensorFlow, no DNS).

    Worker ``i`` is the pod with ``JOB_COMPLETION_INDEX=i``; its hostname is
    ``<TRAIN_JOB_NAME>-<i>`` and, with ``spec.template.spec.subdomain`` set to
    the headless Service ``TRAIN_SERVICE``, the others reach it as
    ``<TRAIN_JOB_NAME>-<i>.<TRAIN_SERVICE>:<TRAIN_PORT>``. ``TRAIN_NUM_WORKERS``
    must equal the Job's ``completions`` and ``parallelism``.
    ``TRAIN_HOST_MAP`` (optional) maps some hostnames to other addresses, as
    a pod's ``hostAliases`` would: off-cluster, e.g. on one machine, where every
    worker needs its own port.
    """
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be os.environ or a dict of variables, got {type(env).__name__}")
    fix_n = "set it in the manifest's env to the Job's completions (= parallelism)"
    n = _whole_var(env, "TRAIN_NUM_WORKERS", minimum=1, fix=fix_n)
    index = _whole_var(env, "JOB_COMPLETION_INDEX", maximum=n - 1,
                       fix=f"the Job has more completions than TRAIN_NUM_WORKERS={n}; make them equal")
    names = {}
    for var, what in (("TRAIN_JOB_NAME", "the Job's metadata.name"), ("TRAIN_SERVICE", "the headless Service's "
                                                                                      "name (= pod subdomain)")):
        value = env.get(var, "").strip()
        if not value:
            raise ClusterError(var, f"is not set: set it in the manifest's env to {what}")
        if not all(_DNS_LABEL.fullmatch(p) and len(p) <= 63 for p in value.split(".")):
            raise ClusterError(var, f"must be a DNS name (lower-case letters, digits, '-', '.'), got {value!r}")
        names[var] = value
    port = _whole_var(env, "TRAIN_PORT", minimum=1, maximum=65535) if "TRAIN_PORT" in env else DEFAULT_PORT
    hosts = [f"{names['TRAIN_JOB_NAME']}-{i}.{names['TRAIN_SERVICE']}" for i in range(n)]
    detail = (f"Indexed Job: JOB_COMPLETION_INDEX={index}, TRAIN_NUM_WORKERS={n}, TRAIN_JOB_NAME="
              f"{names['TRAIN_JOB_NAME']}, TRAIN_SERVICE={names['TRAIN_SERVICE']}, port {port}"
              + (", TRAIN_HOST_MAP" if env.get("TRAIN_HOST_MAP", "").strip() else ""))
    return Cluster("Kubernetes", {"worker": _host_map(env, hosts, port)}, "worker", index, detail=detail)


# --------------------------------------------------------------------------- choosing the source


def resolve_cluster(env: Mapping[str, str], slurm_port_base: int = SLURM_PORT_BASE,
                    slurm_resolver_class: Callable | None = None, *, tensorflow: bool = True) -> Cluster:
    """The cluster described by ``env``: TF_CONFIG, SLURM (``SLURM_PROCID``) or an Indexed Job (``JOB_COMPLETION_INDEX``).

    With one source present, its cluster. With several, TF_CONFIG's if they all
    describe the same workers and the same task (``source`` then names them all),
    else :class:`ClusterError` showing both. With none, :class:`ClusterError`
    naming the three variables looked for. ``tensorflow=False`` reads a SLURM
    step without TensorFlow's resolver (:func:`read_slurm`), so nothing here
    imports TensorFlow.
    """
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be os.environ or a dict of variables, got {type(env).__name__}")
    found = []
    if env.get("TF_CONFIG", "").strip():  # an empty TF_CONFIG means none, as TensorFlow reads it
        found.append(read_tf_config(env["TF_CONFIG"]))
    if "SLURM_PROCID" in env:
        found.append(read_slurm(env, slurm_port_base, slurm_resolver_class, tensorflow=tensorflow))
    if "JOB_COMPLETION_INDEX" in env:
        found.append(read_kubernetes(env))
    if not found:
        hint = ""
        partial = [v for v in (*_K8S_VARS, *_SLURM_VARS[1:]) if v in env]
        if partial:
            hint = (f" ({partial[0]} is set: an Indexed Job sets JOB_COMPLETION_INDEX (completionMode: Indexed), "
                    "srun sets SLURM_PROCID)")
        raise ClusterError("TF_CONFIG", "no cluster description found: set TF_CONFIG, run under SLURM's srun "
                                        "(SLURM_PROCID), or in a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)" + hint)
    first = found[0]
    for other in found[1:]:
        if not first.same_cluster(other):
            var = {"SLURM": "SLURM_PROCID", "Kubernetes": "JOB_COMPLETION_INDEX"}[other.source]
            raise ClusterError(var, f"{first.source} and {other.source} describe different clusters: "
                                    f"{first.source} says {first.tf_config()}, {other.source} ({var}={env[var]}) says "
                                    f"{other.tf_config()}; unset TF_CONFIG or make them agree")
    if len(found) == 1:
        return first
    names = " = ".join(c.source for c in found)
    slurm = next((c for c in found if c.source == "SLURM"), first)
    return Cluster(names, first.cluster, first.task_type, first.task_index, detail=first.detail,
                   tasks_on_node=slurm.tasks_on_node, local_rank=slurm.local_rank)
