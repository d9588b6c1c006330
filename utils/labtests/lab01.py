"""Lab 01 (device detection): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs (random device lists, random CUDA_VISIBLE_DEVICES values)
on the grader's side, ``observe`` calls the learner's function in the
learner's kernel and returns plain data, and ``judge`` computes the expected
answer on the grader's side. q3's expected answers for CPU devices are
measured in fresh TensorFlow processes, never in the learner's kernel.
"""

from __future__ import annotations

import functools
import subprocess
import sys

from gpucourse.grading.items import Fail, expect_raised, item, outcome

SETTINGS = ("logical_devices", "memory_growth", "memory_limit", "soft_placement",
            "intra_op_threads", "inter_op_threads")


def _device_names(kind_counts: dict, logical: bool, rng) -> list[str]:
    """Shuffled device names, e.g. {'GPU': [1, 12], 'CPU': [0]} -> ['/device:GPU:12', ...]."""
    prefix = "/device:" if logical else "/physical_device:"
    names = [f"{prefix}{kind}:{i}" for kind, idx in kind_counts.items() for i in idx]
    rng.shuffle(names)
    return names


def _devices(names: list[str], logical: bool) -> list:
    """Real tf.config device tuples with these names (built in the learner's kernel)."""
    import tensorflow as tf

    cls = tf.config.LogicalDevice if logical else tf.config.PhysicalDevice
    return [cls(name=n, device_type=n.split(":")[-2]) for n in names]


def _kind(name: str) -> str:
    return name.split(":")[-2]


def _index(name: str) -> int:
    return int(name.rsplit(":", 1)[1])


def _type_index(name: str) -> tuple[str, str]:
    """'/device:GPU:3', '/GPU:3', 'GPU:3' -> ('GPU', '3')."""
    parts = name.split(":")
    return (parts[-2].split("/")[-1].upper(), parts[-1]) if len(parts) >= 2 else (name, "")


def _type_name(value) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


# --------------------------------------------------------------------------- q1


@item("q1", points=2, title="summarise_devices counts devices by type")
class q1:
    def cases(rng):
        counts = [{}, {"CPU": [0]}, {"CPU": [0], "GPU": [0, 1, 2]},
                  {"GPU": list(range(rng.randint(1, 9))), "CPU": [0, 1], "TPU": [0, 1, 2, 3]}]
        out = [{"names": _device_names(c, logical, rng), "logical": logical} for c in counts
               for logical in (False, True)]
        return out + [{"real": True}]

    def observe(ns, case):
        import tensorflow as tf

        fn = ns.function("summarise_devices")
        if case.get("real"):
            real = tf.config.list_physical_devices()
            got = fn(real)
            return {"got": got, "type": _type_name(got), "names": [d.name for d in real]}
        devices = _devices(case["names"], case["logical"])
        before = list(devices)
        got = fn(devices)
        return {"got": got, "type": _type_name(got), "mutated": devices != before}

    def judge(case, seen):
        names = seen["names"] if case.get("real") else case["names"]
        want = {}
        for n in names:
            want[_kind(n)] = want.get(_kind(n), 0) + 1
        if seen["type"] != "dict":
            raise Fail(f"summarise_devices should return a dict like {{'CPU': 1, 'GPU': 2}}, got a {seen['type']}")
        where = "this machine's tf.config.list_physical_devices()" if case.get("real") else names
        if seen["got"] != want:
            raise Fail(f"for {where} expected {want}, got {seen['got']}")
        if seen.get("mutated"):
            raise Fail("summarise_devices changed the list it was given; it should only read it")


# --------------------------------------------------------------------------- q2


def _pick(names: list[str]) -> str | None:
    """Reference: the lowest-numbered GPU, else the lowest-numbered CPU (as a logical device name)."""
    for kind in ("GPU", "CPU"):
        found = [n for n in names if _kind(n) == kind]
        if found:
            return min(found, key=_index)
    return None


@item("q2", points=3, title="pick_device prefers the lowest-numbered GPU, else CPU")
class q2:
    def cases(rng):
        gpus = sorted(rng.sample(range(1, 16), rng.randint(2, 4)))
        counts = [{"CPU": [0]}, {"CPU": [0, 1, 2]}, {"CPU": [0], "GPU": gpus},
                  {"CPU": [0], "GPU": [2, 10]},  # numeric, not alphabetical, order
                  {"TPU": [0, 1], "CPU": [2, 10]}]  # no GPU: the lowest CPU, never another type
        return [{"names": _device_names(c, True, rng)} for c in counts] + [{"empty": True}, {"real": True}]

    def observe(ns, case):
        import tensorflow as tf

        fn = ns.function("pick_device")
        if case.get("empty"):
            return outcome(lambda: fn([]))
        if case.get("real"):
            real = tf.config.list_logical_devices()
            name = fn(real)
            placed = None
            if isinstance(name, str):
                try:
                    with tf.device(name):
                        placed = tf.ones(3).device
                except Exception as exc:  # an invalid device string: the judge says so
                    placed = f"error: {type(exc).__name__}: {exc}"
            return {"got": name, "names": [d.name for d in real], "placed": placed}
        return {"got": fn(_devices(case["names"], True))}

    def judge(case, seen):
        if case.get("empty"):
            return expect_raised(seen, "pick_device([])", "there is no device to pick")
        names = seen["names"] if case.get("real") else case["names"]
        want = _pick(names)
        got = seen["got"]
        if got != want:
            hint = ""
            if isinstance(got, str) and _type_index(got) == _type_index(want):
                hint = f" Return the device's own `.name` ({want!r}), not a name you build yourself."
            elif not isinstance(got, str):
                hint = " Return the device's `.name` (a string), not the device object."
            elif got in names and _kind(got) == _kind(want):
                hint = " Compare the indices as numbers: GPU:2 comes before GPU:10."
            raise Fail(f"for {names} expected {want!r}, got {got!r}.{hint}")
        if case.get("real") and not str(seen["placed"]).endswith(want.split(":", 1)[1]):
            raise Fail(f"a tensor created under tf.device({got!r}) landed on {seen['placed']}")


