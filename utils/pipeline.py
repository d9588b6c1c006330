"""Topic 07: tune tf.data input pipelines on the simulator, one technique at a time.

One job, the tf.data side of feeding an accelerator; the simulated reads,
decodes and training steps themselves come from :mod:`gpucourse.simulate`:

* :data:`WORKLOAD` is the notebook's workload (read 20 ms per record within 4
  shards, decode 60 ms, step 20 ms, 8 records) and :data:`VARIANTS` its
  pipelines, each adding one idea: ``Workload.run(**VARIANTS[name])``.
* :func:`describe_options` shows what ``tf.data.Options`` a pipeline carries,
  including what TensorFlow 2.21 adds by itself when they are not set.
* :func:`epoch_orders` reads a dataset epoch by epoch (to see a frozen order).
* :func:`read_autotune_budgets` reads the CPU and RAM budgets autotune resolved, from a trace.
* :func:`explore_pipeline` is the pipeline builder's pure on-change function
  (toggles in; a measured epoch, its ratio to the bound and a timeline out) and
  :func:`pipeline_explorer` wraps it in :class:`gpucourse.explore.Explorer`.
* :func:`variant_claims` checks what the notebook says about the measured variants, from the
  best of their repeats (tests/test_timing_claims.py runs it under CPU load).
* :func:`benchmark` measures the pipelines side by side for ``python -m gpucourse.benchmark``.

Importing this module runs no TensorFlow code.
"""

from __future__ import annotations

import math

from . import _validate
from ._tf import tf as _tf
from .explore import Explorer, View, checkbox, dropdown
from .simulate import AUTOTUNE, Pipeline, Stage, source

__all__ = ["EXPLORER_WORKLOAD", "NOTES", "TUNED_POOL_THREADS", "VARIANTS", "WORKLOAD", "benchmark", "build_pipeline",
           "describe_options", "describe_pipeline", "epoch_orders", "explore_pipeline", "pipeline_explorer",
           "read_autotune_budgets", "variant_claims", "SEQUENTIAL_VARIANTS", "PARALLEL_VARIANTS"]

#: Threads for latency-bound stages in the tuned pipeline (tf.data's default pool has one per core).
TUNED_POOL_THREADS = 8

#: The notebook's workload: 8 records in 4 shards; read 20 ms (sequential within a shard), decode 60 ms
#: (any number at once), a 20 ms training step. ``threads=None``: TensorFlow's default pool.
WORKLOAD = Pipeline(stages=(("decode", 0.06),), read_s=0.02, step_s=0.02, n=8, shards=4, threads=None)

#: The notebook's pipelines as :class:`gpucourse.simulate.Pipeline` toggles, each adding one idea.
VARIANTS = {
    "naive": {},
    "TF default": {"tf_rewrites": True},
    "+ prefetch": {"prefetch": True},
    "+ parallel decode": {"prefetch": True, "parallel": AUTOTUNE},
    "+ interleave": {"prefetch": True, "parallel": AUTOTUNE, "interleave": 4},
    "tuned": {"prefetch": True, "parallel": AUTOTUNE, "interleave": 4, "threads": TUNED_POOL_THREADS},
}

#: What each variant changes, for tables.
NOTES = {
    "naive": "no prefetch, no rewrites: read + decode + step add up",
    "TF default": "TF 2.21 injects a prefetch by itself",
    "+ prefetch": "producer overlaps the step; decode is now the bottleneck",
    "+ parallel decode": "decodes limited by the default pool (one thread per core)",
    "+ interleave": "reads overlap too, but share the same small pool",
    "tuned": f"private_threadpool_size={TUNED_POOL_THREADS}: latency-bound stages get threads",
}


#: The variants that read and decode one record at a time, and those that decode in parallel.
SEQUENTIAL_VARIANTS = ("naive", "TF default", "+ prefetch")
PARALLEL_VARIANTS = ("+ parallel decode", "+ interleave", "tuned")


