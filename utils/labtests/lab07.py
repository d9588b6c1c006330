"""Lab 07 (tf.data tuning): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side, ``observe`` runs the learner's code in
the learner's kernel on simulated workloads from :mod:`gpucourse.simulate`
(sleep-based reads, decodes and training steps) and returns plain numbers, and
``judge`` computes every expected answer and bound here, from the case, with
the private reference functions below (never with a course helper). Timings
are structural (sleeps), so the thresholds can be generous.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from gpucourse.grading.items import Fail, expect_raised, isolated, item, outcome, tr


def _bound(n, stages):
    """Reference: fill + (n - 1) x the slowest stage, for ``(seconds, parallelism)`` stages."""
    return sum(t for t, _ in stages) + (n - 1) * max(t / k for t, k in stages)


def _pair_bound(n, produce_s, step_s, parallelism=1):
    return _bound(n, [(produce_s, parallelism), (step_s, 1)])


def _close(got, want) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, rel_tol=1e-6)


def _workload(case, decode_fn=True):
    """The simulated workload of a case (built in the learner's kernel): read, decode, step."""
    from gpucourse.simulate import Pipeline, Workload

    a, b = case.get("a", 2), case.get("b", 1)
    p = Pipeline(stages=(("decode", case["decode_s"]),), read_s=case.get("read_s", 0.0), step_s=case["step_s"],
                 n=case["n"], shards=case.get("shards", 1), threads=None)
    # the decode function leads nowhere: no __globals__ of this module (see items.isolated)
    return Workload(p, {"decode": isolated("lambda v: a * v + b", a=a, b=b)} if decode_fn else None)


def _decoded(case) -> list[int]:
    a, b = case.get("a", 2), case.get("b", 1)
    return sorted(a * r + b for r in range(case["n"]))


def _drain(ds, lanes, first_lane):
    """Take every element as soon as it is ready (no step in between): delivery times, in seconds after the
    first ``first_lane`` period started (``None`` if that stage never ran), and the flattened values."""
    import time

    lanes.reset()
    got, values = [], []
    for element in ds:
        got.append(time.perf_counter())
        values.extend(element.numpy().reshape(-1).tolist())
    starts = [e.start_s for e in lanes.events() if e.lane.split(" #")[0] == first_lane]
    if not starts:
        return None, values
    return [g - min(starts) for g in got], values


def _device_end(got, step_s) -> float:
    """When a simulated accelerator finishes, starting each step once its element is there and the last
    step is done (virtual time: every step takes exactly ``step_s``, however loaded the machine is)."""
    end = 0.0
    for g in got:
        end = max(g, end) + step_s
    return end


def _sample(values, k=6) -> str:
    if len(values) <= k:
        return str(values)
    return tr("[{head}, ...] ({n} values)", head=", ".join(map(str, values[:k])), n=len(values))


# --------------------------------------------------------------------------- q1


@item("q1", points=2, title="pipeline_bound: fill plus the slowest stage")
class q1:
    def cases(rng):
        fixed = [(1, 0.05, 0.02, 1), (10, 0.03, 0.01, 1), (10, 0.03, 0.01, 3), (10, 0.03, 0.01, 6), (7, 0.01, 0.04, 2)]
        drawn = [(rng.randint(2, 500), round(rng.uniform(0.001, 0.2), 4), round(rng.uniform(0.001, 0.1), 4),
                  rng.randint(2, 16)) for _ in range(12)]
        out = [{"n": n, "p": p, "c": c, "k": k} for n, p, c, k in fixed + drawn]
        out.append({"n": rng.randint(2, 50), "p": 0.02, "c": 0.01, "default": True})
        out += [{"bad": args, "what": what} for args, what in [
            ([0, 0.01, 0.01, 1], "n=0"), ([5, 0.01, 0.01, 0], "parallelism=0"),
            ([5, -0.01, 0.01, 1], "produce_s=-0.01"), ([5, 0.01, -0.02, 2], "step_s=-0.02")]]
        return out

    def observe(ns, case):
        fn = ns.function("pipeline_bound")
        if "bad" in case:
            return outcome(lambda: fn(*case["bad"]))
        if case.get("default"):
            return outcome(lambda: fn(case["n"], case["p"], case["c"]))
        return outcome(lambda: fn(case["n"], case["p"], case["c"], case["k"]))

    def judge(case, seen):
        if "bad" in case:
            return expect_raised(seen, f"pipeline_bound{tuple(case['bad'])}", case["what"])
        n, p, c, k = case["n"], case["p"], case["c"], case.get("k", 1)
        call = (f"pipeline_bound({n}, {p}, {c})" if case.get("default")
                else f"pipeline_bound(n={n}, produce_s={p}, step_s={c}, parallelism={k})")
        if "raised" in seen:
            raise Fail(tr("{call} raised {raised}: {message}, but these inputs are valid", call=call,
                          raised=seen["raised"], message=seen["message"]))
        got, want = seen["value"], _pair_bound(n, p, c, k)
        if _close(got, want):
            return
        hint = ""
        if _close(got, n * max(p / k, c)):
            hint = tr(" That is n elements at the pace of the slowest stage, without the fill: the first element "
                      "must pass through both stages (produce_s + step_s) before the pipeline is full.")
        elif _close(got, p + c + n * max(p / k, c)):
            hint = tr(" After the fill, only n - 1 elements remain.")
        elif k > 1 and _close(got, _pair_bound(n, p, c, 1)):
            hint = tr(" With parallelism={k}, the producer delivers an element every produce_s / {k} seconds.", k=k)
        elif _close(got, n * (p + c)):
            hint = tr(" That is the time with nothing overlapping, not the bound.")
        elif case.get("default"):
            hint = tr(" Without a parallelism argument, use parallelism=1.")
        raise Fail(tr("{call} should be {want:.6f} s (produce + step + (n - 1) * max(produce / parallelism, step)), "
                      "got {got}.{hint}", call=call, want=want, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q2


@item("q2", points=2, title="naive_options: an honest baseline without injected prefetch")
class q2:
    def cases(rng):
        return [{"n": 8, "decode_s": round(rng.uniform(0.018, 0.024), 4), "step_s": round(rng.uniform(0.018, 0.024), 4),
                 "a": rng.randint(2, 9), "b": rng.randint(-20, 20)}]

    def observe(ns, case):
        import tensorflow as tf

        opts = ns.function("naive_options")()
        seen = {"type": type(opts).__name__, "options": isinstance(opts, tf.data.Options)}
        if not seen["options"]:
            return seen
        seen["inject_prefetch"] = opts.experimental_optimization.inject_prefetch
        seen["autotune"] = opts.autotune.enabled
        w = _workload(case)
        ds = w.source(read=False).map(w.stage("decode")).with_options(opts)
        w.train(ds)  # warm-up
        seen["seconds"] = w.train(ds).seconds
        seen["delivered"] = sorted(w.delivered)
        return seen

    def judge(case, seen):
        if not seen["options"]:
            raise Fail(tr("naive_options() should return a tf.data.Options, got a {kind}", kind=seen["type"]))
        inject, autotune = seen["inject_prefetch"], seen["autotune"]
        if inject is not False and autotune is not False:
            raise Fail(tr("naive_options() should turn off both the injected prefetch (experimental_optimization."
                          "inject_prefetch = False) and autotune (autotune.enabled = False), got inject_prefetch="
                          "{inject} and autotune.enabled={autotune}: with TensorFlow's defaults it appends a "
                          "prefetch(AUTOTUNE) to the pipeline by itself", inject=repr(inject), autotune=repr(autotune)))
        if inject is not False:  # TF 2.21 runs inject_prefetch only with autotune on (dataset_utils.cc)
            raise Fail(tr("naive_options().experimental_optimization.inject_prefetch should be False too, got "
                          "{got}. With autotune off, TensorFlow 2.21 skips the injected prefetch anyway (it is one "
                          "of the rewrites that run only with autotune on), so this baseline happens to be serial; "
                          "set inject_prefetch = False as well, so that it says what it is and stays serial when "
                          "autotune is turned back on", got=repr(inject)))
        if autotune is not False:
            raise Fail(tr("naive_options().autotune.enabled should be False, got {got}: with autotune on, "
                          "TensorFlow still tunes the pipeline by itself (it runs stateless maps in parallel, "
                          "map_parallelization, and sizes AUTOTUNE buffers and threads), so the baseline would not "
                          "be naive", got=repr(autotune)))
        if seen["delivered"] != _decoded(case):
            raise Fail(tr("with your options the pipeline delivered {got}, expected {want}",
                          got=_sample(seen["delivered"]), want=_sample(_decoded(case))))
        serial = case["n"] * (case["decode_s"] + case["step_s"])
        if seen["seconds"] < 0.85 * serial:
            raise Fail(tr("{n} elements of {decode_ms:g} ms decode + {step_ms:g} ms step took {took_ms:.0f} ms with "
                          "your options; with nothing overlapping they take at least {serial_ms:.0f} ms, so something "
                          "still prefetches", n=case["n"], decode_ms=case["decode_s"] * 1e3,
                          step_ms=case["step_s"] * 1e3, took_ms=seen["seconds"] * 1e3, serial_ms=serial * 1e3))


# --------------------------------------------------------------------------- q3

Q3_LIMIT = 1.3  # measured epoch / bound


@item("q3", points=4, title="tuned_pipeline reaches 1.3x of the bound and keeps the elements")
class q3:
    def cases(rng):
        return [{"n": 16, "shards": 4, "read_s": 0.008, "decode_s": 0.048, "step_s": 0.032,
                 "a": rng.randint(2, 9), "b": rng.randint(-50, 50)}]

    def observe(ns, case):
        import tensorflow as tf

        w = _workload(case)
        ds = ns.function("tuned_pipeline")(w.source(), w.stage("decode"))
        if not isinstance(ds, tf.data.Dataset):
            return {"type": type(ds).__name__}
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # every overlap must be the learner's own
        # The simulated decode waits rather than computes, like I/O or a remote call: give it threads and
        # tell autotune it may use them. Otherwise tf.data's pool has one thread per core and AUTOTUNE
        # sizes itself by the CPU load it sees, and a correct pipeline fails on a busy 2-core machine.
        options.threading.private_threadpool_size = 8
        options.autotune.cpu_budget = 8
        ds = ds.with_options(options)
        epochs = []
        for _ in range(3):  # epoch 1 is a warm-up: tracing and thread start-up are not what we grade
            before = dict(w.counts)
            got, values = _drain(ds, w.lanes, "read")
            after = w.counts
            epochs.append({"got": got, "delivered": sorted(values),
                           "reads": after["read"] - before["read"], "decodes": after["decode"] - before["decode"]})
        return {"type": "Dataset", "epochs": epochs}

    def judge(case, seen):
        if seen["type"] != "Dataset":
            raise Fail(tr("tuned_pipeline(source, decode) should return a tf.data.Dataset, got a {kind}",
                          kind=seen["type"]))
        n, want = case["n"], _decoded(case)
        for i, e in enumerate(seen["epochs"]):
            if e["delivered"] != want:
                if i:
                    raise Fail(tr("in a later epoch tuned_pipeline must deliver every decoded record once: expected "
                                  "{want}, got {got}", want=_sample(want), got=_sample(e["delivered"])))
                raise Fail(tr("tuned_pipeline must deliver every decoded record once: expected {want}, got {got}",
                              want=_sample(want), got=_sample(e["delivered"])))
            if e["reads"] != n or e["decodes"] != n:
                raise Fail(tr("in epoch {epoch} of {n} records the source was read {reads} times and decode ran "
                              "{decodes} times; both should run {n} times per epoch. Build on `source` and "
                              "`decode` (no cache here: this item is about overlapping the work, not skipping it)",
                              epoch=i + 1, n=n, reads=e["reads"], decodes=e["decodes"]))
        # `source` reads one record after another; decode may run on every record at once. The epoch runs from
        # the first read to the end of the last step of a simulated accelerator fed with the measured deliveries.
        bound = _bound(n, [(case["read_s"], 1), (case["decode_s"], n), (case["step_s"], 1)])
        best = min(_device_end(e["got"], case["step_s"]) for e in seen["epochs"][1:])
        if best / bound > Q3_LIMIT:
            raise Fail(tr("{n} records (read {read_ms:g} ms, decode {decode_ms:g} ms, step {step_ms:g} ms): your "
                          "pipeline took {took_ms:.0f} ms per epoch, {ratio:.2f}x the bound of {bound_ms:.0f} ms; it "
                          "should be within {limit}x. Is the decode parallel, and does the pipeline end with a "
                          "prefetch?", n=n, read_ms=case["read_s"] * 1e3, decode_ms=case["decode_s"] * 1e3,
                          step_ms=case["step_s"] * 1e3, took_ms=best * 1e3, ratio=best / bound,
                          bound_ms=bound * 1e3, limit=Q3_LIMIT))


# --------------------------------------------------------------------------- q4


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


def _reshuffles(ds) -> list:
    """``reshuffle_each_iteration`` of every shuffle in the dataset's chain (True unless turned off)."""
    out = []
    while ds is not None:
        if hasattr(ds, "_reshuffle_each_iteration"):
            out.append(ds._reshuffle_each_iteration is not False)
        inputs = ds._inputs() if hasattr(ds, "_inputs") else []
        ds = inputs[0] if inputs else None
    return out


def _frozen_shuffle() -> str:
    return tr("shuffle(..., reshuffle_each_iteration=False) draws one order and replays it every epoch: leave "
              "reshuffle_each_iteration at its default (True)")


def _structure(ds) -> list:
    """The dataset's chain from the output back to the source: [[class name, buffer size or None], ...]."""
    out = []
    while ds is not None:
        size = getattr(ds, "_buffer_size", None)
        try:
            size = None if size is None else int(size)
        except (TypeError, ValueError):
            size = None
        out.append([type(ds).__name__, size])
        inputs = ds._inputs() if hasattr(ds, "_inputs") else []
        ds = inputs[0] if inputs else None
    return out


MIX = 0.9  # a full shuffle moves some record at least this share of the data ahead of where it was read


def _batches(epoch) -> list[list]:
    """One epoch's flattened order cut back into its batches."""
    out, i = [], 0
    for size in epoch["sizes"]:
        out.append(epoch["order"][i:i + size])
        i += size
    return out


def _whole_batches_shuffled(epochs, read_index) -> bool:
    """True when every batch of every epoch holds records read one after another (so only whole batches
    moved) and yet some epoch is not in reading order: a shuffle placed after batch. (A full shuffle
    before batch makes a batch of 5+ neighbours with chance < 1e-9.)"""
    moved = False
    for e in epochs:
        batches = [[read_index(v) for v in batch] for batch in _batches(e)]
        if any(len(b) > 1 and sorted(b) != list(range(min(b), min(b) + len(b))) for b in batches):
            return False
        moved = moved or [r for b in batches for r in b] != sorted(r for b in batches for r in b)
    return moved


@item("q4", points=3, title="epoch_pipeline decodes once, reshuffles every epoch and ends with a prefetch")
class q4:
    def cases(rng):
        n = rng.randint(1200, 1400)  # records: a shuffle buffer of 1000 (< 0.9 n) mixes them too little
        batch = rng.choice([b for b in range(5, 17) if n % b])  # so there is a last, smaller batch to keep
        return [{"n": n, "batch": batch, "a": rng.randint(2, 9), "b": rng.randint(-50, 50)}]

    def observe(ns, case):
        import tensorflow as tf

        from gpucourse import simulate

        a, b = case["a"], case["b"]
        decode = simulate.Stage(0.0, lambda v: a * v + b, "decode")  # costs nothing: only counts and orders matter
        ds = ns.function("epoch_pipeline")(tf.data.Dataset.range(case["n"]), decode, case["batch"])
        if not isinstance(ds, tf.data.Dataset):
            return {"type": type(ds).__name__}
        epochs = []
        for _ in range(3):
            sizes, order = [], []
            for batch in ds:
                values = batch.numpy().reshape(-1).tolist()
                sizes.append(len(values))
                order.extend(values)
            epochs.append({"sizes": sizes, "order": order})
        return {"type": "Dataset", "epochs": epochs, "decodes": decode.elements, "structure": _structure(ds),
                "reshuffles": _reshuffles(ds)}

    def judge(case, seen):
        n, batch, a, b = case["n"], case["batch"], case["a"], case["b"]
        if seen["type"] != "Dataset":
            raise Fail(tr("epoch_pipeline(source, decode, {batch}) should return a tf.data.Dataset, got a {kind}",
                          batch=batch, kind=seen["type"]))
        want = _decoded(case)
        want_sizes = [batch] * (n // batch) + ([n % batch] if n % batch else [])
        if _whole_batches_shuffled(seen["epochs"], lambda v: (v - b) // a):
            raise Fail(tr("every batch holds {batch} records that were read one after another: the shuffle came "
                          "after batch, so it shuffles whole batches and the same records stay together every epoch. "
                          "Shuffle the records first, then batch them", batch=batch))
        for i, e in enumerate(seen["epochs"]):
            if e["sizes"] != want_sizes:
                raise Fail(tr("with {n} records and batch_size={batch}, epoch {epoch} should have batch sizes "
                              "{want}, got {got}", n=n, batch=batch, epoch=i + 1, want=_sizes(want_sizes),
                              got=_sizes(e["sizes"])))
            if sorted(e["order"]) != want:
                raise Fail(tr("epoch {epoch} should deliver each decoded record once ({want}), got {got}",
                              epoch=i + 1, want=_sample(want), got=_sample(sorted(e["order"]))))
        if seen["decodes"] != n:
            raise Fail(tr("over 3 epochs of {n} records decode ran {decodes} times; with the cache in the right "
                          "place (after decode) it runs {n} times, once per record", n=n, decodes=seen["decodes"]))
        orders = [e["order"] for e in seen["epochs"]]
        if orders[0] == orders[1] == orders[2] and False in seen.get("reshuffles", []):
            raise Fail(tr("all 3 epochs came in the same order {order}...: ", order=orders[0][:8]) + _frozen_shuffle())
        if orders[0] == orders[1] == orders[2]:
            raise Fail(tr("all 3 epochs came in the same order {order}...: the order is frozen. Shuffle every "
                          "epoch, after the cache (a cache placed after shuffle replays the first epoch's order)",
                          order=orders[0][:8]))
        # A shuffle buffer of k can move a record at most k - 1 places ahead of where it was read. A full shuffle
        # moves some record at least 0.9 n ahead in one of 3 epochs (it fails to with chance < exp(-0.015 n) < 1e-7).
        ahead = max((v - b) // a - i for order in orders for i, v in enumerate(order))  # record r is read r-th
        if ahead < MIX * n:
            raise Fail(tr("over 3 epochs of {n} records no record came more than {ahead} places ahead of where it "
                          "was read: the shuffle buffer is too small to mix the data. Use a buffer of 10 000, bigger "
                          "than the data", n=n, ahead=ahead))
        chain = [(name, size) for name, size in seen["structure"] if "Options" not in name]
        last_name, last_size = chain[0] if chain else (tr("nothing"), None)
        if "Prefetch" not in last_name:
            raise Fail(tr("the pipeline should end with a prefetch, so the next batch is prepared while the "
                          "accelerator trains; it ends with {last}. Add .prefetch(tf.data.AUTOTUNE) as the last step",
                          last=last_name.strip("_").replace("Dataset", "") or last_name))
        if last_size == 0:
            raise Fail(tr("the final prefetch has a buffer of 0, which prefetches nothing: use tf.data.AUTOTUNE"))


# --------------------------------------------------------------------------- q5

NOISE = 1000  # augment(v) = NOISE * v + a random offset in [0, NOISE)


@item("q5", points=2, title="augmented_pipeline decodes once and augments afresh every epoch")
class q5:
    def cases(rng):
        n = rng.randint(150, 250)
        batch = rng.choice([b for b in range(4, 13) if n % b])
        return [{"n": n, "batch": batch, "a": rng.randint(2, 9), "b": rng.randint(-50, 50)}]

    def observe(ns, case):
        import random

        import tensorflow as tf

        from gpucourse import simulate

        a, b = case["a"], case["b"]
        noise = random.Random()  # the augmentation's own randomness, fresh at every call
        decode = simulate.Stage(0.0, lambda v: a * v + b, "decode")
        augment = simulate.Stage(0.0, lambda v: NOISE * v + noise.randrange(NOISE), "augment")
        fn = ns.function("augmented_pipeline")
        ds = fn(tf.data.Dataset.range(case["n"]), decode, augment, case["batch"])
        if not isinstance(ds, tf.data.Dataset):
            return {"type": type(ds).__name__}
        epochs = []
        for _ in range(3):
            sizes, order = [], []
            for element in ds:
                values = element.numpy().reshape(-1).tolist()
                sizes.append(len(values))
                order.extend(values)
            epochs.append({"sizes": sizes, "order": order})
        return {"type": "Dataset", "epochs": epochs, "decodes": decode.elements, "augments": augment.elements,
                "structure": _structure(ds), "reshuffles": _reshuffles(ds)}

    def judge(case, seen):
        n, batch, a, b = case["n"], case["batch"], case["a"], case["b"]
        call = f"augmented_pipeline(source, decode, augment, {batch})"
        if seen["type"] != "Dataset":
            raise Fail(tr("{call} should return a tf.data.Dataset, got a {kind}", call=call, kind=seen["type"]))
        want_sizes = [batch] * (n // batch) + ([n % batch] if n % batch else [])
        decoded = _decoded(case)
        epochs = seen["epochs"]
        for i, e in enumerate(epochs):
            if e["sizes"] != want_sizes:
                raise Fail(tr("with {n} records and batch_size={batch}, epoch {epoch} should have batch sizes "
                              "{want}, got {got}", n=n, batch=batch, epoch=i + 1, want=_sizes(want_sizes),
                              got=_sizes(e["sizes"])))
            got = sorted(v // NOISE for v in e["order"])  # augment(decode(r)) = NOISE * decode(r) + noise
            if got != decoded:
                raise Fail(tr("epoch {epoch} should deliver augment(decode(r)) for every record r once. Take away "
                              "augment's random offset and the values should be the decoded records {want}, but "
                              "they are {got}. Decode first, then augment, once each", epoch=i + 1,
                              want=_sample(decoded), got=_sample(got)))
        if seen["decodes"] != n:
            raise Fail(tr("over 3 epochs of {n} records decode ran {decodes} times; cache its results so it runs "
                          "{n} times, once per record", n=n, decodes=seen["decodes"]))
        first = {v // NOISE: v % NOISE for v in epochs[0]["order"]}
        same = sum(first[v // NOISE] == v % NOISE for v in epochs[1]["order"])
        if same > n // 2:
            raise Fail(tr("{same} of {n} records came out of augment with the same random offset in epochs 1 and 2 "
                          "(augment ran {augments} times in 3 epochs): the augmentation is frozen. A cache after "
                          "augment replays its first results; put augment after the cache", same=same, n=n,
                          augments=seen["augments"]))
        if epochs[0]["order"] and [v // NOISE for v in epochs[0]["order"]] == [v // NOISE for v in epochs[1]["order"]]:
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