# --------------------------------------------------------------------------- q3

_GPU_RULES = {  # documented TensorFlow behaviour on GPUs: allowed before / after the runtime starts
    "logical_devices": (True, False), "memory_growth": (True, False), "memory_limit": (True, False),
    "soft_placement": (True, True), "intra_op_threads": (True, False), "inter_op_threads": (True, False),
}

_PROBE = r"""
import sys, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
if sys.argv[1] == "1":
    tf.constant(1.0) + 1.0
n = len(tf.config.get_logical_device_configuration(cpu) or [None]) + 1
tries = {
    "logical_devices": lambda: tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n),
    "memory_growth": lambda: tf.config.experimental.set_memory_growth(cpu, True),
    "memory_limit": lambda: tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration(memory_limit=256)]),
    "soft_placement": lambda: tf.config.set_soft_device_placement(tf.config.get_soft_device_placement()),
    "intra_op_threads": lambda: tf.config.threading.set_intra_op_parallelism_threads(1),
    "inter_op_threads": lambda: tf.config.threading.set_inter_op_parallelism_threads(1),
}
out = {}
for k, f in tries.items():
    try:
        f(); out[k] = True
    except (RuntimeError, ValueError):
        out[k] = False
print(repr(out))
"""


@functools.lru_cache(maxsize=None)
def _cpu_truth(started: bool) -> dict:
    """Ask a fresh TensorFlow process which CPU settings it accepts (before/after the runtime starts)."""
    import ast
    import os

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1")
    proc = subprocess.run([sys.executable, "-c", _PROBE, "1" if started else "0"], capture_output=True,
                          text=True, timeout=120, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"probe process failed: {proc.stderr[-500:]}")
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


@item("q3", points=3, title="config_allowed knows which settings can still change")
class q3:
    def cases(rng):
        combos = [{"setting": s, "device": d, "started": st} for s in SETTINGS for d in ("CPU", "GPU")
                  for st in (False, True)]
        rng.shuffle(combos)
        return combos + [{"setting": bad, "device": "GPU", "started": False, "bad": True}
                         for bad in ("mem_fraction", "virtual_devices")]

    def observe(ns, case):
        fn = ns.function("config_allowed")
        if case.get("bad"):
            return outcome(lambda: fn(case["setting"], case["device"], case["started"]))
        got = fn(case["setting"], case["device"], case["started"])
        return {"got": got, "type": _type_name(got)}

    def judge(case, seen):
        setting, dev, started = case["setting"], case["device"], case["started"]
        if case.get("bad"):
            return expect_raised(seen, f"config_allowed({setting!r}, ...)", "that setting does not exist")
        if seen["type"] != "bool":
            raise Fail(f"config_allowed should return True or False, got {seen['got']!r}")
        want = _cpu_truth(started)[setting] if dev == "CPU" else _GPU_RULES[setting][int(started)]
        if seen["got"] != want:
            when = "after" if started else "before"
            raise Fail(f"config_allowed({setting!r}, {dev!r}, runtime_started={started}) returned {seen['got']}, "
                       f"but TensorFlow {'accepts' if want else 'rejects'} that {when} the runtime starts")


# --------------------------------------------------------------------------- q4


def _visible(value, physical):
    """Reference: how many GPUs CUDA exposes for CUDA_VISIBLE_DEVICES=value."""
    if value is None:
        return physical
    seen = []
    for tok in value.split(","):
        tok = tok.strip()
        if not tok.isdigit() or int(tok) >= physical:
            break
        seen.append(int(tok))
    return len(seen)


@item("q4", points=2, title="visible_gpu_count reads CUDA_VISIBLE_DEVICES like CUDA does")
class q4:
    def cases(rng):
        n = rng.randint(3, 8)
        perm = rng.sample(range(n), rng.randint(1, n))
        pairs = [(None, n), ("", n), ("-1", n), ("0", n), (",".join(map(str, perm)), n),
                 (f"0,{n + 2},1", n), ("1,0", 2), ("0,1", 1), ("GPU-0", n)]
        return [{"value": v, "physical": p} for v, p in pairs]

    def observe(ns, case):
        got = ns.function("visible_gpu_count")(case["value"], case["physical"])
        return {"got": got, "type": _type_name(got)}

    def judge(case, seen):
        value, physical = case["value"], case["physical"]
        if seen["type"] not in ("int", "int64", "int32"):
            raise Fail(f"visible_gpu_count should return a whole number (int), got {seen['got']!r} "
                       f"({seen['type']}) for ({value!r}, {physical})")
        want = _visible(value, physical)
        if seen["got"] != want:
            raise Fail(f"visible_gpu_count({value!r}, {physical}) should be {want}, got {seen['got']!r}")