def variant_claims(comparison, own_bounds_s, cores: int | None = None) -> dict[str, bool]:
    """What notebook 07's section 3 says about the measured variants, each claim with whether it held.

    ``comparison`` is the ``timing.compare`` of :data:`VARIANTS` (names as keys), ``own_bounds_s`` each
    variant's own bound in seconds (``run.bound_s``). Every claim reads the *best* of each variant's
    repeats: the run the machine disturbed least, which is what the pipeline's structure allows. The
    claims are written to hold on a busy 2-core machine too (3 CPU-burning processes beside it; a test
    checks that); the one about the default pool is made only on 1-2 cores (``cores``; default: the
    cores this process may use).
    """
    names = list(VARIANTS)
    best = {}
    for name in names:
        try:
            best[name] = comparison[name].min_s
        except (KeyError, TypeError, AttributeError):
            raise TypeError("comparison must be timing.compare(...) of every pipeline.VARIANTS entry; "
                            f"missing or unreadable: {name!r}") from None
    _validate.mapping("own_bounds_s", own_bounds_s, "{variant: seconds}")
    missing = [n for n in names if n not in own_bounds_s]
    if missing:
        raise ValueError(f"own_bounds_s has no bound for {missing}: give run.bound_s of each variant")
    own = {n: _validate.seconds(f"own_bounds_s[{n!r}]", own_bounds_s[n], allow_zero=False) for n in names}
    if cores is None:
        cores = _schedulable_cores()
    ratio = {n: best[n] / own[n] for n in names}
    seq, par = SEQUENTIAL_VARIANTS, PARALLEL_VARIANTS
    claims = {
        "no pipeline beats its own bound": all(r >= 0.97 for r in ratio.values()),
        "naive, TF default and + prefetch stay within 2x of their own bound": all(ratio[n] <= 2.0 for n in seq),
        "each pipeline that decodes in parallel beats each one that decodes one record at a time":
            max(best[n] for n in par) < min(best[n] for n in seq),
        "+ interleave gains little over + parallel decode (under 1.5x)":
            best["+ parallel decode"] / best["+ interleave"] < 1.5,
        "tuned is the fastest": best["tuned"] <= min(best.values()),
    }
    if cores <= 2:
        claims["on 1-2 cores, + parallel decode stays above its own bound x 1.25 (the default pool)"] = \
            ratio["+ parallel decode"] > 1.25
    return claims


def describe_options(obj) -> dict:
    """The options that matter for speed, from a ``Dataset`` or an ``Options``.

    ``None`` means "not set: TensorFlow's default applies".
    """
    tf = _tf()
    if isinstance(obj, tf.data.Dataset):
        obj = obj.options()
    if not isinstance(obj, tf.data.Options):
        raise TypeError(f"expected a tf.data.Dataset or tf.data.Options, got {type(obj).__name__}")
    return {
        "inject_prefetch": obj.experimental_optimization.inject_prefetch,
        "autotune": obj.autotune.enabled,
        "deterministic": obj.deterministic,
        "private_threadpool_size": obj.threading.private_threadpool_size,
        "map_parallelization": obj.experimental_optimization.map_parallelization,
    }


def epoch_orders(dataset, epochs: int = 2) -> list[list]:
    """The elements of each epoch, in order, with batches flattened: ``[[...], [...]]``.

    Two equal lists mean the order is frozen between epochs.
    """
    epochs = _validate.whole("epochs", epochs)
    tf = _tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    out = []
    for _ in range(epochs):
        order = []
        for element in dataset:
            order.extend(element.numpy().reshape(-1).tolist())
        out.append(order)
    return out


# --------------------------------------------------------------------------- the pipeline builder (explorer)

#: The explorer's workload: 16 records in 4 shards; read 4 ms per record, decode 2 ms per record plus
#: 8 ms per call (the overhead vectorising saves), a training step of 4 ms per record of its batch.
#: Small, so one update measures in about 0.1-0.4 s; the step's cost per record stays the same
#: whatever the batch size.
EXPLORER_WORKLOAD = Pipeline(stages=(("decode", 0.002),), per_call_s=0.008, read_s=0.004, step_s=0.016,
                             n=16, shards=4, batch=4, threads=None)
_PARALLEL = {"off": None, "2": 2, "4": 4, "AUTOTUNE": AUTOTUNE}
_INTERLEAVE = {"off": None, "2": 2, "4": 4}
_THREADS = {"default": None, "4": 4, "8": 8, "16": 16}
_BATCHES = (1, 2, 4, 8, 16)


def _pick(name: str, value, table: dict):
    return table[_validate.one_of(name, value, tuple(table))]


