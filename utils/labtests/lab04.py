"""Public tests of lab 04: MirroredStrategy and multi-worker.

Every check builds fresh inputs (random sizes, random data, strategies over
different device subsets) and checks behaviour: batch sizes, what a dataset
function yields, losses and weights after a distributed step compared with
single-device training, and what TensorFlow's own TF_CONFIG resolver reads.
"""

from __future__ import annotations

import json
import numbers
import os
import random

from gpucourse.grading.items import Fail, expect_raises, item


def _strategies():
    """Strategies over 1 device and over every device of the preferred type (fresh key ranges)."""
    from gpucourse import distribute

    names = distribute.strategy_devices()
    subsets = [names[:1]] + ([names[:2]] if len(names) > 2 else []) + ([names] if len(names) > 1 else [])
    return [distribute.mirrored_strategy(s) for s in subsets]


@item("q1", points=2, title="global_batch(strategy, per_replica) uses the strategy's replica count")
def q1(ns):
    fn = ns.function("global_batch")
    for strategy in _strategies():
        n = strategy.num_replicas_in_sync
        per = random.randint(3, 70)
        got = fn(strategy, per)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise Fail(f"global_batch should return a whole number of examples (an int), got {got!r} "
                       f"({type(got).__name__})")
        if got != per * n:
            raise Fail(f"for a MirroredStrategy over {n} device(s) and per_replica={per}, expected {per * n}, "
                       f"got {got!r}. Use strategy.num_replicas_in_sync, not the number of devices on the machine.")
    for bad in (0, -4):
        expect_raises(lambda: fn(strategy, bad), f"global_batch(strategy, {bad})", "a batch needs >= 1 example")


def _elements(ds, limit=10_000):
    """All (x, y) batches of a finite dataset, as numpy arrays."""
    out = []
    for i, (xb, yb) in enumerate(ds):
        if i >= limit:
            raise Fail("the dataset seems endless: do not .repeat() it, the training loop decides how long to run")
        out.append((xb.numpy(), yb.numpy()))
    return out


@item("q2", points=3, title="make_dataset_fn shards per input pipeline and batches per replica")
def q2(ns):
    import numpy as np
    import tensorflow as tf

    make = ns.function("make_dataset_fn")
    for pipelines, replicas in ((2, 4), (1, 2), (3, 3)):
        per = random.randint(2, 5)
        gbs = per * replicas
        n = gbs * random.randint(3, 6) * pipelines
        x = np.arange(n, dtype="float32").reshape(n, 1) + np.float32(random.randint(0, 1000))
        y = 3.0 * x
        fn = make(x, y, gbs)
        seen = []
        for pid in range(pipelines):
            ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pid,
                                             num_replicas_in_sync=replicas)
            ds = fn(ctx)
            if not isinstance(ds, tf.data.Dataset):
                raise Fail(f"dataset_fn(ctx) should return a tf.data.Dataset, got {type(ds).__name__}")
            batches = _elements(ds)
            sizes = sorted({len(xb) for xb, _ in batches})
            if sizes != [per]:
                raise Fail(f"with {pipelines} input pipeline(s), {replicas} replicas and global batch {gbs}, every "
                           f"batch should hold {per} examples (the per-replica batch), got batch sizes {sizes}")
            for xb, yb in batches:
                if not np.allclose(yb, 3.0 * xb):
                    raise Fail("the x and y of a batch no longer belong together (y = 3x in this test); "
                               "shuffle or shard (x, y) pairs, not x and y separately")
            seen.append(np.concatenate([xb.ravel() for xb, _ in batches]))
        every = np.concatenate(seen)
        if len(every) != n or len(np.unique(every)) != n:
            raise Fail(f"with {pipelines} input pipeline(s) and {n} examples, the pipelines together should yield "
                       f"each example exactly once; they yielded {len(every)} examples, {len(np.unique(every))} "
                       "distinct. Shard by ctx.num_input_pipelines and ctx.input_pipeline_id.")
    strategy = _strategies()[-1]
    reps = strategy.num_replicas_in_sync
    gbs = 2 * reps
    x = np.random.rand(gbs * 3, 1).astype("float32")
    first = next(iter(strategy.distribute_datasets_from_function(make(x, 3.0 * x, gbs))))
    parts = strategy.experimental_local_results(first[0])
    if [int(p.shape[0]) for p in parts] != [2] * reps:
        raise Fail(f"through strategy.distribute_datasets_from_function with {reps} replicas and global batch {gbs}, "
                   f"each replica should get 2 examples, got {[int(p.shape[0]) for p in parts]}")


