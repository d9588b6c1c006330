"""`make test-cpu-paths`: the tutorials' checked outputs again, on CPU code paths unlike the default.

CPUs differ in their kernels: oneDNN, OpenBLAS and Eigen pick code by instruction set, so a float printed
by a checked cell (`# NBVAL_CHECK_OUTPUT`) on the machine that stored it can differ on a learner's laptop,
on Colab or on a GPU. This runs the tutorials under nbval once per path of :data:`PATHS`; any difference in
a checked cell fails.

Which tutorial runs on which path is decided on this machine, by probes, never by a list of CPUs:

* A **signature probe** (a fresh process per path, :func:`signature`) reads which code the path really
  selects: oneDNN's ISA (``ONEDNN_VERBOSE``), OpenBLAS's kernels (``OPENBLAS_VERBOSE``), oneDNN on or off.
  A path whose signature is the default's changes nothing on this CPU (capping oneDNN at an ISA the CPU
  does not have is a no-op), so it is skipped, with the reason.
* **Check probes** (:func:`probe`) run what the tutorials compute, in a fresh process under the path's
  environment after the course's own setup, each step with a time limit: float32, float16 and bfloat16
  matmuls, softmaxes and Keras training steps, and CPU allocator statistics (:data:`STEPS`). TensorFlow
  picks its oneDNN kernels from the CPU's real features, not from the cap, so a capped path can crash on
  one CPU and not on another (a bfloat16 matmul with SIGSEGV under AVX2 on any AVX-512 CPU; a float16
  softmax with AbortedError under AVX512_CORE on a CPU with AVX512_FP16).
* A tutorial runs on a path when every check it needs (:func:`needs`, from :data:`NEEDS`) passed there;
  otherwise it is left out of that path and the run prints the failed step. Every tutorial with checked
  cells must still run on at least one path other than the default, or the run fails (:func:`uncovered`).

    python .ci/cpu_paths.py            # probe, then every path (what CI runs)
    python .ci/cpu_paths.py --list     # probe and print the plan only
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, eq=False)  # a path is itself: two paths with the same name are still two keys
class CodePath:
    """One way to run the tutorials: a name and the environment variables that select its kernels."""

    name: str
    env: Mapping[str, str]

    def describe(self) -> str:
        return f"{self.name}: {' '.join(f'{k}={v}' for k, v in self.env.items())}"


AVX2 = CodePath("oneDNN capped at AVX2, OpenBLAS on Haswell kernels",
                {"ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"})
AVX512 = CodePath("oneDNN capped at AVX512_CORE, OpenBLAS on Haswell kernels",
                  {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "OPENBLAS_CORETYPE": "Haswell"})
#: TensorFlow's Eigen kernels, as in its macOS build, which has no oneDNN. The course's setup then turns on
#: TensorFlow's BFC CPU allocator, so CPU allocator statistics exist here too (gpucourse.colab.setup).
ONEDNN_OFF = CodePath("oneDNN off (TensorFlow's Eigen kernels, as on macOS)", {"TF_ENABLE_ONEDNN_OPTS": "0"})
PATHS = (AVX2, AVX512, ONEDNN_OFF)

#: The checks a probe can run, each as named steps (the code of each step is in :data:`_PROBE_CODE`).
STEPS = {
    "float32": ("float32 matmul", "float32 softmax", "float32 Dense training step"),
    "float16": ("float16 matmul", "float16 softmax", "Dense training step under mixed_float16"),
    "bfloat16": ("bfloat16 matmul", "bfloat16 softmax", "Dense training step under mixed_bfloat16"),
    "allocator statistics": ("tf.config.experimental.get_memory_info('CPU:0') after a matmul",),
}
#: What each check's code names in a notebook (tests/test_cpu_paths.py keeps :data:`NEEDS` in step with it).
MENTIONS = {"float16": r"\bfloat16\b|mixed_float16", "bfloat16": r"bfloat16",
            "allocator statistics": r"get_memory_info|measure_peak|memory_info\(|memory_explorer"}

#: What a tutorial needs besides float32 (every tutorial needs "float32"), and why. Found by running them:
#: these fail on a path where the check fails; the tutorials of :data:`NOT_NEEDED` pass there.
NEEDS = {
    "03": {"allocator statistics": "measures CPU memory with TensorFlow's allocator statistics"},
    "05": {"float16": "computes a softmax and trains under mixed_float16",
           "bfloat16": "trains under mixed_bfloat16"},
}
#: Tutorials whose code names what a check tests without needing it on a CPU, and why (measured: 04 passes
#: with oneDNN capped at AVX512_CORE, 08 and 09 at AVX2, on a CPU where a float16 or bfloat16 op aborts so).
NOT_NEEDED = {
    ("04", "float16"): "float16 is only a label of the T4's data-sheet figures",
    ("05", "allocator statistics"): "catches get_memory_info's ValueError and prints it in an unchecked cell",
    ("08", "bfloat16"): "bfloat16 is only the key of a data-sheet peak",
    ("09", "float16"): "float16 names data-sheet columns; its CPU matmul sweep is float32 (roofline.device_dtypes)",
    ("09", "bfloat16"): "bfloat16 is data-sheet arithmetic; its CPU matmul sweep is float32",
}

PROBE_TAG = "CPU_PATHS "
#: Seconds a probe may take to import TensorFlow and run the course's setup, then for each step.
START_LIMIT_S, STEP_LIMIT_S = 180.0, 90.0

_PROBE_CODE = r'''
import json, sys
def say(kind, check, text=""):
    print(%r + json.dumps([kind, check, text]), flush=True)
say("begin", "start", "import TensorFlow and run the course's setup (gpucourse.colab.setup)")
from gpucourse import colab
colab.setup()
import keras
import numpy as np
import tensorflow as tf
say("ok", "start")

def matmul(dtype):
    a = tf.cast(tf.random.stateless_uniform((128, 128), seed=(1, 2)), dtype)
    float(tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32)))

def softmax(dtype):  # as notebook 05 does: in a tf.function, then eagerly
    logits = tf.constant([[1000.3, 1000.0], [7e4, 0.0], [0.0, 21.0]])
    tf.function(lambda x: tf.nn.softmax(tf.cast(x, dtype)))(logits).numpy()
    tf.nn.softmax(tf.cast(logits, dtype)).numpy()

def train(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        inputs = keras.Input((32,))
        x = keras.layers.Dense(64, activation="relu")(keras.layers.Dense(64, activation="relu")(inputs))
        outputs = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(10)(x))
        model = keras.Model(inputs, outputs)
        model.compile("adam", "sparse_categorical_crossentropy")
        rng = np.random.default_rng(0)
        model.fit(rng.random((128, 32), dtype=np.float32), rng.integers(0, 10, 128), batch_size=32, epochs=1,
                  verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")

def allocator():
    a = tf.random.uniform((512, 512))
    tf.matmul(a, a).numpy()
    tf.config.experimental.get_memory_info("CPU:0")

CODE = {"float32": (lambda: matmul("float32"), lambda: softmax("float32"), lambda: train("float32")),
        "float16": (lambda: matmul("float16"), lambda: softmax("float16"), lambda: train("mixed_float16")),
        "bfloat16": (lambda: matmul("bfloat16"), lambda: softmax("bfloat16"), lambda: train("mixed_bfloat16")),
        "allocator statistics": (allocator,)}
STEPS = json.loads(sys.argv[1])
for check in sys.argv[2:]:
    for step, run in zip(STEPS[check], CODE[check]):
        say("begin", check, step)
        try:
            run()
        except Exception as exc:
            say("error", check, f"{step} raised {type(exc).__name__}: {exc}")
            break
    else:
        say("ok", check)
''' % PROBE_TAG

_SIGNATURE_CODE = r'''
import json
from gpucourse import colab
colab.setup()
import tensorflow as tf
a = tf.random.uniform((64, 64))
tf.matmul(a, a).numpy()
print(%r + json.dumps(["signature", "onednn", colab.onednn_enabled()]), flush=True)
''' % PROBE_TAG


@dataclass(frozen=True)
class Outcome:
    """What one check did on one path: passed, or the step that failed and how."""

    ok: bool
    detail: str = ""


@dataclass
class Survey:
    """What the probes found on one path: the code it selects (``None``: unknown) and each check's outcome."""

    signature: dict | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)


