"""Lab 07's judges: from a case and what the observer saw, pass, or a Fail that names the learner's mistake.

``judge_qN`` is the ``judge`` of item qN of :mod:`gpucourse.labtests.lab07`, where its cases are drawn and
observed (the runs are the observer's records, :mod:`gpucourse.grading.timeline`). It runs on the grader's side
(and in the learner's own ``check()``), never in the graded kernel, and compares with
:mod:`gpucourse.labtests._lab07_reference`. Every message goes through ``tr`` (the zh_CN catalogue,
``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from ..grading.items import Fail, expect_raised, tr
from ..grading.timeline import delivered, lineage, most_at_once, ran
from ._lab07_reference import (MIX, NOISE, Q3_DEADLINE_S, Q3_STARTUP, Q3_UTILISATION, Q4_DEADLINE_S, pair_bound,
                               q2_expected, q3_needs, q3_summary, whole_batches_shuffled)

__all__ = ["judge_q1", "judge_q2", "judge_q3", "judge_q4", "judge_q5"]


def _close(got, want) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, rel_tol=1e-6)


def _sample(values, k=6) -> str:
    if len(values) <= k:
        return str(values)
    return tr("[{head}, ...] ({n} values)", head=", ".join(map(str, values[:k])), n=len(values))


def _flat(element) -> list:
    return [v for sub in element for v in _flat(sub)] if isinstance(element, list) else [element]


def _sizes(sizes):
    """[5, 5, 5, 2] -> '3 x 5, then 2' (short enough for a message)."""
    if len(sizes) <= 6:
        return str(sizes)
    head = sizes[0]
    k = next((i for i, v in enumerate(sizes) if v != head), len(sizes))
    rest = sizes[k:]
    if not rest:
        return f"{k} x {head}"
    return tr("{k} x {head}, then {rest}", k=k, head=head, rest=rest if len(rest) > 1 else rest[0])


def _frozen_shuffle() -> str:
    return tr("shuffle(..., reshuffle_each_iteration=False) draws one order and replays it every epoch: leave "
              "reshuffle_each_iteration at its default (True)")


# --------------------------------------------------------------------------- q1


def judge_q1(case, seen):
    if "bad" in case:
        return expect_raised(seen, f"pipeline_bound{tuple(case['bad'])}", case["what"])
    n, p, c, k = case["n"], case["p"], case["c"], case.get("k", 1)
    call = (f"pipeline_bound({n}, {p}, {c})" if case.get("default")
            else f"pipeline_bound(n={n}, produce_s={p}, step_s={c}, parallelism={k})")
    if "raised" in seen:
        raise Fail(tr("{call} raised {raised}: {message}, but these inputs are valid", call=call,
                      raised=seen["raised"], message=seen["message"]))
    got, want = seen["value"], pair_bound(n, p, c, k)
    if _close(got, want):
        return
    hint = ""
    if _close(got, n * max(p / k, c)):
        hint = tr(" That is n elements at the pace of the slowest stage, without the fill: the first element "
                  "must pass through both stages (produce_s + step_s) before the pipeline is full.")
    elif _close(got, p + c + n * max(p / k, c)):
        hint = tr(" After the fill, only n - 1 elements remain.")
    elif k > 1 and _close(got, pair_bound(n, p, c, 1)):
        hint = tr(" With parallelism={k}, the producer delivers an element every produce_s / {k} seconds.", k=k)
    elif _close(got, n * (p + c)):
        hint = tr(" That is the time with nothing overlapping, not the bound.")
    elif case.get("default"):
        hint = tr(" Without a parallelism argument, use parallelism=1.")
    raise Fail(tr("{call} should be {want:.6f} s (produce + step + (n - 1) * max(produce / parallelism, step)), "
                  "got {got}.{hint}", call=call, want=want, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q2


def _ahead_hint(case, said) -> str:
    """Which of TensorFlow's rewrites ran ahead, from the case's pipeline and what the options said."""
    ops, off = case["ops"], lambda k: said.get(k) is False or said.get("apply_default_optimizations") is False
    if any(a in ("decode", "scale") and b == "batch" for a, b in zip(ops, ops[1:])) and not off("map_and_batch_fusion"):
        return tr(" This pipeline maps right before it batches: TensorFlow fuses map(f).batch(b) into one op that "
                  "maps ahead in a thread of its own (experimental_optimization.map_and_batch_fusion), with or "
                  "without autotune.")
    if not off("inject_prefetch") and said.get("autotune") is not False:
        return tr(" With autotune on, TensorFlow appends a prefetch to the pipeline (inject_prefetch).")
    return tr(" Your dataset prefetches (or maps in parallel) by itself: return `ds` with options, add no steps.")


def judge_q2(case, seen):
    pipeline = " -> ".join(case["ops"])
    if seen["type"] != "Dataset":
        raise Fail(tr("serial_baseline(ds) should return a tf.data.Dataset, got a {kind}", kind=seen["type"]))
    run, want = seen["run"], q2_expected(case)
    got = [element for element, *_ in run["steps"]]
    if got != want:
        raise Fail(tr("for the pipeline {pipeline} the baseline delivered {got}, expected {want}: a baseline "
                      "changes when the work runs, never what the pipeline delivers", pipeline=pipeline,
                      got=_sample(got), want=_sample(want)))
    built = run["marks"].get("built", math.inf)
    if any(r[3] < built for r in run["stages"]):
        raise Fail(tr("serial_baseline ran the pipeline before returning it: return the dataset itself, so that "
                      "its work happens when the step asks for each element"))
    chain = lineage(run, [op for op in case["ops"] if op in ("decode", "scale")])
    if chain["missing"] is not None:
        raise Fail(tr("for the pipeline {pipeline} an element reached the step without passing through {stage}",
                      pipeline=pipeline, stage=chain["missing"]["stage"]))
    steps = run["steps"]
    for i in range(1, len(steps)):
        ahead = steps[i - 1][3] - chain["begun"][i]
        if ahead > 0:
            raise Fail(tr("for the pipeline {pipeline}, the work for element {k} began {ms:.0f} ms before step "
                          "{prev} ended: something still runs ahead while the step runs, so the baseline is not "
                          "serial.{hint}", pipeline=pipeline, k=i + 1, ms=ahead * 1e3, prev=i,
                          hint=_ahead_hint(case, seen.get("options") or {})))


# --------------------------------------------------------------------------- q3


def judge_q3(case, seen):
    if seen["type"] != "Dataset":
        raise Fail(tr("tuned_pipeline(files, read_file, decode, costs) should return a tf.data.Dataset, got a "
                      "{kind}", kind=seen["type"]))
    n, a, b, c = case["records"], case["a"], case["b"], case["c"]
    read, decode, step = case["read_s"], case["decode_s"], case["step_s"]
    want = sorted(c * (a * r + b) for r in range(n))
    limit = Q3_STARTUP * (read + decode)
    best = None
    for run in seen["runs"]:
        got = delivered(run)
        if run["stopped"] is None and sorted(got) != want:
            raise Fail(tr("tuned_pipeline must deliver every decoded record once: expected {want}, got {got}",
                          want=_sample(want), got=_sample(sorted(got))))
        chain = lineage(run, ["read", "decode"])
        if chain["missing"] is not None:
            raise Fail(tr("the element {value} reached the step without being read and then decoded: build on "
                          "read_file and decode", value=chain["missing"]["value"]))
        if run["stopped"] is None and (ran(run, "read") != n or ran(run, "decode") != n):
            raise Fail(tr("for {n} records the files were read {reads} times and decode ran {decodes} times; "
                          "each should run once per record", n=n, reads=ran(run, "read"),
                          decodes=ran(run, "decode")))
        startup, util = q3_summary(run, case)
        key = (startup <= limit, util)
        if best is None or key > best[0]:
            best = (key, startup, util, run)
    _, startup, util, run = best
    reads, decodes = most_at_once(run, {"read"}), most_at_once(run, {"decode"})
    need_r, need_d = q3_needs(case)
    at_once = tr(" At most {reads} reads and {decodes} decodes ran at once, {both} together; to deliver "
                 "one element every {step:.0f} ms, about {need_r} reads ({read:.0f} ms each) and {need_d} decodes "
                 "({decode:.0f} ms each) must be in flight. Are enough files read at once, and does tf.data "
                 "have threads for all of them? Its default pool has one thread per core.",
                 reads=reads, decodes=decodes, both=most_at_once(run, {"read", "decode"}), step=step * 1e3,
                 need_r=need_r, need_d=need_d, read=read * 1e3, decode=decode * 1e3)
    if run["stopped"] is not None:
        raise Fail(tr("in {seconds:g} s only {k} of {n} records reached the step, when the check stopped the "
                      "run: the pipeline is far too slow.", seconds=Q3_DEADLINE_S, k=len(run["steps"]), n=n)
                   + at_once)
    if startup > limit:
        raise Fail(tr("the first record took {ms:.0f} ms to reach the step; one record needs read + decode = "
                      "{need:.0f} ms (allowed: {limit:.0f} ms). Do not hold records back.", ms=startup * 1e3,
                      need=(read + decode) * 1e3, limit=limit * 1e3))
    if util < Q3_UTILISATION:
        raise Fail(tr("after the first record the step was busy {util:.0%} of the time; it should be at least "
                      "{target:.0%}.", util=util, target=Q3_UTILISATION) + at_once)
    chain_names = [name for name, _ in run.get("structure") or [] if "Options" not in name]
    last = chain_names[0] if chain_names else tr("nothing")
    sizes = [size for name, size in run.get("structure") or [] if "Options" not in name]
    if "Prefetch" not in last or (sizes and sizes[0] == 0):
        raise Fail(tr("fast enough, but the pipeline ends with {last}: end it with .prefetch(tf.data.AUTOTUNE), so "
                      "that the next element is ready while the step runs, whatever the step's length",
                      last=last.strip("_").replace("Dataset", "") or last))


# --------------------------------------------------------------------------- q4


def judge_q4(case, seen):
    n, batch, a, b = case["n"], case["batch"], case["a"], case["b"]
    if seen["type"] != "Dataset":
        raise Fail(tr("epoch_stream(source, decode, {batch}) should return a tf.data.Dataset, got a {kind}",
                      batch=batch, kind=seen["type"]))
    run = seen["run"]
    if run["stopped"] is not None:
        raise Fail(tr("the check stopped reading your stream after {seconds:g} s, with {k} batches, and decode "
                      "had run {decodes} times for {n} records", seconds=Q4_DEADLINE_S, k=len(run["steps"]),
                      decodes=ran(run, "decode"), n=n) + (tr(": cache the decoded records, so that later "
                                                                "epochs replay them instead of decoding again")
                                                             if ran(run, "decode") > n else "."))
    sizes = [len(_flat(element)) for element, *_ in run["steps"]]
    flat = delivered(run)
    record = {a * r + b: r for r in range(n)}  # decoded value -> the record it came from
    if len(sizes) < -(-3 * n // batch) + 1:  # the kernel reads 3 epochs of full batches, and one more
        raise Fail(tr("the stream ended after {k} batches ({m} records, {epochs:.1f} epochs of {n}): training "
                      "with steps_per_epoch needs a stream that never ends. Repeat it", k=len(sizes), m=len(flat),
                      epochs=len(flat) / n, n=n))
    if any(size != batch for size in sizes):
        where = next(i for i, size in enumerate(sizes) if size != batch)
        raise Fail(tr("batch {i} of the stream has {size} records, not {batch}: every batch must be full, also "
                      "where one epoch ends and the next begins. Batch after repeating", i=where + 1,
                      size=sizes[where], batch=batch))
    batches = [_flat(element) for element, *_ in run["steps"]][:3 * n // batch]
    if whole_batches_shuffled(batches, record, n):
        raise Fail(tr("every batch holds {batch} records that were read one after another: the shuffle came "
                      "after batch, so it shuffles whole batches and the same records stay together every epoch. "
                      "Shuffle the records first, then batch them", batch=batch))
    epochs = [flat[e * n:(e + 1) * n] for e in range(3)]
    want = sorted(record)
    for e, epoch in enumerate(epochs):
        if sorted(epoch) != want:
            twice = next((v for v in epoch if epoch.count(v) > 1), None)
            raise Fail(tr("records {first} to {last} of the stream (epoch {epoch}) should hold every decoded "
                          "record once; {value} came {times} times, and some other record not at all. The epochs "
                          "run into each other: shuffle first, then repeat", first=e * n + 1, last=(e + 1) * n,
                          epoch=e + 1, value=twice, times=epoch.count(twice)) if twice is not None else
                       tr("epoch {epoch} of the stream should hold every decoded record once: expected {want}, "
                          "got {got}", epoch=e + 1, want=_sample(want), got=_sample(sorted(epoch))))
    decodes = ran(run, "decode")
    if decodes != n:
        raise Fail(tr("over 3 epochs of {n} records decode ran {decodes} times; with the cache in the right "
                      "place (after decode) it runs {n} times, once per record", n=n, decodes=decodes))
    if epochs[0] == epochs[1] == epochs[2]:
        frozen = False in seen.get("reshuffles", [])
        raise Fail(tr("all 3 epochs came in the same order {order}...: ", order=epochs[0][:8]) + (
            _frozen_shuffle() if frozen else tr("the order is frozen. Shuffle every epoch, after the cache (a "
                                                "cache placed after shuffle replays the first epoch's order)")))
    ahead = max(record[v] - i for epoch in epochs for i, v in enumerate(epoch))  # record r is read r-th
    if ahead < MIX * n:
        raise Fail(tr("over 3 epochs of {n} records no record came more than {ahead} places ahead of where it "
                      "was read: the shuffle buffer is too small to mix the data. Give it room for every record "
                      "(the source's size is source.cardinality())", n=n, ahead=ahead))
    chain = [(name, size) for name, size in seen["structure"] if "Options" not in name]
    last_name, last_size = chain[0] if chain else (tr("nothing"), None)
    if "Prefetch" not in last_name:
        raise Fail(tr("the pipeline should end with a prefetch, so the next batch is prepared while the "
                      "accelerator trains; it ends with {last}. Add .prefetch(tf.data.AUTOTUNE) as the last step",
                      last=last_name.strip("_").replace("Dataset", "") or last_name))
    if last_size == 0:
        raise Fail(tr("the final prefetch has a buffer of 0, which prefetches nothing: use tf.data.AUTOTUNE"))


# --------------------------------------------------------------------------- q5


def judge_q5(case, seen):
    n, batch, p, q, a, b = case["n"], case["batch"], case["p"], case["q"], case["a"], case["b"]
    call = f"augmented_pipeline(source, read, decode, augment, {batch})"
    if seen["type"] != "Dataset":
        raise Fail(tr("{call} should return a tf.data.Dataset, got a {kind}", call=call, kind=seen["type"]))
    run = seen["run"]
    if run["stopped"] is not None:
        raise Fail(tr("the check stopped reading your pipeline after 6 s: 3 epochs of {n} records should take "
                      "a fraction of that", n=n))
    marks = [run["marks"].get(f"epoch {e}", math.inf) for e in (1, 2, 3)] + [math.inf]
    epochs = [[s for s in run["steps"] if marks[e] <= s[1] < marks[e + 1]] for e in range(3)]
    want_sizes = [batch] * (n // batch) + [n % batch]
    decoded = sorted(a * (p * r + q) + b for r in range(n))
    orders = []
    for e, steps in enumerate(epochs):
        sizes = [len(_flat(element)) for element, *_ in steps]
        if sizes != want_sizes:
            raise Fail(tr("with {n} records and batch_size={batch}, epoch {epoch} should have batch sizes "
                          "{want}, got {got}", n=n, batch=batch, epoch=e + 1, want=_sizes(want_sizes),
                          got=_sizes(sizes)))
        order = [v // NOISE for element, *_ in steps for v in _flat(element)]
        if sorted(order) != decoded:
            raise Fail(tr("epoch {epoch} should deliver augment(decode(read(r))) for every record r once. Take "
                          "away augment's random offset and the values should be the decoded records {want}, but "
                          "they are {got}. Read, then decode, then augment, once each per epoch", epoch=e + 1,
                          want=_sample(decoded), got=_sample(sorted(order))))
        orders.append(order)
    chain = lineage(run, ["read", "decode", "augment"])
    if chain["missing"] is not None:
        raise Fail(tr("the element {value} reached the step without passing through {stage} first: read, then "
                      "decode, then augment", value=chain["missing"]["value"], stage=chain["missing"]["stage"]))
    reads, decodes, augments = (ran(run, s) for s in ("read", "decode", "augment"))
    if augments < 3 * n:
        raise Fail(tr("augment ran {augments} times in 3 epochs of {n} records: the augmentation is frozen, and "
                      "every epoch sees the same variants. A cache after augment replays its first results; put "
                      "augment after the cache", augments=augments, n=n))
    if decodes < 3 * n:
        raise Fail(tr("decode ran {decodes} times in 3 epochs of {n} records, so its results were cached. A decoded "
                      "record is 40 times the size of a raw one: they do not fit in memory. Cache what read "
                      "returns, and decode every epoch", decodes=decodes, n=n))
    if reads != n:
        raise Fail(tr("read ran {reads} times in 3 epochs of {n} records; it is the slow part and always returns "
                      "the same raw record: cache what it returns, so it runs {n} times, once per record",
                      reads=reads, n=n))
    if decodes != 3 * n or augments != 3 * n:
        raise Fail(tr("decode ran {decodes} and augment {augments} times in 3 epochs of {n} records: each should "
                      "run once per record per epoch", decodes=decodes, augments=augments, n=n))
    if orders[0] == orders[1]:
        if False in seen.get("reshuffles", []):
            raise Fail(tr("epochs 1 and 2 delivered the records in the same order: ") + _frozen_shuffle())
        raise Fail(tr("epochs 1 and 2 delivered the records in the same order: shuffle every epoch, after the "
                      "cache (a shuffle before the cache is replayed with it)"))
    chain = [(name, size) for name, size in seen["structure"] if "Options" not in name]
    last_name, last_size = chain[0] if chain else (tr("nothing"), None)
    if "Prefetch" not in last_name or last_size == 0:
        raise Fail(tr("the pipeline should end with .prefetch(tf.data.AUTOTUNE), so the next batch is prepared "
                      "while the accelerator trains; it ends with {last}",
                      last=last_name.strip("_").replace("Dataset", "") or last_name))
