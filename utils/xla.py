"""Topic 06: XLA. Compile, see what the compiler made of your code, and know when it pays.

Five jobs:

* :func:`gelu_chain` and :func:`variants` give the same elementwise function
  run eagerly, as a plain ``tf.function`` and as ``tf.function(jit_compile=True)``,
  ready for :func:`gpucourse.timing.compare`; :func:`ulp_distance` compares
  their results in float32 units in the last place, and :func:`ulp_budget`
  says how many a device's ``tanh`` kernels may differ by, and why.
* :func:`compiler_ir` fetches XLA's HLO for a function and input, and
  :func:`strip_metadata` makes the text readable. Counting its instructions is
  what the tutorial teaches and lab 06 asks you to write, so no public helper
  here does it for you.
* :func:`fusion_view` and :func:`fusion_explorer`: pick an elementwise chain,
  see its HLO instruction count before and after XLA's passes, its fusions,
  and the measured time of ``tf.function`` against ``jit_compile``.
* :func:`count_traces` and :func:`padding_cost` deal with retracing and
  recompilation when shapes change from call to call.
* :func:`run_probes` runs small programs in fresh processes with
  ``TF_XLA_FLAGS`` set and counts the modules XLA compiled there (read from an
  ``XLA_FLAGS=--xla_dump_to`` folder). Auto-clustering, for instance, is only
  visible that way, because its flags are read once when TensorFlow starts.

:func:`benchmark` measures eager vs ``tf.function`` vs XLA on the elementwise
chain for ``python -m gpucourse.benchmark``.

Importing this module never imports TensorFlow; every function that needs it
imports it when called.
"""

from __future__ import annotations

import glob
import math
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from . import _probe, _validate
from ._tf import keras as _keras
from ._tf import tf as _tf
from ._labrules import answers

__all__ = [
    "AUTO_JIT_FLAGS",
    "BOOKKEEPING_OPS",
    "CHAINS",
    "CompileProbe",
    "ProbeJob",
    "auto_clustering_jobs",
    "benchmark",
    "break_even_calls",
    "compiler_ir",
    "count_traces",
    "fusion_explorer",
    "fusion_view",
    "gelu_chain",
    "padding_cost",
    "run_probes",
    "strip_metadata",
    "ULP_BUDGETS",
    "UlpBudget",
    "ulp_budget",
    "ulp_distance",
    "variants",
]

#: The flags that make ``tf.config.optimizer.set_jit(True)`` cluster ops on a CPU.
#: ``--tf_xla_auto_jit=2`` alone only clusters for GPUs.
AUTO_JIT_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"

#: HLO opcodes that do no arithmetic and (almost) move no data.
BOOKKEEPING_OPS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})

_STAGES = ("hlo", "optimized_hlo", "optimized_hlo_dot", "hlo_serialized", "optimized_hlo_serialized")


# --------------------------------------------------------------------------- the running example


def gelu_chain(x):
    """The tanh approximation of GELU: nine elementwise ops, a textbook case for fusion.

    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``. Without XLA
    each op is a separate kernel that reads and writes the whole array; XLA
    fuses them into one loop that reads ``x`` once and writes the result once.
    """
    tf = _tf()
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def variants(fn: Callable) -> dict[str, Callable]:
    """``{"eager": fn, "tf.function": ..., "jit_compile": ...}``: one function, three ways to run it.

    Each value takes the same arguments as ``fn``. The two compiled versions
    are separate ``tf.function`` objects, so they trace independently.
    """
    _validate.callable_("fn", fn)
    tf = _tf()
    return {"eager": fn, "tf.function": tf.function(fn), "jit_compile": tf.function(fn, jit_compile=True)}


def ulp_distance(a, b) -> int:
    """The largest distance between ``a`` and ``b``, elementwise, in float32 units in the last place (ulps).

    Two float32 numbers are ``k`` ulps apart when ``k - 1`` other float32
    numbers lie between them: 0 means bit-identical, 1 means neighbours. This
    is a *relative* error (one ulp is about ``1.2e-7`` of the value), so one
    tolerance fits every magnitude, unlike ``atol``. NaNs must sit in the same
    places; a NaN against a number is reported as an infinite distance.
    """
    import numpy as np

    x = np.asarray(getattr(a, "numpy", lambda: a)(), dtype=np.float32)
    y = np.asarray(getattr(b, "numpy", lambda: b)(), dtype=np.float32)
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same shape, got {x.shape} and {y.shape}")
    if x.size == 0:
        return 0
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    if (nan_x != nan_y).any():
        return math.inf
    # Map float32 bit patterns onto a line where neighbouring floats are neighbouring integers.
    def ordered(v):
        bits = v.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    keep = ~nan_x
    return int(np.abs(ordered(x[keep]) - ordered(y[keep])).max(initial=0))


