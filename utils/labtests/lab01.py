"""Lab 01 (device detection): public tests.

Every test builds fresh inputs (random device lists, random CUDA_VISIBLE_DEVICES
values) and checks behaviour; q3's expected answers for CPU devices are measured
live against TensorFlow itself.
"""

from __future__ import annotations

import functools
import numbers
import random
import subprocess
import sys

from gpucourse.grading.items import Fail, expect_raises, item

SETTINGS = ("logical_devices", "memory_growth", "memory_limit", "soft_placement",
            "intra_op_threads", "inter_op_threads")


def _devices(kind_counts: dict, logical: bool, rng: random.Random):
    """A shuffled list of fake-but-real tf.config device tuples, e.g. {'GPU': [1, 12], 'CPU': [0]}."""
    import tensorflow as tf

    cls = tf.config.LogicalDevice if logical else tf.config.PhysicalDevice
    prefix = "/device:" if logical else "/physical_device:"
    out = [cls(name=f"{prefix}{kind}:{i}", device_type=kind) for kind, idx in kind_counts.items() for i in idx]
    rng.shuffle(out)
    return out


@item("q1", points=2, title="summarise_devices counts devices by type")
def q1(ns):
    import tensorflow as tf

    fn = ns.function("summarise_devices")
    rng = random.Random()
    cases = [{}, {"CPU": [0]}, {"CPU": [0], "GPU": [0, 1, 2]},
             {"GPU": list(range(rng.randint(1, 9))), "CPU": [0, 1], "TPU": [0, 1, 2, 3]}]
    for counts in cases:
        for logical in (False, True):
            devices = _devices(counts, logical, rng)
            before = list(devices)
            got = fn(devices)
            want = {k: len(v) for k, v in counts.items() if v}
            if not isinstance(got, dict):
                raise Fail(f"summarise_devices should return a dict like {{'CPU': 1, 'GPU': 2}}, "
                           f"got a {type(got).__name__}")
            if got != want:
                raise Fail(f"for {[d.name for d in devices]} expected {want}, got {got}")
            if devices != before:
                raise Fail("summarise_devices changed the list it was given; it should only read it")
    real = tf.config.list_physical_devices()
    want = {}
    for d in real:
        want[d.device_type] = want.get(d.device_type, 0) + 1
    if fn(real) != want:
        raise Fail(f"on this machine's tf.config.list_physical_devices() expected {want}, got {fn(real)}")


@item("q2", points=3, title="pick_device prefers the lowest-numbered GPU, else CPU")
def q2(ns):
    import tensorflow as tf

    fn = ns.function("pick_device")
    rng = random.Random()
    gpus = sorted(rng.sample(range(1, 16), rng.randint(2, 4)))
    cases = [
        ({"CPU": [0]}, "/device:CPU:0"),
        ({"CPU": [0, 1, 2]}, "/device:CPU:0"),
        ({"CPU": [0], "GPU": gpus}, f"/device:GPU:{gpus[0]}"),
        ({"CPU": [0], "GPU": [2, 10]}, "/device:GPU:2"),  # numeric, not alphabetical, order
        ({"TPU": [0, 1], "CPU": [2, 10]}, "/device:CPU:2"),  # no GPU: the lowest CPU, never another type
    ]
    for counts, want in cases:
        devices = _devices(counts, True, rng)
        got = fn(devices)
        if got != want:
            raise Fail(f"for {[d.name for d in devices]} expected {want!r}, got {got!r}")
    expect_raises(lambda: fn([]), "pick_device([])", "there is no device to pick")
    # And the answer must actually work with tf.device on this machine.
    name = fn(tf.config.list_logical_devices())
    with tf.device(name):
        x = tf.ones(3)
    if not x.device.endswith(name.split(":", 1)[1]):
        raise Fail(f"a tensor created under tf.device({name!r}) landed on {x.device}")


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
def q3(ns):
    fn = ns.function("config_allowed")
    rng = random.Random()
    combos = [(s, d, st) for s in SETTINGS for d in ("CPU", "GPU") for st in (False, True)]
    rng.shuffle(combos)
    for setting, dev, started in combos:
        want = _cpu_truth(started)[setting] if dev == "CPU" else _GPU_RULES[setting][int(started)]
        got = fn(setting, dev, started)
        if not isinstance(got, bool):
            raise Fail(f"config_allowed should return True or False, got {got!r}")
        if got != want:
            when = "after" if started else "before"
            raise Fail(f"config_allowed({setting!r}, {dev!r}, runtime_started={started}) returned {got}, but "
                       f"TensorFlow {'accepts' if want else 'rejects'} that {when} the runtime starts")
    for bad in ("mem_fraction", "virtual_devices"):
        expect_raises(lambda: fn(bad, "GPU", False), f"config_allowed({bad!r}, ...)", "that setting does not exist")


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
def q4(ns):
    fn = ns.function("visible_gpu_count")
    rng = random.Random()
    n = rng.randint(3, 8)
    perm = rng.sample(range(n), rng.randint(1, n))
    cases = [(None, n), ("", n), ("-1", n), ("0", n), (",".join(map(str, perm)), n),
             (f"0,{n + 2},1", n), ("1,0", 2), ("0,1", 1), ("GPU-0", n)]
    for value, physical in cases:
        want = _visible(value, physical)
        got = fn(value, physical)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise Fail(f"visible_gpu_count should return a whole number (int), got {got!r} "
                       f"({type(got).__name__}) for ({value!r}, {physical})")
        if got != want:
            raise Fail(f"visible_gpu_count({value!r}, {physical}) should be {want}, got {got!r}")
