"""Lab 02 (placement): public tests, graded on device strings and behaviour, never on log text.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs on the grader's side (random device names, values, and
*which* of the learner's logical devices to use, as fractions, because the
grader cannot see the learner's devices); ``observe`` builds the tensors in
the learner's kernel, calls the learner's function and reports plain facts
(devices, values, soft-placement settings); ``judge`` computes the expected
answers on the grader's side and says what to fix.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

from gpucourse.grading.items import Fail, expect_raised, in_kernel, item, outcome, tr

_TYPES = ["CPU", "GPU", "TPU", "XLA_GPU"]


def _short(name: str) -> str:
    """Reference: '/job:x/replica:0/task:0/device:GPU:3' -> 'GPU:3'."""
    kind, index = name.strip().rstrip("/").rsplit("/", 1)[-1].removeprefix("device:").rsplit(":", 1)
    return f"{kind.upper()}:{int(index)}"


def _random_name(rng) -> str:
    kind = rng.choice(_TYPES)
    index = rng.choice([0, 1, rng.randint(2, 9), rng.randint(10, 99)])
    job = rng.choice(["localhost", "worker", "chief", "ps"])
    task = rng.randint(0, 12)
    spelled = kind.lower() if rng.random() < 0.25 else kind
    return rng.choice([f"/job:{job}/replica:0/task:{task}/device:{spelled}:{index}", f"/device:{spelled}:{index}",
                       f"/{spelled}:{index}", f"{spelled}:{index}", f"/job:{job}/task:{task}/device:{spelled}:{index}"])


# --------------------------------------------------------------------------- learner-side helpers (observe only)


def _tensor_facts(value) -> dict:
    """Plain facts about what the learner returned: is it an eager tensor, where does it live, its values."""
    import tensorflow as tf

    facts = {"type": type(value).__name__, "is_tensor": False, "device": None, "value": None, "shape": None}
    if tf.is_tensor(value) and isinstance(getattr(value, "device", None), str) and "device:" in value.device:
        facts.update(is_tensor=True, device=value.device, shape=list(value.shape), value=value.numpy().tolist())
    return facts


def _logical_names() -> list[str]:
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices() if d.device_type in ("CPU", "GPU")]


def _pick(names: list[str], fraction: float) -> str:
    return names[min(int(fraction * len(names)), len(names) - 1)]


def _runtime_soft_placement() -> bool:
    """Does the eager runtime really fall back from a missing device? (Not what the setting says.)"""
    import tensorflow as tf

    missing = f"/device:CPU:{len(tf.config.list_logical_devices('CPU')) + 11}"
    try:
        with tf.device(missing):
            tf.zeros(())
        return True
    except tf.errors.InvalidArgumentError:
        return False


def _not_a_tensor(facts: dict, what: str) -> str | None:
    if facts["is_tensor"]:
        return None
    return tr("{what} should be a TensorFlow tensor (so it knows its device), got a {kind}: "
              "do not convert it with .numpy() or Python/NumPy arithmetic", what=what, kind=facts["type"])


def _close(got, want, tol: float = 1e-4) -> bool:
    return isinstance(got, (int, float)) and abs(got - want) <= tol * max(1.0, abs(want))


# --------------------------------------------------------------------------- q1


@item("q1", points=2, title="short_name turns any device string into TYPE:index")
class q1:
    def cases(rng):
        names = [_random_name(rng) for _ in range(25)]
        names += ["/job:localhost/replica:0/task:0/device:CPU:0", "/device:GPU:12",
                  "/job:localhost/replica:0/task:3/device:gpu:2", f"/device:XLA_GPU:{rng.randint(0, 9)}"]
        rng.shuffle(names)
        bad = ["", "/job:localhost/replica:0/task:0", f"/job:worker/task:{rng.randint(1, 9)}"]
        return [{"name": n} for n in names] + [{"name": b, "bad": True} for b in bad]

    def observe(ns, case):
        fn = ns.function("short_name")
        return outcome(lambda: fn(case["name"]))

    def judge(case, seen):
        name = case["name"]
        if case.get("bad"):
            return expect_raised(seen, f"short_name({name!r})", "there is no device in it")
        want = _short(name)
        if "raised" in seen:
            raise Fail(tr("short_name({name}) should be {want}, but it raised {raised}: {message}", name=repr(name),
                          want=repr(want), raised=seen["raised"], message=seen["message"]))
        got = seen["value"]
        if got == want:
            return
        hint = ""
        if isinstance(got, str) and ("/" in got or "job:" in got or "device:" in got):
            hint = tr(" Keep only the last part, TYPE:index: drop the job, replica, task and 'device:'.")
        elif isinstance(got, str) and got.upper() == want:
            hint = tr(" Write the type in upper case (TensorFlow accepts 'gpu:1', but prints 'GPU:1').")
        elif "_" in want:
            hint = tr(" Device types can contain '_' (XLA_GPU): split on the last ':' only.")
        raise Fail(tr("short_name({name}) should be {want}, got {got}.{hint}", name=repr(name), want=repr(want),
                      got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q2


@in_kernel
def _q2_observe(ns, case):
    import tensorflow as tf

    fn = ns.function("run_where")
    default = tf.ones(1).device  # where an op without tf.device lands
    names = [n for n in _logical_names() if _short(n) != _short(default)]
    if not names:
        return {"names": []}
    name = _pick(names, case["pick"])
    with tf.device(name):
        x = tf.reshape(tf.constant(case["values"], tf.float32), case["shape"])
    scale = case["scale"]
    got = fn(x, lambda t: tf.reduce_sum(t * scale))
    return {"names": names, "x_device": x.device, "got": _tensor_facts(got)}


@item("q2", points=2, title="run_where runs a function on the device its input lives on")
class q2:
    def cases(rng):
        out = []
        for _ in range(3):
            rows, cols = rng.randint(2, 5), rng.randint(2, 5)
            out.append({"pick": rng.random(), "shape": [rows, cols], "scale": round(rng.uniform(0.5, 3.0), 3),
                        "values": [round(rng.uniform(-1, 1), 3) for _ in range(rows * cols)]})
        return out

    def observe(ns, case):
        return ns.kernel(_q2_observe, case)

    def judge(case, seen):
        if not seen["names"]:
            raise Fail(tr("this check needs at least two logical devices: run the setup cell at the top of the lab "
                          "first (it splits the device), then this cell again"))
        got, where_x = seen["got"], _short(seen["x_device"])
        problem = _not_a_tensor(got, tr("run_where(x, fn) should return fn(x), which"))
        if problem:
            raise Fail(problem)
        if _short(got["device"]) != where_x:
            raise Fail(tr("x lives on {where_x} but the result was computed on {where}; without tf.device "
                          "TensorFlow does not follow your data, it copies it to the default device", where_x=where_x,
                          where=_short(got["device"])))
        want = sum(case["values"]) * case["scale"]
        if not _close(got["value"], want):
            raise Fail(tr("run_where(x, fn) should return fn(x) = {want:.5f} (x of shape {shape}), got {got}",
                          want=want, shape=case["shape"], got=repr(got["value"])))


# --------------------------------------------------------------------------- q3


@in_kernel
def _q3_observe(ns, case):
    import tensorflow as tf

    fn = ns.function("place_strictly")
    soft0, log0 = tf.config.get_soft_device_placement(), tf.debugging.get_log_device_placement()
    if "missing" in case:
        n = len(tf.config.list_logical_devices(case["missing"]))
        name = (f"/CPU:{n + case['offset']}" if case["missing"] == "CPU"
                else f"/device:GPU:{n + case['offset']}")
    else:  # off the default device, so that a result computed in the wrong place shows
        default = _short(tf.ones(1).device)
        names = _logical_names()
        name = _pick([n for n in names if _short(n) != default] or names, case["pick"])
    k = case.get("k", 2)
    calls = []

    def work():
        calls.append([tf.config.get_soft_device_placement(), _runtime_soft_placement()])
        return tf.matmul(tf.ones((k, k)), tf.ones((k, k)))

    tf.config.set_soft_device_placement(case["before"])
    try:
        seen = outcome(lambda: _tensor_facts(fn(name, work)))
        seen.update(name=name, calls=calls, soft_after=tf.config.get_soft_device_placement(),
                    runtime_after=_runtime_soft_placement())
        return seen
    finally:  # the log flag first: in TF 2.21 setting it also sets the runtime's soft placement
        tf.debugging.set_log_device_placement(log0)
        tf.config.set_soft_device_placement(soft0)


@item("q3", points=3, title="place_strictly turns soft placement off, raises ValueError, restores the setting")
class q3:
    def cases(rng):
        out = []
        for before in (True, False):
            group = [{"before": before, "pick": rng.random(), "k": rng.randint(2, 5)} for _ in range(2)]
            group += [{"before": before, "missing": kind, "offset": rng.randint(0, 5)} for kind in ("CPU", "GPU")]
            rng.shuffle(group)
            out += group
        return out

    def observe(ns, case):
        return ns.kernel(_q3_observe, case)

    def judge(case, seen):
        name, before = seen["name"], case["before"]
        call = f"place_strictly({name!r}, fn)"
        if "missing" in case:
            if "raised" not in seen:
                got = seen["value"]
                where = _short(got["device"]) if got["is_tensor"] else tr("a {kind}", kind=got["type"])
                raise Fail(tr("{call} should raise ValueError ({name} does not exist), but it returned a result on "
                              "{where}: soft placement was still on (turn it off with "
                              "tf.config.set_soft_device_placement(False))", call=call, name=name, where=where))
            expect_raised(seen, call, tr("{name} does not exist: turn TensorFlow's InvalidArgumentError into a "
                                         "ValueError", name=name))
            if _short(name) not in seen["message"] and name not in seen["message"]:
                raise Fail(tr("the ValueError for {name} should name that device, it says: {message}",
                              name=repr(name), message=seen["message"]))
        else:
            if "raised" in seen:
                raise Fail(tr("{call} raised {raised} although {name} exists: {message}", call=call,
                              raised=seen["raised"], name=name, message=seen["message"]))
            calls = seen["calls"]
            if len(calls) != 1:
                raise Fail(tr("{call} should call fn() exactly once, with soft placement off; it called it "
                              "{n} time(s)", call=call, n=len(calls)))
            setting, runtime = calls[0]
            if setting and not runtime:
                raise Fail(tr("during fn() tf.config.get_soft_device_placement() said True while the runtime had "
                              "soft placement off: that is what tf.debugging.set_log_device_placement(False) does "
                              "after the first op (a TF 2.21 bug). Turn soft placement off with "
                              "tf.config.set_soft_device_placement(False)"))
            if setting:
                raise Fail(tr("soft placement was still on while {call} ran fn(): turn it off with "
                              "tf.config.set_soft_device_placement(False) first", call=call))
            got = seen["value"]
            problem = _not_a_tensor(got, tr("{call} should return fn(), which", call=call))
            if problem:
                raise Fail(problem)
            if _short(got["device"]) != _short(name):
                raise Fail(tr("{call} should return fn() computed on {want}, got {got}", call=call, want=_short(name),
                              got=_short(got["device"])))
            if got["value"] != [[float(case["k"])] * case["k"]] * case["k"]:
                raise Fail(tr("{call} should return fn()'s result, got {got}", call=call, got=repr(got["value"])))
        after = seen["soft_after"]
        if after != before:
            said = tr("soft placement was {before} before {call} and {after} after", before=before, call=call,
                      after=after)
            if after:
                raise Fail(tr("{said}: put back the value you read with tf.config.get_soft_device_placement() "
                              "before the call, not True", said=said))
            if "missing" in case:
                raise Fail(tr("{said} TensorFlow raised: restore it in a finally block, so that it is restored even "
                              "when the call fails", said=said))
            raise Fail(tr("{said}: restore the previous setting (read it with tf.config.get_soft_device_placement() "
                          "first)", said=said))
        if seen["soft_after"] and not seen["runtime_after"]:
            raise Fail(tr("after {call} tf.config.get_soft_device_placement() says True but the runtime's soft "
                          "placement is off: do not call tf.debugging.set_log_device_placement(False) (in TF 2.21 it "
                          "switches soft placement off); use tf.config.set_soft_device_placement", call=call))


# --------------------------------------------------------------------------- q4


@in_kernel
def _q4_observe(ns, case):
    import tensorflow as tf

    fn = ns.function("replicate_and_sum")
    names = _logical_names()
    others = [n for n in names if _short(n) != "CPU:0"] or names  # so a sum left on the default device fails
    devs = [_pick(names, p) for p in case["picks"]]
    devs[case["off"]] = _pick(others, case["off_pick"])  # at least one replica off the default device
    reduce_on = "/CPU:0" if case["reduce_pick"] is None else _pick(others, case["reduce_pick"])
    size, base = case["size"], case["base"]
    called = []

    def replica(i):
        called.append(i if isinstance(i, int) else repr(i))
        return tf.ones((size,)) * (base + 3.0 * i)

    out = fn(replica, devs) if case["reduce_pick"] is None else fn(replica, devs, reduce_on)
    seen = {"devs": devs, "reduce_on": reduce_on, "called": called, "returned": type(out).__name__}
    if isinstance(out, (tuple, list)) and len(out) == 2:
        partials, total = out
        seen["partials"] = [_tensor_facts(p) for p in partials] if isinstance(partials, (list, tuple)) else None
        seen["total"] = _tensor_facts(total)
    return seen


@item("q4", points=3, title="replicate_and_sum runs one replica per device and add_n's on the reduce device")
class q4:
    def cases(rng):
        out = []
        for trial in range(3):
            n = rng.randint(2, 5)
            out.append({"picks": [rng.random() for _ in range(n)], "off": rng.randrange(n), "off_pick": rng.random(),
                        "reduce_pick": None if trial == 0 else rng.random(), "size": rng.randint(2, 7),
                        "base": round(rng.uniform(-2.0, 2.0), 3)})
        return out

    def observe(ns, case):
        return ns.kernel(_q4_observe, case)

    def judge(case, seen):
        devs, reduce_on = seen["devs"], seen["reduce_on"]
        if "total" not in seen:
            raise Fail(tr("replicate_and_sum should return a pair (partials, total), got a {kind}",
                          kind=seen["returned"]))
        partials = seen["partials"]
        if partials is None:
            raise Fail(tr("the first element of the pair should be the list of partial results"))
        if len(partials) != len(devs):
            raise Fail(tr("for devices {devs} expected {want} partial results, got {got}", devs=devs, want=len(devs),
                          got=len(partials)))
        if sorted(map(str, seen["called"])) != sorted(map(str, range(len(devs)))):
            raise Fail(tr("for {n} devices fn should be called with 0 .. {last}, one call each; it was called with "
                          "{called}", n=len(devs), last=len(devs) - 1, called=seen["called"]))
        for i, (p, d) in enumerate(zip(partials, devs)):
            problem = _not_a_tensor(p, tr("partial result {i}", i=i))
            if problem:
                raise Fail(problem)
            if _short(p["device"]) != _short(d):
                raise Fail(tr("partial result {i} should be computed on {want} (devices={devs}), it is on {got}: "
                              "run fn(i) under tf.device(devices[i])", i=i, want=_short(d), devs=devs,
                              got=_short(p["device"])))
            if not _close(p["value"][0], case["base"] + 3.0 * i, 1e-5):
                raise Fail(tr("partial result {i} should be fn({i}), got {got}", i=i, got=repr(p["value"])))
        total = seen["total"]
        problem = _not_a_tensor(total, tr("the total"))
        if problem:
            raise Fail(problem)
        if _short(total["device"]) != _short(reduce_on):
            raise Fail(tr("the sum should be computed on {want} (reduce_on={reduce_on}), it is on {got}: call "
                          "tf.add_n under tf.device(reduce_on)", want=_short(reduce_on), reduce_on=repr(reduce_on),
                          got=_short(total["device"])))
        want = sum(case["base"] + 3.0 * i for i in range(len(devs)))
        size = case["size"]
        if total["shape"] != [size] or not all(_close(v, want) for v in total["value"]):
            raise Fail(tr("the total of {n} replicas should be {want:.4f} in every element (shape ({size},), what "
                          "tf.add_n gives), got {got} of shape {shape}", n=len(devs), want=want, size=size,
                          got=repr(total["value"]), shape=tuple(total["shape"])))