def build_pipeline(prefetch: bool = False, parallel: str = "off", interleave: str = "off", cache: bool = False,
                   vectorise: bool = False, batch: int = 4, threads: str = "default", *,
                   workload: Pipeline = EXPLORER_WORKLOAD) -> Pipeline:
    """The explorer's settings as a :class:`gpucourse.simulate.Pipeline` of ``workload``'s costs.

    ``parallel``: ``"off"``, ``"2"``, ``"4"`` or ``"AUTOTUNE"`` (num_parallel_calls of the decode);
    ``interleave``: ``"off"``, ``"2"`` or ``"4"`` shards read at once; ``threads``: ``"default"`` (one
    per core) or a private pool of ``"4"``, ``"8"``, ``"16"``; ``batch``: records per step (the step's
    cost per record is ``workload``'s, so the device time per epoch does not change).
    """
    if not isinstance(workload, Pipeline):
        raise TypeError(f"workload must be a gpucourse.simulate.Pipeline, got {type(workload).__name__}")
    batch = _validate.one_of("batch", _validate.whole("batch", batch), _BATCHES)
    per_record = workload.step_s / (workload.batch or 1)
    return workload.replace(prefetch=prefetch, parallel=_pick("parallel", parallel, _PARALLEL),
                            interleave=_pick("interleave", interleave, _INTERLEAVE), cache=cache,
                            vectorise=vectorise, batch=batch, step_s=per_record * batch,
                            threads=_pick("threads", threads, _THREADS))


def describe_pipeline(p: Pipeline) -> str:
    """The tf.data chain a :class:`gpucourse.simulate.Pipeline` builds, as one line of code."""
    if not isinstance(p, Pipeline):
        raise TypeError(f"p must be a gpucourse.simulate.Pipeline, got {type(p).__name__}")

    def calls(k):
        return "" if k is None else f", num_parallel_calls={'AUTOTUNE' if k == AUTOTUNE else k}"

    if not p.reads:
        chain = ["records"]
    elif p.interleave is None:
        chain = ["shards.flat_map(read)"]
    else:
        chain = [f"shards.interleave(read, cycle_length={p.interleave}{calls(p.interleave)})"]
    if p.vectorise:
        chain.append(f"batch({p.batch})")
    chain += [f"map({name}{calls(p.parallel_of(name))})" for name, _ in p.stages]
    if p.cache:
        chain.append("cache()")
    if p.batch is not None and not p.vectorise:
        chain.append(f"batch({p.batch})")
    if p.prefetch:
        chain.append("prefetch(AUTOTUNE)")
    code = ".".join(chain)
    if p.threads is not None:
        code += f"  # private_threadpool_size={p.threads}"
    return code


def _best_bound(p: Pipeline) -> float:
    """The bound of the best pipeline of ``p``'s costs without a cache: everything parallel, with a prefetch."""
    best = p.replace(prefetch=True, parallel=AUTOTUNE, interleave=p.shards if p.reads else None, cache=False)
    options = [best] + ([best.replace(vectorise=True)] if best.batch is not None else [])
    return min(q.bound() for q in options)


def explore_pipeline(prefetch: bool = False, parallel: str = "off", interleave: str = "off", cache: bool = False,
                     vectorise: bool = False, batch: int = 4, threads: str = "default", *,
                     workload: Pipeline = EXPLORER_WORKLOAD, plot: bool = True) -> View:
    """The pipeline builder's on-change function: build the pipeline (:func:`build_pipeline`), run one epoch
    (with ``cache``, a second one, served by the cache the first filled), and return its epoch time as a
    ratio to its own bound and to the best bound of the workload, with its timeline (``plot``).
    About 0.1-0.4 s with the default workload."""
    from .timing import format_seconds

    p = build_pipeline(prefetch, parallel, interleave, cache, vectorise, batch, threads, workload=workload)
    w = p.workload()
    run = w.run()
    if cache:
        run = w.run()  # the first epoch filled the cache
    if sorted(w.delivered) != w.expected():
        raise RuntimeError(f"the pipeline delivered {sorted(w.delivered)}, expected {w.expected()}")
    best = _best_bound(p)
    epoch = "epoch 2 (from the cache)" if cache else "epoch"
    text = (f"{epoch} {format_seconds(run.seconds)}: {run.ratio:.2f}x the bound of this pipeline "
            f"({format_seconds(run.bound_s)}), {run.seconds / best:.2f}x the best bound at this batch size "
            f"without a cache ({format_seconds(best)}); device busy {run.utilisation:.0%}\n"
            f"{describe_pipeline(p)}\n"
            f"decode ran {w.stage('decode').calls} calls on {w.stage('decode').elements} records; {run.steps} steps")
    figure = None
    if plot:
        import matplotlib.pyplot as plt

        from .plots import timeline

        ax = timeline(run.timeline, title=f"{epoch}: {run.ratio:.2f}x its bound, device busy {run.utilisation:.0%}")
        ax.axvline(run.bound_s * 1e3, color="#c44e52", linestyle="--", linewidth=1)
        ax.text(run.bound_s * 1e3, -0.6, " bound", color="#c44e52", fontsize=8)
        figure = ax.figure
        plt.close(figure)
    return View(text, figure)


