"""Lab 03's judges: from a case and what the observer saw, pass, or a Fail that names the learner's mistake.

``judge_qN`` is the ``judge`` of item qN of :mod:`gpucourse.labtests.lab03`, where its cases are drawn and
observed. It runs on the grader's side (and in the learner's own ``check()``), never in the graded kernel, and
compares with :mod:`gpucourse.labtests._lab03_reference`. Every message goes through ``tr`` (the zh_CN catalogue,
``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from ..grading.items import Fail, expect_raised, tr
from ._lab03_reference import (MiB, RESET_SLACK, allowed_cost, largest, need, nbytes, q6_candidates, q6_close,
                               q6_window, reference_sgd)

__all__ = ["judge_q1", "judge_q2", "judge_q3", "judge_q4", "judge_q5", "judge_q6"]


# --------------------------------------------------------------------------- q1


def judge_q1(case, seen, build_model, build_optimizer):
    """``build_model``/``build_optimizer``: lab03's builders, the ones the kernel used."""
    model = build_model(case["model"])
    weights, grads = nbytes(model.weights), nbytes(model.trainable_weights)
    frozen = weights - grads
    dtype = case["model"]["dtype"]
    shapes = [tuple(w.shape) for w in model.weights]
    for opt, res in zip(case["optimizers"], seen["results"]):
        got, label = res["got"], opt["label"]
        if res["type"] not in ("int", "int64", "int32"):
            raise Fail(tr("training_state_bytes should return a whole number of bytes (int), got {got} "
                          "({kind}) for keras.optimizers.{label}", got=repr(got), kind=res["type"], label=label))
        optimizer = build_optimizer(opt)
        optimizer.build(model.trainable_variables)
        state = [v for v in optimizer.variables if len(v.shape)]
        scalars = [v for v in optimizer.variables if not len(v.shape)]
        accumulators = [v for v in state if "gradient_accumulator" in v.path]
        slots = nbytes(state)
        want = weights + grads + slots
        if got == want:
            continue
        where = tr("for a {dtype} model with weights {shapes} ({weights} bytes, {grads} of them trainable) and "
                   "keras.optimizers.{label}", dtype=dtype, shapes=shapes, weights=weights, grads=grads,
                   label=label)
        if got == want - grads and accumulators:  # an accumulator has exactly the gradients' size
            hint = tr("You left out the gradients (one per trainable weight) or the gradient accumulator (with "
                      "gradient_accumulation_steps the optimizer keeps one more parameter-sized variable per "
                      "trainable weight): they take the same bytes.")
        elif got == want - grads:
            hint = tr("You left out the gradients: every trainable weight gets one, of the same size.")
        elif frozen and got == want - frozen:
            hint = tr("You left out the non-trainable weights (BatchNormalization's moving mean and variance): "
                      "count all of model.weights, and gradients for model.trainable_weights only.")
        elif frozen and got == want + frozen:
            hint = tr("Only trainable weights get gradients: count them over model.trainable_weights, not "
                      "model.weights.")
        elif scalars and got == want + nbytes(scalars):
            hint = tr("You counted the optimizer's scalar variables (iteration counter, learning rate): count "
                      "only its per-parameter state, the variables with a shape.")
        elif dtype != "float32" and got == nbytes(model.weights, 4) + nbytes(model.trainable_weights, 4) \
                + nbytes(state, 4):
            hint = tr("You assumed 4 bytes per value; these weights are {dtype}: use each variable's dtype "
                      "(np.dtype(v.dtype).itemsize).", dtype=dtype)
        else:
            hint = tr("Expected {weights} (weights) + {grads} (gradients) + {slots} (optimizer state) bytes; "
                      "build a copy of the optimizer on the trainable weights and look at its variables.",
                      weights=weights, grads=grads, slots=slots)
        raise Fail(tr("{where}: expected {want} bytes, got {got}. {hint}", where=where, want=want, got=got,
                      hint=hint))


# --------------------------------------------------------------------------- q2