def _env(path: CodePath | None, extra: Mapping[str, str] = {}) -> dict[str, str]:
    return {**os.environ, **(path.env if path else {}), **extra}


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _crash(returncode: int | None, tail: list[str]) -> str:
    if returncode is not None and returncode < 0:
        import signal

        try:
            how = f"the process died of {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"the process died of signal {-returncode}"
    else:
        how = f"the process exited with code {returncode}"
    said = [ln for ln in tail if ln.strip() and not ln.startswith(PROBE_TAG)]
    last = next((ln for ln in reversed(said) if re.search(r"error|what\(\)|abort|fault", ln, re.I)), None)
    return f"{how}" + (f" ({_short(last, 200)})" if last else "")


def _run_probe(args: list[str], env: dict[str, str], limits: Callable[[str], float]):
    """Run the probe code with ``args``; yield ``(kind, check, text)`` as it reports, then ``("end", ...)``.

    ``limits(check)`` is the time the probe may take until its next report, given the check it is on.
    A probe that exceeds it is killed and reported as ``("timeout", check, seconds)``.
    """
    proc = subprocess.Popen([sys.executable, "-c", _PROBE_CODE, json.dumps(STEPS), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: ([lines.put(ln) for ln in proc.stdout], lines.put(None)), daemon=True).start()
    tail: list[str] = []
    check = "start"
    while True:
        limit = limits(check)
        try:
            line = lines.get(timeout=limit)
        except queue.Empty:
            proc.kill()
            proc.wait()
            yield "timeout", check, f"{limit:g}"
            return
        if line is None:
            proc.wait()
            yield "end", check, _crash(proc.returncode, tail) if proc.returncode else ""
            return
        tail = (tail + [line.rstrip("\n")])[-30:]
        if line.startswith(PROBE_TAG):
            kind, check, text = json.loads(line[len(PROBE_TAG):])
            yield kind, check, text


def probe(path: CodePath, checks: list[str], step_limit_s: float = STEP_LIMIT_S,
          start_limit_s: float = START_LIMIT_S) -> dict[str, Outcome]:
    """Run ``checks`` on ``path``, each in a fresh process until one crashes: ``{check: Outcome}``.

    A step that raises fails its check and the probe goes on; a step that kills the process (a signal, an
    abort) or outlives ``step_limit_s`` fails its check, and the checks after it run in a new process.
    """
    todo, done = list(checks), {}
    while todo:
        current, step = "start", "import TensorFlow and run the course's setup"
        for kind, check, text in _run_probe(todo, _env(path),
                                            lambda c: start_limit_s if c == "start" else step_limit_s):
            if kind == "begin":
                current, step = check, text
            elif kind == "ok" and check != "start":
                done[check] = Outcome(True)
            elif kind == "error":
                done[check] = Outcome(False, _short(text))
            elif kind in ("timeout", "end") and current in todo and current not in done:
                why = f"did not finish within {text} s" if kind == "timeout" else text or "the process ended"
                done[current] = Outcome(False, f"{step}: {why}")
            elif kind in ("timeout", "end") and current == "start":
                why = f"did not finish within {text} s" if kind == "timeout" else text or "the process ended"
                return {**done, **{c: Outcome(False, f"{step}: {why}") for c in todo if c not in done}}
        todo = [c for c in todo if c not in done]
    return done


def signature(path: CodePath | None, timeout_s: float = START_LIMIT_S) -> dict | None:
    """Which code ``path`` (``None``: the default) selects here: oneDNN on or off, its ISA, OpenBLAS's kernels.

    Read from a fresh process's ``ONEDNN_VERBOSE`` and ``OPENBLAS_VERBOSE`` lines; ``None`` when the process
    failed or printed neither, so that nothing unknown is ever taken for the default.
    """
    env = _env(path, {"ONEDNN_VERBOSE": "1", "OPENBLAS_VERBOSE": "2"})
    try:
        proc = subprocess.run([sys.executable, "-c", _SIGNATURE_CODE], env=env, cwd=ROOT, capture_output=True,
                              text=True, errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    text = proc.stdout + "\n" + proc.stderr
    isa = re.search(r"onednn_verbose.*?,isa:([^\n]+)", text)
    core = re.search(r"^Core: *(\S+)", text, re.M)
    onednn = re.search(re.escape(PROBE_TAG) + r'\["signature", "onednn", (\w+)\]', text)
    if proc.returncode != 0 or not onednn or not (isa or core):
        return None
    return {"oneDNN": json.loads(onednn.group(1)), "oneDNN ISA": isa.group(1).strip() if isa else None,
            "OpenBLAS": core.group(1) if core else None}


def needs(notebook: Path) -> dict[str, str]:
    """The checks ``notebook`` needs, each with why: float32 always, plus its :data:`NEEDS`."""
    return {"float32": "computes in float32", **NEEDS.get(notebook.name[:2], {})}


def survey(paths=PATHS, notebooks: list[Path] = (), probe=probe, signature=signature) -> tuple[dict | None, dict]:
    """``(default signature, {path: Survey})``: probes each path for the checks ``notebooks`` need.

    A path whose signature is the default's is not probed further (its outcomes stay empty).
    """
    checks = sorted({c for nb in notebooks for c in needs(nb)}, key=list(STEPS).index)
    default = signature(None)
    found = {}
    for path in paths:
        sig = signature(path)
        found[path] = Survey(sig, {} if default is not None and sig == default else probe(path, checks))
    return default, found


@dataclass
class Step:
    """One path in the plan: the tutorials it runs, those left out with why, or why it is skipped."""

    path: CodePath
    run: list[Path]
    left_out: list[tuple[Path, str]]
    skipped: str = ""


def plan(notebooks: list[Path], default: dict | None, surveys: Mapping[CodePath, Survey]) -> list[Step]:
    """What to run on each surveyed path (pure: the probes' findings in, the plan out)."""
    steps = []
    for path, found in surveys.items():
        if default is not None and found.signature == default:
            what = ", ".join(f"{k} {v}" for k, v in default.items() if v is not None)
            steps.append(Step(path, [], [], f"it selects the same code as the default on this CPU ({what}): "
                                             "nothing new to check"))
            continue
        run, left_out = [], []
        for nb in notebooks:
            failed = [(check, why, found.outcomes.get(check, Outcome(False, "not probed")))
                      for check, why in needs(nb).items()]
            failed = [f for f in failed if not f[2].ok]
            if failed:
                left_out.append((nb, "; ".join(f"it {why} ({check}), and on this path {o.detail}"
                                                for check, why, o in failed)))
            else:
                run.append(nb)
        steps.append(Step(path, run, left_out))
    return steps


def checked(notebook: Path) -> bool:
    """Whether ``notebook`` has cells whose output nbval compares (``# NBVAL_CHECK_OUTPUT``)."""
    return "# NBVAL_CHECK_OUTPUT" in notebook.read_text(encoding="utf-8")


def uncovered(notebooks: list[Path], steps: list[Step], is_checked: Callable[[Path], bool] = checked) -> list[Path]:
    """The tutorials with checked cells that no path other than the default runs (the run fails on any)."""
    ran = {nb for s in steps for nb in s.run}
    return [nb for nb in notebooks if is_checked(nb) and nb not in ran]


def describe(steps: list[Step]) -> str:
    """The plan as the run prints it: each path, then what it runs, skips or leaves out, and why."""
    out = []
    for s in steps:
        out.append(f"== {s.path.describe()}")
        if s.skipped:
            out.append(f"   skipped: {s.skipped}")
            continue
        out.append(f"   runs {', '.join(nb.name[:2] for nb in s.run) or 'nothing'}")
        out += [f"   left out {nb.name[:2]}: {why}" for nb, why in s.left_out]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="probe, print the plan and stop")
    ap.add_argument("--jobs", default=os.environ.get("JOBS", "2"))
    args = ap.parse_args(argv)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    start = time.monotonic()
    default, surveys = survey(PATHS, notebooks)
    print(f"probed {len(PATHS)} paths in {time.monotonic() - start:.0f} s; the default selects {default}", flush=True)
    for path, found in surveys.items():
        print(f"   {path.name}: {found.signature}; " + ", ".join(
            f"{c} {'ok' if o.ok else 'FAILED'}" for c, o in found.outcomes.items()), flush=True)
    steps = plan(notebooks, default, surveys)
    print(describe(steps), flush=True)
    missing = uncovered(notebooks, steps)
    failed = []
    for s in ([] if args.list else steps):
        if not s.run:
            continue
        print(f"== running {s.path.describe()}", flush=True)
        cmd = [sys.executable, "-m", "pytest", "-n", str(args.jobs), "--dist", "loadfile", "-p", "no:cacheprovider",
               "-q", *[str(nb.relative_to(ROOT)) for nb in s.run]]
        if subprocess.run(cmd, cwd=ROOT, env=_env(s.path)).returncode != 0:
            failed.append(s.path.name)
    if missing:
        print(f"no path other than the default runs {', '.join(nb.name for nb in missing)}: their checked outputs "
              "go unchecked on other CPUs. Add a path to .ci/cpu_paths.py that they can run on.", file=sys.stderr)
    if failed:
        print(f"checked outputs differ on: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