@dataclass(frozen=True)
class UlpBudget:
    """How far (in float32 ulps) XLA's ``tanh`` chains may be from TensorFlow's plain kernels on a device type."""

    device_type: str
    ulps: int
    basis: str


#: Per device type: the ulp budget for XLA against the plain kernels on ``tanh`` chains, and what it rests on.
ULP_BUDGETS = {
    "CPU": UlpBudget("CPU", 16, "measured, not documented: TensorFlow's Tanh kernel and XLA both use rational "
                     "approximations with no documented bound (XLA's is Eigen's, 'accurate up to a couple of "
                     "ulps' by Eigen's comment); the notebooks re-check 16 on every CPU code path the course "
                     "tests (oneDNN on, AVX2-only, off)"),
    "GPU": UlpBudget("GPU", 58, "2 ulps for CUDA's tanhf, the plain kernel's (CUDA Math API, documented) + 40 for "
                     "XLA:GPU's fast tanh, which has no documented bound ('isn't numerically precise, but it's "
                     "good enough for ML', xla/service/gpu/elemental_ir_emitter.cc): 40 ulps is the relative "
                     "error 20 eps that XLA's exhaustive tests allow f32 tanh + 16 for the chain's other "
                     "roundings (8 ops on each side, half an eps each)"),
}


def ulp_budget(device) -> UlpBudget:
    """The :class:`UlpBudget` for ``device``: 'CPU' or 'GPU', a device string such as '/GPU:0', or a device object.

    A device object is anything with a ``device_type`` attribute, as
    ``tf.config.list_physical_devices()`` returns.
    """
    kind = getattr(device, "device_type", device)
    if not isinstance(kind, str):
        raise TypeError(f"device must be 'CPU', 'GPU', a device string such as '/GPU:0' or a device with a "
                        f"device_type, got {device!r} of type {type(device).__name__}")
    m = re.fullmatch(r"(?:/job:\w+/replica:\d+/task:\d+)?/?(?:device:)?([A-Za-z_]+)(?::\d+)?", kind.strip())
    kind = m.group(1).upper() if m else kind
    if kind not in ULP_BUDGETS:
        raise ValueError(f"device must be a CPU or a GPU, got {device!r}: no ulp budget is known for {kind!r} "
                         f"(pass 'CPU' or 'GPU')")
    return ULP_BUDGETS[kind]


# --------------------------------------------------------------------------- reading HLO


def compiler_ir(fn, *args, stage: str = "optimized_hlo") -> str:
    """The HLO text XLA makes of ``fn(*args)``.

    Args:
        fn: a ``tf.function(..., jit_compile=True)``, or a plain Python function
            (it is wrapped in one for you).
        args: concrete tensors: XLA compiles for exact shapes, so a
            ``tf.TensorSpec`` with a ``None`` dimension is not accepted.
        stage: ``"hlo"`` (what TensorFlow handed to XLA) or ``"optimized_hlo"``
            (after fusion and the other passes), or any stage
            ``experimental_get_compiler_ir`` knows.
    """
    _validate.one_of("stage", stage, _STAGES)
    _validate.callable_("fn", fn)
    tf = _tf()
    if not hasattr(fn, "experimental_get_compiler_ir"):
        fn = tf.function(fn, jit_compile=True)
    try:
        return fn.experimental_get_compiler_ir(*args)(stage=stage)
    except ValueError as err:
        if "jit_compile" in str(err):
            raise ValueError("fn is a tf.function without jit_compile=True, so XLA never sees it; "
                             "use tf.function(f, jit_compile=True), or pass the plain Python function") from err
        raise


def strip_metadata(text: str) -> str:
    """HLO text without ``metadata={...}`` attributes (source locations): easier to read."""
    _validate.text("text", text, what="HLO text from compiler_ir")
    return re.sub(r",? metadata=\{[^}]*\}", "", text)


