"""Topic 07: tune tf.data input pipelines on the simulator, one technique at a time.

One job, the tf.data side of feeding an accelerator; the simulated reads,
decodes and training steps themselves come from :mod:`gpucourse.simulate`:

* :data:`WORKLOAD` is the notebook's workload (read 20 ms per record within 4
  shards, decode 60 ms, step 20 ms, 8 records) and :data:`VARIANTS` its
  pipelines, each adding one idea: ``Workload.run(**VARIANTS[name])``.
* :func:`describe_options` shows what ``tf.data.Options`` a pipeline carries,
  including what TensorFlow 2.21 adds by itself when they are not set.
* :func:`epoch_orders` reads a dataset epoch by epoch (to see a frozen order).
* :func:`benchmark` measures the pipelines side by side for ``python -m gpucourse.benchmark``.

Importing this module runs no TensorFlow code.
"""

from __future__ import annotations

import math

from . import _validate
from ._tf import tf as _tf
from .simulate import AUTOTUNE, Pipeline, Stage, source

__all__ = ["NOTES", "TUNED_POOL_THREADS", "VARIANTS", "WORKLOAD", "benchmark", "describe_options", "epoch_orders"]

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


def _row(case, median_s, bound_s, baseline_s, note):
    return {"topic": "07 tf.data", "case": case, "median_s": median_s, "bound_s": bound_s,
            "ratio_to_bound": median_s / bound_s if bound_s > 0 else math.inf,
            "speedup": None if baseline_s is None else baseline_s / median_s, "note": note}


def benchmark(quick: bool = False, *, workload: Pipeline | None = None) -> list[dict]:
    """Measure the topic's pipelines side by side; one row per case.

    Rows have ``topic, case, median_s, bound_s, ratio_to_bound, speedup, note``:
    every variant against the best bound of ``workload`` (default
    :data:`WORKLOAD`), a warm cache against the steps alone, and a vectorised
    decode against its decode work. ``speedup`` is against the first case of
    each comparison. About 15 s on 2 cores (``quick``: one timed repeat, no
    "TF default": about 8 s).
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
    return rows
