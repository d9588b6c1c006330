"""Topic 06: XLA. Compile, read what the compiler made of your code, and know when it pays.

Four jobs:

* :func:`gelu_chain` and :func:`variants` give the same elementwise function
  run eagerly, as a plain ``tf.function`` and as ``tf.function(jit_compile=True)``,
  ready for :func:`gpucourse.timing.compare`.
* :func:`compiler_ir` and :func:`parse_hlo` fetch and read XLA's HLO text:
  how many instructions of each kind, how many fusions (kernels), and which
  computations they live in. That is how you *see* fusion instead of guessing.
* :func:`count_traces`, :func:`bucket_length` and :func:`pad_to_bucket` deal
  with retracing and recompilation when shapes change from call to call.
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
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

__all__ = [
    "AUTO_JIT_FLAGS",
    "BOOKKEEPING_OPS",
    "CompileProbe",
    "HloSummary",
    "ProbeJob",
    "auto_clustering_jobs",
    "benchmark",
    "break_even_calls",
    "bucket_length",
    "compiler_ir",
    "count_traces",
    "gelu_chain",
    "pad_to_bucket",
    "parse_hlo",
    "run_probes",
    "variants",
]

#: The flags that make ``tf.config.optimizer.set_jit(True)`` cluster ops on a CPU.
#: ``--tf_xla_auto_jit=2`` alone only clusters for GPUs.
AUTO_JIT_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"

#: HLO opcodes that do no arithmetic and (almost) move no data.
BOOKKEEPING_OPS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})

_STAGES = ("hlo", "optimized_hlo", "optimized_hlo_dot", "hlo_serialized", "optimized_hlo_serialized")


def _tf():
    import tensorflow as tf  # imported lazily: importing gpucourse must stay cheap

    return tf


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
    if not callable(fn):
        raise TypeError(f"fn must be a Python function of tensors, got {type(fn).__name__}")
    tf = _tf()
    return {"eager": fn, "tf.function": tf.function(fn), "jit_compile": tf.function(fn, jit_compile=True)}


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
    if stage not in _STAGES:
        raise ValueError(f"stage must be one of {', '.join(_STAGES)}, got {stage!r}")
    tf = _tf()
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    if not hasattr(fn, "experimental_get_compiler_ir"):
        fn = tf.function(fn, jit_compile=True)
    try:
        return fn.experimental_get_compiler_ir(*args)(stage=stage)
    except ValueError as err:
        if "jit_compile" in str(err):
            raise ValueError("fn is a tf.function without jit_compile=True, so XLA never sees it; "
                             "use tf.function(f, jit_compile=True), or pass the plain Python function") from err
        raise


_HEADER = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")
_KIND = re.compile(r"\bkind=(k\w+)")


def _skip_type(rest: str) -> str:
    """Drop the leading shape ('f32[4]{0}' or a parenthesised tuple shape) from an instruction."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[i + 1:]
        return ""
    return rest.split(None, 1)[1] if " " in rest else ""


def _opcode(line: str) -> str | None:
    m = _INSTR.match(line)
    if not m:
        return None
    op = _OPCODE.match(_skip_type(m.group(3)).lstrip())
    return op.group(1) if op else None


@dataclass
class HloSummary:
    """What an HLO module contains: opcode counts per computation, and its fusions.

    ``computations`` maps each computation's name to a Counter of opcodes;
    ``entry`` names the one that runs (the others are called by it: fused
    computations, reduction bodies, ...).
    """

    module: str
    entry: str
    computations: dict[str, Counter] = field(default_factory=dict)
    fusion_kinds: Counter = field(default_factory=Counter)

    @property
    def op_counts(self) -> Counter:
        """Instructions of each opcode, summed over every computation."""
        total: Counter = Counter()
        for counts in self.computations.values():
            total.update(counts)
        return total

    @property
    def entry_ops(self) -> Counter:
        """Opcodes in the entry computation: roughly the kernels that run, in the optimized stage."""
        return Counter(self.computations.get(self.entry, Counter()))

    @property
    def fusions(self) -> int:
        """Number of ``fusion`` instructions: each becomes one generated kernel."""
        return self.op_counts["fusion"]

    @property
    def kernels(self) -> int:
        """Entry instructions that do work (everything but :data:`BOOKKEEPING_OPS`)."""
        return sum(n for op, n in self.entry_ops.items() if op not in BOOKKEEPING_OPS)

    def to_text(self) -> str:
        """A short human-readable summary."""
        real = {op: n for op, n in sorted(self.entry_ops.items()) if op not in BOOKKEEPING_OPS}
        lines = [f"module {self.module}: {len(self.computations)} computation(s), "
                 f"{sum(self.op_counts.values())} instruction(s)",
                 f"entry {self.entry}: {self.kernels} kernel(s) {real}",
                 f"fusions: {self.fusions} {dict(sorted(self.fusion_kinds.items()))}"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.to_text())


