"""Lab 04's judges: from a case and what the observer saw, pass, or a Fail that names the learner's mistake.

``judge_qN`` is the ``judge`` of item qN of :mod:`gpucourse.labtests.lab04`, where its cases are drawn and
observed; :func:`progress_text` is what q5 tells the learner when its time runs out. They run on the grader's side
(and in the learner's own ``check()``), never in the graded kernel, and compare with
:mod:`gpucourse.labtests._lab04_reference`. Every message goes through ``tr`` (the zh_CN catalogue,
``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import json

from ..grading.items import Fail, expect_raised, tr
from ._lab04_reference import AUX, L2, MAIN, array_split, q2_steps, q3_reference, sgd_linear, tf_split

__all__ = ["judge_q1", "judge_q2", "judge_q3", "judge_q4", "judge_q5", "progress_text"]


# --------------------------------------------------------------------------- q1


def judge_q1(case, seen):
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


def _fail_raised(case, seen):
    reps, gbs = seen["replicas"], seen["gbs"]
    hint = ""
    if "divisible" in seen["raised"] or "multiple" in seen["raised"]:
        hint = " " + tr("ctx.get_per_replica_batch_size(global_batch_size) refuses a global batch that is not a "
                        "multiple of the replica count: no single per-replica size exists. Split each global "
                        "batch yourself, {sizes} here.", sizes=array_split(gbs, reps))
    raise Fail(tr("with {pipelines} input pipeline(s), {reps} replicas and global batch {gbs}, your dataset_fn "
                  "raised {raised}.{hint}", pipelines=seen["pipelines"], reps=reps, gbs=gbs, raised=seen["raised"],
                  hint=hint))


def _fail_uneven(setup, step, sizes, gbs, replicas):
    raise Fail(tr("{setup}: step {step} holds the right examples, but split {sizes} over the replicas; split it as "
                  "evenly as possible, as np.array_split does: {want} (the first {extra} replica(s) get one example "
                  "more).", setup=setup, step=step, sizes=sizes, want=array_split(gbs, replicas),
                  extra=gbs % replicas))


def judge_q2(case, seen):
    if "type" in seen and seen["type"] != "Dataset":
        raise Fail(tr("dataset_fn(ctx) should return a tf.data.Dataset, got {kind}", kind=seen["type"]))
    if "raised" in seen:
        _fail_raised(case, seen)
    if case.get("through_strategy"):
        reps, gbs = seen["replicas"], seen["gbs"]
        sizes = [len(p) for p in seen["parts"]]
        setup = tr("through strategy.distribute_datasets_from_function with {reps} replicas and global batch "
                   "{gbs}", reps=reps, gbs=gbs)
        if sorted(v for p in seen["parts"] for v in p) != list(range(gbs)):
            raise Fail(tr("{setup}, the first step should hold examples 0 to {last}, split {want}; the replicas "
                          "got {sizes} examples", setup=setup, last=gbs - 1, want=array_split(gbs, reps),
                          sizes=sizes))
        if sizes != array_split(gbs, reps):
            _fail_uneven(setup, 1, sizes, gbs, reps)
        return
    pipelines, replicas, gbs, n, offset = (case["pipelines"], case["replicas"], case["gbs"], case["n"],
                                           case["offset"])
    setup = tr("with {pipelines} input pipeline(s), {replicas} replicas, global batch {gbs} and {n} examples",
               pipelines=pipelines, replicas=replicas, gbs=gbs, n=n)
    pipes = seen["pipelines"]
    if any(pipe["endless"] for pipe in pipes):
        raise Fail(tr("the dataset seems endless: do not .repeat() it, the training loop decides how long "
                      "to run"))
    for pipe in pipes:
        for b in pipe["batches"]:
            if len(b["x"]) != len(b["y"]) or any(abs(yv - 3.0 * xv) > 1e-3 * max(1.0, abs(xv))
                                                 for xv, yv in zip(b["x"], b["y"])):
                raise Fail(tr("the x and y of a batch no longer belong together (y = 3x in this test); "
                              "shuffle, shard or split (x, y) pairs, not x and y separately"))
    every = sorted(v for pipe in pipes for b in pipe["batches"] for v in b["x"])
    want_all = [offset + i for i in range(n)]
    full = (n // gbs) * gbs  # the examples of the full global batches
    if every != want_all:
        missing = sorted(set(want_all) - set(every))
        if len(set(every)) == len(every) and set(every) < set(want_all) and min(missing) >= offset + full:
            raise Fail(tr("{setup}: the last, partial step should hold the last {rest} examples; {dropped} of "
                          "them were dropped. That is what batch(..., drop_remainder=True) does. Keep them "
                          "(leave drop_remainder at False): every example must be seen exactly once.",
                          setup=setup, rest=n - full, dropped=len(missing)))
        raise Fail(tr("{setup}: the pipelines together should yield each example exactly once; they yielded "
                      "{count} examples, {distinct} distinct. Each pipeline must yield only the parts of its "
                      "own replicas (ctx.num_input_pipelines, ctx.input_pipeline_id).", setup=setup,
                      count=len(every), distinct=len(set(every))))
    steps = q2_steps(case, pipes)
    for s, parts in enumerate(steps):
        first, last = s * gbs, min((s + 1) * gbs, n) - 1
        held = sorted(v for part in parts for v in part)
        sizes = [len(part) for part in parts]
        if held != [offset + i for i in range(first, last + 1)]:
            raise Fail(tr("{setup}: step {step} should hold examples {first} to {last} (the global batch one "
                          "device would train on at that step), split over the replicas as {want}; the "
                          "replicas got {sizes} examples, from {low} to {high}. The strategy gives pipeline p's "
                          "batches to its replicas in turn, so each pipeline yields, per step, one batch per "
                          "replica of its own.", setup=setup, step=s + 1, first=first, last=last,
                          want=array_split(last - first + 1, replicas), sizes=sizes,
                          low=(min(held) - offset) if held else "-", high=(max(held) - offset) if held else "-"))
        if last - first + 1 == gbs and sizes != array_split(gbs, replicas):
            _fail_uneven(setup, s + 1, sizes, gbs, replicas)


# --------------------------------------------------------------------------- q3


def _mistakes(case, weights, rows, replicas, got) -> list[str]:
    """Name the classic mistake(s) whose update the learner's weights match, head by head."""
    import numpy as np

    def close(a, b):
        return all(np.allclose(np.array(x, float), y, rtol=1e-3, atol=1e-4, equal_nan=True) for x, y in zip(a, b))

    for main in MAIN:
        for aux in AUX:
            for l2 in L2:
                _, want = q3_reference(case, weights, rows, replicas, main, aux, l2)
                if close(got, want):
                    hints = []
                    if main != "right":
                        hints.append(tr("The main loss was divided per replica by its own share of the examples: on "
                                        "an uneven split (or an empty replica) that weights examples unequally. "
                                        "Divide by the number of examples in the whole step."))
                    if aux == "examples":
                        hints.append(tr("The auxiliary loss was averaged over all examples; average it over the "
                                        "labelled ones only (has_aux == 1) in the whole step."))
                    elif aux != "right":
                        hints.append(tr("The auxiliary loss was averaged per replica; its divisor is the number of "
                                        "labelled examples in the whole step, which no replica knows alone: sum it "
                                        "over the replicas (tf.distribute.get_replica_context().all_reduce)."))
                    if l2 == "per_replica":
                        hints.append(tr("The regularisation loss was added on every replica, and the replicas' "
                                        "gradients are summed: it counted {n} times. Scale it with "
                                        "tf.nn.scale_regularization_loss.", n=replicas))
                    elif l2 == "missing":
                        hints.append(tr("The model's regularisation losses (model.losses) are missing from the "
                                        "loss."))
                    return hints
    return []


