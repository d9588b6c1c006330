"""Lab 05's judges: from a case and what the observer saw, pass, or a Fail that names the learner's mistake.

``judge_qN`` is the ``judge`` of item qN of :mod:`gpucourse.labtests.lab05`, where its cases are drawn and
observed. It runs on the grader's side (and in the learner's own ``check()``), never in the graded kernel, and
compares with :mod:`gpucourse.labtests._lab05_reference`. Every message goes through ``tr`` (the zh_CN catalogue,
``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from ..grading.items import Fail, expect_raised, tr
from ._lab05_reference import (FP16_MAX, as_vector, flatten, mistaken_rule, q1_forward, q3_candidates,
                               real_optimizer_trace, reference_grads, safe_scale, trajectory)

__all__ = ["judge_q1", "judge_q2", "judge_q3", "judge_q4", "judge_q5"]


def _number(value):
    """A float from a plain observation, or None if it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# --------------------------------------------------------------------------- q1


_COMPUTE = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


_DELICATE = {"UnitNormalization": "float32", "Activation": "float32"}


def judge_q1(case, seen):
    import numpy as np

    policy, before = case["policy"], case["before"]
    call = tr("{fn} with the global policy {before}", fn=f"to_mixed_precision(model, {policy!r})",
              before=repr(before))
    want, peak = q1_forward(case, case["x"])
    given = [["Dense", "float32", "float32"]] * (len(case["dense"]) - 1) + [
        ["UnitNormalization", "float32", "float32"], ["Dense", "float32", "float32"],
        ["Activation", "float32", "float32"]]
    if seen["same"]:
        raise Fail(tr("{call} returned the model it was given: its layers still compute in float32, since a "
                      "layer keeps the policy it was created with. Return a new model with new layers.",
                      call=call))
    if seen["after"] != before:
        raise Fail(tr("{call} left the global policy at {after}; it must restore {before}, or leave it alone "
                      "and give each new layer its dtype", call=call, after=repr(seen["after"]),
                      before=repr(before)))
    if not seen["is_model"]:
        raise Fail(tr("{call} should return a keras.Model, got a {kind}", call=call, kind=seen["type"]))
    changed = seen["given_layers"] != given or not np.allclose(seen["given_out"], want, atol=1e-4)
    if changed:
        raise Fail(tr("{call} changed the model it was given (its layers now: {layers}). Leave it as it is: "
                      "the float32 model stays in use (for evaluation, as a reference); build a new one.",
                      call=call, layers=seen["given_layers"]))
    layers = seen["layers"]
    if [kind for kind, _, _ in layers] != [kind for kind, _, _ in given]:
        raise Fail(tr("{call}: the new model should have the given model's layers, in order, {want}; it has "
                      "{got}", call=call, want=[k for k, _, _ in given], got=[k for k, _, _ in layers]))
    stored = [d for d in seen["weight_dtypes"] if d != "float32"]
    if stored:
        raise Fail(tr("{call}: every weight should be stored in float32, found {stored}. Use the 'mixed_...' "
                      "policy (float32 variables, 16-bit compute), not plain 'float16'/'bfloat16'", call=call,
                      stored=stored))
    got_w = seen["weights"]
    ref_w = [w for pair in case["dense"] for w in pair]
    if len(got_w) != len(ref_w) or any(np.shape(g) != np.shape(r) or not np.allclose(g, r, atol=1e-6)
                                       for g, r in zip(got_w, ref_w)):
        raise Fail(tr("{call}: the new model's weights differ from the given model's. A rebuilt layer starts "
                      "with new, random weights: copy the trained ones over (get_weights / set_weights).",
                      call=call))
    sixteen = _COMPUTE[policy]
    for (kind, compute, _), i in zip(layers, range(len(layers))):
        need = _DELICATE.get(kind, sixteen)
        if compute == need:
            continue
        if kind == "Dense":
            raise Fail(tr("{call}: the Dense layers should compute in {dtype}; layer {i} ({kind}) computes in "
                          "{got}. A layer's config carries its dtype, so a copy of a float32 layer computes in "
                          "float32 whatever the global policy says: give each new Dense layer the policy.",
                          call=call, dtype=sixteen, i=i + 1, kind=kind, got=compute))
        if kind == "UnitNormalization":
            raise Fail(tr("{call}: the UnitNormalization layer computes in {got}; keep it in float32. It sums "
                          "the squares of the activations: in float16 that sum overflows (above 65504) for "
                          "activations of a few hundred, and squares below about 6e-8 flush to zero, so an "
                          "example's vector becomes 0, inf or NaN; bfloat16 keeps the range but only 2 to 3 "
                          "digits.", call=call, got=compute))
        raise Fail(tr("{call}: the final softmax computes in {got}; the model's output must be float32: keep "
                      "that layer in float32", call=call, got=compute))
    if seen["out_dtype"] != "float32":
        raise Fail(tr("{call}: the model's output should be float32, got {dtype}", call=call,
                      dtype=seen["out_dtype"]))
    out = np.array(seen["out"], float)
    # 16-bit Dense layers round each input and weight (float16: 2**-11 relative, bfloat16: 2**-8), so the
    # probabilities move by about 1e-3 (float16) or 1e-2 (bfloat16); 0.05 leaves room, and a normalisation
    # that overflowed or flushed gives NaN (float16) or probabilities of the wrong vector
    bad = [i for i in range(len(want)) if not np.all(np.isfinite(out[i])) or np.abs(out[i] - want[i]).max() > 0.05]
    if bad:
        raise Fail(tr("{call}: for inputs whose activations at the normalisation peak at {peaks}, the output "
                      "should be {want}, got {got}", call=call, peaks=[float(f"{peak[i]:.2g}") for i in bad],
                      want=np.round(want[bad[0]], 3).tolist(), got=np.round(out[bad[0]], 3).tolist()))


