"""Lab 09 (the roofline and MFU): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases`` draws fresh shapes, dtypes,
devices and steps on the grader's side; ``observe`` calls the learner's function in the learner's kernel
and returns the number it gave; ``judge`` computes the answer on the grader's side and, when the answer
matches a classic mistake (a multiply-add counted as 1 FLOP, the output write forgotten, bits for
bytes, TFLOP/s against GB/s without the units, the forward pass only, the sparse or the wrong dtype's
peak), says which. q5 is a measurement: the learner's code times an op that runs here, on the trusted side
(a matmul, a copy and a tiny op on this machine's device, called through ``run``/``sync`` stand-ins), and the
judge compares the learner's time with this side's clock of the same calls. Nothing here uses
:mod:`gpucourse.mfu` or :mod:`gpucourse.roofline`.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from gpucourse.grading.items import Fail, item, outcome, tr

SIZES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}

#: The lab asks for the answers without the course's own FLOP and roofline modules: in the graded kernel they
#: cannot be imported (nor any course module that imports them).
FORBIDDEN_MODULES = ("gpucourse.mfu", "gpucourse.roofline")


def _number(seen, what: str) -> float:
    got = seen["got"]
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
        raise Fail(tr("{what} should return a number, got {got!r} ({kind})", what=what, got=got, kind=seen["type"]))
    return float(got)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


def _call(ns, name, *args) -> dict:
    """Call the learner's function ``name``; a NumPy or TensorFlow scalar counts as a number."""
    got = ns.function(name)(*args)
    try:
        got = got if isinstance(got, (str, bool, int, float)) else float(got)
    except (TypeError, ValueError):
        pass
    return {"got": got, "type": type(got).__name__}


# --------------------------------------------------------------------------- q1


@item("q1", points=3, title="arithmetic_intensity of a matmul from its shapes and dtype")
class q1:
    def cases(rng):
        dtypes = ["float32", "bfloat16", "float16", "float64", rng.choice(list(SIZES))]
        return [{"m": rng.choice([1, 8, rng.randint(2, 4096)]), "n": rng.randint(16, 8192),
                 "k": rng.randint(16, 8192), "dtype": d} for d in dtypes]

    def observe(ns, case):
        return _call(ns, "arithmetic_intensity", case["m"], case["n"], case["k"], case["dtype"])

    def judge(case, seen):
        m, n, k, dtype = case["m"], case["n"], case["k"], case["dtype"]
        what = f"arithmetic_intensity({m}, {n}, {k}, {dtype!r})"
        got = _number(seen, what)
        size = SIZES[dtype]
        inputs, output = m * k + k * n, m * n
        want = 2 * m * n * k / ((inputs + output) * size)
        if _close(got, want):
            return
        msg = tr("{what} should be {want:.6g} FLOP/byte, got {got:.6g}.", what=what, want=want, got=got)
        if _close(got, want / 2):
            msg += tr(" A multiply-add is 2 FLOPs: (m, k) @ (k, n) does 2*m*n*k of them, not m*n*k.")
        elif _close(got, 2 * m * n * k / (inputs * size)):
            msg += tr(" Count the output too: the result (m x n) is written to memory once.")
        elif _close(got, want / 8):
            msg += tr(" Use bytes, not bits: a {dtype} is {size} bytes ({bits} bits).", dtype=dtype, size=size,
                      bits=size * 8)
        raise Fail(msg)


# --------------------------------------------------------------------------- q2


