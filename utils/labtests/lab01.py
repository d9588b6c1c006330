"""Lab 01 (device detection): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases``
draws fresh inputs (random device lists, random CUDA_VISIBLE_DEVICES values)
on the grader's side, ``observe`` calls the learner's function in the
learner's kernel and returns plain data, and ``judge`` computes the expected
answer on the grader's side. q3's expected answers for CPU devices are
measured in fresh TensorFlow processes, never in the learner's kernel.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import functools

from gpucourse.grading.items import Fail, expect_raised, in_kernel, item, outcome, tr

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


def _dict_or_type(value) -> str:
    """'dict' for any mapping type (a collections.Counter is a fine answer), else the type's name."""
    return "dict" if isinstance(value, dict) else _type_name(value)


# --------------------------------------------------------------------------- q1


@in_kernel
def _q1_observe(ns, case):
    import tensorflow as tf

    fn = ns.function("summarise_devices")
    if case.get("real"):
        real = tf.config.list_physical_devices()
        got = fn(real)
        return {"got": got, "type": _dict_or_type(got), "names": [d.name for d in real]}
    devices = _devices(case["names"], case["logical"])
    before = list(devices)
    got = fn(devices)
    return {"got": got, "type": _dict_or_type(got), "mutated": devices != before}


@item("q1", points=2, title="summarise_devices counts devices by type")
class q1:
    def cases(rng):
        counts = [{}, {"CPU": [0]}, {"CPU": [0], "GPU": [0, 1, 2]},
                  {"GPU": list(range(rng.randint(1, 9))), "CPU": [0, 1], "TPU": [0, 1, 2, 3]}]
        out = [{"names": _device_names(c, logical, rng), "logical": logical} for c in counts
               for logical in (False, True)]
        return out + [{"real": True}]

    def observe(ns, case):
        return ns.kernel(_q1_observe, case)

    def judge(case, seen):
        names = seen["names"] if case.get("real") else case["names"]
        want = {}
        for n in names:
            want[_kind(n)] = want.get(_kind(n), 0) + 1
        if seen["type"] != "dict":
            raise Fail(tr("summarise_devices should return a dict like {example}, got a {kind}",
                          example="{'CPU': 1, 'GPU': 2}", kind=seen["type"]))
        where = tr("this machine's tf.config.list_physical_devices()") if case.get("real") else names
        if seen["got"] != want:
            hint = ""
            if set(seen["got"]) - set(want):
                hint = tr(" Count the devices in the list you were given (it may not be this machine's): "
                          "look at each device's .device_type.")
            raise Fail(tr("for {where} expected {want}, got {got}.{hint}", where=where, want=want, got=seen["got"],
                          hint=hint))
        if seen.get("mutated"):
            raise Fail(tr("summarise_devices changed the list it was given; it should only read it"))


# --------------------------------------------------------------------------- q2


def _pick(names: list[str]) -> str | None:
    """Reference: the lowest-numbered GPU, else the lowest-numbered CPU (as a logical device name)."""
    for kind in ("GPU", "CPU"):
        found = [n for n in names if _kind(n) == kind]
        if found:
            return min(found, key=_index)
    return None


@in_kernel
def _q2_observe(ns, case):
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