def pipeline_explorer(workload: Pipeline = EXPLORER_WORKLOAD) -> Explorer:
    """The pipeline builder: toggles for prefetch, parallel map, interleave, cache and vectorise, with their
    parameters; each change measures one epoch (:func:`explore_pipeline`) and redraws the timeline. Without
    widgets it prints the naive and the tuned pipeline instead."""
    build_pipeline(workload=workload)  # checks the workload

    def update(**values):
        return explore_pipeline(**values, workload=workload)

    controls = [checkbox("prefetch", False, "prefetch(AUTOTUNE)"),
                dropdown("parallel", list(_PARALLEL), "off", "decode num_parallel_calls"),
                dropdown("interleave", list(_INTERLEAVE), "off", "interleave shards"),
                checkbox("cache", False, "cache() (show epoch 2)"),
                checkbox("vectorise", False, "vectorise: batch before map"),
                dropdown("batch", list(_BATCHES), workload.batch or 4, "batch size"),
                dropdown("threads", list(_THREADS), "default", "private_threadpool_size")]
    tuned = {"prefetch": True, "parallel": "AUTOTUNE", "interleave": "4", "vectorise": True, "threads": "8"}
    return Explorer("pipeline builder", update, controls, title="Pipeline builder", presets=[{}, tuned])


# --------------------------------------------------------------------------- what autotune may use


def _schedulable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))  # what TensorFlow counts on Linux (port::NumSchedulableCPUs)
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def read_autotune_budgets(dataset=None) -> dict:
    """What autotune's ``cpu_budget`` and ``ram_budget`` resolve to, read from TensorFlow itself.

    Iterates a few elements of ``dataset`` (default: a small parallel map) under the profiler and reads
    the metadata TensorFlow attaches to the pipeline's root iterator. Returns ``cpu_budget`` (cores),
    ``ram_budget_mb``, ``free_ram_mb`` and ``total_ram_mb`` (the RAM figures TensorFlow reports beside
    it), ``threadpool_size`` and ``schedulable_cores`` (this process's CPU affinity, for comparison).
    The budgets are None when autotune is off. Takes about 0.3 s; needs the profiler plugin
    (``tensorboard-plugin-profile``) to read the trace.
    """
    import re
    import shutil
    import tempfile

    from .profiling import capture_trace

    tf = _tf()
    if dataset is None:
        dataset = tf.data.Dataset.range(8).map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
    elif not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset or None, got {type(dataset).__name__}")
    logdir = tempfile.mkdtemp(prefix="gpucourse-budgets-")
    try:
        with capture_trace(logdir) as capture:
            for _ in dataset.take(8):
                pass
        roots = [e.args for e in capture.events() if e.name.startswith("Iterator::Root")]
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    if not roots:
        raise RuntimeError("the trace holds no Iterator::Root event: the dataset produced nothing to trace")
    meta = roots[0]
    usage = re.match(r"(\d+) out of (\d+)", meta.get("ram_usage_megabytes", ""))  # "17904 out of 25276 (70.8%)"
    used, total = (int(x) for x in usage.groups()) if usage else (None, None)

    def number(key):
        return int(meta[key]) if key in meta else None

    return {"cpu_budget": number("cpu_budget"), "ram_budget_mb": number("ram_budget_megabytes"),
            "free_ram_mb": None if usage is None else total - used, "total_ram_mb": total,
            "threadpool_size": number("threadpool_size"), "schedulable_cores": _schedulable_cores()}