@answers('06', 'q2')
def _hlo_proto(fn, x, stage: str):
    """The HloModuleProto of ``fn(x)`` at ``stage`` ('hlo' or 'optimized_hlo'), read from XLA's serialized form.

    Counting reads the proto, not the text: the text is for people (and for lab 06).
    """
    try:
        from tensorflow.compiler.xla.service import hlo_pb2
    except ImportError as err:  # pragma: no cover - depends on the TensorFlow build
        raise RuntimeError("this TensorFlow build does not ship XLA's HLO protos "
                           "(tensorflow.compiler.xla.service.hlo_pb2); read the HLO text instead") from err
    return hlo_pb2.HloModuleProto.FromString(compiler_ir(fn, x, stage=stage + "_serialized"))


@answers('06', 'q2')
@dataclass
class _HloCounts:
    """Opcodes per computation of one HLO module, and the kinds of its fusions."""

    entry: str
    computations: dict[str, Counter]
    fusion_kinds: Counter

    @classmethod
    def of(cls, fn, x, stage: str) -> "_HloCounts":
        module = _hlo_proto(fn, x, stage)
        comps = {c.name: Counter(i.opcode for i in c.instructions) for c in module.computations}
        kinds = Counter(i.fusion_kind or "unknown" for c in module.computations for i in c.instructions
                        if i.opcode == "fusion")
        return cls(module.entry_computation_name, comps, kinds)

    @property
    def total(self) -> Counter:
        out: Counter = Counter()
        for counts in self.computations.values():
            out.update(counts)
        return out

    @property
    def work(self) -> int:
        """Instructions that compute (all computations, bookkeeping left out)."""
        return sum(n for op, n in self.total.items() if op not in BOOKKEEPING_OPS)

    @property
    def kernels(self) -> int:
        """Entry instructions that do work: roughly the kernels launched, in the optimized stage."""
        return sum(n for op, n in self.computations.get(self.entry, Counter()).items() if op not in BOOKKEEPING_OPS)

    @property
    def fusions(self) -> int:
        return self.total["fusion"]


# --------------------------------------------------------------------------- the fusion explorer


def _gelu_erf(x):
    tf = _tf()
    return 0.5 * x * (1.0 + tf.math.erf(x * 0.7071067811865476))


def _swish(x):
    return x * _tf().sigmoid(x)


def _scale(x):
    return x * 2.0


def _softmax_rows(x):
    tf = _tf()
    return tf.reshape(tf.nn.softmax(tf.reshape(x, (-1, 256)), axis=-1), (-1,))


def _layer_norm_rows(x):
    tf = _tf()
    rows = tf.reshape(x, (-1, 256))
    mean, var = tf.nn.moments(rows, axes=[-1], keepdims=True)
    return tf.reshape((rows - mean) * tf.math.rsqrt(var + 1e-5), (-1,))


#: The elementwise chains the fusion explorer offers: name -> function of a 1-D float32 tensor
#: (the row-wise ones view it as rows of 256).
CHAINS: dict[str, Callable] = {
    "x * 2 (one op)": _scale,
    "swish x*sigmoid(x)": _swish,
    "gelu (tanh approximation)": gelu_chain,
    "gelu (erf)": _gelu_erf,
    "softmax over rows of 256": _softmax_rows,
    "layer norm over rows of 256": _layer_norm_rows,
}


def fusion_view(chain: str = "gelu (tanh approximation)", log2_size: int = 20, repeats: int = 5):
    """The fusion explorer's update: HLO instructions before/after XLA, fusions, and measured times.

    Compiles ``CHAINS[chain]`` for ``2**log2_size`` floats, counts the
    instructions that compute in the HLO TensorFlow hands to XLA and the
    kernels left in the optimized HLO's entry computation, and times
    ``tf.function`` against ``jit_compile=True`` side by side
    (:func:`gpucourse.timing.compare`, ``repeats`` interleaved runs).
    Returns an :class:`gpucourse.explore.View` (text and a two-panel figure).
    """
    from . import timing
    from .explore import View

    _validate.one_of("chain", chain, CHAINS)
    n = 1 << _validate.whole("log2_size", log2_size, 10, 26, what="the input has 2**log2_size floats")
    repeats = _validate.whole("repeats", repeats, 1, what="timed runs per variant")
    tf = _tf()
    fn = CHAINS[chain]
    x = tf.random.normal((n,), seed=6)
    before, after = _HloCounts.of(fn, x, "hlo"), _HloCounts.of(fn, x, "optimized_hlo")
    runs = variants(fn)
    cmp = timing.compare({"tf.function": lambda: runs["tf.function"](x), "jit_compile": lambda: runs["jit_compile"](x)},
                         warmup=1, repeats=repeats)
    speedup = cmp.speedup("jit_compile")
    text = (f"{chain}, 2^{log2_size} floats: {before.work} computing instruction(s) before XLA's passes -> "
            f"{after.kernels} kernel(s) after, {after.fusions} of them fusion(s) "
            f"{dict(sorted(after.fusion_kinds.items()))}; jit_compile {speedup:.2f}x vs tf.function "
            f"({timing.format_seconds(cmp['jit_compile'].median_s)} vs "
            f"{timing.format_seconds(cmp['tf.function'].median_s)})")
    return View(text, _fusion_figure(chain, before, after, cmp))