@item("q2", points=3, title="pick_device prefers the lowest-numbered GPU, else CPU")
class q2:
    def cases(rng):
        gpus = sorted(rng.sample(range(1, 16), rng.randint(2, 4)))
        counts = [{"CPU": [0]}, {"CPU": [0, 1, 2]}, {"CPU": [0], "GPU": gpus},
                  {"CPU": [0], "GPU": [2, 10]},  # numeric, not alphabetical, order
                  {"TPU": [0, 1], "CPU": [2, 10]}]  # no GPU: the lowest CPU, never another type
        return [{"names": _device_names(c, True, rng)} for c in counts] + [{"empty": True}, {"real": True}]

    def observe(ns, case):
        return ns.kernel(_q2_observe, case)

    def judge(case, seen):
        if case.get("empty"):
            return expect_raised(seen, "pick_device([])", "there is no device to pick")
        names = seen["names"] if case.get("real") else case["names"]
        want = _pick(names)
        got = seen["got"]
        if got != want:
            hint = ""
            if isinstance(got, str) and _type_index(got) == _type_index(want):
                hint = tr(" Return the device's own `.name` ({want}), not a name you build yourself.", want=repr(want))
            elif not isinstance(got, str):
                hint = tr(" Return the device's `.name` (a string), not the device object.")
            elif got in names and _kind(got) == _kind(want):
                hint = tr(" Compare the indices as numbers: GPU:2 comes before GPU:10.")
            elif got in names:
                hint = tr(" Prefer a GPU, else a CPU; never a {kind}.", kind=_kind(got))
            raise Fail(tr("for {where} expected {want}, got {got}.{hint}", where=names, want=repr(want),
                          got=repr(got), hint=hint))
        if case.get("real") and not str(seen["placed"]).endswith(want.split(":", 1)[1]):
            raise Fail(tr("a tensor created under tf.device({name}) landed on {placed}", name=repr(got),
                          placed=seen["placed"]))


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
emit(out)
"""


@functools.lru_cache(maxsize=None)
def _cpu_truth(started: bool) -> dict:
    """Ask a fresh TensorFlow process which CPU settings it accepts (before/after the runtime starts)."""
    from gpucourse import _probe

    return _probe.run(_PROBE, "1" if started else "0", env={"CUDA_VISIBLE_DEVICES": "-1"}, timeout=120,
                      label="lab 01 q3 reference probe")


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
            raise Fail(tr("config_allowed should return True or False, got {got}", got=repr(seen["got"])))
        want = _cpu_truth(started)[setting] if dev == "CPU" else _GPU_RULES[setting][int(started)]
        if seen["got"] != want:
            call, got = f"config_allowed({setting!r}, {dev!r}, runtime_started={started})", seen["got"]
            if want:
                raise Fail(tr("{call} returned {got}, but TensorFlow accepts that after the runtime starts", call=call,
                              got=got) if started else
                           tr("{call} returned {got}, but TensorFlow accepts that before the runtime starts", call=call,
                              got=got))
            raise Fail(tr("{call} returned {got}, but TensorFlow rejects that after the runtime starts", call=call,
                          got=got) if started else
                       tr("{call} returned {got}, but TensorFlow rejects that before the runtime starts", call=call,
                          got=got))


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
            raise Fail(tr("visible_gpu_count should return a whole number (int), got {got} ({kind}) for ({value}, "
                          "{physical})", got=repr(seen["got"]), kind=seen["type"], value=repr(value),
                          physical=physical))
        want = _visible(value, physical)
        got = seen["got"]
        if got != want:
            hint = ""
            if value is not None and not value.strip() and got == physical:
                hint = tr(" An empty CUDA_VISIBLE_DEVICES hides every GPU; only an unset one (None) shows them all.")
            elif isinstance(got, int) and got > want:
                hint = tr(" CUDA stops at the first invalid entry (not a number, or not an existing GPU): the "
                          "entries after it are ignored.")
            raise Fail(tr("visible_gpu_count({value}, {physical}) should be {want}, got {got}.{hint}",
                          value=repr(value), physical=physical, want=want, got=repr(got), hint=hint))


# --------------------------------------------------------------------------- q5

_CPU_BUILD = {"is_cuda_build": False, "is_rocm_build": False, "is_tensorrt_build": False}  # all a CPU build has


def _cuda_build(rng) -> dict:
    cuda, cudnn = rng.choice([("12.5.1", "9"), ("12.3", "8"), ("11.8", "8"), ("12.2", "8.9"), ("12.8", "9.3")])
    ccs = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"][: rng.randint(3, 5)]
    return {"cpu_compiler": "/usr/lib/llvm-18/bin/clang", "cuda_compute_capabilities": ccs, "cuda_version": cuda,
            "cudnn_version": cudnn, "is_cuda_build": True, "is_rocm_build": False,
            "is_tensorrt_build": rng.random() < 0.5}


@item("q5", points=2, title="cuda_versions reads the build info safely, CPU-only build or not")
class q5:
    def cases(rng):
        builds = [dict(_CPU_BUILD), _cuda_build(rng), _cuda_build(rng), dict(_CPU_BUILD, is_rocm_build=True)]
        rng.shuffle(builds)
        return [{"info": b} for b in builds] + [{"real": True}]

    def observe(ns, case):
        import tensorflow as tf

        fn = ns.function("cuda_versions")
        info = dict(tf.sysconfig.get_build_info()) if case.get("real") else dict(case["info"])
        seen = outcome(lambda: fn(dict(info)))
        seen["info"] = info
        return seen

    def judge(case, seen):
        info = seen["info"]
        kind = tr("a CUDA build") if info.get("is_cuda_build") else tr("a build without CUDA")
        where = tr("this machine's tf.sysconfig.get_build_info()") if case.get("real") else f"{kind} ({info})"
        want = ({"cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version")}
                if info.get("is_cuda_build") else None)
        if "raised" in seen:
            hint = ""
            if seen["raised"] == "KeyError":
                hint = tr(" A CPU-only build's dict has only is_cuda_build, is_rocm_build and is_tensorrt_build: "
                          "read the versions with info.get('cuda_version'), never info['cuda_version'].")
            raise Fail(tr("for {where} cuda_versions raised {raised}: {message}.{hint}", where=where,
                          raised=seen["raised"], message=seen["message"], hint=hint))
        got = seen["value"]
        if got == want:
            return
        hint = ""
        if want is None and isinstance(got, dict):
            hint = tr(" A build without CUDA has no versions to report: return None, not a dict.")
        elif want is not None and got is None:
            hint = tr(" This is a CUDA build (is_cuda_build is True): read the dict you were given, not this "
                      "machine's tf.sysconfig.get_build_info().")
        elif want is not None and not isinstance(got, dict):
            hint = tr(" Return a dict {example}.", example="{'cuda': ..., 'cudnn': ...}")
        raise Fail(tr("for {where} expected {want}, got {got}.{hint}", where=where, want=repr(want), got=repr(got),
                      hint=hint))
