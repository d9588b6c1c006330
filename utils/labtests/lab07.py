"""Lab 07 (tf.data tuning): public tests.

Every test builds a fresh simulated workload (sleep-based reads, decodes and
training steps from gpucourse.pipeline), so timings are structural and the
thresholds can be generous. Bounds are checked on fresh random numbers, cache
placement on the workload's call counters and on the element order per epoch.
"""

from __future__ import annotations

import math
import random

from gpucourse.grading.items import Fail, expect_raises, item


def _bound(n, produce_s, step_s, parallelism):
    return produce_s + step_s + (n - 1) * max(produce_s / parallelism, step_s)


@item("q1", points=2, title="pipeline_bound: fill plus the slowest stage")
def q1(ns):
    fn = ns.function("pipeline_bound")
    rng = random.Random()
    cases = [(1, 0.05, 0.02, 1), (10, 0.03, 0.01, 1), (10, 0.03, 0.01, 3), (10, 0.03, 0.01, 6), (7, 0.01, 0.04, 2)]
    cases += [(rng.randint(2, 500), round(rng.uniform(0.001, 0.2), 4), round(rng.uniform(0.001, 0.1), 4),
               rng.randint(1, 16)) for _ in range(12)]
    for n, p, c, par in cases:
        want = _bound(n, p, c, par)
        got = fn(n, p, c, par)
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isclose(got, want, rel_tol=1e-6):
            raise Fail(f"pipeline_bound(n={n}, produce_s={p}, step_s={c}, parallelism={par}) should be "
                       f"{want:.6f} s (produce + step + (n - 1) * max(produce / parallelism, step)), got {got!r}")
    n, p, c = rng.randint(2, 50), 0.02, 0.01
    if not math.isclose(fn(n, p, c), _bound(n, p, c, 1), rel_tol=1e-6):
        raise Fail(f"pipeline_bound({n}, {p}, {c}) without parallelism should use parallelism=1 and give "
                   f"{_bound(n, p, c, 1):.6f}, got {fn(n, p, c)!r}")
    for args, what in [((0, 0.01, 0.01, 1), "n=0"), ((5, 0.01, 0.01, 0), "parallelism=0"),
                       ((5, -0.01, 0.01, 1), "produce_s=-0.01"), ((5, 0.01, -0.02, 2), "step_s=-0.02")]:
        expect_raises(lambda: fn(*args), f"pipeline_bound{args}", what)


@item("q2", points=2, title="naive_options: an honest baseline without injected prefetch")
def q2(ns):
    import tensorflow as tf
    from gpucourse.pipeline import Costs, SimulatedWorkload

    opts = ns.function("naive_options")()
    if not isinstance(opts, tf.data.Options):
        raise Fail(f"naive_options() should return a tf.data.Options, got a {type(opts).__name__}")
    if opts.experimental_optimization.inject_prefetch is not False:
        raise Fail("naive_options().experimental_optimization.inject_prefetch should be False, got "
                   f"{opts.experimental_optimization.inject_prefetch!r}")
    if opts.autotune.enabled is not False:
        raise Fail(f"naive_options().autotune.enabled should be False, got {opts.autotune.enabled!r}")
    w = SimulatedWorkload(Costs(read_s=0.0, decode_s=0.02, step_s=0.02, n=8, shards=1))
    ds = w.source(read=False).map(w.decode).with_options(opts)
    w.train(ds)
    seconds = w.train(ds)
    if sorted(w.delivered) != w.expected():
        raise Fail(f"with your options the pipeline delivered {sorted(w.delivered)}, expected {w.expected()}")
    if seconds < 0.85 * w.costs.serial_s:
        raise Fail(f"8 elements of 20 ms decode + 20 ms step took {seconds * 1e3:.0f} ms with your options; "
                   f"with nothing overlapping they take at least {w.costs.serial_s * 1e3:.0f} ms, so something "
                   "still prefetches")


def _tuned_workload():
    from gpucourse.pipeline import Costs, SimulatedWorkload

    return SimulatedWorkload(Costs(read_s=0.008, decode_s=0.048, step_s=0.032, n=16, shards=4))