# --------------------------------------------------------------------------- q2


_HINTS = {  # each a function, so that the hint is in the learner's language when it is shown
    "applies_on_overflow": lambda: tr("a step with non-finite gradients must be skipped: return apply_update=False "
                                      "for it"),
    "no_reset_on_overflow": lambda: tr("an overflow must also reset good_steps to 0 (the growth count starts again)"),
    "no_halving": lambda: tr("an overflow must halve the scale (scale / 2), not keep it"),
    "one_step_late": lambda: tr("the scale doubles ON the growth_steps-th finite step in a row, i.e. when "
                                "good_steps + 1 == growth_steps, not one step later"),
    "no_reset_on_growth": lambda: tr("when the scale doubles, reset good_steps to 0"),
}


def judge_q2(case, seen):
    flags, initial, growth = case["flags"], case["initial"], case["growth"]
    want = real_optimizer_trace(flags, initial, growth)
    got_traj = []
    scale, good = initial, 0
    for i, (ok, step, (want_scale, want_applied)) in enumerate(zip(flags, seen["steps"], want), 1):
        if "bad" in step:
            raise Fail(tr("next_loss_scale should return a tuple (new_scale, new_good_steps, apply_update), got "
                          "{bad} (a {kind})", bad=step["bad"], kind=step["type"]))
        new_scale, new_good, applied = step["got"]
        got_traj.append([new_scale, new_good, applied])
        if _number(new_scale) != want_scale or bool(applied) != want_applied:
            hints = [text() for kind, text in _HINTS.items()
                     if trajectory(mistaken_rule(kind), flags[:i], initial, growth) == got_traj]
            hint = tr(" Hint: {hints}.", hints=tr(" Or: ").join(hints)) if hints else ""
            raise Fail(tr("with initial scale {initial:g}, growth_steps={growth} and finite flags {flags}: at "
                          "step {i} (scale {scale:g}, good_steps {good}, finite={ok}) the real LossScaleOptimizer "
                          "gives scale {want_scale:g} and {action} the update; "
                          "you returned scale {new_scale} and apply_update={applied}.{hint}", initial=initial,
                          growth=growth, flags=flags[:i], i=i, scale=scale, good=good, ok=ok,
                          want_scale=want_scale, action=tr("applies") if want_applied else tr("skips"),
                          new_scale=repr(new_scale), applied=repr(applied), hint=hint))
        scale, good = new_scale, new_good


# --------------------------------------------------------------------------- q3


def _bypass() -> str:
    """The advice for a train_step that went around the LossScaleOptimizer (in the learner's language)."""
    return tr("Call `optimizer.apply_gradients(zip(grads, model.trainable_variables))` on the LossScaleOptimizer "
              "you were given, with the gradients of `optimizer.scale_loss(loss)`: it divides them by the scale, "
              "skips the step if any is inf/NaN, and moves the scale. Do not go through `optimizer.inner_optimizer` "
              "(or an optimizer of your own): that bypasses all three")