def _reference_step(weights, x, y, lr):
    """One SGD step of the same model on one device: returns (loss, new weights)."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(y.shape[1])])
    model.set_weights(weights)
    opt = keras.optimizers.SGD(lr)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.reduce_mean(tf.square(y - model(x)), axis=-1))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return float(loss), model.get_weights()


@item("q3", points=3, title="make_train_step: a distributed step whose loss and update match one device")
def q3(ns):
    import keras
    import numpy as np
    import tensorflow as tf

    make = ns.function("make_train_step")
    strategy = _strategies()[-1]
    n = strategy.num_replicas_in_sync
    if n < 2:
        raise Fail("this check needs at least 2 devices: run the setup cell at the top of the lab first")
    feats, outs, lr = random.randint(3, 6), random.randint(1, 3), 0.1
    gbs = n * random.randint(2, 4)
    rng = np.random.default_rng(random.randint(0, 10_000))
    x = rng.normal(size=(2 * gbs, feats)).astype("float32")
    y = rng.normal(size=(2 * gbs, outs)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((feats,)), keras.layers.Dense(outs)])
        optimizer = keras.optimizers.SGD(lr)
    weights = model.get_weights()
    step = make(strategy, model, optimizer, gbs)
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(gbs)))
    for k in range(2):
        xb, yb = x[k * gbs:(k + 1) * gbs], y[k * gbs:(k + 1) * gbs]
        want_loss, weights = _reference_step(weights, xb, yb, lr)
        got = step(next(batches))
        try:
            got_loss = float(got)
        except (TypeError, ValueError):
            raise Fail(f"step(batch) should return the loss as a scalar (reduce the per-replica losses with "
                       f"strategy.reduce), got {type(got).__name__}: {str(got)[:120]}")
        if not np.isclose(got_loss, want_loss, rtol=1e-3, atol=1e-6):
            raise Fail(f"{n} replicas, global batch {gbs}, step {k + 1}: the loss should be the mean squared error "
                       f"over the global batch, {want_loss:.6f}; got {got_loss:.6f} "
                       f"(ratio {got_loss / want_loss:.2f}). Average per example with "
                       "tf.nn.compute_average_loss(..., global_batch_size=...) and reduce with SUM.")
        diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), weights))
        if diff > 1e-3:
            raise Fail(f"{n} replicas, global batch {gbs}, step {k + 1}: the loss is right but the weights after "
                       f"the update differ from single-device SGD by up to {diff:.2g}. Gradients are summed "
                       "over replicas, so each replica's loss must be divided by the GLOBAL batch size, "
                       "not averaged over its own share.")


@item("q4", points=2, title="make_tf_config builds a TF_CONFIG that TensorFlow reads correctly")
def q4(ns):
    import tensorflow as tf

    fn = ns.function("make_tf_config")
    n = random.randint(2, 4)
    ports = random.sample(range(20000, 60000), n)
    for index in range(n):
        before = os.environ.get("TF_CONFIG")
        try:
            text = fn(ports, index)
        finally:
            after = os.environ.get("TF_CONFIG")
            if after != before:  # undo it, so this kernel does not believe it is a cluster worker
                if before is None:
                    os.environ.pop("TF_CONFIG", None)
                else:
                    os.environ["TF_CONFIG"] = before
        if after != before:
            raise Fail(f"make_tf_config({ports}, {index}) changed os.environ['TF_CONFIG']: it should only return "
                       "the string. Setting it in this notebook makes the kernel itself a cluster worker for every "
                       "strategy created afterwards (the check has put it back).")
        if not isinstance(text, str):
            raise Fail(f"make_tf_config({ports}, {index}) should return a JSON string (environment variables are "
                       f"strings), got {type(text).__name__}")
        try:
            json.loads(text)
        except ValueError as err:
            raise Fail(f"make_tf_config({ports}, {index}) is not valid JSON ({err}): {text[:120]}")
        saved = os.environ.get("TF_CONFIG")
        os.environ["TF_CONFIG"] = text
        try:
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            cluster = resolver.cluster_spec().as_dict()
            task = (resolver.task_type, resolver.task_id)
        finally:
            if saved is None:
                os.environ.pop("TF_CONFIG", None)
            else:
                os.environ["TF_CONFIG"] = saved
        want = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        if cluster != want:
            raise Fail(f"for ports {ports}, TensorFlow should read the cluster {want}, but it read {cluster}")
        if task != ("worker", index):
            raise Fail(f"for index {index}, TensorFlow should read task ('worker', {index}), but it read {task}")
    for bad_args in ((ports, n), (ports, -1), (ports[:1] * 2, 0)):
        expect_raises(lambda: fn(*bad_args), f"make_tf_config{bad_args}", "index out of range or repeated port")