def judge_q2(case, seen):
    mx, budget, calls = case["max_batch"], case["budget"], seen["calls"]
    formula = (f"peak_bytes(n) = {case['fixed']} + {case['per']}*n"
               + (f" + {case['quad']}*n^2" if case["quad"] else "")
               + (" (activations counted from 256 KiB on)" if case["hidden"] else "")
               + ", rounded up to 256 bytes")
    desc = tr("{formula}, budget {budget}, max_batch {max_batch}", formula=formula, budget=budget, max_batch=mx)
    res, want = seen["result"], largest(case)
    spent, allowed = sum(calls), allowed_cost(want)
    no_number = tr(" Here every batch over the budget runs out of memory, so no measurement above the budget "
                   "has a number to interpolate with: aim from below, along the line through the two largest "
                   "batches you measured to fit.") if case["capacity"] == budget else ""
    if seen["bad"]:
        raise Fail(tr("for {desc}: you called peak_bytes({arg}); a batch size is a whole number from 1 to "
                      "max_batch (with //, not /)", desc=desc, arg=seen["bad"][0]))
    if seen["stopped"]:
        raise Fail(tr("for {desc}: the check stopped your search after {count} measurements of {spent} "
                      "examples in all; at most {allowed} (8 x the answer + 64) are allowed. Each measurement "
                      "tells you how many bytes a batch needs: use them to aim at the budget.", desc=desc,
                      count=len(calls), spent=spent, allowed=allowed) + no_number)
    if res.get("raised") == "ResourceExhaustedError":
        raise Fail(tr("for {desc}: peak_bytes raised ResourceExhaustedError ({message}) and your "
                      "function let it escape: catch tf.errors.ResourceExhaustedError and treat that batch as "
                      "'does not fit'", desc=desc, message=res["message"][:80]))
    if want is None:
        return expect_raised(res, tr("for {desc}, largest_batch", desc=desc),
                             "not even a batch of 1 fits the budget")
    if "raised" in res:
        values = [need(case, n) for n in calls]
        flat = tr(" peak_bytes gave {value} bytes for every batch you measured ({sizes}): at small batches the "
                  "counters may not grow at all (a CPU leaves out tensors under 256 KiB), so try a larger batch "
                  "before you take a slope.", value=values[0], sizes=calls) \
            if len(calls) > 1 and len(set(values)) == 1 else ""
        raise Fail(tr("for {desc}: your function raised {raised}: {message}", desc=desc, raised=res["raised"],
                      message=res["message"]) + flat)
    got = res["value"]
    if seen["type"] not in ("int", "int64", "int32"):
        raise Fail(tr("for {desc}: largest_batch should return a whole number (int), got {got}", desc=desc,
                      got=repr(got)))
    if got > mx:
        raise Fail(tr("for {desc}: returned {got}, more than max_batch={max_batch}; the answer is at most "
                      "max_batch", desc=desc, got=got, max_batch=mx))
    unmeasured = [n for n in ([got] if got == mx else [got, got + 1]) if n not in calls]
    if unmeasured:
        raise Fail(tr("for {desc}: you returned {got} without measuring peak_bytes({n}). A prediction is not a "
                      "measurement (the bytes are not exactly on a line): return a batch you measured to fit, "
                      "and measure the next size up too (unless it is max_batch) to know it does not.",
                      desc=desc, got=got, n=unmeasured[0]))
    if got != want:
        hint = ""
        if got == want - 1 and need(case, want) == budget:
            hint = tr(" peak_bytes({want}) is exactly the budget, and a peak equal to the budget fits: "
                      "compare with <=, not <.", want=want)
        raise Fail(tr("for {desc}: expected {want}, got {got}.{hint}", desc=desc, want=want, got=got, hint=hint))
    if spent > allowed:
        raise Fail(tr("for {desc}: found {got}, but your {count} measurements cost {spent} examples (a step on n "
                      "examples costs n); at most {allowed} (8 x the answer + 64) are allowed. Bisection spends "
                      "about the answer on each of about log2(answer) steps: use the bytes each measurement "
                      "returned to aim at the budget.", desc=desc, got=got, count=len(calls), spent=spent,
                      allowed=allowed) + no_number)


# --------------------------------------------------------------------------- q3