def _api_advice(mistake: str) -> str:
    """What to use instead, per known API mistake (in the learner's language)."""
    if mistake == "keras2":
        return tr("get_scaled_loss and get_unscaled_gradients were Keras 2's (tf.keras.mixed_precision); Keras 3's "
                  "LossScaleOptimizer has neither. Scale with `optimizer.scale_loss(loss)`, differentiate that, and "
                  "pass the gradients to `optimizer.apply_gradients`, which divides them by the scale itself.")
    if mistake == "dynamic_scale":
        return tr("A LossScaleOptimizer creates `dynamic_scale` only when it is built, at its first apply_gradients, "
                  "so it does not exist yet. `optimizer.scale_loss(1.0)` gives the current scale either way (the "
                  "initial scale before the first step).")
    if mistake == "swapped":
        return tr("A Keras loss takes (y_true, y_pred) in that order: call `loss_fn(y, model(x, training=True))`. "
                  "With the two swapped, the labels are read as predictions (the rank error above).")
    return ""


def _mistake_hint(kind, case) -> str:
    scale = case["initial"]
    return {
        "no_clip": tr("That is the update of the gradients before clipping: clip their global norm to clip_norm."),
        "clipped_scaled": tr("The gradients were clipped while still scaled: they are {scale:g} times (the loss scale) "
                             "the true ones, so a limit of clip_norm on them is a limit of clip_norm / {scale:g} on "
                             "the true gradients. Clip the scaled gradients to clip_norm times the scale (or clip "
                             "after unscaling).", scale=scale),
        "divided_twice": tr("The update is 1/{scale:g} (one over the loss scale) of the right one: the gradients "
                            "passed to apply_gradients had already been divided by the scale (or clipped as if "
                            "they had), and the LossScaleOptimizer divides them again.", scale=scale),
        "not_divided": tr("The update is {scale:g} times (the loss scale) the right one: the scaled gradients reached "
                          "the weights without being divided. {bypass}", scale=scale, bypass=_bypass()),
        "per_tensor": tr("Each weight's gradient was clipped on its own: clip the global norm, over all the "
                         "gradients together (tf.clip_by_global_norm)."),
    }.get(kind, "")