@item("q2", points=2, title="bounding_roof names the roof that limits an op")
class q2:
    def cases(rng):
        out = []
        for side in ("memory", "compute", "memory", "compute", "compute"):
            peak = rng.choice([8.1, 19.5, 65.0, 121.0, 312.0, 989.5]) * rng.uniform(0.8, 1.2)
            bw = rng.choice([300.0, 900.0, 2039.0, 3350.0]) * rng.uniform(0.8, 1.2)
            ridge = peak * 1e12 / (bw * 1e9)
            # Far enough from the ridge that units mixed up by 1000 (or the ridge inverted) flip the verdict.
            factor = rng.uniform(2.0, 8.0)
            intensity = ridge / factor if side == "memory" else ridge * factor
            nbytes = float(rng.randint(10**6, 10**9))
            out.append({"flops": intensity * nbytes, "nbytes": nbytes, "peak_tflops": round(peak, 3),
                        "bandwidth_gbs": round(bw, 1)})
        return out

    def observe(ns, case):
        return _call(ns, "bounding_roof", case["flops"], case["nbytes"], case["peak_tflops"], case["bandwidth_gbs"])

    def judge(case, seen):
        f, b, p, w = case["flops"], case["nbytes"], case["peak_tflops"], case["bandwidth_gbs"]
        ridge = p * 1e12 / (w * 1e9)
        want = "memory" if f / b < ridge else "compute"
        got = seen["got"]
        what = tr("{call} (intensity {intensity:.3g} FLOP/byte on a device of {p} TFLOP/s and {w} GB/s)",
                  call=f"bounding_roof({f:.4g}, {b:.4g}, {p}, {w})", intensity=f / b, p=p, w=w)
        if got not in ("memory", "compute"):
            raise Fail(tr("{what} should return 'memory' or 'compute', got {got!r}", what=what, got=got))
        if got != want:
            raise Fail(tr("{what} should be {want!r}, got {got!r}: the ridge point is peak / bandwidth = "
                          "{ridge:.3g} FLOP/byte. Put both in the same units first (TFLOP/s is 1e12 FLOP/s, GB/s "
                          "is 1e9 bytes/s), and an op below the ridge is memory-bound.",
                          what=what, want=want, got=got, ridge=ridge))


# --------------------------------------------------------------------------- q3


@item("q3", points=2, title="dense_train_flops counts forward and backward")
class q3:
    def cases(rng):
        return [{"batch": rng.randint(1, 4096), "d_in": rng.randint(8, 8192), "d_out": rng.randint(8, 8192)}
                for _ in range(4)]

    def observe(ns, case):
        return _call(ns, "dense_train_flops", case["batch"], case["d_in"], case["d_out"])

    def judge(case, seen):
        b, i, o = case["batch"], case["d_in"], case["d_out"]
        what = f"dense_train_flops({b}, {i}, {o})"
        got = _number(seen, what)
        unit = b * i * o
        if _close(got, 6 * unit):
            return
        msg = tr("{what} should be 6 * batch * d_in * d_out = {want:,}, got {got:,.0f}.", what=what, want=6 * unit,
                 got=got)
        hints = {2: tr(" That is the forward pass only: the backward pass computes the gradient of W (x^T @ dy) "
                       "and of x (dy @ W^T), each as many FLOPs as the forward."),
                 3: tr(" A multiply-add is 2 FLOPs: each of the three matmuls (forward, dW, dx) is 2*b*d_in*d_out."),
                 4: tr(" The backward pass has two matmuls: dW = x^T @ dy and, since this is not the first layer, "
                       "dx = dy @ W^T for the layer below."),
                 1: tr(" Count forward and backward, and a multiply-add as 2 FLOPs.")}
        for factor, hint in hints.items():
            if _close(got, factor * unit):
                msg += hint
                break
        raise Fail(msg)


# --------------------------------------------------------------------------- q4

_SHEETS = {  # dense TFLOP/s per dtype; "sparse": the 2:4 structured-sparsity figures, twice the dense
    "A100": {"float32": 19.5, "tfloat32": 156.0, "float16": 312.0, "bfloat16": 312.0},
    "H100": {"float32": 67.0, "tfloat32": 494.5, "float16": 989.5, "bfloat16": 989.5},
    "L4": {"float32": 30.3, "tfloat32": 60.0, "float16": 121.0, "bfloat16": 121.0},
}