def judge_q3(case, seen):
    eff, mx, res = case["effective"], case["max"], seen["result"]
    call = f"accumulation_plan({eff}, {mx})"
    if case.get("bad"):
        return expect_raised(res, call, "batch sizes must be >= 1")
    if "raised" in res:
        raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=res["raised"], message=res["message"]))
    got, kinds = res["value"], seen["kinds"]
    if kinds is None or len(kinds) != 2 or any(k not in ("int", "int64", "int32") for k in kinds):
        raise Fail(tr("accumulation_plan should return a tuple (micro_batch, steps) of two ints, got {got}",
                      got=repr(got)))
    micro, steps = got
    want_steps = next(s for s in range(1, eff + 1) if eff % s == 0 and eff // s <= mx)
    want = [eff // want_steps, want_steps]
    if got == want:
        return
    if [steps, micro] == want:  # either swapped, or a valid plan with too many steps: say both
        raise Fail(tr("{call} returned {got}. If you meant (steps, micro_batch), return (micro_batch, "
                      "steps) instead. Read as (micro_batch, steps), it takes {steps} steps where {want_steps} "
                      "step(s) of {want_micro} also add up and fit: fewer steps means fewer, larger micro-batches.",
                      call=call, got=tuple(got), steps=steps, want_steps=want[1], want_micro=want[0]))
    if micro * steps != eff:
        raise Fail(tr("{call} returned micro_batch={micro}, steps={steps}: {micro} x {steps} = {product}, "
                      "not the effective batch {eff}; the micro-batch must divide it exactly", call=call,
                      micro=micro, steps=steps, product=micro * steps, eff=eff))
    if micro > mx:
        raise Fail(tr("{call} returned micro_batch={micro}, more than max_batch={max_batch}: accumulate over "
                      "several smaller micro-batches", call=call, micro=micro, max_batch=mx))
    raise Fail(tr("{call} returned {steps} steps; {want_steps} step(s) of {want_micro} also add up and fit, "
                  "and fewer steps means fewer, larger micro-batches", call=call, steps=steps,
                  want_steps=want_steps, want_micro=eff // want_steps))


# --------------------------------------------------------------------------- q4


def _why_weights_differ(case, seen) -> str:
    """The mistake behind wrong weights, from what the model and its optimizer say about the training."""
    import numpy as np

    optimizer, lr, momentum = seen.get("optimizer"), seen.get("lr"), seen.get("momentum")
    if optimizer != "SGD":
        return tr("Your model.optimizer is {optimizer}: the check compares with plain SGD, whose update is the "
                  "learning rate times the averaged gradient. Compile with keras.optimizers.SGD(learning_rate, "
                  "gradient_accumulation_steps=...).", optimizer=optimizer)
    if momentum:
        return tr("The SGD has momentum={momentum:g}: plain SGD has none (leave momentum at 0).", momentum=momentum)
    if lr is not None and not math.isclose(lr, case["lr"], rel_tol=1e-5):
        return tr("The optimizer's learning rate is {got:g}, not the learning_rate={lr} you were given. Keras "
                  "averages the accumulated gradients (it does not add them up), so the learning rate needs no "
                  "scaling.", got=lr, lr=case["lr"])
    if seen.get("loss") not in _MSE:
        return tr("The model is compiled with the loss {loss}: use loss='mse' (mean squared error, averaged over "
                  "the batch).", loss=seen.get("loss"))
    if seen.get("first") is not None and not np.isclose(seen["first"], case["x"][0][0], atol=1e-6):
        return tr("The first training batch did not start with the first example: model.fit shuffles by default. "
                  "Pass shuffle=False, so that the batches come in order.")
    return tr("Train in order (shuffle=False) with plain SGD and loss 'mse'.")


_MSE = ("mse", "mean_squared_error", "meansquarederror", "MSE", "MeanSquaredError")


def judge_q4(case, seen):
    import numpy as np

    micro, eff, lr = case["micro"], case["effective"], case["lr"]
    if case.get("bad"):
        call = f"train_with_accumulation(..., micro_batch={micro}, effective_batch={eff}, ...)"
        why = tr("{micro} does not divide {eff}", micro=micro, eff=eff)
        if "raised" not in seen["result"] and seen.get("returned_model"):
            raise Fail(tr("{call} should raise ValueError ({why}), but it trained the model and returned it. "
                          "Check the batch sizes before you compile or train.", call=call, why=why))
        return expect_raised(seen["result"], call, why)
    if not seen["returned_model"]:
        raise Fail(tr("train_with_accumulation should return the model it was given, trained"))
    steps, n = eff // micro, len(case["x"])
    w, b = np.array(seen["w"], "float64"), np.array(seen["b"], "float64")
    want_w, want_b = reference_sgd(case["w0"], case["b0"], case["x"], case["y"], lr, eff)
    err = float(max(np.abs(w - want_w).max(), np.abs(b - want_b).max()))
    if err > 1e-4:
        per_micro, _ = reference_sgd(case["w0"], case["b0"], case["x"], case["y"], lr, micro)
        if steps > 1 and np.abs(w - per_micro).max() < 1e-4:
            raise Fail(tr("with micro_batch={micro} and effective_batch={eff}, your weights match one SGD "
                          "update per micro-batch: the gradients were not accumulated. Give the optimizer "
                          "gradient_accumulation_steps={steps}.", micro=micro, eff=eff, steps=steps))
        where = tr("on {n} random examples with micro_batch={micro}, effective_batch={eff}, learning_rate={lr}: "
                   "the weights differ from {updates} SGD steps with batch {eff} by {err:.3g} (allowed 1e-4).",
                   n=n, micro=micro, eff=eff, lr=lr, updates=n // eff, err=err)
        raise Fail(where + " " + _why_weights_differ(case, seen))
    passes, biggest, smallest = seen.get("passes") or [0, 0, 0]
    if passes != n // micro or biggest != micro or smallest != micro or seen.get("iterations") != n // eff:
        raise Fail(tr("the weights are right, but the training was not {want_passes} passes on micro-batches of "
                      "{micro} and {updates} optimizer updates: the model saw {passes} training pass(es) of "
                      "{smallest} to {biggest} rows and its optimizer made {iterations} update(s). "
                      "Compile the model with keras.optimizers.SGD(learning_rate, gradient_accumulation_steps="
                      "{acc}) and train it on batches of {micro} (not on big batches, nor with another optimizer "
                      "that you replace afterwards).", want_passes=n // micro, micro=micro, updates=n // eff,
                      passes=passes, smallest=smallest, biggest=biggest, iterations=seen.get("iterations"),
                      acc=steps if steps > 1 else None))
    want_acc = steps if steps > 1 else None
    if seen["optimizer"] != "SGD" or seen["accumulation"] != want_acc:
        raise Fail(tr("the weights are right, but with micro_batch={micro} and effective_batch={eff} the model "
                      "should be compiled with keras.optimizers.SGD(learning_rate, gradient_accumulation_steps="
                      "{want_acc}) and trained on batches of {micro}; model.optimizer is {optimizer} with "
                      "gradient_accumulation_steps={accumulation}", micro=micro, eff=eff, want_acc=want_acc,
                      optimizer=seen["optimizer"], accumulation=seen["accumulation"]))


# --------------------------------------------------------------------------- q5


def judge_q5(case, seen):
    total, n, reserve = case["total"], case["n"], case["reserve"]
    call = f"virtual_gpus({total}, {n}, reserve_mib={reserve})"
    if case.get("bad"):
        return expect_raised(seen["result"], call, tr("there is not at least 1 MiB for each virtual GPU")
                             if n >= 1 else tr("n must be >= 1"))
    if "raised" in seen["result"]:
        raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=seen["result"]["raised"],
                      message=seen["result"]["message"]))
    value = seen["result"]["value"]
    items = value["items"]
    if items is None or not all(it["config"] for it in items):
        what = value["type"] if items is None else [it["type"] for it in items][:3]
        raise Fail(tr("{call} should return a list of tf.config.LogicalDeviceConfiguration (what "
                      "set_logical_device_configuration takes), got {what}", call=call, what=what))
    if len(items) != n:
        raise Fail(tr("{call} returned {count} configurations; it should return {n}, one per virtual GPU",
                      call=call, count=len(items), n=n))
    want = (total // MiB - reserve) // n
    limits = [it["limit"] for it in items]
    if all(it["limit_type"] in ("int", "int64") for it in items) and limits == [want] * n:
        return
    got = limits[0]
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        raise Fail(tr("{call}: memory_limit should be a whole number of MiB, got {got}", call=call, got=repr(got)))
    if got >= 100 * want * 1024:
        hint = tr("{got} is in bytes, but memory_limit takes MiB: TensorFlow would read it as {got} MiB, "
                  "which is no limit at all. Divide bytes by 2**20.", got=got)
    elif got <= 1:
        hint = tr("that is a fraction, but memory_limit is an absolute size in MiB: TensorFlow keeps whole MiB, "
                  "so this virtual GPU could hold nothing.")
    elif reserve and got == total // MiB // n:
        hint = tr("leave reserve_mib={reserve} MiB for the CUDA context and other processes before splitting.",
                  reserve=reserve)
    elif 1.04 < got / want < 1.06:
        hint = tr("that counts MB (10**6 bytes); memory_limit is in MiB (2**20 bytes).")
    elif not all(it["limit_type"] in ("int", "int64") for it in items) or got > want:
        hint = tr("round down to a whole number of MiB (//): the limits must add up to no more than the GPU "
                  "minus the reserve, and TensorFlow truncates a fraction of a MiB anyway.")
    else:
        hint = tr("every virtual GPU gets the same share: (total MiB - reserve_mib) // n.")
    raise Fail(tr("{call}: expected memory_limit={want} (MiB) for each of the {n} virtual GPUs, got {limits}. "
                  "{hint}", call=call, want=want, n=n, limits=limits, hint=hint))


# --------------------------------------------------------------------------- q6


def judge_q6(case, seen):
    device, batches, budget = seen["device"], case["batches"], case["budget"]
    call = f"batch_that_fits(step, {batches}, {budget}, {device!r})"
    if "unavailable" in seen:
        raise Fail(tr("TensorFlow keeps no memory statistics for {device} in this kernel ({error}), so nothing "
                      "can be measured: restart the kernel and run the setup cell first (before TensorFlow "
                      "starts, it turns on what keeps them).", device=device, error=seen["unavailable"]))
    res = seen["result"]
    if "raised" in res:
        raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=res["raised"],
                      message=res["message"]))
    value = res["value"]
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)):
        raise Fail(tr("{call} should return a tuple (peaks, best), peaks a list with one number per batch size; "
                      "got {got}", call=call, got=repr(value)[:200]))
    peaks, best = value
    if len(peaks) != len(batches) or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                             for p in peaks):
        raise Fail(tr("{call}: peaks should hold one number of bytes per batch size ({count}), in their order; "
                      "got {peaks}", call=call, count=len(batches), peaks=peaks))
    log = seen["log"]
    for n, got in zip(batches, peaks):
        _judge_peak(case, device, log, n, got, call)
    fitting = [n for n, p in zip(batches, peaks) if p <= budget]
    want = max(fitting) if fitting else None
    if best != want:
        raise Fail(tr("{call}: with your peaks {peaks} the batch sizes that fit {budget} bytes are {fitting}, so "
                      "best should be {want}, got {got}. The largest that fits, whatever the order of "
                      "batch_sizes (None if none fits).", call=call, peaks=peaks, budget=budget,
                      fitting=fitting, want=want, got=best))