def judge_q3(case, seen):
    import numpy as np

    if "unreduced" in seen:
        raise Fail(tr("step(batch) should return the loss as a scalar (reduce the per-replica losses with "
                      "strategy.reduce), got {got}", got=seen["unreduced"]))
    replicas, gbs, weights = seen["replicas"], case["gbs"], case["weights"]
    for k, got in enumerate(seen["steps"]):
        rows = list(range(k * gbs, (k + 1) * gbs))
        want_loss, want = q3_reference(case, weights, rows, replicas)
        labelled = int(sum(case["has_aux"][i] for i in rows))
        where = tr("{n} replicas, step {k}: a global batch of {size} (split {split}), {labelled} labelled for "
                   "the auxiliary head", n=replicas, k=k + 1, size=len(rows), split=tf_split(len(rows), replicas),
                   labelled=labelled)
        diff = max(float(np.abs(np.array(a, float) - c).max()) for a, c in zip(got["weights"], want))
        if not np.isfinite(got["loss"]) or not np.isfinite(diff):
            raise Fail(tr("{where}: the loss or the weights became NaN. A replica that holds no labelled example "
                          "(or no example at all) divided 0 by 0: the divisors are counts over the whole step, "
                          "summed over the replicas.", where=where))
        if np.isclose(got["loss"], want_loss / replicas, rtol=1e-3) and diff <= 1e-3:
            raise Fail(tr("{where}: the loss should be {want:.6f}, got {got:.6f}, {n} times less: the replicas' "
                          "losses are parts of the step's loss, so reduce them with SUM, not MEAN.", where=where,
                          want=want_loss, got=got["loss"], n=replicas))
        if not np.isclose(got["loss"], want_loss, rtol=1e-3, atol=1e-6) or diff > 1e-3:
            hints = _mistakes(case, weights, rows, replicas, got["weights"])
            what = (tr("the loss is right but the weights after the update differ by up to {diff:.2g}",
                       diff=diff) if np.isclose(got["loss"], want_loss, rtol=1e-3, atol=1e-6)
                    else tr("the loss should be {want:.6f}, got {got:.6f}", want=want_loss, got=got["loss"]))
            raise Fail(tr("{where}: {what}. {hints}", where=where, what=what, hints=" ".join(hints) or tr(
                "The step's loss is the main head's squared error averaged over every example of the step, plus "
                "aux_weight times the auxiliary head's averaged over the labelled examples of the step, plus "
                "the model's regularisation losses once; its gradient must be the gradient of that loss.")))
        weights = want


