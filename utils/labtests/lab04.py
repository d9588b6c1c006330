"""Lab 04 (MirroredStrategy and multi-worker): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (random sizes, random data, random
initial weights, random ports), ``observe`` runs the learner's function in the
learner's kernel under strategies over different device subsets and returns
plain data (batches, losses, weights, strings), and ``judge`` computes the
expected answer on the grader's side: batch arithmetic, sharding, and the
reference training (one device, in NumPy) of q3 and q5, including the wrong
answers the classic mistakes would give, so the message can name the mistake.

q3 feeds global batches that do not split evenly over the replicas, so only a
loss divided by the global batch size passes. q5 kills a training run after a
random step, restarts it on fresh weights and other data, and compares the
final weights with an uninterrupted run. Under the grader the first run is a
real process (``ns.worker``: the submission's cells run again in a fresh
process, see :mod:`gpucourse.grading.kernel_standby`) killed with SIGKILL, so
only what it saved on disk survives; ``check()`` simulates the kill with an
exception from ``on_step`` that ``except Exception`` cannot catch.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import json

from gpucourse.grading.items import Fail, ItemTimeout, expect_raised, item, outcome, tr

# --------------------------------------------------------------------------- shared


def _type_name(value) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


def _strategies():
    """Strategies over 1 device, 2 devices and every device of the preferred type (fresh key ranges)."""
    from gpucourse import distribute

    names = distribute.strategy_devices()
    subsets = [names[:1]] + ([names[:2]] if len(names) > 2 else []) + ([names] if len(names) > 1 else [])
    return [distribute.mirrored_strategy(s) for s in subsets]


def _all_devices_strategy():
    from gpucourse import distribute

    return distribute.mirrored_strategy(distribute.strategy_devices())


def _split(batch: int, replicas: int) -> list[int]:
    """TensorFlow's split of a batch over replicas: ceil(batch / replicas) each, in order, until it runs out."""
    per = -(-batch // replicas)
    return [max(0, min(per, batch - i * per)) for i in range(replicas)]


def _matrix(rng, rows: int, cols: int, scale: float = 1.0) -> list[list[float]]:
    return [[round(rng.gauss(0.0, scale), 4) for _ in range(cols)] for _ in range(rows)]


def _linear_model(strategy, kernel, bias):
    """A Dense layer under ``strategy.scope()`` with the given weights (built in the learner's kernel)."""
    import keras
    import numpy as np

    kernel, bias = np.array(kernel, "float32"), np.array(bias, "float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((kernel.shape[0],)), keras.layers.Dense(kernel.shape[1])])
    model.set_weights([kernel, bias])
    return model


# --------------------------------------------------------------------------- q1


@item("q1", points=2, title="global_batch(strategy, per_replica) uses the strategy's replica count")
class q1:
    def cases(rng):
        return [{"per": rng.randint(3, 70)} for _ in range(3)] + [{"bad": b} for b in (0, -rng.randint(1, 9))]

    def observe(ns, case):
        from gpucourse import distribute

        fn = ns.function("global_batch")
        machine = len(distribute.strategy_devices())
        if "bad" in case:
            return outcome(lambda: fn(_all_devices_strategy(), case["bad"]))
        out = []
        for strategy in _strategies():
            got = fn(strategy, case["per"])
            out.append({"replicas": int(strategy.num_replicas_in_sync), "got": got, "type": _type_name(got)})
        return {"runs": out, "machine": machine}

    def judge(case, seen):
        if "bad" in case:
            return expect_raised(seen, f"global_batch(strategy, {case['bad']})", "a batch needs >= 1 example")
        per = case["per"]
        for run in seen["runs"]:
            n, got = run["replicas"], run["got"]
            if run["type"] not in ("int", "int64", "int32"):
                raise Fail(tr("global_batch should return a whole number of examples (an int), got {got} ({kind})",
                              got=repr(got), kind=run["type"]))
            if got != per * n:
                hint = (tr(" Use strategy.num_replicas_in_sync, not the number of devices on the machine.")
                        if got == per * seen["machine"] else "")
                raise Fail(tr("for a MirroredStrategy over {n} device(s) and per_replica={per}, expected {want}, "
                              "got {got}.{hint}", n=n, per=per, want=per * n, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q2


def _shard_sizes(n: int, pipelines: int) -> list[int]:
    """Examples per input pipeline when ``Dataset.shard(pipelines, i)`` splits ``n`` of them."""
    return [len(range(i, n, pipelines)) for i in range(pipelines)]


@item("q2", points=3, title="make_dataset_fn shards per input pipeline and batches per replica")
class q2:
    def cases(rng):
        out = []
        for pipelines, replicas, even in ((2, 4, False), (1, 2, False), (3, 3, True)):
            per = rng.randint(2, 5)
            gbs = per * replicas
            n = gbs * rng.randint(3, 6) * pipelines
            if not even:  # a data size that does not split evenly: some pipeline ends with a partial batch
                n += rng.choice([r for r in range(1, per * pipelines * 2)
                                 if any(size % per for size in _shard_sizes(n + r, pipelines))])
            out.append({"pipelines": pipelines, "replicas": replicas, "gbs": gbs, "n": n,
                        "offset": rng.randint(0, 1000)})
        return out + [{"through_strategy": True, "per": 2, "rows": 3}]

    def observe(ns, case):
        import numpy as np
        import tensorflow as tf

        make = ns.function("make_dataset_fn")
        if case.get("through_strategy"):
            strategy = _all_devices_strategy()
            reps = int(strategy.num_replicas_in_sync)
            gbs = case["per"] * reps
            x = np.arange(gbs * case["rows"], dtype="float32").reshape(-1, 1)
            dataset_fn = make(x, 3.0 * x, gbs)
            probe = dataset_fn(tf.distribute.InputContext(num_replicas_in_sync=reps))
            if not isinstance(probe, tf.data.Dataset):
                return {"type": type(probe).__name__}
            first = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
            return {"replicas": reps, "gbs": gbs,
                    "sizes": [int(p.shape[0]) for p in strategy.experimental_local_results(first[0])]}
        n, pipelines = case["n"], case["pipelines"]
        x = np.arange(n, dtype="float32").reshape(n, 1) + np.float32(case["offset"])
        fn = make(x, 3.0 * x, case["gbs"])
        pipes = []
        for pid in range(pipelines):
            ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pid,
                                             num_replicas_in_sync=case["replicas"])
            ds = fn(ctx)
            if not isinstance(ds, tf.data.Dataset):
                return {"type": type(ds).__name__}
            batches, endless = [], False
            for i, (xb, yb) in enumerate(ds):
                if i >= n:  # more batches than examples: it repeats (every batch holds at least one example)
                    endless = True
                    break
                batches.append({"x": xb.numpy().ravel().tolist(), "y": yb.numpy().ravel().tolist()})
            pipes.append({"batches": [] if endless else batches, "endless": endless})
            if endless:
                break
        return {"type": "Dataset", "pipelines": pipes}

    def judge(case, seen):
        if "type" in seen and seen["type"] != "Dataset":
            raise Fail(tr("dataset_fn(ctx) should return a tf.data.Dataset, got {kind}", kind=seen["type"]))
        if case.get("through_strategy"):
            reps, gbs = seen["replicas"], seen["gbs"]
            if seen["sizes"] != [case["per"]] * reps:
                raise Fail(tr("through strategy.distribute_datasets_from_function with {reps} replicas and global "
                              "batch {gbs}, each replica should get {per} examples, got {sizes}", reps=reps, gbs=gbs,
                              per=case["per"], sizes=seen["sizes"]))
            return
        pipelines, replicas, gbs, n = case["pipelines"], case["replicas"], case["gbs"], case["n"]
        per = gbs // replicas
        every = []
        for pipe in seen["pipelines"]:
            if pipe["endless"]:
                raise Fail(tr("the dataset seems endless: do not .repeat() it, the training loop decides how long "
                              "to run"))
            sizes = [len(b["x"]) for b in pipe["batches"]]
            if any(size != per for size in sizes[:-1]) or (sizes and not 1 <= sizes[-1] <= per):
                raise Fail(tr("with {pipelines} input pipeline(s), {replicas} replicas and global batch {gbs}, every "
                              "batch should hold {per} examples (the per-replica batch; only a pipeline's last batch "
                              "may hold fewer), got batch sizes {sizes}", pipelines=pipelines, replicas=replicas,
                              gbs=gbs, per=per, sizes=sorted(set(sizes))))
            for b in pipe["batches"]:
                if any(abs(yv - 3.0 * xv) > 1e-3 * max(1.0, abs(xv)) for xv, yv in zip(b["x"], b["y"])):
                    raise Fail(tr("the x and y of a batch no longer belong together (y = 3x in this test); "
                                  "shuffle or shard (x, y) pairs, not x and y separately"))
                every.extend(b["x"])
        dropped = n - len(every)
        if (len(set(every)) == len(every) and 0 < dropped < per * pipelines
                and all(len(b["x"]) == per for pipe in seen["pipelines"] for b in pipe["batches"])):
            raise Fail(tr("with {pipelines} input pipeline(s), {n} examples and per-replica batches of {per}, the "
                          "pipelines together yielded {count} examples: {dropped} were dropped. That is what "
                          "batch(..., drop_remainder=True) does to each pipeline's last, partial batch. Keep it "
                          "(leave drop_remainder at False): every example must be seen exactly once.",
                          pipelines=pipelines, n=n, per=per, count=len(every), dropped=dropped))
        if len(every) != n or len(set(every)) != n:
            raise Fail(tr("with {pipelines} input pipeline(s) and {n} examples, the pipelines together should yield "
                          "each example exactly once; they yielded {count} examples, {distinct} distinct. Shard by "
                          "ctx.num_input_pipelines and ctx.input_pipeline_id.", pipelines=pipelines, n=n,
                          count=len(every), distinct=len(set(every))))


# --------------------------------------------------------------------------- q3


def _sgd_linear(kernel, bias, batches, lr, momentum=0.0, velocity=None):
    """Reference: SGD (Keras' momentum rule) on mean-over-outputs squared error, loss summed / batch size.

    Returns (losses, kernel, bias, velocity). Plain Python, float64.
    """
    import numpy as np

    w, b = np.array(kernel, float), np.array(bias, float)
    vw, vb = velocity if velocity is not None else (np.zeros_like(w), np.zeros_like(b))
    losses = []
    for x, y in batches:
        x, y = np.array(x, float), np.array(y, float)
        pred = x @ w + b
        losses.append(float(np.mean(np.mean((y - pred) ** 2, axis=1))))
        d = -2.0 * (y - pred) / (y.shape[1] * x.shape[0])
        gw, gb = x.T @ d, d.sum(axis=0)
        vw, vb = momentum * vw - lr * gw, momentum * vb - lr * gb
        w, b = w + vw, b + vb
    return losses, w, b, (vw, vb)


def _mean_of_replica_means(kernel, bias, x, y, replicas):
    """The loss a per-replica reduce_mean divided by the replica count gives on an uneven split."""
    import numpy as np

    w, b = np.array(kernel, float), np.array(bias, float)
    x, y = np.array(x, float), np.array(y, float)
    per_example = np.mean((y - (x @ w + b)) ** 2, axis=1)
    total, start = 0.0, 0
    for size in _split(len(x), replicas):
        if size:
            total += per_example[start:start + size].mean() / replicas
        start += size
    return total


@item("q3", points=3, title="make_train_step: a distributed step whose loss and update match one device")
class q3:
    def cases(rng):
        out = []
        for gbs in rng.sample([7, 11, 13], 1):  # primes: an uneven split over any 2, 4, 6 or 8 replicas
            feats, outs = rng.randint(3, 6), rng.randint(1, 3)
            out.append({"gbs": gbs, "lr": 0.1, "x": _matrix(rng, 2 * gbs, feats), "y": _matrix(rng, 2 * gbs, outs),
                        "kernel": _matrix(rng, feats, outs, 0.5), "bias": [round(rng.gauss(0, 0.1), 4)
                                                                          for _ in range(outs)]})
        return out

    def observe(ns, case):
        import keras
        import numpy as np
        import tensorflow as tf

        make = ns.function("make_train_step")
        strategy = _all_devices_strategy()
        n = int(strategy.num_replicas_in_sync)
        if n < 2:
            raise Fail(tr("this check needs at least 2 devices: run the setup cell at the top of the lab first"))
        gbs = case["gbs"]
        model = _linear_model(strategy, case["kernel"], case["bias"])
        with strategy.scope():
            optimizer = keras.optimizers.SGD(case["lr"])
        step = make(strategy, model, optimizer, gbs)
        data = tf.data.Dataset.from_tensor_slices((np.array(case["x"], "float32"), np.array(case["y"], "float32")))
        batches = iter(strategy.experimental_distribute_dataset(data.batch(gbs)))
        steps = []
        for _ in range(2):
            got = step(next(batches))
            try:
                loss = float(got)
            except (TypeError, ValueError):
                return {"replicas": n, "steps": steps, "unreduced": f"{type(got).__name__}: {str(got)[:120]}"}
            steps.append({"loss": loss, "weights": [w.tolist() for w in model.get_weights()]})
        return {"replicas": n, "steps": steps}

    def judge(case, seen):
        import numpy as np

        if "unreduced" in seen:
            raise Fail(tr("step(batch) should return the loss as a scalar (reduce the per-replica losses with "
                          "strategy.reduce), got {got}", got=seen["unreduced"]))
        n, gbs = seen["replicas"], case["gbs"]
        x, y = case["x"], case["y"]
        kernel, bias = case["kernel"], case["bias"]
        for k, got in enumerate(seen["steps"]):
            xb, yb = x[k * gbs:(k + 1) * gbs], y[k * gbs:(k + 1) * gbs]
            losses, w, b, _ = _sgd_linear(kernel, bias, [(xb, yb)], case["lr"])
            want = losses[0]
            where = tr("{n} replicas, global batch {gbs} (split {split}), step {k}", n=n, gbs=gbs,
                       split=_split(gbs, n), k=k + 1)
            per_replica = tr("You averaged per replica (reduce_mean, or compute_average_loss without a size) and "
                             "divided by the replica count: that is wrong when the replicas hold different numbers "
                             "of examples. Divide each replica's sum by the global batch size: "
                             "tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size).")
            # (a mean of replica means can come within the tolerance of the true loss by chance: the weights tell)
            replica_means = (len(set(_split(gbs, n))) > 1  # on an even split both means are the same
                             and np.isclose(got["loss"], _mean_of_replica_means(kernel, bias, xb, yb, n), rtol=1e-3))
            if not np.isclose(got["loss"], want, rtol=1e-3, atol=1e-6):
                hint = per_replica if replica_means else tr(
                    "Average per example with tf.nn.compute_average_loss(..., global_batch_size=...) and "
                    "reduce with SUM.")
                raise Fail(tr("{where}: the loss should be the mean squared error over the global batch, "
                              "{want:.6f}; got {got:.6f} (ratio {ratio:.2f}). {hint}", where=where, want=want,
                              got=got["loss"], ratio=got["loss"] / want, hint=hint))
            diff = max(float(np.abs(np.array(a) - c).max()) for a, c in zip(got["weights"], (w, b)))
            if diff > 1e-3 and replica_means:
                raise Fail(tr("{where}: the loss is right but the weights after the update differ from "
                              "single-device SGD by up to {diff:.2g}. {hint}", where=where, diff=diff,
                              hint=per_replica))
            if diff > 1e-3:
                raise Fail(tr("{where}: the loss is right but the weights after the update differ from "
                              "single-device SGD by up to {diff:.2g}. Gradients are summed over replicas, so each "
                              "replica's loss must be divided by the GLOBAL batch size, not averaged over its own "
                              "share.", where=where, diff=diff))
            kernel, bias = w.tolist(), b.tolist()


# --------------------------------------------------------------------------- q4


@item("q4", points=2, title="make_tf_config builds a TF_CONFIG that TensorFlow reads correctly")
class q4:
    def cases(rng):
        n = rng.randint(2, 4)
        ports = rng.sample(range(20000, 60000), n)
        good = [{"ports": ports, "index": i} for i in range(n)]
        bad = [{"ports": ports, "index": n, "bad": True}, {"ports": ports, "index": -1, "bad": True},
               {"ports": [ports[0], ports[0]], "index": 0, "bad": True}]
        return good + bad

    def observe(ns, case):
        import os

        import tensorflow as tf

        fn = ns.function("make_tf_config")
        ports, index = case["ports"], case["index"]
        before = os.environ.get("TF_CONFIG")
        try:
            result = outcome(lambda: fn(ports, index))
        finally:
            after = os.environ.get("TF_CONFIG")
            if after != before:  # undo it, so this kernel does not believe it is a cluster worker
                os.environ.pop("TF_CONFIG", None) if before is None else os.environ.__setitem__("TF_CONFIG", before)
        seen = {"result": result, "changed_env": after != before}
        text = result.get("value")
        if not case.get("bad") and isinstance(text, str):
            os.environ["TF_CONFIG"] = text
            try:
                resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
                seen["tf_read"] = {"cluster": resolver.cluster_spec().as_dict(),
                                   "task": [resolver.task_type, resolver.task_id]}
            except Exception as exc:  # the judge says what TensorFlow could not read
                seen["tf_read"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            finally:
                os.environ.pop("TF_CONFIG", None) if before is None else os.environ.__setitem__("TF_CONFIG", before)
        return seen

    def judge(case, seen):
        ports, index = case["ports"], case["index"]
        call = f"make_tf_config({ports}, {index})"
        if seen["changed_env"]:
            raise Fail(tr("{call} changed os.environ['TF_CONFIG']: it should only return the string. Setting it in "
                          "this notebook makes the kernel itself a cluster worker for every strategy created "
                          "afterwards (the check has put it back).", call=call))
        if case.get("bad"):
            return expect_raised(seen["result"], call, "index out of range or repeated port")
        result = seen["result"]
        if "raised" in result:
            raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=result["raised"],
                          message=result.get("message", "")))
        text = result["value"]
        if not isinstance(text, str):
            raise Fail(tr("{call} should return a JSON string (environment variables are strings), got {got}",
                          call=call, got=repr(text)))
        try:
            parsed = json.loads(text)
        except ValueError as err:
            raise Fail(tr("{call} is not valid JSON ({err}): {text}", call=call, err=err, text=text[:120]))
        want_cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        if not isinstance(parsed, dict) or parsed.get("cluster") != want_cluster:
            got = parsed.get("cluster") if isinstance(parsed, dict) else parsed
            raise Fail(tr("for ports {ports} the cluster should be {want}, got {got}", ports=ports, want=want_cluster,
                          got=got))
        task = parsed.get("task")
        if task != {"type": "worker", "index": index}:
            raise Fail(tr("for index {index} the task should be {want} (index an int), got {task}", index=index,
                          want=f"{{'type': 'worker', 'index': {index}}}", task=task))
        read = seen.get("tf_read", {})
        if read.get("cluster") != want_cluster or read.get("task") != ["worker", index]:
            raise Fail(tr("TensorFlow's TFConfigClusterResolver read {read} from {text}", read=read, text=text[:120]))


# --------------------------------------------------------------------------- q5


class _WorkerKilled(BaseException):
    """The simulated failure q5 raises from ``on_step``: a BaseException, so ``except Exception`` won't swallow it."""


def _train_step(strategy, model, optimizer, global_batch):
    """A correct distributed step (so q5 grades checkpointing only, not q3 again)."""
    import tensorflow as tf

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(y - model(x, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # No AutoGraph: it would read this file's source, which the grader reports as the learner's code
    # reading the checks (and nothing here needs converting).
    @tf.function(autograph=False)
    def step(batch):
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    return step


def _fresh_run(strategy, case, kernel, bias, targets="y"):
    """Model, built momentum optimizer, step function and dataset for one launch of q5's training."""
    import keras
    import numpy as np
    import tensorflow as tf

    model = _linear_model(strategy, kernel, bias)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(case["lr"], momentum=case["momentum"])
        optimizer.build(model.trainable_variables)  # momentum slots now, under the scope
    data = tf.data.Dataset.from_tensor_slices((np.array(case["x"], "float32"), np.array(case[targets], "float32")))
    return model, optimizer, _train_step(strategy, model, optimizer, case["gbs"]), data.batch(case["gbs"])


#: Seconds q5's first run may take in its worker process, the submission's cells included.
FIRST_RUN_S = 90.0


def _folder_state(folder) -> str:
    """What the checkpoint folder holds right now, as a short digest of its files' names and contents (files
    over 16 MiB by size and time): it changes whenever a checkpoint is written, whatever the learner names it."""
    import hashlib
    import os

    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
                digest.update(os.path.relpath(path, folder).encode() + b"\0")
                if info.st_size <= 16 * 2**20:
                    with open(path, "rb") as f:
                        digest.update(f.read())
                else:
                    digest.update(f"{info.st_size}:{info.st_mtime_ns}".encode())
            except OSError:  # a file renamed or removed while we look: the folder is changing anyway
                digest.update(b"?")
    return digest.hexdigest()[:16]


def _first_launch(variables, args, report):
    """In a fresh worker process, after the submission's cells: q5's first run, killed after step ``crash_at``.

    The standby (:mod:`gpucourse.grading.kernel_standby`) kills this process with SIGKILL the moment it
    reads the report of that step; ``on_step`` waits for it, so no further step runs.
    """
    import time

    from gpucourse.grading.items import plain

    from gpucourse import distribute

    case, fn = args["case"], variables.get("train_resumable")
    if not callable(fn):
        report(["missing"])
        return
    strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])
    model, optimizer, step_fn, data = _fresh_run(strategy, case, case["kernel"], case["bias"])

    def on_step(k):
        report(["folder", plain(k), _folder_state(args["folder"])])  # before "step": the kill comes on that
        report(["step", plain(k)])
        if k == case["crash_at"]:
            time.sleep(3600)

    try:
        fn(strategy, model, optimizer, step_fn, data, case["steps"], args["folder"], case["save_every"], on_step)
    except BaseException as exc:  # noqa: BLE001 (the learner's error, for the message)
        report(["raised", f"{type(exc).__name__}: {exc}"[:300]])
        return
    report(["returned"])


def _first_run_killed(worker, case, folder) -> dict:
    """The grader's first run: a fresh process that runs the submission again and is killed after ``crash_at``."""
    answer = worker(_first_launch, {"case": case, "folder": folder}, ["step", case["crash_at"]], FIRST_RUN_S)
    reports = [r for r in answer["reports"] if isinstance(r, list) and r]
    steps = [r[1] for r in reports if r[0] == "step" and len(r) == 2]
    folders = [r[2] for r in reports if r[0] == "folder" and len(r) == 3]
    said = {r[0]: r[1:] for r in reports}
    lines = [line for line in str(answer.get("log", "")).splitlines() if line.strip()]
    error = lines[-1][:300] if lines else ""  # the end of what the process printed says why it ended
    if answer["ended"] == "killed":
        first, error = "killed", ""
    elif "missing" in said:
        first = "missing"
    elif "raised" in said:
        first, error = "raised", str(said["raised"][0]) if said["raised"] else ""
    elif "returned" in said:
        first, error = "finished", ""
    elif answer["ended"] == "timeout":
        first = "timeout"
    else:
        first, error = "died", f"{answer['ended']}; {error or '-'}"
    return {"first": first, "first_steps": steps, "first_error": error, "first_folders": folders}


def _first_run_simulated(fn, case, folder, progress) -> dict:
    """check()'s first run, in this kernel: on_step raises after ``crash_at`` (a BaseException).

    ``progress`` gets the steps on_step saw and when (for the message if the item's time runs out).
    """
    import time
    import numpy as np

    from gpucourse.grading.items import counted, plain

    from gpucourse import distribute

    strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])  # 2 replicas are enough here
    model, optimizer, step_fn, data = _fresh_run(strategy, case, case["kernel"], case["bias"])
    first_steps, at_kill, folders = progress.setdefault("first", []), [], []

    def fail_after(k):
        first_steps.append(plain(k))
        progress["at"] = time.monotonic()
        folders.append(_folder_state(folder))
        if k == case["crash_at"]:
            at_kill.extend(v.numpy().copy() for v in model.variables + optimizer.variables)
            raise _WorkerKilled(f"simulated failure after step {k}")

    # on_step reaches neither this log nor the model through __closure__ (see counted)
    on_step, _ = counted(fail_after)
    try:
        fn(strategy, model, optimizer, step_fn, data, case["steps"], folder, case["save_every"], on_step)
        first = "finished"
    except _WorkerKilled:
        first = "killed"
    if first == "killed" and at_kill and any(not np.array_equal(a, v.numpy()) for a, v in
                                             zip(at_kill, model.variables + optimizer.variables)):
        first = "went on"  # a dead worker trains no further
    return {"first": first, "first_steps": first_steps, "first_error": "", "first_folders": folders}