def parse_hlo(text: str) -> HloSummary:
    """Parse HLO text (from :func:`compiler_ir`) into an :class:`HloSummary`.

    Every instruction line ``[ROOT] %name = <shape> <opcode>(operands), attrs``
    is counted under the computation it appears in. Shapes may be tuples with
    spaces, e.g. ``(f32[2]{0}, s32[]) tuple(...)``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be HLO text (a str), got {type(text).__name__}")
    module_m = re.search(r"^\s*HloModule\s+([\w.\-]+)", text, re.M)
    if not module_m:
        raise ValueError("text does not look like HLO: no 'HloModule <name>' line. "
                         "Get it with compiler_ir(fn, x) or fn.experimental_get_compiler_ir(x)(stage='hlo')")
    summary = HloSummary(module=module_m.group(1), entry="")
    current = None
    for line in text.splitlines():
        head = _HEADER.match(line)
        if head:
            current = head.group(2)
            summary.computations[current] = Counter()
            if head.group(1):
                summary.entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is None:
            continue
        op = _opcode(line)
        if op:
            summary.computations[current][op] += 1
            if op == "fusion":
                kind = _KIND.search(line)
                summary.fusion_kinds[kind.group(1) if kind else "unknown"] += 1
    if not summary.entry:
        raise ValueError("HLO text has no ENTRY computation; pass the whole module text, not an excerpt")
    return summary


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


def _check_buckets(buckets) -> list[int]:
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
        raise ValueError(f"buckets must be a non-empty list of positive lengths, got {buckets!r}")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ValueError(f"buckets must be positive whole numbers, got {list(buckets)}")
    return sorted(set(buckets))


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` items (buckets in any order).

    Raises ValueError when ``n`` exceeds the largest bucket: silently
    truncating data is worse than failing.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a whole number >= 0, got {n!r}")
    sizes = _check_buckets(buckets)
    for b in sizes:
        if b >= n:
            return b
    raise ValueError(f"length {n} does not fit the largest bucket {sizes[-1]}; add a bigger bucket")


def pad_to_bucket(x, buckets: Sequence[int]):
    """Zero-pad the first axis of ``x`` to :func:`bucket_length`; return ``(padded, n)``.

    With XLA every distinct shape is a separate compilation. Padding to a few
    bucket lengths bounds the number of compilations by ``len(buckets)``;
    slice the result back with ``[:n]``.
    """
    tf = _tf()
    x = tf.convert_to_tensor(x)
    if x.shape.rank is None or x.shape.rank < 1:
        raise ValueError(f"x must have at least one axis to pad, got shape {x.shape}")
    n = int(x.shape[0])
    target = bucket_length(n, buckets)
    pads = [[0, target - n]] + [[0, 0]] * (x.shape.rank - 1)
    return tf.pad(x, pads), n


def break_even_calls(compile_s: float, saved_per_call_s: float) -> float:
    """How many calls it takes before XLA's extra compile time is paid back.

    ``compile_s`` is the extra first-call time of the XLA version,
    ``saved_per_call_s`` the steady-state time it saves per call. Returns
    ``inf`` when it saves nothing (XLA never pays off).
    """
    for name, v in (("compile_s", compile_s), ("saved_per_call_s", saved_per_call_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number of seconds, got {type(v).__name__}")
    if compile_s < 0:
        raise ValueError(f"compile_s must be >= 0, got {compile_s}")
    if saved_per_call_s <= 0:
        return float("inf")
    return compile_s / saved_per_call_s


# --------------------------------------------------------------------------- fresh-process probes


@dataclass(frozen=True)
class ProbeJob:
    """A program to run in a fresh Python process with ``TF_XLA_FLAGS`` set."""

    label: str
    code: str
    tf_xla_flags: str = ""
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment, e.g. CUDA_VISIBLE_DEVICES


@dataclass
class CompileProbe:
    """What one :class:`ProbeJob` did: the XLA modules it compiled, and what it printed."""

    label: str
    tf_xla_flags: str
    modules: list[str]
    stdout: str
    returncode: int

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

    Each process gets ``TF_XLA_FLAGS`` from its job and
    ``XLA_FLAGS=--xla_dump_to=<temporary folder>``; every module XLA compiles
    leaves files there, which are counted and then deleted. A job that fails
    raises RuntimeError with its stderr.
    """
    if isinstance(jobs, ProbeJob):
        jobs = [jobs]
    jobs = list(jobs)
    if not jobs or not all(isinstance(j, ProbeJob) for j in jobs):
        raise TypeError("jobs must be a non-empty list of ProbeJob(label, code, tf_xla_flags)")
    for j in jobs:
        if not isinstance(j.code, str) or not j.code.strip():
            raise ValueError(f"probe {j.label!r} has no code to run")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(j.env).items()):
            raise TypeError(f"probe {j.label!r}: env values must be strings")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    with tempfile.TemporaryDirectory(prefix="gpucourse-xla-") as root:
        running = []
        for i, job in enumerate(jobs):
            dump = os.path.join(root, f"job{i}")
            os.mkdir(dump)
            # Parallel processes on one GPU: memory growth, or the first would reserve nearly all of it.
            env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", **os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **job.env,
                   "TF_XLA_FLAGS": job.tf_xla_flags,
                   "XLA_FLAGS": f"--xla_dump_to={dump}"}
            proc = subprocess.Popen([sys.executable, "-c", job.code], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
            running.append((job, dump, proc))
        out = []
        for job, dump, proc in running:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise RuntimeError(f"probe {job.label!r} took longer than {timeout} s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"probe {job.label!r} exited with {proc.returncode}:\n{stderr[-2000:]}")
            out.append(CompileProbe(job.label, job.tf_xla_flags, _module_names(dump), stdout, proc.returncode))
    return out


_AUTO_JIT_CODE = """\
import tensorflow as tf
tf.config.optimizer.set_jit(True)  # auto-clustering: no jit_compile anywhere below
@tf.function
def chain(x):
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
x = tf.random.normal((1000,))
chain(x); chain(x)
print(tf.config.optimizer.get_jit())
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