@item("q4", points=3, title="step_mfu: model FLOPs utilisation of a measured step")
class q4:
    def cases(rng):
        out = []
        for name, dtype in [("A100", "bfloat16"), ("H100", "tfloat32"), ("L4", "float16"),
                            (rng.choice(list(_SHEETS)), rng.choice(["bfloat16", "float16", "tfloat32"]))]:
            dense = _SHEETS[name]
            sheet = {"dense": dict(dense), "sparse": {d: 2 * v for d, v in dense.items() if d != "float32"}}
            params, tokens = rng.randint(10**6, 10**9), rng.choice([2048, 4096, 8192, 16384, 65536])
            target = rng.uniform(0.1, 0.6)  # the MFU the step is made to have
            step_s = 6 * params * tokens / (target * dense[dtype] * 1e12)
            out.append({"params": params, "tokens": tokens, "step_s": step_s, "sheet": sheet, "dtype": dtype,
                        "gpu": name})
        return out

    def observe(ns, case):
        return _call(ns, "step_mfu", case["params"], case["tokens"], case["step_s"], case["sheet"], case["dtype"])

    def judge(case, seen):
        p, t, s, sheet, dtype = case["params"], case["tokens"], case["step_s"], case["sheet"], case["dtype"]
        what = f"step_mfu({p}, {t}, {s:.4g}, <{case['gpu']} data sheet>, {dtype!r})"
        got = _number(seen, what)
        flops = 6 * p * t

        def mfu(f, peak):
            return f / s / (peak * 1e12)

        want = mfu(flops, sheet["dense"][dtype])
        if _close(got, want):
            return
        msg = tr("{what} should be {want:.4f}, got {got:.4g}.", what=what, want=want, got=got)
        if _close(got, mfu(flops, sheet["sparse"][dtype])):
            msg += tr(" You divided by the peak 'with sparsity': it needs 2:4 structured-sparse weights, which a "
                      "dense model does not have. Use sheet['dense'][dtype].")
        elif _close(got, mfu(2 * p * t, sheet["dense"][dtype])):
            msg += tr(" 2 x params x tokens is the forward pass only: a training step is 6 x params x tokens.")
        elif any(_close(got, mfu(flops, v)) for d, v in sheet["dense"].items() if d != dtype):
            msg += tr(" You used another dtype's peak: the matmuls run in {dtype}, so divide by "
                      "sheet['dense'][{dtype_repr}].", dtype=dtype, dtype_repr=repr(dtype))
        elif _close(got, 100 * want):
            msg += tr(" Return a fraction (0.4 for 40%), not a percentage.")
        elif _close(got, 1e12 * want):
            msg += tr(" Your answer is exactly 10^12 times too large: the sheet gives TFLOP/s, so multiply the peak "
                      "by 1e12 to get FLOP/s before you divide.")
        raise Fail(msg)


# --------------------------------------------------------------------------- q5

#: Below this share of both roofs an op is bound by neither: its time goes to launching and overhead. The cases
#: sit far from it: the check's matmuls and copies reach about half of their roof or more (measured here: 0.5 to
#: 1.2 on 2 busy cores), its tiny op about a thousandth (a call costs tens of microseconds for a few KiB).
OVERHEAD_SHARE = 0.25
#: Seconds the first call of an op takes on top (it prepares the op, as tracing and compiling do).
FIRST_CALL_S = (0.1, 0.2)


