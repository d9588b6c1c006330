"""Does data parallelism pay? Predict it from compute per step against all-reduce bytes per step.

The one job: a small, explicit model of synchronous data parallelism, its
inputs stated with their sources, and the measured points set beside it.

One training step on N replicas, each with its own per-replica batch, costs::

    step(N) = overhead + compute + allreduce(N)             separate devices
    step(N) = N * (overhead + compute) + allreduce(N)       replicas sharing one processor
                                                            (logical CPUs, virtual GPUs)
    allreduce(N) = 2 (N-1)/N * bytes / bandwidth + 2 (N-1) * latency     (ring; NCCL's busbw formula)

where ``compute = 6 * params * per_replica_batch / FLOP_rate`` (2 FLOPs per
parameter and example forward, 4 backward) and ``overhead`` is the fixed cost
of launching the step's kernels. Two ratios come out:

* **weak-scaling efficiency** ``step(1) / step(N)``: the throughput gain over
  one device that trains on one per-replica batch, divided by N;
* **speedup over one device on the same global batch**,
  ``(overhead + N * compute) / step(N)``: what you gain over simply giving one
  device the whole batch. On separate devices it exceeds 1 exactly when
  ``(N-1) * compute > allreduce(N)``: data parallelism pays when each replica's
  compute outweighs the all-reduce of the gradients.

Hardware figures are inputs, each with its source (:data:`DEVICES`,
:data:`LINKS`); the parts no datasheet gives (the fraction of peak reached,
per-kernel launch cost, all-reduce latency) are explicit, labelled assumptions.
:func:`calibrate` builds the same inputs from timings measured here.
:func:`scaling_rows` turns measured throughputs into the table the notebook
prints, :func:`scaling_update` is the pure update function of the notebook's
explorer and :func:`scaling_explorer` assembles that explorer. Pure Python: no
TensorFlow import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from . import _validate
from ._labrules import answers

__all__ = [
    "DEVICES",
    "Device",
    "KERNEL_FREE_OPS",
    "LINKS",
    "Link",
    "Prediction",
    "Profile",
    "allreduce_seconds",
    "break_even_batch",
    "bus_bandwidth",
    "calibrate",
    "count_kernels",
    "datasheet_profile",
    "predict",
    "predict_step",
    "scaling_explorer",
    "scaling_rows",
    "scaling_table",
    "scaling_update",
    "train_flops",
]


@dataclass(frozen=True)
class Device:
    """One accelerator's peak arithmetic rate for one precision, with where the number comes from."""

    name: str
    flops: float
    source: str


@dataclass(frozen=True)
class Link:
    """The link the all-reduce runs over: bandwidth per direction per device, with its source."""

    name: str
    bytes_per_s: float
    source: str


#: Datasheet peak rates (dense, no sparsity).
DEVICES = {
    "T4 fp32": Device("NVIDIA T4, float32", 8.1e12, "NVIDIA T4 datasheet: 8.1 TFLOPS single precision"),
    "T4 fp16": Device("NVIDIA T4, float16 Tensor Cores", 65e12,
                      "NVIDIA T4 datasheet: 65 TFLOPS mixed precision (FP16/FP32)"),
    "A100 tf32": Device("NVIDIA A100 SXM, TF32 Tensor Cores", 156e12,
                        "NVIDIA A100 datasheet: 156 TFLOPS TF32 (312 only with sparsity)"),
    "A100 bf16": Device("NVIDIA A100 SXM, bfloat16 Tensor Cores", 312e12,
                        "NVIDIA A100 datasheet: 312 TFLOPS BF16/FP16 (624 only with sparsity)"),
}

#: Interconnect bandwidth per direction (NCCL's "bus bandwidth" is measured against this).
LINKS = {
    "PCIe 3.0 x16": Link("PCIe 3.0 x16", 16e9,
                         "NVIDIA T4 datasheet: interconnect 32 GB/s (PCIe Gen3 x16), i.e. 16 GB/s each way"),
    "NVLink 3": Link("NVLink 3 (A100 SXM)", 300e9,
                     "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU, i.e. 300 GB/s each way"),
}