def judge_q3(case, seen):
    import numpy as np

    if "api_mistake" in seen:
        raise Fail(tr("train_step raised {raised}. {advice}", raised=seen["raised"],
                      advice=_api_advice(seen["api_mistake"])))
    initial, clip = case["initial"], case["clip"]
    ref_loss, grads = reference_grads(case["weights"], case["x"], case["y"])
    norm = float(np.linalg.norm(as_vector(grads)))
    setup = tr("a mixed_float16 model ({in_dim} inputs, {n_classes} classes), "
               "LossScaleOptimizer(SGD({lr}), initial_scale={initial:g}), a batch of 8 whose gradients have a "
               "global norm of {norm:.4g}, and clip_norm={clip:g}", in_dim=case["in_dim"],
               n_classes=case["n_classes"], lr=case["lr"], initial=initial, norm=norm, clip=clip)
    loss, got_norm = seen["loss"], seen["norm"]
    if _number(loss) is None or _number(got_norm) is None:
        got = loss.get("not_triple") if isinstance(loss, dict) else repr((loss, got_norm))
        raise Fail(tr("train_step should return (loss, grad_norm, skipped): two scalars (0-d tensors or "
                      "numbers) and a bool, got {got}", got=got))
    if not np.isclose(loss, ref_loss, rtol=2e-2, atol=1e-3):
        hint = (tr(" (that is the scaled loss: return the loss from before optimizer.scale_loss)")
                if np.isclose(loss, ref_loss * initial, rtol=2e-2) else "")
        raise Fail(tr("with {setup}: train_step returned loss {loss:.5g}, expected the unscaled loss "
                      "{ref_loss:.5g}{hint}", setup=setup, loss=loss, ref_loss=ref_loss, hint=hint))
    # float16 forward and backward passes: the gradients are within about 1% of the float64 ones
    if not np.isclose(got_norm, norm, rtol=3e-2):
        hint = ""
        if np.isclose(got_norm, norm * initial, rtol=3e-2):
            hint = tr(" That is the norm of the scaled gradients: divide it by the loss scale.")
        elif np.isclose(got_norm, min(norm, clip), rtol=3e-2):
            hint = tr(" That is the norm after clipping: report it from before.")
        elif np.isclose(got_norm, norm / initial, rtol=3e-2):
            hint = tr(" That is the true norm divided by the loss scale once more: the gradients you measured "
                      "were not scaled (differentiate optimizer.scale_loss(loss)), or already divided.")
        raise Fail(tr("with {setup}: grad_norm should be the global norm of the true (unscaled) gradients before "
                      "clipping, {norm:.4g}; got {got:.4g}.{hint}", setup=setup, norm=norm, got=got_norm,
                      hint=hint))
    delta = as_vector(case["weights"]) - as_vector(seen["after1"])
    candidates = q3_candidates(case, grads, norm)
    want = candidates["right"]
    if not np.all(np.isfinite(delta)) or np.linalg.norm(delta - want) > 0.1 * np.linalg.norm(want):
        errors = {k: np.linalg.norm(delta - c) / np.linalg.norm(c) for k, c in candidates.items()
                  if k != "right" and np.all(np.isfinite(delta))}
        near = sorted((e, k) for k, e in errors.items() if e < 0.1)
        hint = " ".join(_mistake_hint(k, case) for _, k in near) or tr(
            "Differentiate optimizer.scale_loss(loss), clip those gradients so that the true gradients' global "
            "norm is at most clip_norm, and pass them to the LossScaleOptimizer's apply_gradients, which "
            "divides them by the scale.")
        ratio = float(np.dot(delta, want) / np.dot(want, want)) if np.all(np.isfinite(delta)) else math.nan
        raise Fail(tr("with {setup}: the weight update is {ratio:.3g} times the right one (SGD on the true "
                      "gradients, clipped to a global norm of clip_norm). {hint}", setup=setup, ratio=ratio,
                      hint=hint))
    if seen["skipped"] is not False:
        raise Fail(tr("with {setup}: the optimizer applied this step, so skipped should be False (a bool), got "
                      "{got}", setup=setup, got=seen["skipped"]))
    if seen["counter1"] != 1 or seen["scale1"] != initial:
        raise Fail(tr("with {setup}: the weights moved correctly, but the LossScaleOptimizer did not count the "
                      "step (its step counter is {counter}, its scale {scale:g}). {bypass}", setup=setup,
                      counter=seen["counter1"], scale=seen["scale1"], bypass=_bypass()))
    if not case["overflow"]:
        return
    changed = not np.array_equal(as_vector(seen["after1"]), as_vector(seen["after2"]), equal_nan=True)
    if changed:
        raise Fail(tr("with {setup}: a batch of inputs around 1e6 (inf in float16) must not change the weights, "
                      "but they changed: the LossScaleOptimizer did not see the overflow. Pass it the gradients "
                      "with their inf and NaN (tf.clip_by_global_norm turns them into NaN, which is fine; "
                      "tf.clip_by_value or zeroing makes them finite), and apply through it, not its "
                      "inner_optimizer.", setup=setup))
    if seen["scale2"] != initial / 2:
        raise Fail(tr("with {setup}: after the overflowing batch the scale should halve to {half:g}, got "
                      "{got:g}. Clipping must keep inf and NaN as they are (tf.clip_by_global_norm turns them "
                      "into NaN, which is fine; tf.clip_by_value or zeroing makes them finite): the "
                      "LossScaleOptimizer needs to see them to skip the step and lower the scale", setup=setup,
                      half=initial / 2, got=seen["scale2"]))
    if seen["skipped2"] is not True:
        raise Fail(tr("with {setup}: the LossScaleOptimizer skipped the overflowing step (the weights did not "
                      "move and its iterations did not advance), so skipped should be True, got {got}",
                      setup=setup, got=seen["skipped2"]))


# --------------------------------------------------------------------------- q4