# --------------------------------------------------------------------------- q4


def judge_q4(case, seen):
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


def progress_text(case, progress) -> str:
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


def judge_q5(case, seen):
    import numpy as np

    steps, every, notice, crash = case["steps"], case["save_every"], case["notice_at"], case["crash_at"]
    gbs = case["gbs"]
    batches = [(case["x"][k * gbs:(k + 1) * gbs], case["y"][k * gbs:(k + 1) * gbs]) for k in range(steps)]
    where = tr("(steps={steps}, save_every={every}, preempted({notice}) True, killed after step {crash})",
               steps=steps, every=every, notice=notice, crash=crash)
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
    if seen["first"] == "died":
        raise Fail(tr("the first run's process ended before the check killed it after step {crash} ({error})",
                      crash=crash, error=error))
    if seen["first"] != "killed" or seen["first_steps"] != list(range(1, crash + 1)):
        raise Fail(tr("the first run should call on_step(k) after each step k = 1, 2, ... and let what on_step "
                      "raises propagate; the check kills the run after step {crash}. on_step saw {saw} and the "
                      "run {ended}.", crash=crash, saw=seen["first_steps"][:12],
                      ended=tr("ended normally") if seen["first"] == "finished" else tr("was killed")))
    folders = seen.get("first_folders") or []

    def saved_at(k):  # the checkpoint folder changed between on_step(k - 1) and on_step(k)
        return len(folders) >= k and folders[k - 1] != folders[k - 2]

    for k in sorted(set(range(every, crash + 1, every)) | {notice}):  # due: its checkpoint is already on disk
        if len(folders) > k and not saved_at(k) and saved_at(k + 1):
            raise Fail(tr("when on_step({k}) was called, the checkpoint of step {k} was not on disk yet (the "
                          "checkpoint folder had not changed since on_step({prev})). Save first, then call "
                          "on_step(k): a worker killed right after on_step(k) would otherwise lose that "
                          "checkpoint.", k=k, prev=k - 1))
    want_steps = list(range(notice + 1, steps + 1))
    got_steps = seen["second_steps"]
    if got_steps != want_steps:
        start = got_steps[0] - 1 if got_steps and isinstance(got_steps[0], int) else None
        if start == (notice // every) * every and not saved_at(notice):
            hint = tr("preempted({notice}) was True, but no checkpoint was written after step {notice}: the "
                      "platform's notice is the last chance to save what the steps since step {start} "
                      "learned.", notice=notice, start=start)
            if notice not in seen.get("asked", []):
                hint += " " + tr("preempted(k) was never called for step {notice}: ask after every step.",
                                 notice=notice)
        elif start is not None and notice < start <= crash:
            hint = tr("A checkpoint was written after step {start}, which was not due: save every save_every "
                      "steps and after a step k for which preempted(k) is True, no more.", start=start)
        elif start == 0:
            hint = tr("Restore the latest checkpoint (model, optimizer, the step counter and the loss history) "
                      "before training.")
        else:
            hint = tr("Restore the LATEST checkpoint, and keep the step counter in it.")
        raise Fail(tr("after the restart {where} training should continue at step {step} (the latest "
                      "checkpoint is the one written after step {notice}, on the platform's notice) and call "
                      "on_step for steps {want}; it called it for {got}. {hint}", where=where, step=notice + 1,
                      notice=notice, want=want_steps, got=got_steps[:12], hint=hint))
    later = [(case["x"][k * gbs:(k + 1) * gbs], case["y_restart"][k * gbs:(k + 1) * gbs]) for k in range(steps)]
    trained = batches[:notice] + later[notice:]  # the restart trains on its own data
    ref_losses, w, b, _ = sgd_linear(case["kernel"], case["bias"], trained, case["lr"], case["momentum"])
    got_w = [np.array(a) for a in seen["weights"]]

    def close(pair):
        return max(float(np.abs(g - r).max()) for g, r in zip(got_w, pair)) <= 1e-3

    if close((w, b)):
        _judge_losses(case, seen["losses"], ref_losses)
        return
    # Diagnose with the wrong answers the classic mistakes give.
    _, w0, b0, vel = sgd_linear(case["kernel"], case["bias"], batches[:notice], case["lr"], case["momentum"])
    _, nw, nb, _ = sgd_linear(w0, b0, later[notice:], case["lr"], case["momentum"])  # momentum lost
    _, dw, db, _ = sgd_linear(w0, b0, later[:steps - notice], case["lr"], case["momentum"], vel)  # no skip
    if close((nw, nb)):
        hint = tr("The optimizer's momentum was not restored: put the optimizer in the checkpoint "
                  "(tf.train.Checkpoint(model=model, optimizer=optimizer, ...)).")
    elif close((dw, db)):
        hint = tr("After resuming at step {step} the run trained on the first batches again: skip the "
                  "{resume} batches already trained on (dataset.skip(...)).", step=notice + 1, resume=notice)
    else:
        hint = tr("Checkpoint model, optimizer and step counter together, restore all three, and skip the "
                  "batches already seen.")
    raise Fail(tr("after the restart {where} the final weights differ from an uninterrupted run of {steps} "
                  "steps (on the restart's own data after step {resume}) by up to {diff:.2g}. {hint}",
                  where=where, steps=steps, resume=notice,
                  diff=max(float(np.abs(g - r).max()) for g, r in zip(got_w, (w, b))), hint=hint))


def _judge_losses(case, got, want) -> None:
    """The returned history: the loss of every step whose update the final weights hold (steps 1..notice_at from
    the killed run, the rest from the restart), not the killed run's losses of the steps it trained in vain."""
    import numpy as np

    steps, notice, crash, gbs = case["steps"], case["notice_at"], case["crash_at"], case["gbs"]
    numbers = isinstance(got, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in got)
    if numbers and len(got) == steps and np.allclose(got, want, rtol=1e-3, atol=1e-6):
        return
    if numbers and len(got) == steps - notice and np.allclose(got, want[notice:], rtol=1e-3, atol=1e-6):
        raise Fail(tr("the final weights are right, but train_resumable returned only the losses of the steps this "
                      "call trained ({n} of them). Return the losses of all {steps} steps: the first {notice} were "
                      "trained by the killed run, and only what it saved on disk survived, so keep them with the "
                      "checkpoint.", n=len(got), steps=steps, notice=notice))
    if numbers and len(got) == steps and np.allclose(got[:notice], want[:notice], rtol=1e-3, atol=1e-6):
        batches = [(case["x"][k * gbs:(k + 1) * gbs], case["y"][k * gbs:(k + 1) * gbs]) for k in range(crash)]
        _, w0, b0, vel = sgd_linear(case["kernel"], case["bias"], batches[:notice], case["lr"], case["momentum"])
        stale, *_ = sgd_linear(w0, b0, batches[notice:], case["lr"], case["momentum"], vel)
        if np.allclose(got[notice:crash], stale, rtol=1e-3, atol=1e-6):
            raise Fail(tr("the final weights are right, but the losses you returned after step {notice}, up to step "
                          "{crash}, are those of the killed run, whose updates were lost with it (the restart trained those "
                          "steps again, from the checkpoint of step {notice}). Save the history together with the "
                          "checkpoint, so that both describe the same steps.", crash=crash, notice=notice))
    raise Fail(tr("the final weights are right, but train_resumable should return the losses of all {steps} steps "
                  "(a list of floats, step 1 first), as the run that produced these weights computed them; got "
                  "{got}", steps=steps, got=str(got)[:160]))