@item("q3", points=4, title="tuned_pipeline reaches 1.3x of the bound and keeps the elements")
def q3(ns):
    import tensorflow as tf

    fn = ns.function("tuned_pipeline")
    w = _tuned_workload()
    ds = fn(w.source(), w.decode)
    if not isinstance(ds, tf.data.Dataset):
        raise Fail(f"tuned_pipeline(source, decode) should return a tf.data.Dataset, got a {type(ds).__name__}")
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # every overlap must be the learner's own
    # The simulated decode waits rather than computes, like I/O or a remote call: give it threads and
    # tell autotune it may use them. Otherwise tf.data's pool has one thread per core and AUTOTUNE
    # sizes itself by the CPU load it sees, and a correct pipeline fails on a busy 2-core machine.
    options.threading.private_threadpool_size = 8
    options.autotune.cpu_budget = 8
    ds = ds.with_options(options)
    n = w.costs.n
    times = []
    for epoch in range(3):  # epoch 0 is a warm-up: tracing and thread start-up are not what we grade
        reads, decodes = w.counts.reads, w.counts.decodes
        seconds = w.train(ds)
        if sorted(w.delivered) != w.expected():
            raise Fail(f"{'in a later epoch ' if epoch else ''}tuned_pipeline must deliver every decoded record "
                       f"once: expected {w.expected()}, got {sorted(w.delivered)}")
        reads, decodes = w.counts.reads - reads, w.counts.decodes - decodes
        if reads != n or decodes != n:
            raise Fail(f"in epoch {epoch + 1} of {n} records the source was read {reads} times and decode ran "
                       f"{decodes} times; both should run {n} times per epoch. Build on `source` and `decode` "
                       "(no cache here: this item is about overlapping the work, not skipping it)")
        if epoch:
            times.append(seconds)
    bound = w.costs.best_bound_s
    ratio = min(times) / bound
    if ratio > 1.3:
        c = w.costs
        raise Fail(f"16 records (read {c.read_s * 1e3:g} ms, decode {c.decode_s * 1e3:g} ms, step "
                   f"{c.step_s * 1e3:g} ms): your pipeline took {min(times) * 1e3:.0f} ms per epoch, "
                   f"{ratio:.2f}x the bound of {bound * 1e3:.0f} ms; it should be within 1.3x. Is the decode "
                   f"parallel, and does the pipeline end with a prefetch?")


def _sizes(sizes):
    """[5, 5, 5, 2] -> '3 x 5, then 2' (short enough for a message)."""
    if len(sizes) <= 6:
        return str(sizes)
    head = sizes[0]
    k = next((i for i, v in enumerate(sizes) if v != head), len(sizes))
    rest = sizes[k:]
    return f"{k} x {head}" + (f", then {rest if len(rest) > 1 else rest[0]}" if rest else "")


@item("q4", points=3, title="epoch_pipeline decodes once and reshuffles every epoch")
def q4(ns):
    import tensorflow as tf
    from gpucourse.pipeline import Costs, SimulatedWorkload

    fn = ns.function("epoch_pipeline")
    rng = random.Random()
    n = 4 * rng.randint(30, 50)  # a multiple of the 4 shards
    batch = rng.choice([b for b in range(5, 17) if n % b])  # so there is a last, smaller batch to keep
    shards = 4
    w = SimulatedWorkload(Costs(read_s=0.0, decode_s=0.0, step_s=0.0, n=n, shards=shards))
    read_pos = {2 * r + 1: i for i, r in enumerate(r for s in range(shards) for r in range(s, n, shards))}
    ds = fn(w.source(), w.decode, batch)
    if not isinstance(ds, tf.data.Dataset):
        raise Fail(f"epoch_pipeline(source, decode, {batch}) should return a tf.data.Dataset, "
                   f"got a {type(ds).__name__}")
    orders = []
    for e in range(3):
        sizes, order = [], []
        for b in ds:
            values = b.numpy().reshape(-1).tolist()
            sizes.append(len(values))
            order.extend(values)
        want_sizes = [batch] * (n // batch) + ([n % batch] if n % batch else [])
        if sizes != want_sizes:
            raise Fail(f"with {n} records and batch_size={batch}, epoch {e + 1} should have batch sizes "
                       f"{_sizes(want_sizes)}, got {_sizes(sizes)}")
        if sorted(order) != w.expected():
            raise Fail(f"epoch {e + 1} should deliver each decoded record once ({w.expected()}), "
                       f"got {sorted(order)}")
        orders.append(order)
    if w.counts.decodes != n:
        raise Fail(f"over 3 epochs of {n} records decode ran {w.counts.decodes} times; with the cache in the "
                   f"right place it runs {n} times (once per record)")
    if w.counts.reads != n:
        raise Fail(f"over 3 epochs of {n} records the source was read {w.counts.reads} times, expected {n}")
    if orders[0] == orders[1] == orders[2]:
        raise Fail(f"all 3 epochs came in the same order {orders[0][:8]}...: the order is frozen. Shuffle "
                   "every epoch, after the cache (a cache placed after shuffle replays the first epoch's order)")
    # A shuffle buffer of k can only move a record up to k - 1 places ahead of where it was read. A full
    # shuffle of n records moves some record more than n / 2 places ahead (the chance it does not is < 1e-15).
    ahead = max(read_pos[v] - i for order in orders for i, v in enumerate(order))
    if ahead < n // 2:
        raise Fail(f"over 3 epochs of {n} records no record came more than {ahead} places ahead of where it was "
                   f"read: the shuffle buffer is too small to mix the data. Use a buffer of 10 000, bigger than "
                   "the data")