def _row(case, median_s, bound_s, baseline_s, note):
    return {"topic": "07 tf.data", "case": case, "median_s": median_s, "bound_s": bound_s,
            "ratio_to_bound": median_s / bound_s if bound_s > 0 else math.inf,
            "speedup": None if baseline_s is None else baseline_s / median_s, "note": note}


def benchmark(quick: bool = False, *, workload: Pipeline | None = None) -> list[dict]:
    """Measure the topic's pipelines side by side; one row per case.

    Rows have ``topic, case, median_s, bound_s, ratio_to_bound, speedup, note``:
    every variant against the best bound of ``workload`` (default
    :data:`WORKLOAD`), a warm cache against the steps alone, a vectorised
    decode against its decode work, and 4 threads of a map that sleeps against
    4 of one that computes in pure Python (holding the GIL), each against its
    own limit. ``speedup`` is against the first case of each comparison. About
    17 s on 2 cores (``quick``: one timed repeat, no "TF default": about 9 s).
    """
    from . import timing

    if not isinstance(quick, bool):
        raise TypeError(f"quick must be True or False, got {quick!r}")
    workload = WORKLOAD if workload is None else workload
    if not isinstance(workload, Pipeline):
        raise TypeError(f"workload must be a gpucourse.simulate.Pipeline, got {type(workload).__name__}")
    repeats = 1 if quick else 2
    rows: list[dict] = []

    # 1. one epoch, each tuning step added in turn; every ratio is to the best bound (unlimited threads)
    w = workload.workload()
    names = [name for name in VARIANTS if not (quick and name == "TF default")]
    best = w.run(**VARIANTS["tuned"]).bound_s
    cmp = timing.compare({name: (lambda t=VARIANTS[name]: w.run(**t)) for name in names},
                         warmup=1, repeats=repeats, bound_s=best)
    for name in names:
        rows.append(_row(name, cmp[name].median_s, best, cmp["naive"].median_s, NOTES[name]))

    # 2. cache: epochs of a sequential producer with prefetch, with and without a warm cache
    w2 = workload.workload()
    cmp2 = timing.compare({"no cache": lambda: w2.run(prefetch=True),
                           "warm cache": lambda: w2.run(prefetch=True, cache=True)}, warmup=1, repeats=repeats)
    rows.append(_row("cache: epoch 2", cmp2["warm cache"].median_s, w2.run(prefetch=True, cache=True).bound_s,
                     cmp2["no cache"].median_s, "records come from memory; bound = the steps alone"))

    # 3. vectorised decode: the producer alone, one call per element vs one call per batch of 8
    batch, n, per_element, per_call = 8, 64, 0.0005, 0.004
    decode = Stage(per_element, lambda r: 2 * r + 1, "decode", per_call_s=per_call)
    scalar = source(n, threads=None).map(decode).batch(batch)
    vector = source(n, threads=None).batch(batch).map(decode)
    cmp3 = timing.compare({"scalar": lambda: sum(1 for _ in scalar), "vectorised": lambda: sum(1 for _ in vector)},
                          warmup=1, repeats=repeats)
    rows.append(_row("vectorised decode", cmp3["vectorised"].median_s, n * per_element + (n // batch) * per_call,
                     cmp3["scalar"].median_s,
                     f"batch({batch}) before map: one call per batch; bound = the decode work alone"))

    # 4. threads: 4 at once of a map that sleeps (releases the GIL) and of one computing in Python (holds it)
    calls, cost, k = (8, 0.01, 4) if quick else (12, 0.02, 4)
    for label, gil in (("sleeps", False), ("computes in Python", True)):
        stage = Stage(cost, name=label, holds_gil=gil)
        one, many = source(calls).map(stage), source(calls).map(stage, num_parallel_calls=k)
        cmp4 = timing.compare({"one": lambda: sum(1 for _ in one), "many": lambda: sum(1 for _ in many)},
                              warmup=1, repeats=repeats)
        limit = 1 if gil else k
        rows.append(_row(f"map that {label}, {k} threads", cmp4["many"].median_s, calls * cost / limit,
                         cmp4["one"].median_s, f"{calls} calls of {cost * 1e3:g} ms; bound = their work / {limit} "
                         + ("(the GIL: one call computes at a time)" if gil else f"({k} calls at once)")))
    return rows