def judge_q4(case, seen):
    shown = [g if len(list(flatten(g))) <= 4 else tr("array with max|g|={peak:.4g}",
                                                     peak=max(abs(v) for v in flatten(g)))
             for g in case["grads"]]
    if case.get("zeros"):
        return expect_raised(seen, tr("max_safe_scale of all-zero gradients"), "every scale is safe")
    if "raised" in seen:
        raise Fail(tr("max_safe_scale({shown}) raised {raised}: {message}", shown=shown, raised=seen["raised"],
                      message=seen.get("message", "")))
    got = seen["value"]
    want = safe_scale(case["grads"])
    if _number(got) is None:
        raise Fail(tr("max_safe_scale({shown}) should return a number (a power of two), got {got}", shown=shown,
                      got=repr(got)))
    got = float(got)
    if got == want:
        return
    hints = []  # every classic mistake that explains this answer (a random case can fit two)
    if got in (safe_scale(case["grads"], 65535.0), safe_scale(case["grads"], 65536.0)):
        hints.append(tr("float16's largest finite value is 65504 = (2 - 2**-10) * 2**15, not 65535 (the "
                        "largest 16-bit integer) or 2**16: use 65504 (np.finfo(np.float16).max)"))
    elif got == 2 * want:
        hints.append(tr("that scale makes max|g| * scale exceed 65504 (round log2 down, not up)"))
    if got == safe_scale(case["grads"], absolute=False):
        hints.append(tr("use the largest *absolute* value: a gradient of -1e6 overflows as surely as +1e6"))
    if got <= 0 or not math.log2(got).is_integer():
        hints.append(tr("return a power of two, 2**k (k may be negative)"))
    if got == want / 2:
        hints.append(tr("a scale twice as large still fits: max|g| * scale may equal 65504 exactly"))
    hint = tr(" Hint: {hints}.", hints=tr(" Or: ").join(hints)) if hints else ""
    raise Fail(tr("max_safe_scale({shown}) should be {want:g} (the largest power of two with max|g| * scale <= "
                  "{limit:g}), got {got:g}.{hint}", shown=shown, want=want, limit=FP16_MAX, got=got, hint=hint))


# --------------------------------------------------------------------------- q5


def judge_q5(case, seen):
    scale, growth, lr = case["scale"], case["growth"], case["lr"]
    call = f"make_scaled_optimizer(SGD({lr}), {scale:g}, {growth!r})"
    if "raised" in seen:
        msg = seen.get("message", "")
        if "dynamic_growth" in msg:
            raise Fail(tr("{call} raised {raised}: `dynamic_growth=True` is the Keras 2 / TF1 argument. "
                          "Keras 3's LossScaleOptimizer is always dynamic: LossScaleOptimizer(inner, "
                          "initial_scale=scale, dynamic_growth_steps=growth_steps)", call=call,
                          raised=seen["raised"]))
        if "dynamic" in msg:
            raise Fail(tr("{call} raised {raised}: Keras 3's LossScaleOptimizer has no fixed mode "
                          "(dynamic=False). For a fixed scale, set loss_scale_factor=scale on the plain optimizer "
                          "and return it", call=call, raised=seen["raised"]))
        raise Fail(tr("{call} raised {raised}: {message}", call=call, raised=seen["raised"], message=msg))
    got = seen["value"]
    if not got.get("is_optimizer"):
        raise Fail(tr("{call} should return a Keras optimizer, got a {kind}", call=call, kind=got.get("type")))
    if growth is None:
        if got["is_lso"]:
            raise Fail(tr("{call}: growth_steps=None asks for a fixed scale, but a LossScaleOptimizer moves its "
                          "scale. Return the plain optimizer with loss_scale_factor=scale (e.g. "
                          "inner.loss_scale_factor = scale)", call=call))
        if got["scale_loss"] != scale:
            raise Fail(tr("{call}: scale_loss(1.0) should give {scale:g}, got {got:g}. Set "
                          "loss_scale_factor=scale on the optimizer", call=call, scale=scale,
                          got=got["scale_loss"]))
        if got["learning_rate"] != lr or got["weights"][0] != -lr:
            raise Fail(tr("{call}: a scaled gradient of {scale:g} (1 unscaled) should move a weight by -{lr:g} "
                          "(SGD({lr})), it moved it to {moved:g}. Keep the optimizer you were given "
                          "(its learning rate) and only add the loss scale factor", call=call, scale=scale, lr=lr,
                          moved=got["weights"][0]))
        return
    if not got["is_lso"]:
        raise Fail(tr("{call}: with growth_steps={growth} the scale must be dynamic: return "
                      "keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale, "
                      "dynamic_growth_steps=growth_steps), not a {kind}", call=call, growth=growth,
                      kind=got["type"]))
    if not got["wraps_given"]:
        raise Fail(tr("{call}: wrap the optimizer you were given (LossScaleOptimizer(inner, ...)), not a new "
                      "one: its learning rate and settings would be lost", call=call))
    if got["initial_scale"] != scale:
        raise Fail(tr("{call}: the initial scale should be {scale:g}, got {got:g} (pass initial_scale=scale)",
                      call=call, scale=scale, got=got["initial_scale"]))
    if got["growth_steps"] != growth:
        raise Fail(tr("{call}: dynamic_growth_steps should be {growth}, got {got} (pass "
                      "dynamic_growth_steps=growth_steps)", call=call, growth=growth,
                      got=repr(got["growth_steps"])))