def _progress_text(case, progress) -> str:
    """How far q5's runs got when the item's time ran out, and what that suggests (busy machine or a loop)."""
    import time

    first, second, steps = progress.get("first", []), progress.get("second"), case["steps"]
    if any(isinstance(k, int) and k > steps for k in (second or []) + first):
        return tr("Your training went on past step {steps} (on_step saw step {k}): it does not stop. Train "
                  "exactly until step `steps`, and do not .repeat() the dataset.", steps=steps,
                  k=max(k for k in (second or []) + first if isinstance(k, int)))
    where = tr("The first run had reached step {k} (the check stops it after step {crash}).",
               k=first[-1] if first else 0, crash=case["crash_at"])
    if second is not None:
        where = tr("The restart had reached step {k} of {steps}.", k=second[-1] if second else "-", steps=steps)
    if "at" not in progress:
        return where + " " + tr("on_step was never called: look for an endless loop before the first step, or an "
                                "iterator that never ends.")
    idle = time.monotonic() - progress["at"]
    if idle < 15:
        return where + " " + tr("Your code was still making progress ({idle:.0f} s since the last on_step), so "
                                "the machine is probably busy, or slow experiments ran before: run the check "
                                "again.", idle=idle)
    return where + " " + tr("Nothing happened for the last {idle:.0f} s (no on_step): look for an endless loop, or "
                            "an iterator that never ends (e.g. a dataset with .repeat()).", idle=idle)