#: Ops in a traced graph that launch no kernel of their own (constants, variable reads, plumbing).
KERNEL_FREE_OPS = frozenset({"Const", "NoOp", "Identity", "IdentityN", "Placeholder", "ReadVariableOp",
                             "VarHandleOp", "_Arg", "_Retval", "StopGradient", "Shape", "Pack",
                             "StatefulPartitionedCall", "PartitionedCall"})


@dataclass(frozen=True)
class Profile:
    """A machine, as the model sees it.

    ``flops``: FLOP/s one device reaches on this work; ``bytes_per_s`` and
    ``latency_s``: the all-reduce link; ``overhead_s``: fixed cost of one step
    on one device; ``shared``: the replicas share one physical processor
    (logical CPUs, virtual GPUs), so their compute and overhead add up.
    ``source`` says where each number came from.
    """

    name: str
    flops: float
    bytes_per_s: float
    latency_s: float = 0.0
    overhead_s: float = 0.0
    shared: bool = False
    source: str = ""

    def __post_init__(self):
        _validate.real("flops", self.flops, 0.0, strict_min=True, what="FLOP/s one device reaches")
        _validate.real("bytes_per_s", self.bytes_per_s, 0.0, strict_min=True, what="link bandwidth per direction")
        _validate.seconds("latency_s", self.latency_s)
        _validate.seconds("overhead_s", self.overhead_s)
        if not isinstance(self.shared, bool):
            raise TypeError(f"shared must be True or False, got {self.shared!r}")


def datasheet_profile(name: str, device: Device, link: Link, *, utilization: float = 0.5, kernels: int = 0,
                      launch_s: float = 5e-6, latency_s: float = 10e-6) -> Profile:
    """A :class:`Profile` from datasheet numbers plus the three assumptions no datasheet gives.

    Args:
        utilization: fraction of the peak FLOP rate a step reaches. Assumed 0.5
            for well-sized dense layers; tiny layers reach far less.
        kernels: kernels one training step launches (count them in the traced
            graph with :func:`count_kernels`).
        launch_s: cost of launching one kernel. Assumed 5 us (a CUDA launch costs
            a few us, plus TensorFlow's per-op dispatch); measure yours with the
            profiler of topic 08.
        latency_s: latency of one ring step of the all-reduce. Assumed 10 us;
            nccl-tests' ``all_reduce_perf`` time at small sizes measures it
            (its PERFORMANCE.md: "time is useful with small sizes, to measure the
            constant overhead").
    """
    _validate.text("name", name)
    if not isinstance(device, Device) or not isinstance(link, Link):
        raise TypeError("device and link must come from scaling.DEVICES and scaling.LINKS (Device, Link)")
    _validate.real("utilization", utilization, 0.0, 1.0, strict_min=True, what="fraction of peak FLOP/s")
    _validate.whole("kernels", kernels, minimum=0)
    _validate.seconds("launch_s", launch_s)
    return Profile(name, device.flops * utilization, link.bytes_per_s, latency_s, kernels * launch_s, False,
                   f"{device.source}; {link.source}; assumed: {utilization:.0%} of peak, {kernels} kernels x "
                   f"{launch_s * 1e6:g} us launch, {latency_s * 1e6:g} us per ring step")


def count_kernels(graph) -> int:
    """Ops in a traced graph that launch a kernel (``graph.get_operations()`` minus :data:`KERNEL_FREE_OPS`).

    ``graph`` is e.g. ``step.get_concrete_function(x, y).graph``. Function-call
    ops are skipped: their bodies live in the graph's library, not here.
    """
    ops = getattr(graph, "get_operations", None)
    if not callable(ops):
        raise TypeError(f"graph must be a TensorFlow graph (e.g. concrete_function.graph), got {type(graph).__name__}")
    return sum(1 for op in ops() if op.type not in KERNEL_FREE_OPS)


# --------------------------------------------------------------------------- the model


@answers('09', 'q4')
def train_flops(params: int, examples: int) -> float:
    """FLOPs of one training step of a dense model: ``6 * params * examples`` (2 forward, 4 backward)."""
    _validate.whole("params", params, what="trainable parameters")
    _validate.whole("examples", examples, minimum=0, what="examples in the step")
    return 6.0 * params * examples


