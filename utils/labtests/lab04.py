"""Lab 04 (MirroredStrategy and multi-worker): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (random sizes, random data, random
initial weights, random ports), ``observe`` runs the learner's function in the
learner's kernel under strategies over different device subsets and returns
plain data (batches, losses, weights, strings), and ``judge`` computes the
expected answer on the grader's side: batch arithmetic, sharding, and the
reference training (one device, in NumPy) of q3 and q5, including the wrong
answers the classic mistakes would give, so the message can name the mistake.

q2 feeds global batches that do not divide by the replica count, through several input pipelines, and
compares each step with the global batch one device would train on. q3's model has two heads, an auxiliary
loss averaged over the labelled examples only and L2 penalties, on batches split unevenly (one replica
empty), so only divisors summed over the replicas pass. q5 announces a preemption after one step, kills the
training run a step or more later, restarts it on fresh weights and other data, and compares the final
weights and the whole loss history with an uninterrupted run. Under the grader the first run is a
real process (``ns.fresh_process()``: the submission's cells run again in a
second kernel) killed with SIGKILL from ``on_step``, which runs in the grader, as does ``preempted``,
so only what it saved on disk survives; ``check()`` simulates the kill with an
exception from ``on_step`` that ``except Exception`` cannot catch.
This file is what each item draws and runs, and the code the graded kernel gets (the ``@in_kernel``
functions and what they use). Each item's verdict is in :mod:`gpucourse.labtests._lab04_judges`, and the
reference training and batch arithmetic it compares with in :mod:`gpucourse.labtests._lab04_reference`: both run
only on the grader's side (the kernel's copy of the course has no ``labtests``).
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

from gpucourse.grading.items import Fail, ItemTimeout, in_kernel, item, outcome, tr
from gpucourse.labtests._lab04_judges import judge_q1, judge_q2, judge_q3, judge_q4, judge_q5, progress_text

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


@in_kernel
def _q1_observe(ns, case):
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


@item("q1", points=2, title="global_batch(strategy, per_replica) uses the strategy's replica count")
class q1:
    def cases(rng):
        return [{"per": rng.randint(3, 70)} for _ in range(3)] + [{"bad": b} for b in (0, -rng.randint(1, 9))]

    def observe(ns, case):
        return ns.kernel(_q1_observe, case)

    judge = judge_q1


# --------------------------------------------------------------------------- q2


def _raised(exc) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


@in_kernel
def _q2_observe(ns, case):
    import numpy as np
    import tensorflow as tf

    make = ns.function("make_dataset_fn")
    if case.get("through_strategy"):
        strategy = _all_devices_strategy()
        reps = int(strategy.num_replicas_in_sync)
        gbs = case["per"] * reps + 1  # not a multiple of the replica count (unless there is one replica)
        x = np.arange(gbs * case["rows"], dtype="float32").reshape(-1, 1)
        try:
            first = next(iter(strategy.distribute_datasets_from_function(make(x, 3.0 * x, gbs))))
        except NotImplementedError:
            raise
        except Exception as exc:  # the judge names the classic one: get_per_replica_batch_size
            return {"raised": _raised(exc), "replicas": reps, "gbs": gbs, "pipelines": 1}
        return {"replicas": reps, "gbs": gbs, "parts": [p.numpy().ravel().tolist()
                                                        for p in strategy.experimental_local_results(first[0])]}
    n, pipelines, replicas, gbs = case["n"], case["pipelines"], case["replicas"], case["gbs"]
    x = np.arange(n, dtype="float32").reshape(n, 1) + np.float32(case["offset"])
    fn = make(x, 3.0 * x, gbs)
    limit = (replicas // pipelines) * (-(-n // gbs) + 2) + n  # batches of a finite answer, with room to spare
    pipes = []
    for pid in range(pipelines):
        ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pid,
                                         num_replicas_in_sync=replicas)
        try:
            ds = fn(ctx)
            if not isinstance(ds, tf.data.Dataset):
                return {"type": type(ds).__name__}
            batches, endless = [], False
            for i, (xb, yb) in enumerate(ds):
                if i >= limit:
                    endless = True
                    break
                batches.append({"x": xb.numpy().ravel().tolist(), "y": yb.numpy().ravel().tolist()})
        except NotImplementedError:
            raise
        except Exception as exc:
            return {"raised": _raised(exc), "replicas": replicas, "gbs": gbs, "pipelines": pipelines}
        pipes.append({"batches": [] if endless else batches, "endless": endless})
        if endless:
            break
    return {"type": "Dataset", "pipelines": pipes}


@item("q2", points=3, title="make_dataset_fn: each step gets one device's global batch, split over the replicas")
class q2:
    def cases(rng):
        out = []
        # (pipelines, replicas, remainder of the global batch over the replicas): 0 is the tutorial's even case
        for pipelines, replicas, uneven in ((2, 4, True), (1, 2, True), (3, 3, False)):
            per = rng.randint(2, 4)
            # 1 or 2 more than a multiple: TensorFlow's own split (ceil(B / R) each until it runs out) differs
            gbs = per * replicas + (rng.randint(1, max(1, replicas - 2)) if uneven else 0)
            n = gbs * rng.randint(1, 2) + rng.randint(1, gbs - 1)  # a last, partial global batch
            out.append({"pipelines": pipelines, "replicas": replicas, "gbs": gbs, "n": n,
                        "offset": rng.randint(0, 1000)})
        return out + [{"through_strategy": True, "per": 2, "rows": 3}]

    def observe(ns, case):
        return ns.kernel(_q2_observe, case)

    judge = judge_q2


# --------------------------------------------------------------------------- q3


def _two_head_model(strategy, case):
    """The check's model, under the strategy: two Dense heads on the input ("main", "aux"), each kernel with an
    L2 penalty, so that ``model.losses`` holds two regularisation losses."""
    import keras
    import numpy as np

    with strategy.scope():
        inputs = keras.Input((len(case["x"][0]),))
        heads = [keras.layers.Dense(len(case[key][0]), kernel_regularizer=keras.regularizers.L2(case["l2"]),
                                    name=name)(inputs) for key, name in (("y_main", "main"), ("y_aux", "aux"))]
        model = keras.Model(inputs, heads)
    model.set_weights([np.array(w, "float32") for w in case["weights"]])
    return model


@in_kernel
def _q3_observe(ns, case):
    import keras
    import numpy as np
    import tensorflow as tf

    make = ns.function("make_train_step")
    strategy = _all_devices_strategy()
    n = int(strategy.num_replicas_in_sync)
    if n < 2:
        raise Fail(tr("this check needs at least 2 devices: run the setup cell at the top of the lab first"))
    model = _two_head_model(strategy, case)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(case["lr"])
    step = make(strategy, model, optimizer, case["aux"])
    data = tf.data.Dataset.from_tensor_slices(tuple(np.array(case[k], "float32")
                                                    for k in ("x", "y_main", "y_aux", "has_aux")))
    batches = iter(strategy.experimental_distribute_dataset(data.batch(case["gbs"])))
    steps = []
    for batch in batches:
        got = step(batch)
        try:
            loss = float(got)
        except (TypeError, ValueError):
            return {"replicas": n, "steps": steps, "unreduced": f"{type(got).__name__}: {str(got)[:120]}"}
        steps.append({"loss": loss, "weights": [w.tolist() for w in model.get_weights()]})
    return {"replicas": n, "steps": steps}


@item("q3", points=3, title="make_train_step: two heads, a partly labelled auxiliary loss and L2, as on one device")
class q3:
    def cases(rng):
        # 5 examples per step: split unevenly over 2, 3, 4 or 8 replicas, and 4 or more leave one with nothing
        # (TensorFlow fills replicas in order: 2, 2, 1, 0 over 4). Two steps of the same size: one trace.
        gbs, steps = 5, 2
        feats, outs_main, outs_aux = rng.randint(3, 5), rng.randint(1, 2), rng.randint(1, 2)
        has = [1.0 if rng.random() < 0.6 else 0.0 for _ in range(gbs * steps)]
        for s in range(steps):
            has[s * gbs] = 1.0  # every step has a labelled example
            has[s * gbs + 4] = 0.0  # the replica that holds the step's fifth example alone (4 replicas) has none
        weights = [_matrix(rng, feats, outs_main, 0.5), [round(rng.gauss(0, 0.1), 4) for _ in range(outs_main)],
                   _matrix(rng, feats, outs_aux, 0.5), [round(rng.gauss(0, 0.1), 4) for _ in range(outs_aux)]]
        return [{"gbs": gbs, "lr": 0.2, "l2": round(rng.uniform(0.05, 0.2), 3), "aux": round(rng.uniform(0.3, 3), 2),
                 "x": _matrix(rng, gbs * steps, feats), "y_main": _matrix(rng, gbs * steps, outs_main),
                 "y_aux": _matrix(rng, gbs * steps, outs_aux), "has_aux": has, "weights": weights}]

    def observe(ns, case):
        return ns.kernel(_q3_observe, case)

    judge = judge_q3


# --------------------------------------------------------------------------- q4


@in_kernel
def _q4_observe(ns, case):
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
        return ns.kernel(_q4_observe, case)

    judge = judge_q4


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


@in_kernel
def _q5_refuse_a_stub(ns) -> None:
    """Raise NotImplementedError, as calling it would, when ``train_resumable`` is still the lab's stub: a body
    that only raises NotImplementedError. A call could do nothing else, so the verdict is the same ('not
    attempted'), without the killed first run's fresh process (about 5 s for every untouched lab)."""
    import dis

    code = ns.function("train_resumable").__code__
    ops = {i.opname for i in dis.get_instructions(code)}
    only_raises = ops <= {"RESUME", "NOP", "CACHE", "LOAD_GLOBAL", "LOAD_CONST", "PUSH_NULL", "PRECALL", "CALL",
                          "CALL_FUNCTION", "RAISE_VARARGS"}
    if only_raises and "RAISE_VARARGS" in ops and set(code.co_names) == {"NotImplementedError"}:
        raise NotImplementedError("train_resumable is still the stub")


@in_kernel
def _q5_folder(ns):
    """A new checkpoint folder that the graded kernel, its fresh process and the check all see: under the
    grader, the kernel's working folder (its scratch folder, shared like a job's disk); in check(), a
    temporary folder."""
    import os
    import tempfile

    return tempfile.mkdtemp(prefix="gpucourse-lab04-", dir=os.getcwd() if os.environ.get("GPUCOURSE_GRADING") else None)


@in_kernel
def _q5_launch(ns, case, folder, preempted, on_step, restart):
    """One launch of q5's training: the first (on the case's weights and targets) or the restart (other initial
    weights, other targets after the checkpoint). Returns the losses and the final weights."""
    from gpucourse import distribute

    fn = ns.function("train_resumable")
    strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])
    model, optimizer, step_fn, data = (_fresh_run(strategy, case, case["fresh_kernel"], case["bias"], "y_restart")
                                       if restart else _fresh_run(strategy, case, case["kernel"], case["bias"]))
    losses = fn(strategy, model, optimizer, step_fn, data, case["steps"], folder, case["save_every"], preempted,
                on_step)
    return {"losses": losses, "weights": [w.tolist() for w in model.get_weights()]}


def _first_run_killed(ns, case, folder, note, preempted) -> dict:
    """The grader's first run: a fresh process that runs the submission's cells again, killed with SIGKILL from
    ``on_step`` (which runs here, in the grader) the moment the run reports step ``crash_at``."""
    from gpucourse.grading.items import KernelLost, ProcessKilled, RaisedInKernel

    try:
        with ns.fresh_process() as first:
            def on_step(k):
                note(k)
                if k == case["crash_at"]:
                    first.kill()

            first.kernel(_q5_launch, case, folder, preempted, on_step, False)
            return {"first": "finished", "first_error": ""}
    except ProcessKilled:
        return {"first": "killed", "first_error": ""}
    except RaisedInKernel as exc:
        if exc.type_name == "NotDefined":
            return {"first": "missing", "first_error": ""}
        return {"first": "raised", "first_error": f"{exc.type_name}: {exc}"[:300]}
    except KernelLost as exc:
        return {"first": "died", "first_error": str(exc)[:300]}


@in_kernel
def _first_run_simulated(ns, case, folder, note, preempted) -> dict:
    """check()'s first run, in this kernel: on_step raises after ``crash_at`` (a BaseException). ``note(k)`` tells
    the check each step."""
    import numpy as np

    from gpucourse import distribute

    fn = ns.function("train_resumable")
    strategy = distribute.mirrored_strategy(distribute.strategy_devices()[:2])  # 2 replicas are enough here
    model, optimizer, step_fn, data = _fresh_run(strategy, case, case["kernel"], case["bias"])
    at_kill = []

    def fail_after(k):
        note(k)
        if k == case["crash_at"]:
            at_kill.extend(v.numpy().copy() for v in model.variables + optimizer.variables)
            raise _WorkerKilled(f"simulated failure after step {k}")

    try:
        fn(strategy, model, optimizer, step_fn, data, case["steps"], folder, case["save_every"], preempted,
           fail_after)
        first = "finished"
    except _WorkerKilled:
        first = "killed"
    if first == "killed" and at_kill and any(not np.array_equal(a, v.numpy()) for a, v in
                                             zip(at_kill, model.variables + optimizer.variables)):
        first = "went on"  # a dead worker trains no further
    return {"first": first, "first_error": ""}


#: What the restart's launch reads of the case (``_q5_launch`` with ``restart=True``, ``_fresh_run``).
_RESTART_KEYS = ("steps", "save_every", "gbs", "lr", "momentum", "x", "y_restart", "fresh_kernel", "bias")


@item("q5", points=3, title="train_resumable: checkpoint when due or preempted, resume with the whole loss history")
class q5:
    def cases(rng):
        every, steps = rng.choice([3, 4]), rng.randint(9, 10)
        # The platform's notice comes after a step that is not due (at least one periodic checkpoint before it),
        # and the kill a step or more later, before the next due step: so the notice's checkpoint is the latest,
        # and the steps between it and the kill are trained twice.
        options = [(notice, kill) for notice in range(every + 1, steps) if notice % every
                   for kill in range(notice + 1, steps) if all(k % every for k in range(notice, kill + 1))]
        notice, kill = rng.choice(options)
        feats, outs, gbs = rng.randint(2, 4), rng.randint(1, 2), rng.choice([8, 12])
        return [{"steps": steps, "save_every": every, "notice_at": notice, "crash_at": kill, "gbs": gbs, "lr": 0.05,
                 "momentum": 0.9, "x": _matrix(rng, steps * gbs, feats), "y": _matrix(rng, steps * gbs, outs),
                 "kernel": _matrix(rng, feats, outs, 0.5), "bias": [0.0] * outs,
                 "fresh_kernel": _matrix(rng, feats, outs, 0.5),
                 # the restart's data: other targets, so only a restart that trains (from what was saved on
                 # disk) ends at the right weights, not one that replays a run kept in memory
                 "y_restart": _matrix(rng, steps * gbs, outs)}]

    def observe(ns, case):
        import shutil
        import time

        ns.function("train_resumable")  # not defined yet: not attempted
        ns.kernel(_q5_refuse_a_stub)  # still the stub: not attempted, without a fresh process
        folder = ns.kernel(_q5_folder)
        progress: dict = {"first": [], "folders": [], "asked": []}

        def note_first(k):  # runs here, where the check runs: what is on disk when on_step(k) is called
            progress["first"].append(k)
            progress["at"] = time.monotonic()
            progress["folders"].append(_folder_state(folder))

        def preempted(k):  # the platform's notice, after step notice_at of the first run only
            progress["asked"].append(k)
            return k == case["notice_at"]

        def never(k):
            return False

        def note_second(k):
            progress["second"].append(k)
            progress["at"] = time.monotonic()

        try:
            if ns.fresh_process is not None:  # the grader: a real process, killed with SIGKILL
                first = _first_run_killed(ns, case, folder, note_first, preempted)
            else:  # check(): the kill simulated in this kernel
                first = ns.kernel(_first_run_simulated, case, folder, note_first, preempted)
            # The restart: a new process would build everything again, from *other* initial weights, and here
            # the data after the checkpoint differs too. It gets only what it needs: not the first run's initial
            # weights or targets, which a restart that replays instead of restoring would use.
            progress["second"] = []
            end = ns.kernel(_q5_launch, {k: case[k] for k in _RESTART_KEYS}, folder, never, note_second, True)
            return {**first, "first_steps": progress["first"], "first_folders": progress["folders"],
                    "asked": progress["asked"], "second_steps": progress["second"], "losses": end["losses"],
                    "weights": end["weights"]}
        except ItemTimeout:  # say how far the runs got: a busy machine is not an endless loop
            raise ItemTimeout(progress_text(case, progress)) from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    judge = judge_q5
