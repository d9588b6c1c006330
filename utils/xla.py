"""Topic 06: XLA. Compile, see what the compiler made of your code, and know when it pays.

Five jobs:

* :func:`gelu_chain` and :func:`variants` give the same elementwise function
  run eagerly, as a plain ``tf.function`` and as ``tf.function(jit_compile=True)``,
  ready for :func:`gpucourse.timing.compare`; :func:`ulp_distance` compares
  their results in float32 units in the last place.
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
from ._tf import tf as _tf

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


# --------------------------------------------------------------------------- retracing and shapes


def count_traces(fn, inputs: Sequence) -> list[int]:
    """Call ``fn`` on each input in turn; return its trace count after each call.

    ``fn`` must be a ``tf.function``. A count that grows with every new shape
    means a retrace (and, with XLA, a recompilation) per shape.
    """
    if not hasattr(fn, "experimental_get_tracing_count"):
        raise TypeError(f"fn must be a tf.function (it has no experimental_get_tracing_count), "
                        f"got {type(fn).__name__}")
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not inputs:
        raise ValueError("inputs must be a non-empty list of arguments, one per call")
    counts = []
    for x in inputs:
        fn(*x) if isinstance(x, tuple) else fn(x)
        counts.append(fn.experimental_get_tracing_count())
    return counts


def padding_cost(lengths: Sequence[int], buckets: Sequence[int]) -> dict:
    """What padding ``lengths`` up to ``buckets`` costs and saves, over a whole workload.

    Each length is padded to the smallest bucket that holds it. Returns
    ``{"compilations": distinct buckets used, "without_buckets": distinct
    lengths, "padded_fraction": padding / padded total, "worst_fraction": the
    largest padding share of a single input}``. Fewer buckets mean fewer
    compilations and more wasted work; this puts numbers on the trade-off.
    Raises ValueError if a length does not fit the largest bucket.
    """
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"lengths must be a non-empty list of input lengths, got {lengths!r}")
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
        raise ValueError(f"buckets must be a non-empty list of bucket lengths, got {buckets!r}")
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


def run_probes(jobs: Sequence[ProbeJob], timeout: float = 120) -> list[CompileProbe]:
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
    jobs = list(jobs)
    if not jobs or not all(isinstance(j, ProbeJob) for j in jobs):
        raise TypeError("jobs must be a non-empty list of ProbeJob(label, code, tf_xla_flags)")
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
    import keras
    import numpy as np

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
