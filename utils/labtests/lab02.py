"""Public tests of lab 02 (placement): graded on device strings and behaviour, never on log text."""

import random

from gpucourse.grading.items import Fail, expect_raises, item

_TYPES = ["CPU", "GPU", "TPU", "XLA_GPU"]


def _short(name):
    """Reference: '/job:x/replica:0/task:0/device:GPU:3' -> 'GPU:3'."""
    kind, index = name.rstrip("/").rsplit("/", 1)[-1].removeprefix("device:").rsplit(":", 1)
    return f"{kind.upper()}:{int(index)}"


def _random_name(rng):
    kind = rng.choice(_TYPES)
    index = rng.choice([0, 1, rng.randint(2, 9), rng.randint(10, 99)])
    job = rng.choice(["localhost", "worker", "chief", "ps"])
    task = rng.randint(0, 12)
    spelled = kind.lower() if rng.random() < 0.25 else kind
    form = rng.randrange(5)
    name = [f"/job:{job}/replica:0/task:{task}/device:{spelled}:{index}", f"/device:{spelled}:{index}",
            f"/{spelled}:{index}", f"{spelled}:{index}", f"/job:{job}/task:{task}/device:{spelled}:{index}"][form]
    return name, f"{kind}:{index}"


def _tensor_device(got, what):
    """Short device name of the eager tensor ``got``; a learner-facing Fail if it is not one."""
    import tensorflow as tf

    if not tf.is_tensor(got) or not isinstance(getattr(got, "device", None), str) or "device:" not in got.device:
        raise Fail(f"{what} should be a TensorFlow tensor (so it knows its device), got {type(got).__name__}: "
                   "do not convert it with .numpy() or Python/NumPy arithmetic")
    return _short(got.device)


@item("q1", points=2, title="short_name turns any device string into TYPE:index")
def q1(ns):
    fn = ns.function("short_name")
    rng = random.Random()
    cases = [_random_name(rng) for _ in range(25)]
    cases += [("/job:localhost/replica:0/task:0/device:CPU:0", "CPU:0"), ("/device:GPU:12", "GPU:12"),
              ("/job:localhost/replica:0/task:3/device:gpu:2", "GPU:2")]
    rng.shuffle(cases)
    for name, want in cases:
        got = fn(name)
        if got != want:
            raise Fail(f"short_name({name!r}) should be {want!r}, got {got!r}")
    for bad in ("", "/job:localhost/replica:0/task:0", f"/job:worker/task:{rng.randint(1, 9)}"):
        expect_raises(lambda: fn(bad), f"short_name({bad!r})", "there is no device in it")


def _logical_names():
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices() if d.device_type in ("CPU", "GPU")]


@item("q2", points=2, title="run_where runs a function on the device its input lives on")
def q2(ns):
    import tensorflow as tf

    fn = ns.function("run_where")
    rng = random.Random()
    default = _short(tf.ones(1).device)  # where an op without tf.device lands
    names = [n for n in _logical_names() if _short(n) != default]
    if not names:
        raise Fail("this check needs at least two logical devices: run the setup cell at the top of the lab first")
    for name in rng.sample(names, min(len(names), 3)):
        with tf.device(name):
            x = tf.random.uniform((rng.randint(2, 6), rng.randint(2, 6)))
        scale = rng.uniform(0.5, 3.0)
        got = fn(x, lambda t: tf.reduce_sum(t * scale))
        where = _tensor_device(got, "run_where(x, fn) should return fn(x), which")
        if where != _short(x.device):
            raise Fail(f"x lives on {_short(x.device)} but the result was computed on {where}; "
                       "without tf.device TensorFlow does not follow your data, it copies it to the default device")
        want = float(tf.reduce_sum(x).numpy()) * scale
        if abs(float(got.numpy()) - want) > 1e-4 * max(1.0, abs(want)):
            raise Fail(f"run_where(x, fn) should return fn(x) = {want:.5f}, got {float(got.numpy()):.5f}")