def allreduce_seconds(nbytes: float, replicas: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time of one ring all-reduce of ``nbytes`` over ``replicas`` devices.

    ``2 (N-1)/N * nbytes / bytes_per_s + 2 (N-1) * latency_s``: each device
    sends and receives ``2 (N-1)/N`` of the data (NVIDIA nccl-tests,
    doc/PERFORMANCE.md, "AllReduce"), in ``2 (N-1)`` steps. Zero for one replica.
    """
    _validate.real("nbytes", nbytes, 0.0, what="bytes all-reduced per step")
    _validate.whole("replicas", replicas)
    _validate.real("bytes_per_s", bytes_per_s, 0.0, strict_min=True, what="link bandwidth per direction")
    _validate.seconds("latency_s", latency_s)
    if replicas == 1:
        return 0.0
    return 2 * (replicas - 1) / replicas * nbytes / bytes_per_s + 2 * (replicas - 1) * latency_s


def bus_bandwidth(nbytes: float, replicas: int, seconds: float) -> float:
    """NCCL's "bus bandwidth" of an all-reduce of ``nbytes`` over ``replicas`` devices that took ``seconds``.

    ``busbw = algbw * 2 (N-1)/N`` with ``algbw = nbytes / seconds`` (NVIDIA
    nccl-tests, doc/PERFORMANCE.md): the rate each device's link carried,
    comparable with the link's peak whatever N is. A :class:`Profile`'s
    ``bytes_per_s`` is this number; :func:`calibrate` measures it.
    """
    _validate.real("nbytes", nbytes, 0.0, what="bytes all-reduced")
    _validate.whole("replicas", replicas, minimum=2)
    _validate.seconds("seconds", seconds, allow_zero=False)
    return 2 * (replicas - 1) / replicas * nbytes / seconds


@dataclass(frozen=True)
class Prediction:
    """Predicted times (seconds per step) and the two ratios that decide whether data parallelism pays."""

    replicas: int
    compute_s: float
    overhead_s: float
    allreduce_s: float
    step_s: float
    single_s: float
    same_batch_s: float

    @property
    def efficiency(self) -> float:
        """Weak-scaling efficiency: one device's step on one per-replica batch over the N-replica step."""
        return self.single_s / self.step_s

    @property
    def throughput_gain(self) -> float:
        """Examples per second over one device training on one per-replica batch (ideal: N)."""
        return self.replicas * self.efficiency

    @property
    def speedup(self) -> float:
        """Over one device training on the whole global batch: above 1 means data parallelism pays."""
        return self.same_batch_s / self.step_s

    @property
    def comm_to_compute(self) -> float:
        """All-reduce time over compute time per replica step (``inf`` when there is no compute)."""
        return self.allreduce_s / self.compute_s if self.compute_s > 0 else float("inf")


def predict_step(compute_s: float, allreduce_s: float, replicas: int, *, overhead_s: float = 0.0,
                 shared: bool = False, overlap: float = 0.0) -> Prediction:
    """The model from its two numbers: compute and all-reduce seconds per step (plus the fixed overhead).

    Args:
        compute_s: one replica's compute per step.
        allreduce_s: the all-reduce of one step's gradients over ``replicas`` devices.
        overhead_s: fixed cost of one step on one device (kernel launches, dispatch).
        shared: the replicas share one processor (logical CPUs, virtual GPUs): their
            compute and overhead add up instead of running side by side.
        overlap: fraction of the all-reduce hidden behind the backward pass. Default
            0: Keras 3's optimizer all-reduces every gradient in one call inside
            ``apply_gradients``, once the backward pass has produced them all.
    """
    _validate.seconds("compute_s", compute_s)
    _validate.seconds("allreduce_s", allreduce_s)
    _validate.whole("replicas", replicas)
    _validate.seconds("overhead_s", overhead_s)
    _validate.real("overlap", overlap, 0.0, 1.0, what="fraction of the all-reduce hidden")
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be True or False, got {shared!r}")
    if compute_s + overhead_s <= 0:
        raise ValueError("compute_s + overhead_s must be > 0: a step that costs nothing cannot be scaled")
    comm = (1.0 - overlap) * allreduce_s if replicas > 1 else 0.0
    local = replicas * (overhead_s + compute_s) if shared else overhead_s + compute_s
    return Prediction(replicas, compute_s, overhead_s, comm, local + comm, overhead_s + compute_s,
                      overhead_s + replicas * compute_s)


def predict(profile: Profile, params: int, per_replica_batch: int, replicas: int, *, bytes_per_param: int = 4,
            overlap: float = 0.0) -> Prediction:
    """The model for a dense network of ``params`` parameters on ``profile``.

    Compute is :func:`train_flops` / ``profile.flops``; the all-reduce moves
    ``params * bytes_per_param`` bytes (float32 gradients: 4).
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a scaling.Profile, got {type(profile).__name__}")
    _validate.whole("per_replica_batch", per_replica_batch)
    _validate.whole("bytes_per_param", bytes_per_param, what="bytes per gradient value (float32: 4)")
    compute = train_flops(params, per_replica_batch) / profile.flops
    comm = allreduce_seconds(params * bytes_per_param, replicas, profile.bytes_per_s, profile.latency_s)
    return predict_step(compute, comm, replicas, overhead_s=profile.overhead_s, shared=profile.shared,
                        overlap=overlap)


def break_even_batch(profile: Profile, params: int, replicas: int, *, bytes_per_param: int = 4) -> float:
    """Per-replica batch above which N replicas beat one device on the same global batch.

    On separate devices data parallelism pays when ``(N-1) * compute > allreduce(N)``,
    i.e. above ``4 F / (3 N B) + F L / (3 P)`` examples per replica (``F``: FLOP/s,
    ``B``: link bytes/s, ``L``: latency per ring step, ``P``: parameters, float32
    gradients). For dense layers the parameter count cancels out of the first
    term: what decides is the batch per replica against the machine's FLOPs per
    link byte. Replicas that share one processor never pay: ``inf``.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a scaling.Profile, got {type(profile).__name__}")
    _validate.whole("params", params)
    _validate.whole("replicas", replicas, minimum=2)
    _validate.whole("bytes_per_param", bytes_per_param)
    if profile.shared:
        return float("inf")
    per_example = train_flops(params, 1) / profile.flops  # compute seconds per example
    comm = allreduce_seconds(params * bytes_per_param, replicas, profile.bytes_per_s, profile.latency_s)
    return comm / ((replicas - 1) * per_example)


def calibrate(name: str, *, params: int, per_replica_batch: int, step_s: float, big_step_s: float,
              big_factor: int, allreduce_s: Mapping[int, float], bytes_per_step: float, shared: bool,
              replica_step_s: float | None = None) -> Profile:
    """A :class:`Profile` of *this* machine from timings measured side by side.

    Args:
        params, per_replica_batch: the measured model and batch.
        step_s: one step on one device (no strategy) with the per-replica batch.
        big_step_s: one step on one device with ``big_factor`` times that batch.
            The difference is compute (it grows with the batch).
        allreduce_s: ``{replicas: seconds}`` of the all-reduce alone; the largest
            count gives the bandwidth (its latency folded in).
        bytes_per_step: bytes all-reduced per step.
        shared: the replicas share the processor (logical devices).
        replica_step_s: one replica's step under the strategy, if measured: the
            overhead is this minus the compute (the strategy's own per-step work
            included); default ``step_s``.
    """
    _validate.whole("big_factor", big_factor, minimum=2)
    for label, v in (("step_s", step_s), ("big_step_s", big_step_s)):
        _validate.seconds(label, v, allow_zero=False)
    if replica_step_s is not None:
        _validate.seconds("replica_step_s", replica_step_s, allow_zero=False)
    _validate.mapping("allreduce_s", allreduce_s, "{replicas: seconds}")
    n = max(allreduce_s)
    _validate.whole("replica count", n, minimum=2, what="the largest key of allreduce_s")
    _validate.seconds(f"allreduce_s[{n}]", allreduce_s[n], allow_zero=False)
    compute = max((big_step_s - step_s) / (big_factor - 1), step_s * 1e-3)  # timing noise can make it ~0
    overhead = max((step_s if replica_step_s is None else replica_step_s) - compute, 0.0)
    bandwidth = bus_bandwidth(bytes_per_step, n, allreduce_s[n])
    return Profile(name, train_flops(params, per_replica_batch) / compute, bandwidth, 0.0, overhead, shared,
                   f"measured here: {step_s * 1e3:.3g} ms per step at batch {per_replica_batch}, "
                   f"{big_step_s * 1e3:.3g} ms at batch {big_factor * per_replica_batch}, all-reduce of "
                   f"{bytes_per_step / 1e3:.0f} kB over {n} replicas {allreduce_s[n] * 1e3:.3g} ms")


# --------------------------------------------------------------------------- measured rows


def scaling_rows(throughputs: Mapping[int, float]) -> list[dict]:
    """Throughput per replica count -> rows with speedup over the smallest count and the ideal next to it.

    Args:
        throughputs: ``{replicas: examples per second}``.

    Returns:
        One dict per replica count, ascending: ``replicas``, ``throughput``,
        ``speedup`` (vs the smallest count), ``ideal`` (linear scaling) and
        ``efficiency`` (speedup / ideal).
    """
    _validate.mapping("throughputs", throughputs, "{replicas: examples_per_second}")
    for k, v in throughputs.items():
        _validate.whole("replica count", k)
        _validate.real(f"throughput for {k} replicas", v, 0.0, strict_min=True, what="examples per second")
    base_n = min(throughputs)
    base = throughputs[base_n]
    rows = []
    for n in sorted(throughputs):
        speedup = throughputs[n] / base
        ideal = n / base_n
        rows.append({"replicas": n, "throughput": throughputs[n], "speedup": speedup, "ideal": ideal,
                     "efficiency": speedup / ideal})
    return rows


def scaling_table(rows: Sequence[dict], predicted: Mapping[int, float] | None = None) -> str:
    """Plain-text table of :func:`scaling_rows`, with the ideal and (optionally) predicted efficiency beside it."""
    keys = {"replicas", "throughput", "speedup", "ideal", "efficiency"}
    rows = _validate.sequence("rows", rows, "dicts, as scaling_rows() returns")
    for r in rows:
        if not isinstance(r, Mapping):
            raise TypeError(f"rows must be the list of dicts that scaling_rows() returns, got an item {r!r}")
        if not keys <= set(r):
            raise ValueError(f"a row lacks {sorted(keys - set(r))}: pass the list that scaling_rows() returns")
    head = ("replicas", "examples/s", "speedup", "ideal", "efficiency")
    lines = [head + (("predicted",) if predicted else ())]
    for r in rows:
        cells = (str(r["replicas"]), f"{r['throughput']:,.0f}", f"{r['speedup']:.2f}x", f"{r['ideal']:.2f}x",
                 f"{r['efficiency']:.0%}")
        if predicted:
            p = predicted.get(r["replicas"])
            cells += ("n/a" if p is None else f"{p:.0%}",)
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in lines)