def _q5_device(tf) -> str:
    """The device the check's ops run on: the first GPU when TensorFlow sees one, else the CPU."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def _q5_sizes(gpu: bool) -> dict:
    """Sizes that keep each op far from the overhead share on the device kind, and cheap: a matmul of 3-10 ms and a
    copy of 5-12 ms on 2 CPU cores; on a GPU a matmul of 4096-8192 (about 3 ms on an H100 in TF32, 140 ms on a T4)
    and a copy of 1-2 GiB (0.4 ms on an H200, 7 ms on a T4; the learner's launches then take about as long as
    the copy, which keeps it near the memory roof, not below a quarter of it)."""
    if gpu:
        return {"matmul": (4096, 8192), "copy": (2**27, 2**28), "roof_matmul": 8192, "roof_copy": 2**28}
    return {"matmul": (640, 1024), "copy": (2**23, 2**24), "roof_matmul": 1024, "roof_copy": 2**24}


def _q5_op(tf, spec: dict):
    """(a function that runs the op once, its FLOPs, its bytes): inputs made once, outside any timing."""
    if spec["kind"] == "matmul":
        m, n, k = spec["m"], spec["n"], spec["k"]
        a, b = tf.random.normal((m, k)), tf.random.normal((k, n))
        return tf.function(lambda: tf.matmul(a, b)), 2 * m * n * k, 4 * (m * k + k * n + m * n)
    x = tf.random.normal((spec["size"],))
    return tf.function(lambda: x * 2.0), spec["size"], 8 * spec["size"]  # one multiply, read and write 4 bytes


class _DeviceQueue:
    """The check's ops, run in order by a thread of their own, as a GPU runs kernels from its stream.

    ``run()`` queues one call and returns at once; ``sync()`` returns once every queued call has finished. Each
    call's start and end are recorded on this side's clock (time.perf_counter, the same monotonic clock as the
    learner's). On a GPU each call ends with ``tf.test.experimental.sync_devices()``, so that its end is the end of
    its kernels. A bounded number of calls, each wait bounded: nothing here waits on the learner's code.
    """

    MAX_CALLS = 400

    def __init__(self, op, first_call_s: float, wait, now):
        import threading

        self.op, self.first_call_s, self.wait, self.now = op, first_call_s, wait, now
        self.runs, self.syncs, self.done = [], [], []  # run() arrivals, sync() [arrival, return], [start, end]
        self.cond = threading.Condition()
        self.pending = 0
        self.closed = False
        self.thread = threading.Thread(target=self._work, name="gpucourse-q5-device", daemon=True)
        self.thread.start()

    def _work(self):
        while True:
            with self.cond:
                while not self.pending and not self.closed:
                    self.cond.wait()
                if not self.pending:
                    return
            start = self.now()
            if not self.done:
                self.wait(self.first_call_s)  # the first call prepares the op
            self.op()
            end = self.now()
            with self.cond:
                self.done.append([start, end])
                self.pending -= 1
                self.cond.notify_all()

    def run(self):
        with self.cond:
            if len(self.runs) >= self.MAX_CALLS:
                raise RuntimeError(f"the check runs the op at most {self.MAX_CALLS} times")
            self.runs.append(self.now())
            self.pending += 1
            self.cond.notify_all()

    def sync(self, limit_s: float = 60.0):
        arrival = self.now()
        with self.cond:
            self.cond.wait_for(lambda: not self.pending, timeout=limit_s)
        self.syncs.append([arrival, self.now()])

    def close(self, limit_s: float = 60.0):
        """Wait for the queued calls (their times are the check's evidence), then stop the thread."""
        self.sync(limit_s)
        self.syncs.pop()
        self.abort()
        self.thread.join(limit_s)

    def abort(self):
        """Drop the calls not started yet and let the thread end after the one it runs (the item's time is up)."""
        with self.cond:
            self.closed = True
            self.pending = min(self.pending, 1)
            self.cond.notify_all()


_ROOFS: dict = {}


def _q5_roof(tf, device: str) -> dict:
    """This device's roofs, measured here once: the best of 6 calls of a large square matmul (FLOP/s) and of a copy
    y = 2x over an array as large as the check's largest copy (bytes/s), after a warm-up call of each. The best of
    several, because other programs only ever slow a call down."""
    import time

    if device not in _ROOFS:
        sizes = _q5_sizes(device.startswith("GPU"))
        best = {}
        with tf.device(device):
            for spec in ({"kind": "matmul", "m": sizes["roof_matmul"], "n": sizes["roof_matmul"],
                          "k": sizes["roof_matmul"]}, {"kind": "copy", "size": sizes["roof_copy"]}):
                fn, flops, nbytes = _q5_op(tf, spec)
                times = []
                for _ in range(7):
                    start = time.perf_counter()
                    fn()
                    tf.test.experimental.sync_devices()
                    times.append(time.perf_counter() - start)
                best[spec["kind"]] = (flops, nbytes, min(times[1:]))
        flops, _, seconds = best["matmul"]
        _, nbytes, copy_s = best["copy"]
        _ROOFS[device] = {"peak_tflops": flops / seconds / 1e12, "bandwidth_gbs": nbytes / copy_s / 1e9}
    return _ROOFS[device]


def _q5_spec(case: dict, device: str) -> dict:
    """The case's op with sizes for the device kind (the case draws fractions; the device decides the range)."""
    sizes = _q5_sizes(device.startswith("GPU"))
    if case["kind"] == "matmul":
        lo, hi = sizes["matmul"]
        m, n, k = (lo + int(u * (hi - lo)) // 64 * 64 for u in case["u"])
        return {"kind": "matmul", "m": m, "n": n, "k": k}
    if case["kind"] == "copy":
        lo, hi = sizes["copy"]
        return {"kind": "copy", "size": lo + int(case["u"][0] * (hi - lo)) // 1024 * 1024}
    return {"kind": "copy", "size": 64 + int(case["u"][0] * 192)}  # "tiny": a few hundred floats


def _q5_runner(tf, fn, device: str):
    """One call of the op as the queue runs it: on ``device`` (device scopes are per thread), and on a GPU until its
    kernels have finished (a GPU call returns once they are queued), so that the call's end is the op's end."""
    def op():
        with tf.device(device):
            fn()
        if device.startswith("GPU"):
            tf.test.experimental.sync_devices()

    return op


def _q5_time_learner(measure_roof, op, first_call_s: float, flops: int, nbytes: int, roof: dict) -> dict:
    """Call the learner's ``measure_roof`` with ``run``/``sync`` over a :class:`_DeviceQueue` of ``op``; what it
    returned, and every launch, wait and call on this side's clock."""
    import time

    queue = _DeviceQueue(op, first_call_s, time.sleep, time.perf_counter)

    # The learner's code gets stand-ins for these two: every call comes back here, to this process's clock.
    def run():
        queue.run()

    def sync():
        queue.sync()

    try:
        result = outcome(lambda: measure_roof(run, sync, flops, nbytes, roof["peak_tflops"], roof["bandwidth_gbs"]))
    except BaseException:  # the item's time is up (or the kernel was lost): wait for nothing
        queue.abort()
        raise
    queue.close()
    return {"flops": flops, "nbytes": nbytes, "roof": roof, "result": result, "runs": queue.runs,
            "syncs": queue.syncs, "done": queue.done}


def _q5_describe(spec: dict) -> str:
    if spec["kind"] == "matmul":
        return tr("a float32 matmul ({m}, {k}) @ ({k}, {n})", m=spec["m"], k=spec["k"], n=spec["n"])
    return tr("y = 2 * x over {size} float32 values", size=f"{spec['size']:,}")


@item("q5", points=3, title="measure_roof times an op on this device and names the roof that bounds it")
class q5:
    def cases(rng):
        kinds = ["matmul", "copy", "tiny"]
        rng.shuffle(kinds)
        return [{"kind": k, "u": [rng.random() for _ in range(3)], "first_call_s": rng.uniform(*FIRST_CALL_S)}
                for k in kinds]

    def observe(ns, case):
        import os

        measure_roof = ns.function("measure_roof")  # not written yet: "not attempted", without starting TensorFlow
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # this process shares the GPU with the kernel
        import tensorflow as tf

        device = _q5_device(tf)
        roof = _q5_roof(tf, device)
        spec = _q5_spec(case, device)
        with tf.device(device):
            fn, flops, nbytes = _q5_op(tf, spec)

        seen = _q5_time_learner(measure_roof, _q5_runner(tf, fn, device), case["first_call_s"], flops, nbytes, roof)
        return {"device": device, "op": spec, **seen}

    def judge(case, seen):
        roof, flops, nbytes = seen["roof"], seen["flops"], seen["nbytes"]
        peak, bw = roof["peak_tflops"], roof["bandwidth_gbs"]
        what = tr("{op} on {device} ({flops:.4g} FLOPs, {nbytes:.4g} bytes; roofs {peak:.3g} TFLOP/s and {bw:.3g} "
                  "GB/s)", op=_q5_describe(seen["op"]), device=seen["device"], flops=flops, nbytes=nbytes, peak=peak,
                  bw=bw)
        res = seen["result"]
        if "raised" in res:
            raise Fail(tr("measure_roof for {what} raised {raised}: {message}", what=what, raised=res["raised"],
                          message=res["message"]))
        got = res["value"]
        keys = ("seconds", "tflops", "gbs", "bound")
        if not isinstance(got, dict) or any(k not in got for k in keys):
            raise Fail(tr("measure_roof should return a dict with the keys {keys}, got {got}", keys=list(keys),
                          got=repr(got)[:200]))
        nums = {k: got[k] for k in keys[:3]}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                   for v in nums.values()):
            raise Fail(tr("measure_roof for {what}: seconds, tflops and gbs should be positive numbers, got {got}",
                          what=what, got=nums))
        runs, syncs, done = seen["runs"], seen["syncs"], seen["done"]
        if not runs:
            raise Fail(tr("measure_roof for {what}: you never called run(), so {seconds:.3g} s is not a measurement "
                          "of the op.", what=what, seconds=nums["seconds"]))
        if not any(arrival >= runs[-1] for arrival, _ in syncs):
            raise Fail(tr("measure_roof for {what}: you never called sync() after your last run(). run() returns "
                          "before the op has finished, as on a GPU: call sync() before you stop the clock.",
                          what=what))
        if len(done) < 2:
            raise Fail(tr("measure_roof for {what}: you ran the op once, and its first call is slow (it prepares "
                          "the op): run it once, then time several calls.", what=what))
        _q5_judge_seconds(what, nums["seconds"], done)
        _q5_judge_units(what, nums, flops, nbytes)
        shares = {"compute": nums["tflops"] / peak, "memory": nums["gbs"] / bw}
        top = max(shares, key=shares.get)
        want = top if shares[top] >= OVERHEAD_SHARE else "overhead"
        if got["bound"] != want:
            raise Fail(tr("measure_roof for {what}: your measurement reaches {compute:.3g} of the compute roof and "
                          "{memory:.3g} of the memory roof, so the bound is {want!r}, not {got!r}: the roof with the "
                          "larger share, or 'overhead' when both are below {limit} (then the time goes to launching "
                          "the op, and the intensity alone would name the wrong roof).", what=what,
                          compute=shares["compute"], memory=shares["memory"], want=want, got=got["bound"],
                          limit=OVERHEAD_SHARE))


def _q5_judge_seconds(what: str, seconds: float, done: list) -> None:
    """Fail unless ``seconds`` lies where a timing of the op's calls after the first can land.

    The check's clock timed every call ([start, end]; the same monotonic clock as the learner's, on the same
    machine), and the calls the learner timed are among them. A clock stopped after sync() spans whole calls, so
    its time per call is at least the fastest call (0.8x: clock readings and rounding). It spans each call's run
    time plus the idle time before it (the launches' round trips when the op is shorter than they are), so it is
    at most the slowest call with its idle time before it; 1.3x and 3 ms more for the launch and the reply at the
    ends of the timed window. Busy machines slow the learner's and the check's views of the same calls alike.
    """
    steady = [(end - start, start - prev_end) for (start, end), (_, prev_end) in zip(done[1:], done[:-1])]
    fastest = min(d for d, _ in steady)
    slowest = max(d + max(0.0, idle) for d, idle in steady)
    if seconds < 0.8 * fastest:
        raise Fail(tr("measure_roof for {what}: {seconds:.3g} s per call is shorter than any call of the op took "
                      "({fastest:.3g} s at the fastest, on the check's clock). Stop the clock after sync(), once the "
                      "op has finished.", what=what, seconds=seconds, fastest=fastest))
    if seconds > 1.3 * slowest + 0.003:
        raise Fail(tr("measure_roof for {what}: {seconds:.3g} s per call is longer than any call after the first "
                      "took ({slowest:.3g} s at the slowest, on the check's clock). The first call prepares the op "
                      "and is slow: leave it out of your timing, and wait for it (sync()) before you start the "
                      "clock.", what=what, seconds=seconds, slowest=slowest))


def _q5_judge_units(what: str, nums: dict, flops: float, nbytes: float) -> None:
    """Fail unless tflops and gbs are the FLOPs and bytes over the learner's own seconds, in TFLOP/s and GB/s."""
    seconds = nums["seconds"]
    units = {"tflops": tr(" Mind the units: 1 TFLOP/s is 1e12 FLOP/s."),
             "gbs": tr(" Mind the units: 1 GB/s is 1e9 bytes per second.")}
    for key, amount, unit, scale in (("tflops", flops, "TFLOP/s", 1e12), ("gbs", nbytes, "GB/s", 1e9)):
        want, got = amount / seconds / scale, nums[key]
        if math.isclose(got, want, rel_tol=1e-3):
            continue
        msg = tr("measure_roof for {what}: with your {seconds:.4g} s per call, {key} should be {want:.4g} {unit}, got "
                 "{got:.4g}.", what=what, seconds=seconds, key=key, want=want, unit=unit, got=got)
        if math.isclose(got, 8 * want, rel_tol=1e-3):
            msg += tr(" That is 8 times too many: bytes, not bits.")
        elif any(math.isclose(got, f * want, rel_tol=1e-3) for f in (1e3, 1e6, 1e9, 1e12)):
            msg += units[key]
        raise Fail(msg)