@item("q5", points=3, title="train_resumable: resume after a worker failure with the same final weights",
      worker=True)
class q5:
    def cases(rng):
        out = []
        for save_every in rng.sample([2, 3], 1):
            steps = rng.randint(8, 9)
            # at least two checkpoints before the failure, and none written at the failing step itself
            crash = rng.choice([k for k in range(2 * save_every + 1, steps) if k % save_every])
            feats, outs, gbs = rng.randint(2, 4), rng.randint(1, 2), rng.choice([8, 12])
            out.append({"steps": steps, "save_every": save_every, "crash_at": crash, "gbs": gbs, "lr": 0.05,
                        "momentum": 0.9, "x": _matrix(rng, steps * gbs, feats), "y": _matrix(rng, steps * gbs, outs),
                        "kernel": _matrix(rng, feats, outs, 0.5), "bias": [0.0] * outs,
                        "fresh_kernel": _matrix(rng, feats, outs, 0.5),
                        # the restart's data: other targets, so only a restart that trains (from what was
                        # saved on disk) ends at the right weights, not one that replays a run kept in memory
                        "y_restart": _matrix(rng, steps * gbs, outs)})
        return out

    def observe(ns, case):
        import shutil
        import tempfile
        import time

        from gpucourse.grading.items import counted, plain

        from gpucourse import distribute

        fn = ns.function("train_resumable")
        folder = tempfile.mkdtemp(prefix="gpucourse-lab04-")
        progress: dict = {}
        try:
            if ns.worker is not None:  # the grader: a real process, killed with SIGKILL
                first = _first_run_killed(ns.worker, case, folder)
            else:  # check(): the kill simulated in this kernel
                first = _first_run_simulated(fn, case, folder, progress)
            # The restart: a new process would build everything again, from *other* initial weights, and here
            # the data after the checkpoint differs too.
            strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])
            model, optimizer, step_fn, data = _fresh_run(strategy, case, case["fresh_kernel"], case["bias"],
                                                         "y_restart")
            second_steps = progress["second"] = []

            def seen_step(k):
                second_steps.append(plain(k))
                progress["at"] = time.monotonic()

            losses = fn(strategy, model, optimizer, step_fn, data, case["steps"], folder, case["save_every"],
                        counted(seen_step)[0])
            return {**first, "second_steps": second_steps, "losses": plain(losses),
                    "weights": [w.tolist() for w in model.get_weights()]}
        except ItemTimeout:  # say how far the runs got: a busy machine is not an endless loop
            raise ItemTimeout(_progress_text(case, progress)) from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def judge(case, seen):
        import numpy as np

        steps, every, crash = case["steps"], case["save_every"], case["crash_at"]
        gbs = case["gbs"]
        batches = [(case["x"][k * gbs:(k + 1) * gbs], case["y"][k * gbs:(k + 1) * gbs]) for k in range(steps)]
        where = tr("(steps={steps}, save_every={every}, killed after step {crash})", steps=steps, every=every,
                   crash=crash)
        if seen["first"] == "went on":
            raise Fail(tr("the check killed the first run after step {crash}, yet its model and optimizer changed "
                          "afterwards: a killed worker trains no further. Let what on_step raises propagate; after "
                          "the restart only what was saved on disk is left.", crash=crash))
        if seen["first"] == "missing":
            raise Fail(tr("the grader runs your notebook's cells again in a fresh process, as a restarted worker "
                          "runs its program again, and `train_resumable` was not defined there. Define it in a "
                          "code cell that runs without errors from a fresh start."))
        error = seen.get("first_error") or "-"
        if seen["first"] == "raised":
            raise Fail(tr("the first run should train until the check kills its process after step {crash}, but "
                          "train_resumable raised {error}", crash=crash, error=error))
        if seen["first"] == "timeout":
            raise Fail(tr("the first run should reach step {crash}, where the check kills its process, within "
                          "{seconds:.0f} s, but it was still running. That process runs your notebook's cells "
                          "first, so slow experiments in them count too. Its last output: {error}", crash=crash,
                          seconds=FIRST_RUN_S, error=error))
        if seen["first"] == "died":
            raise Fail(tr("the first run's process ended before the check killed it after step {crash} ({error})",
                          crash=crash, error=error))
        if seen["first"] != "killed" or seen["first_steps"] != list(range(1, crash + 1)):
            raise Fail(tr("the first run should call on_step(k) after each step k = 1, 2, ... and let what on_step "
                          "raises propagate; the check kills the run after step {crash}. on_step saw {saw} and the "
                          "run {ended}.", crash=crash, saw=seen["first_steps"][:12],
                          ended=tr("ended normally") if seen["first"] == "finished" else tr("was killed")))
        folders = seen.get("first_folders") or []
        for k in range(every, crash + 1, every):  # on_step(k) of a due step: its checkpoint is already on disk
            if len(folders) >= k and folders[k - 1] == folders[k - 2]:
                raise Fail(tr("when on_step({k}) was called, the checkpoint of step {k} was not on disk yet (the "
                              "checkpoint folder had not changed since on_step({prev})). Save first, then call "
                              "on_step(k): a worker killed right after on_step(k) would otherwise lose that "
                              "checkpoint.", k=k, prev=k - 1))
        resume = (crash // every) * every  # the last checkpoint written before the failure
        want_steps = list(range(resume + 1, steps + 1))
        got_steps = seen["second_steps"]
        if got_steps != want_steps:
            first = got_steps[0] if got_steps else None
            raise Fail(tr("after the restart {where} training should continue at step {step} (the last "
                          "checkpoint was written after step {resume}) and call on_step for steps {want}; "
                          "it called it for {got}. {hint}", where=where, step=resume + 1, resume=resume,
                          want=want_steps, got=got_steps[:12],
                          hint=tr("Restore the latest checkpoint (model, optimizer and the step counter) before "
                                  "training.") if first == 1
                          else tr("Restore the LATEST checkpoint, and keep the step counter in it.")))
        later = [(case["x"][k * gbs:(k + 1) * gbs], case["y_restart"][k * gbs:(k + 1) * gbs]) for k in range(steps)]
        batches = batches[:resume] + later[resume:]  # the restart trains on its own data
        ref_losses, w, b, _ = _sgd_linear(case["kernel"], case["bias"], batches, case["lr"], case["momentum"])
        got_w = [np.array(a) for a in seen["weights"]]
        if max(float(np.abs(g - r).max()) for g, r in zip(got_w, (w, b))) <= 1e-3:
            want_losses = ref_losses[resume:]
            if (not isinstance(seen["losses"], list) or len(seen["losses"]) != len(want_losses)
                    or not np.allclose(seen["losses"], want_losses, rtol=1e-3, atol=1e-6)):
                raise Fail(tr("the final weights are right, but train_resumable should return the losses of the "
                              "steps it trained ({n} floats for steps {steps}), got {got}", n=len(want_steps),
                              steps=want_steps, got=str(seen["losses"])[:120]))
            return
        # Diagnose with the wrong answers the classic mistakes give.
        _, w0, b0, vel = _sgd_linear(case["kernel"], case["bias"], batches[:resume], case["lr"], case["momentum"])
        _, nw, nb, _ = _sgd_linear(w0, b0, batches[resume:], case["lr"], case["momentum"])  # momentum lost
        _, dw, db, _ = _sgd_linear(w0, b0, later[:steps - resume], case["lr"], case["momentum"], vel)  # no skip

        def close(pair):
            return max(float(np.abs(g - r).max()) for g, r in zip(got_w, pair)) <= 1e-3

        if close((nw, nb)):
            hint = tr("The optimizer's momentum was not restored: put the optimizer in the checkpoint "
                      "(tf.train.Checkpoint(model=model, optimizer=optimizer, step=...)).")
        elif close((dw, db)):
            hint = tr("After resuming at step {step} the run trained on the first batches again: skip the "
                      "{resume} batches already trained on (dataset.skip(...)).", step=resume + 1, resume=resume)
        else:
            hint = tr("Checkpoint model, optimizer and step counter together, restore all three, and skip the "
                      "batches already seen.")
        raise Fail(tr("after the restart {where} the final weights differ from an uninterrupted run of {steps} "
                      "steps (on the restart's own data after step {resume}) by up to {diff:.2g}. {hint}",
                      where=where, steps=steps, resume=resume,
                      diff=max(float(np.abs(g - r).max()) for g, r in zip(got_w, (w, b))), hint=hint))