# --------------------------------------------------------------------------- the explorer


def scaling_update(profiles: Mapping[str, Profile], measured: Mapping[int, float] | None = None,
                   measured_on: str | None = None, max_replicas: int = 8):
    """The explorer's pure update function: ``update(replicas, per_replica_batch, params_m, machine) -> View``.

    Args:
        profiles: ``{name: Profile}``, the machines to choose from.
        measured: ``{replicas: throughput gain over 1 replica}`` measured in
            this notebook, drawn as points when ``machine == measured_on``.
        measured_on: the profile the measurement belongs to.
        max_replicas: the curve's right end.
    """
    _validate.mapping("profiles", profiles, "{name: scaling.Profile}")
    bad = [name for name, p in profiles.items() if not isinstance(p, Profile)]
    if bad:
        raise TypeError(f"profiles must map names to scaling.Profile objects; not so for {bad}")
    _validate.whole("max_replicas", max_replicas, minimum=2)
    measured = dict(measured or {})
    if measured_on is not None:
        _validate.one_of("measured_on", measured_on, list(profiles))

    def update(replicas: int = 2, per_replica_batch: int = 64, params_m: float = 0.1, machine: str = ""):
        from .explore import View

        name = machine or next(iter(profiles))
        _validate.one_of("machine", name, list(profiles))
        profile = profiles[name]
        params = max(1, round(params_m * 1e6))
        p = predict(profile, params, per_replica_batch, replicas)
        pays = "pays" if p.speedup > 1 else "does not pay"
        text = (f"{name}, {params / 1e6:g}M parameters, {per_replica_batch} examples per replica, {replicas} "
                f"replicas: compute {p.compute_s * 1e3:.3g} ms + overhead {p.overhead_s * 1e3:.3g} ms per replica, "
                f"all-reduce {p.allreduce_s * 1e3:.3g} ms per step\n"
                f"weak-scaling efficiency {p.efficiency:.0%} (throughput {p.throughput_gain:.2f}x of one device "
                f"with its per-replica batch); over one device on the same global batch: {p.speedup:.2f}x, "
                f"data parallelism {pays} here")
        return View(text, _scaling_figure(profile, name, params, per_replica_batch, replicas, max_replicas,
                                          measured if name == measured_on else {}))

    return update