def _judge_peak(case: dict, device: str, log: list, n: int, got, call: str) -> None:
    """Fail unless ``got`` is what the allocator saw during a measured call of step(n), and a peak this step can
    have; say which classic mistake it matches otherwise."""
    calls = [i for i, row in enumerate(log) if row[0] == n]
    lo, hi = q6_window(case, n, device)
    where = tr("{call}, batch size {n}", call=call, n=n)
    if not calls:
        raise Fail(tr("{where}: you never called step({n}), so {got} is not a measurement of it.", where=where, n=n,
                      got=got))
    candidates = q6_candidates(log, n, warmup=case["model"]["kind"] == "mlp")
    if any(q6_close(got, c) for c in candidates):
        if not lo <= got <= hi:  # the allocator's own numbers, outside what this step can need: not believable
            raise Fail(tr("{where}: {got} bytes is outside what this step can need ({lo} to {hi} bytes from its "
                          "shapes): the allocator's counters in this kernel do not look real.", where=where, got=got,
                          lo=lo, hi=hi))
        return
    measured = [log[i][4] - log[i][1] for i in calls]
    if not any(log[i][2] - log[i][1] <= RESET_SLACK for i in calls):
        hint = tr("the allocator's peak was not reset before any call of step({n}): get_memory_info's 'peak' is the "
                  "highest since the last reset, so it still held an earlier, larger step's peak. Call "
                  "reset_memory_stats before each measurement.", n=n)
    elif 0 in calls and case["model"]["kind"] == "mlp" and q6_close(got, log[0][4] - log[0][1]):
        hint = tr("you measured the step's first call, which also traces it and creates the optimizer's state. Call "
                  "step once before you measure.")
    elif any(q6_close(got, log[i][4]) for i in calls):
        hint = tr("that is the allocator's whole peak, with what was already in use before the call (the notebook's "
                  "other tensors, the model's weights): subtract get_memory_info's 'current' read just before the "
                  "call.")
    elif any(q6_close(got * 2**20, m) or q6_close(got * 10**6, m) or q6_close(got * 1024, m) for m in measured):
        hint = tr("peaks are in bytes: do not convert them to KiB, MiB or MB.")
    elif got < lo:
        hint = tr("that is less than this step needs: read 'peak' (the highest since the reset), not 'current' (what "
                  "is still allocated once the step is over)")
        if device != "CPU:0":
            hint += tr(", on the device the step runs on ({device})", device=device)
        hint += "."
    else:
        hint = tr("the allocator's peak during your calls of step({n}) rose by {measured} bytes.", n=n,
                  measured=measured)
    raise Fail(tr("{where}: got {got} bytes; {hint}", where=where, got=got, hint=hint))