@item("q3", points=3, title="place_strictly turns soft placement off, raises ValueError, restores the setting")
def q3(ns):
    import tensorflow as tf

    fn = ns.function("place_strictly")
    rng = random.Random()
    original = tf.config.get_soft_device_placement()
    names = _logical_names()
    n_cpu = len(tf.config.list_logical_devices("CPU"))
    n_gpu = len(tf.config.list_logical_devices("GPU"))
    missing = [f"/CPU:{n_cpu + rng.randint(0, 5)}", f"/device:GPU:{n_gpu + rng.randint(0, 5)}"]
    try:
        for before in (True, False):
            for name in rng.sample(names, min(len(names), 2)):
                tf.config.set_soft_device_placement(before)
                k = rng.randint(2, 5)
                seen = []

                def work():
                    seen.append(tf.config.get_soft_device_placement())
                    return tf.matmul(tf.ones((k, k)), tf.ones((k, k)))

                got = fn(name, work)
                now = tf.config.get_soft_device_placement()
                if now != before:
                    raise Fail(f"soft placement was {before} before place_strictly({name!r}, ...) and {now} after: "
                               "restore the previous setting")
                if seen != [False]:
                    raise Fail(f"place_strictly({name!r}, fn) should call fn() once with soft placement off; "
                               f"fn() was called {len(seen)} time(s), soft placement during the call(s): {seen}")
                where = _tensor_device(got, f"place_strictly({name!r}, fn) should return fn(), which")
                if where != _short(name):
                    raise Fail(f"place_strictly({name!r}, fn) should return fn() computed on {_short(name)}, "
                               f"got {where}")
                if float(got.numpy()[0, 0]) != k:
                    raise Fail(f"place_strictly should return fn()'s result, got {got.numpy()!r}")
            for name in missing:
                tf.config.set_soft_device_placement(before)
                try:
                    got = fn(name, lambda: tf.matmul(tf.ones((2, 2)), tf.ones((2, 2))))
                except ValueError as exc:
                    if _short(name) not in str(exc) and name not in str(exc):
                        raise Fail(f"the ValueError for {name!r} should name that device, it says: {exc}")
                except Exception as exc:
                    raise Fail(f"place_strictly({name!r}, fn) on a device that does not exist should raise "
                               f"ValueError, it raised {type(exc).__name__}")
                else:
                    where = _short(got.device) if tf.is_tensor(got) else repr(got)
                    raise Fail(f"place_strictly({name!r}, fn) should raise ValueError (no such device), but it "
                               f"returned a result on {where}: soft placement was not off")
                now = tf.config.get_soft_device_placement()
                if now != before:
                    raise Fail(f"soft placement was {before} before the failing place_strictly({name!r}, ...) and "
                               f"{now} after: restore it even when TensorFlow raises (try/finally)")
    finally:
        tf.config.set_soft_device_placement(original)


@item("q4", points=3, title="replicate_and_sum runs one replica per device and add_n's on the reduce device")
def q4(ns):
    import tensorflow as tf

    fn = ns.function("replicate_and_sum")
    rng = random.Random()
    names = _logical_names()
    others = [n for n in names if _short(n) != "CPU:0"] or names  # so a sum left on the default device fails
    for trial in range(3):
        devs = [rng.choice(names) for _ in range(rng.randint(2, 5))]
        devs[rng.randrange(len(devs))] = rng.choice(others)  # at least one replica off the default device
        reduce_on = "/CPU:0" if trial == 0 else rng.choice(others)
        size, base = rng.randint(2, 7), rng.uniform(-2.0, 2.0)

        def replica(i):
            return tf.ones((size,)) * (base + 3.0 * i)

        args = (replica, devs) if trial == 0 else (replica, devs, reduce_on)
        out = fn(*args)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Fail(f"replicate_and_sum should return (partials, total), got {type(out).__name__}")
        partials, total = out
        partials = list(partials)
        if len(partials) != len(devs):
            raise Fail(f"for devices {devs} expected {len(devs)} partial results, got {len(partials)}")
        for i, (p, d) in enumerate(zip(partials, devs)):
            where = _tensor_device(p, f"partial result {i}")
            if where != _short(d):
                raise Fail(f"partial result {i} should be computed on {_short(d)} (devices={devs}), "
                           f"it is on {where}")
            if abs(float(p.numpy()[0]) - (base + 3.0 * i)) > 1e-5:
                raise Fail(f"partial result {i} should be fn({i}), got {p.numpy()!r}")
        where = _tensor_device(total, "the total")
        if where != _short(reduce_on):
            raise Fail(f"the sum should be computed on {_short(reduce_on)} (reduce_on={reduce_on!r}), "
                       f"it is on {where}")
        want = sum(base + 3.0 * i for i in range(len(devs)))
        if tuple(total.shape) != (size,) or abs(float(total.numpy()[0]) - want) > 1e-4:
            raise Fail(f"the total for {len(devs)} replicas should be {want:.4f} in every element "
                       f"(shape ({size},)), got {total.numpy()!r}")