def _fusion_figure(chain, before: "_HloCounts", after: "_HloCounts", cmp):
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3), gridspec_kw={"width_ratios": [3, 2]})
    ops = sorted(op for op in before.total if op not in BOOKKEEPING_OPS)
    entry_after = after.computations.get(after.entry, Counter())
    labels = ops + sorted(op for op in entry_after if op not in BOOKKEEPING_OPS and op not in ops)
    pos = range(len(labels))
    left.barh([p + 0.2 for p in pos], [before.total[op] for op in labels], height=0.4, label="before (hlo)")
    left.barh([p - 0.2 for p in pos], [entry_after[op] for op in labels], height=0.4,
              label="after: kernels in ENTRY")
    left.set_yticks(list(pos), labels)
    left.invert_yaxis()
    left.set(xlabel="instructions", title=f"{chain}: what XLA made of it")
    left.legend(loc="lower right", fontsize=8)
    names = [t.name for t in cmp.timings]
    right.bar(names, [t.median_s * 1e3 for t in cmp.timings], color=["tab:grey", "tab:green"])
    right.set(ylabel="median ms per call", title=f"jit_compile: {cmp.speedup('jit_compile'):.2f}x")
    fig.tight_layout()
    return fig


def fusion_explorer(show: bool = True):
    """The explorer of notebook 06: choose a chain and a size, press Run (each update compiles and times)."""
    from .explore import Explorer, dropdown, slider

    ex = Explorer("06-fusion", fusion_view,
                  [dropdown("chain", list(CHAINS), "gelu (tanh approximation)"),
                   slider("log2_size", 12, 24, 20, label="log2(floats)")],
                  title="XLA fusion explorer", manual=True)
    if show:
        ex.show()
    return ex


# --------------------------------------------------------------------------- retracing and shapes


def count_traces(fn, inputs: Sequence) -> list[int]:
    """Call ``fn`` on each input in turn; return its trace count after each call.

    ``fn`` must be a ``tf.function``. A count that grows with every new shape
    means a retrace (and, with XLA, a recompilation) per shape.
    """
    if not hasattr(fn, "experimental_get_tracing_count"):
        raise TypeError(f"fn must be a tf.function (it has no experimental_get_tracing_count), "
                        f"got {type(fn).__name__}")
    inputs = _validate.sequence("inputs", inputs, "arguments, one per call (a tuple for several)")
    counts = []
    for x in inputs:
        fn(*x) if isinstance(x, tuple) else fn(x)
        counts.append(fn.experimental_get_tracing_count())
    return counts


@answers('06', 'q4')
def padding_cost(lengths: Sequence[int], buckets: Sequence[int]) -> dict:
    """What padding ``lengths`` up to ``buckets`` costs and saves, over a whole workload.

    Each length is padded to the smallest bucket that holds it. Returns
    ``{"compilations": distinct buckets used, "without_buckets": distinct
    lengths, "padded_fraction": padding / padded total, "worst_fraction": the
    largest padding share of a single input}``. Fewer buckets mean fewer
    compilations and more wasted work; this puts numbers on the trade-off.
    Raises ValueError if a length does not fit the largest bucket.
    """
    lengths = _validate.sequence("lengths", lengths, "input lengths")
    buckets = _validate.sequence("buckets", buckets, "bucket lengths")
    ns = [_validate.whole("length", n, 1) for n in lengths]
    sizes = sorted({_validate.whole("bucket", b, 1) for b in buckets})
    if max(ns) > sizes[-1]:
        raise ValueError(f"length {max(ns)} does not fit the largest bucket {sizes[-1]}; add a bigger bucket")
    used = [next(b for b in sizes if b >= n) for n in ns]
    return {"compilations": len(set(used)), "without_buckets": len(set(ns)),
            "padded_fraction": 1 - sum(ns) / sum(used), "worst_fraction": max(1 - n / b for n, b in zip(ns, used))}