# The batch sizes per replica and model sizes (millions of parameters) the explorer offers.
_EXPLORER_BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024, 4096)
_EXPLORER_PARAMS_M = (1.0, 10.0, 100.0, 1000.0)


def scaling_explorer(machines: Mapping[str, Profile], measured: Mapping[int, float] | None = None, *,
                     measured_on: str | None = None, replicas: int = 2, per_replica_batch: int = 64,
                     params: int = 100_000, max_replicas: int = 8):
    """The notebook's explorer: replicas, batch per replica, model size and machine in; prediction out.

    Args:
        machines: ``{name: Profile}``, the machines to choose from; the first is the default.
        measured: ``{replicas: throughput gain over 1 replica}`` measured in the notebook, drawn as
            points on ``measured_on``.
        measured_on: the machine the measurement belongs to; defaults to the first one when
            ``measured`` is given.
        replicas, per_replica_batch, params: the starting values (the notebook's own model); the
            batch and the model size join the offered choices if they are not among them.
        max_replicas: the slider's and the curve's right end.

    Returns:
        a :class:`gpucourse.explore.Explorer`; call ``.show()``. Without widgets it prints the current
        values and, for the first machine other than ``measured_on``, the notebook's model at 2
        replicas and a 100M-parameter model at 1024 examples per replica.
    """
    from .explore import Explorer, dropdown, slider

    if not isinstance(machines, Mapping) or not machines or not all(isinstance(p, Profile) for p in machines.values()):
        raise TypeError(f"machines must be a non-empty {{name: scaling.Profile}} dict (see datasheet_profile and "
                        f"calibrate), got {machines!r}")
    if measured and measured_on is None:
        measured_on = next(iter(machines))
    max_replicas = _validate.whole("max_replicas", max_replicas, minimum=2)
    replicas = _validate.whole("replicas", replicas, minimum=1, maximum=max_replicas)
    per_replica_batch = _validate.whole("per_replica_batch", per_replica_batch)
    params = _validate.whole("params", params)
    update = scaling_update(machines, measured, measured_on, max_replicas=max_replicas)
    params_m = round(params / 1e6, 3) or 0.001
    controls = [slider("replicas", 1, max_replicas, replicas),
                dropdown("per_replica_batch", sorted({*_EXPLORER_BATCHES, per_replica_batch}), per_replica_batch,
                         label="examples per replica"),
                dropdown("params_m", sorted({*_EXPLORER_PARAMS_M, params_m}), params_m,
                         label="parameters (millions)"),
                dropdown("machine", list(machines))]
    others = [name for name in machines if name != measured_on]
    presets = []
    if others:
        presets = [{"machine": others[0], "replicas": 2},
                   {"machine": others[0], "replicas": 2, "per_replica_batch": 1024, "params_m": 100.0}]
    return Explorer("scaling-model", update, controls, title="Data-parallel scaling model", presets=presets)


def _scaling_figure(profile, name, params, batch, replicas, max_replicas, measured):
    import matplotlib.pyplot as plt

    ns = list(range(1, max(max_replicas, replicas) + 1))
    preds = [predict(profile, params, batch, n) for n in ns]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(ns, ns, ":", color="gray", label="ideal (linear)")
    ax.plot(ns, [q.throughput_gain for q in preds], "-", label="predicted throughput vs 1 device, same per-replica batch")
    ax.plot(ns, [q.speedup for q in preds], "--", label="predicted speedup vs 1 device, same global batch")
    if measured:
        ax.plot(sorted(measured), [measured[k] for k in sorted(measured)], "o", color="black",
                label="measured here (throughput vs 1 replica)")
    ax.axvline(replicas, color="gray", alpha=0.3)
    ax.axhline(1.0, color="gray", alpha=0.3)
    ax.set_xlabel("replicas")
    ax.set_ylabel("x one device")
    ax.set_title(f"{name}: {params / 1e6:g}M params, batch {batch} per replica", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig

