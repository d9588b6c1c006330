"""Lab 09 (the roofline and MFU): public tests.

Each item is split in three (see :mod:`gpucourse.grading.items`): ``cases`` draws fresh shapes, dtypes,
devices and steps on the grader's side; ``observe`` calls the learner's function in the learner's kernel
and returns the number it gave; ``judge`` computes the answer on the grader's side and, when the answer
matches a classic mistake (a multiply-add counted as 1 FLOP, the output write forgotten, bits for
bytes, TFLOP/s against GB/s without the units, the forward pass only, the sparse or the wrong dtype's
peak), says which. Nothing here uses :mod:`gpucourse.mfu` or :mod:`gpucourse.roofline`.
Every message goes through ``tr`` (the zh_CN catalogue, ``grading/locale/zh_CN.po``).
"""

from __future__ import annotations

import math

from gpucourse.grading.items import Fail, item, tr

SIZES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


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