def break_even_calls(compile_s: float, saved_per_call_s: float) -> float:
    """How many calls it takes before XLA's extra compile time is paid back.

    ``compile_s`` is the extra first-call time of the XLA version,
    ``saved_per_call_s`` the steady-state time it saves per call. Returns
    ``inf`` when it saves nothing (XLA never pays off).
    """
    compile_s = _validate.seconds("compile_s", compile_s)
    saved_per_call_s = _validate.real("saved_per_call_s", saved_per_call_s, what="seconds saved per call")
    if saved_per_call_s <= 0:
        return float("inf")
    return compile_s / saved_per_call_s


# --------------------------------------------------------------------------- fresh-process probes


@dataclass(frozen=True)
class ProbeJob:
    """A program to run in a fresh Python process with ``TF_XLA_FLAGS`` set; it may ``emit(obj)`` an answer."""

    label: str
    code: str
    tf_xla_flags: str = ""
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment, e.g. CUDA_VISIBLE_DEVICES


@dataclass
class CompileProbe:
    """What one :class:`ProbeJob` did: the XLA modules it compiled, and what it emitted."""

    label: str
    tf_xla_flags: str
    modules: list[str]
    answer: object = None

    @property
    def compilations(self) -> int:
        """Number of modules XLA compiled in that process."""
        return len(self.modules)

    def __str__(self) -> str:
        flags = self.tf_xla_flags or "(none)"
        return f"{self.label}: TF_XLA_FLAGS={flags} -> {self.compilations} XLA compilation(s)"


def _module_names(folder: str) -> list[str]:
    """'module_0003.a_inference_f_12__.1.before_optimizations.txt' -> 'module_0003.a_inference_f_12__'."""
    return sorted({".".join(os.path.basename(p).split(".")[:2]) for p in glob.glob(os.path.join(folder, "module_*"))})


def run_probes(jobs: Sequence[ProbeJob], timeout: float = 300) -> list[CompileProbe]:
    """Run each job in its own fresh Python process, all at once, and count XLA compilations.

    Each process runs through :func:`gpucourse._probe.run_many` (the course's
    environment minus what the setup cell set, a timeout, ``emit(obj)`` for an
    answer), with ``TF_XLA_FLAGS`` from its job and
    ``XLA_FLAGS=--xla_dump_to=<temporary folder>``; every module XLA compiles
    leaves files there, which are counted and then deleted. A job that fails
    raises RuntimeError with the end of its stderr.
    """
    if isinstance(jobs, ProbeJob):
        jobs = [jobs]
    jobs = _validate.sequence("jobs", jobs, "ProbeJob(label, code, tf_xla_flags)")
    if not all(isinstance(j, ProbeJob) for j in jobs):
        raise TypeError("jobs must be a list of ProbeJob(label, code, tf_xla_flags), got "
                        f"{[type(j).__name__ for j in jobs]}")
    for j in jobs:
        _validate.text(f"the code of probe {j.label!r}", j.code, what="no code to run")
        _validate.env_vars(f"the env of probe {j.label!r}", dict(j.env))
    _validate.seconds("timeout", timeout, allow_zero=False)
    with tempfile.TemporaryDirectory(prefix="gpucourse-xla-") as root:
        probes, dumps = [], []
        for i, job in enumerate(jobs):
            dump = os.path.join(root, f"job{i}")
            os.mkdir(dump)
            dumps.append(dump)
            # Parallel processes on one GPU: memory growth, or the first would reserve nearly all of it.
            env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", **job.env, "TF_XLA_FLAGS": job.tf_xla_flags,
                   "XLA_FLAGS": f"--xla_dump_to={dump}"}
            probes.append(_probe.Probe(job.code, env=env,
                                       label=f"probe {job.label!r}"))
        answers = _probe.run_many(probes, timeout=timeout)
        out = []
        for job, dump, answer in zip(jobs, dumps, answers):
            if isinstance(answer, _probe.ProbeError) and "printed no answer" in str(answer) and "exit code 0" in str(answer):
                answer = None  # the job ran to the end and chose not to emit anything
            elif isinstance(answer, Exception):
                raise RuntimeError(str(answer)) from None
            out.append(CompileProbe(job.label, job.tf_xla_flags, _module_names(dump), answer))
    return out


_AUTO_JIT_CODE = """\
import tensorflow as tf
tf.config.optimizer.set_jit(True)  # auto-clustering: no jit_compile anywhere below
@tf.function
def chain(x):
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
x = tf.random.normal((1000,))
chain(x); chain(x)
emit(tf.config.optimizer.get_jit())
"""


def auto_clustering_jobs(cpu_only: bool = True) -> list[ProbeJob]:
    """Two probes of ``tf.config.optimizer.set_jit(True)`` on a plain ``tf.function``: without and with flags.

    With ``cpu_only`` (the default) the probes hide any GPU
    (``CUDA_VISIBLE_DEVICES=-1``), so they show the CPU behaviour on every
    machine. On a GPU, ``set_jit(True)`` clusters GPU ops without any flags.
    """
    if not isinstance(cpu_only, bool):
        raise TypeError(f"cpu_only must be True or False, got {cpu_only!r}")
    env = {"CUDA_VISIBLE_DEVICES": "-1"} if cpu_only else {}
    where = " (CPU)" if cpu_only else ""
    return [ProbeJob(f"set_jit(True){where}", _AUTO_JIT_CODE, "", env),
            ProbeJob(f"set_jit(True) + flags{where}", _AUTO_JIT_CODE, AUTO_JIT_FLAGS, env)]


# --------------------------------------------------------------------------- benchmark


def _mlp_step_timings(quick: bool):
    """Keras 3 MLP ``train_on_batch`` with ``jit_compile`` False and True, side by side."""
    import numpy as np

    keras = _keras()

    from . import timing

    def build(jit):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="gelu"),
                                  keras.layers.Dense(256, activation="gelu"), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=jit)
        return model

    rng = np.random.default_rng(6)
    X, y = rng.random((512, 64), dtype=np.float32), rng.random((512, 1), dtype=np.float32)
    plain, fused = build(False), build(True)
    return timing.compare({"jit_compile=False": lambda: plain.train_on_batch(X, y),
                           "jit_compile=True": lambda: fused.train_on_batch(X, y)},
                          warmup=2, repeats=5 if quick else 15)


def benchmark(quick: bool = False) -> list[dict]:
    """Eager vs ``tf.function`` vs ``jit_compile=True`` on :func:`gelu_chain`, plus a Keras MLP train step.

    For the chain the bound is one memory pass: an XLA-compiled ``x * 2``
    over the same array reads ``x`` once and writes once, the least traffic
    any implementation of the chain needs. Speedups are relative to plain
    ``tf.function`` (chain) and to ``jit_compile=False`` (MLP, no bound).
    Each row has the keys ``topic``, ``case``, ``median_s``, ``bound_s``,
    ``ratio_to_bound``, ``speedup`` and ``note``.
    """
    if not isinstance(quick, bool):
        raise TypeError(f"quick must be True or False, got {quick!r}")
    from . import timing

    tf = _tf()
    n, repeats = (1 << 20, 3) if quick else (1 << 22, 7)
    x = tf.random.normal((n,), seed=6)
    runs = variants(gelu_chain)
    one_pass = tf.function(lambda t: t * 2.0, jit_compile=True)
    cmp = timing.compare({"one memory pass": lambda: one_pass(x), **{k: (lambda f=f: f(x)) for k, f in runs.items()}},
                         warmup=2, repeats=repeats, baseline="tf.function")
    bound = cmp["one memory pass"].median_s
    rows = []
    for t in cmp.timings:
        if t.name == "one memory pass":
            note, case = f"x*2 under XLA over {n} floats: the bound", t.name
        else:
            first = "" if t.name == "eager" else f"; first call {t.first_call_s:.3f} s (trace" + (
                " + XLA compile)" if t.name == "jit_compile" else ")")
            note, case = f"gelu_chain over {n} floats{first}", f"gelu_chain {t.name}"
        rows.append({"topic": "06 XLA", "case": case, "median_s": t.median_s, "bound_s": bound,
                     "ratio_to_bound": t.median_s / bound,
                     "speedup": None if t.name == "one memory pass" else cmp.speedup(t.name), "note": note})
    mlp = _mlp_step_timings(quick)
    for t in mlp.timings:
        rows.append({"topic": "06 XLA", "case": f"MLP train step {t.name}", "median_s": t.median_s,
                     "bound_s": None, "ratio_to_bound": None, "speedup": mlp.speedup(t.name),
                     "note": "Keras 3 train_on_batch, 512x64 -> 256 -> 256 -> 1, gelu; no bound given (matmul-dominated)"})
    return rows
