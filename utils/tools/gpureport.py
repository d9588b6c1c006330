"""The GPU check (`make test-gpu`): run the whole course on this machine's NVIDIA GPU and write gpu-report.md.

    make test-gpu                                  # all of it, from a fresh clone
    python -m utils.gpureport preflight            # is there an NVIDIA GPU at all? (nothing installed yet)
    python -m gpucourse.gpureport run              # in .venv-gpu: tests, measurements, report
    python -m gpucourse.gpureport measure --json m.json   # the measurements alone

The steps, in order (:func:`plan`):

1. **Preflight.** ``nvidia-smi`` must list a GPU; without one the check stops at once, before
   anything is installed, and says why (:func:`preflight`).
2. **An environment of its own.** The Makefile creates ``.venv-gpu`` with ``tensorflow[and-cuda]``;
   TensorFlow there must see the GPU (:func:`require_tensorflow_gpu`), else the CUDA libraries it
   failed to load are the problem, not the course.
3. **Every tutorial, lab and solution with the GPU required.** ``GPUCOURSE_REQUIRE_GPU=1`` makes each
   notebook's setup cell (:func:`gpucourse.colab.setup`) fail when TensorFlow sees no GPU, so a
   notebook cannot pass by silently running on the CPU; the GPU-only tests (``-m gpu``) fail instead
   of skipping.
4. **Measurements** in a fresh process (:func:`measure`): achieved matmul TFLOP/s per dtype against
   the data sheet; mixed precision against float32 and TF32 for a matmul and a training step, each
   beside the ceiling the notebooks state; and the XLA, tf.data and capstone ratios of
   ``gpucourse.benchmark``.
5. **The report** (:func:`format_report`): ``gpu-report.md``. Commit it under ``docs/gpu-reports/``.

Running this module with ``python -m utils.gpureport`` from the repository root works before the
course is installed (only the preflight needs that); everything else imports lazily.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["NoGpuError", "Step", "SMI_FIELDS", "query_gpus", "preflight", "plan", "run_plan",
           "require_tensorflow_gpu", "notebook_results", "measure", "format_report", "main"]

ROOT = Path(__file__).resolve().parents[2]
#: What ``nvidia-smi --query-gpu`` is asked for, in this order.
SMI_FIELDS = ("name", "compute_cap", "memory.total", "driver_version")
#: The notebooks the check runs: tutorials under nbval, labs and solutions through the grader.
KINDS = {"notebooks": "tutorial", "labs": "lab", "solutions": "solution"}


class NoGpuError(RuntimeError):
    """No usable NVIDIA GPU: the message says what was looked for and what to do."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the check, with the JUnit file it leaves (if any)."""

    name: str
    argv: list
    env: dict
    junit: str | None = None


# --------------------------------------------------------------------------- 1. preflight


def query_gpus(run: Callable = subprocess.run) -> list[dict]:
    """The GPUs ``nvidia-smi`` lists, as dicts with the keys of :data:`SMI_FIELDS` (empty: none).

    ``run`` is :func:`subprocess.run` (a fake in tests). No ``nvidia-smi`` on ``PATH`` means no NVIDIA
    driver: an empty list, never a ``FileNotFoundError``.
    """
    if run is subprocess.run and shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    gpus = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(SMI_FIELDS) and parts[0]:
            gpus.append(dict(zip(SMI_FIELDS, parts)))
    return gpus


def preflight(gpus: list[dict] | None = None) -> list[dict]:
    """The GPUs to test on; :class:`NoGpuError` at once when there is none (nothing is installed then)."""
    gpus = query_gpus() if gpus is None else gpus
    if not gpus:
        raise NoGpuError(
            "make test-gpu needs an NVIDIA GPU, and this machine has none: nvidia-smi is missing or lists no "
            "GPU (an Apple GPU under tensorflow-metal is not an NVIDIA GPU: this check needs CUDA). Nothing was "
            "installed. On a CPU-only machine run `make test` (the notebooks take their CPU "
            "path); on Colab or Kaggle pick a GPU runtime first; on a GPU machine install the NVIDIA driver "
            "and check that `nvidia-smi` lists the card.")
    return gpus


def require_tensorflow_gpu(tf=None) -> list:
    """TensorFlow's physical GPUs; :class:`NoGpuError` naming the likely cause when it sees none."""
    if tf is None:
        import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        info = tf.sysconfig.get_build_info()
        if not info.get("is_cuda_build"):
            raise NoGpuError(f"TensorFlow {tf.__version__} here is a CPU-only build; this check installs "
                             "tensorflow[and-cuda] in .venv-gpu: run it through `make test-gpu`")
        raise NoGpuError(f"TensorFlow {tf.__version__} (built for CUDA {info.get('cuda_version')}, cuDNN "
                         f"{info.get('cudnn_version')}) sees no GPU although nvidia-smi lists one: it could not "
                         "load a CUDA library. Run `python -c \"import tensorflow as tf; "
                         "tf.config.list_physical_devices('GPU')\"` with TF_CPP_MIN_LOG_LEVEL=0: the log names "
                         "the library it missed (then check the driver is new enough for that CUDA).")
    return gpus


# --------------------------------------------------------------------------- 2-3. the plan


def plan(python: str, out: Path, jobs: int = 2) -> list[Step]:
    """The test steps, each a pytest run with the GPU required and a JUnit file in ``out``."""
    if not isinstance(python, str) or not python:
        raise TypeError(f"python must be the path of the interpreter as a string, got {python!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r} (pytest-xdist workers)")
    out = Path(out)
    env = {"GPUCOURSE_REQUIRE_GPU": "1", "CI": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
    pytest = [python, "-m", "pytest", "-p", "no:cacheprovider", "-n", str(jobs), "--dist", "loadfile"]
    return [
        Step("tutorials (nbval)", pytest + ["notebooks", f"--junitxml={out / 'tutorials.xml'}"], env,
             str(out / "tutorials.xml")),
        Step("labs and solutions (the grader)",
             pytest + ["tests/grading/grader/test_grade_solutions.py", "tests/grading/grader/test_grade_labs.py",
                       f"--junitxml={out / 'labs.xml'}"], env, str(out / "labs.xml")),
        Step("GPU-only tests", pytest + ["tests", "-m", "gpu", f"--junitxml={out / 'gpu-tests.xml'}"], env,
             str(out / "gpu-tests.xml")),
    ]


def run_plan(steps: Sequence[Step], run: Callable = subprocess.run, echo=print) -> dict[str, int]:
    """Run each step from the repository root (all of them, even after a failure); exit code by step name."""
    codes = {}
    for step in steps:
        echo(f"== {step.name}: {' '.join(step.argv)}")
        proc = run(step.argv, cwd=str(ROOT), env={**os.environ, **step.env})
        codes[step.name] = proc.returncode
    return codes


_NOTEBOOK = re.compile(r"(notebooks|labs|solutions)[./](\d\d_[A-Za-z0-9_]+?)(?:\.ipynb|$)")
_PARAM = re.compile(r"\[(\d\d_[A-Za-z0-9_]+)\]")


def _notebook_of(case: ET.Element) -> str | None:
    classname, name = case.get("classname", ""), case.get("name", "")
    m = _NOTEBOOK.search(classname.replace("/", "."))
    if m:
        return f"{m.group(1)}/{m.group(2)}.ipynb"
    p = _PARAM.search(name)
    if p and "grade_solutions" in classname:
        return f"solutions/{p.group(1)}.ipynb"
    if p and "grade_labs" in classname:
        return f"labs/{p.group(1)}.ipynb"
    return None


_ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")
_EXCEPTION = re.compile(r"^[A-Za-z_.]*(?:Error|Exception|Exit|Interrupt)\b")


def _first_line(case: ET.Element) -> str | None:
    """``"<test name>: <the exception line>"`` for a failed or erroring test case, else None."""
    for tag in ("failure", "error"):
        bad = case.find(tag)
        if bad is not None:
            text = _ANSI.sub("", bad.get("message") or bad.text or "")
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            raised = [ln for ln in lines if _EXCEPTION.match(ln)]
            what = (raised[-1] if raised else lines[0] if lines else tag)[:300]
            return f"{case.get('name')}: {what}"
    return None


def notebook_results(junit_files: Sequence[str | Path]) -> dict[str, dict]:
    """Pass or fail for each notebook in JUnit files: ``{path: {"passed": n, "failed": n, "first_error": str|None}}``.

    Tutorials appear as nbval's cells (``notebooks/05_x.ipynb::Cell 29``), labs and solutions as the
    grader tests' parameters (``test_solution_scores_full_marks[05_x]``). Other test cases are
    gathered under ``"other tests"``. A missing file (a step that crashed) is reported as an error.
    """
    results: dict[str, dict] = {}
    for path in junit_files:
        path = Path(path)
        if not path.exists():
            results[f"({path.name})"] = {"passed": 0, "failed": 1, "skipped": 0,
                                         "first_error": f"{path.name} was not written: the step did not run"}
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            key = _notebook_of(case) or "other tests"
            row = results.setdefault(key, {"passed": 0, "failed": 0, "skipped": 0, "first_error": None})
            err = _first_line(case)
            if err:
                row["failed"] += 1
                row["first_error"] = row["first_error"] or err
            elif case.find("skipped") is not None:
                row["skipped"] += 1
            else:
                row["passed"] += 1
    return dict(sorted(results.items()))


# --------------------------------------------------------------------------- 4. measurements


def _build_mlp(in_dim: int, width: int, classes: int = 10):
    """Notebook 05's MLP (two hidden ReLU layers, float32 softmax), at its GPU-path size."""
    import keras

    inputs = keras.Input((in_dim,))
    x = keras.layers.Dense(width, activation="relu")(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    x = keras.layers.Dense(classes)(x)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(x))


def _ceiling(device: dict, dtype: str, tf32: bool) -> float | None:
    """The data-sheet ceiling of ``dtype`` against float32 (TF32 on or off), as notebook 05 states it."""
    from .. import precision

    return precision.pick_speedup_bound(device, f"mixed_{dtype}", tf32=tf32).matmul


def _training_step_ratios(device: dict) -> list[dict]:
    """Notebook 05's GPU-path training step: mixed precision against float32 with TF32 on and off."""
    import numpy as np
    import tensorflow as tf

    from .. import precision, precision_hardware

    in_dim, width, batch = 1024, 4096, 1024
    x = np.random.default_rng(2).random((batch, in_dim), dtype=np.float32)
    y = np.random.default_rng(3).integers(0, 10, batch)
    bf16 = precision_hardware.tensor_core_support(device["compute_capability"], device["device_name"])["bfloat16"]
    policies = ["float32", "mixed_float16"] + (["mixed_bfloat16"] if bf16 else [])
    rows = []
    for tf32 in (True, False):
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        cmp = precision.compare_policies(lambda: _build_mlp(in_dim, width), x, y, policies=policies, repeats=10)
        base = cmp["float32"].median_s
        for p in policies[1:]:
            ceiling = _ceiling(device, p.removeprefix("mixed_"), tf32)
            rows.append({"what": f"training step, {p} vs float32 (TF32 {'on' if tf32 else 'off'})",
                         "claim": f"below the matmul ceiling {ceiling:.1f}x" if ceiling else "above 1x",
                         "measured": base / cmp[p].median_s, "ceiling": ceiling})
    tf.config.experimental.enable_tensor_float_32_execution(True)
    return rows


def measure(quick: bool = False, echo=print) -> dict:
    """Everything the report states about this GPU, measured in this process (a fresh one)."""
    import tensorflow as tf

    from .. import devices, precision, roofline
    from . import benchmark

    require_tensorflow_gpu(tf)
    gpu = devices.nvml_gpus()[0] if devices.nvml_gpus() else None
    name = gpu.name if gpu else tf.config.experimental.get_device_details(
        tf.config.list_physical_devices("GPU")[0]).get("device_name", "unknown GPU")
    device = {**precision.describe_device(), "device_name": name}
    cc = device["compute_capability"]
    info = tf.sysconfig.get_build_info()
    peaks = roofline.datasheet_gpu(name)
    echo("measuring the roofline: matmul TFLOP/s per dtype, memory bandwidth ...")
    roof, matmuls, _ = roofline.measure_roof(quick=quick)
    rate = {r.dtype: r.best_tflops for r in matmuls}
    ratios = []
    for dtype in ("float16", "bfloat16"):
        for base in ("tfloat32", "float32"):
            if dtype in rate and base in rate:
                ceiling = _ceiling(device, dtype, base == "tfloat32")
                ratios.append({"what": f"matmul, {dtype} vs {'TF32' if base == 'tfloat32' else 'float32 (TF32 off)'}",
                               "claim": f"at most the data-sheet ratio {ceiling:.1f}x" if ceiling else "above 1x",
                               "measured": rate[dtype] / rate[base], "ceiling": ceiling})
    echo("measuring notebook 05's training step per policy ...")
    ratios += _training_step_ratios(device)
    echo("running gpucourse.benchmark (XLA, tf.data, capstone) ...")
    # the thread pools are a CPU matter; the roofline was measured above
    sources = [s for s in benchmark.SOURCES if s[0] not in ("gpucourse.startup", "gpucourse.roofline")]
    bench = benchmark.collect(quick=quick, sources=sources, echo=echo)
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": {"name": name, "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
                "memory_mib": gpu.memory_total_mib if gpu else None, "driver": gpu.driver if gpu else None,
                "count": len(tf.config.list_physical_devices("GPU"))},
        "tensorflow": {"version": tf.__version__, "cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version")},
        # the variant row the roof used ("A100 40GB": 1,555 GB/s), else the peaks' row alone
        "datasheet": (f"{roofline.datasheet_roof(name).name}: {roofline.datasheet_roof(name).source}"
                      if _has_roof(name) else peaks.source if peaks else None),
        "matmul": [dataclasses.asdict(r) | {"tflops_by_shape": {"x".join(map(str, k)): v
                                                                for k, v in r.tflops_by_shape.items()}}
                   for r in matmuls],
        "roof": dataclasses.asdict(roof),
        "ratios": ratios,
        "benchmark": bench,
    }


# --------------------------------------------------------------------------- 5. the report


def _has_roof(name: str) -> bool:
    from .. import roofline

    try:
        roofline.datasheet_roof(name)
    except ValueError:
        return False
    return True


def format_report(measured: dict, results: dict[str, dict], codes: dict[str, int] | None = None) -> str:
    """``gpu-report.md``: the GPU, pass/fail per notebook, matmul TFLOP/s against the data sheet, the ratios."""
    from .. import roofline

    g, t = measured["gpu"], measured["tensorflow"]
    failed = sum(r["failed"] for r in results.values())
    lines = [f"# GPU report: {g['name']}, {measured['date']}", "",
             f"Written by `make test-gpu` (`python -m gpucourse.gpureport run`). Verdict: "
             f"**{'all notebooks passed' if not failed and results else f'{failed} failing test(s)'}**.", "",
             "## The machine", "",
             "| GPU | compute capability | memory | driver | GPUs | TensorFlow | CUDA (build) | cuDNN (build) |",
             "|---|---|---|---|---|---|---|---|",
             f"| {g['name']} | {g['compute_capability']} | {g['memory_mib']} MiB | {g['driver']} | {g['count']} | "
             f"{t['version']} | {t['cuda']} | {t['cudnn']} |", "",
             "## Notebooks, with the GPU required", "",
             "| notebook | passed | failed | skipped | first error |", "|---|---|---|---|---|"]
    for nb, r in results.items():
        lines.append(f"| {nb} | {r['passed']} | {r['failed']} | {r['skipped']} | {r['first_error'] or ''} |")
    if codes:
        lines += ["", "Exit codes: " + ", ".join(f"{k} {v}" for k, v in codes.items()) + "."]
    peaks = roofline.datasheet_gpu(g["name"])
    rows = [roofline.MatmulResult(m["dtype"], m["device"], m["best_tflops"], tuple(m["best_shape"]), {})
            for m in measured["matmul"]]
    lines += ["", "## Achieved matmul TFLOP/s per dtype (best over a sweep of shapes)", "",
              roofline.format_matmul_table(rows, peaks), "",
              f"Data sheet: {measured['datasheet'] or 'none in the course for this GPU'} (dense, no sparsity).", ""]
    if measured.get("roof"):
        reference = roofline.datasheet_roof(g["name"]) if _has_roof(g["name"]) else None
        lines += ["## The roofline: measured beside the data sheet", "",
                  roofline.format_roof(roofline.Roof(**measured["roof"]), reference), ""]
    lines += [
              "## Ratios the notebooks state, measured here", "",
              "| what | the notebooks' claim | measured | within the claim |", "|---|---|---|---|"]
    for r in measured["ratios"]:
        ok = "-" if r["ceiling"] is None else ("yes" if r["measured"] <= r["ceiling"] * 1.05 else "NO: above the ceiling")
        lines.append(f"| {r['what']} | {r['claim']} | {r['measured']:.2f}x | {ok} |")
    lines += ["", "## XLA, tf.data and the capstone (`gpucourse.benchmark`)", "",
              "| topic | case | median | bound | / bound | speedup | note |", "|---|---|---|---|---|---|---|"]
    fmt = lambda v, unit: "-" if v is None else (f"{v * 1e3:.2f} ms" if unit == "s" else f"{v:.2f}x")  # noqa: E731
    for b in measured["benchmark"]:
        lines.append(f"| {b['topic']} | {b['case']} | {fmt(b['median_s'], 's')} | {fmt(b['bound_s'], 's')} | "
                     f"{fmt(b['ratio_to_bound'], 'x')} | {fmt(b['speedup'], 'x')} | {b['note']} |")
    lines += ["", "'/ bound' is the measured time over the theoretical best (1.00 = at the limit). "
              "Ratios come from one run, side by side; absolute times vary between runs.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucourse.gpureport", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("preflight", help="stop at once unless nvidia-smi lists a GPU")
    run_p = sub.add_parser("run", help="the tests with the GPU required, the measurements, the report")
    run_p.add_argument("--report", type=Path, default=ROOT / "gpu-report.md")
    run_p.add_argument("--out", type=Path, default=ROOT / "gpu-test-output")
    run_p.add_argument("--jobs", type=int, default=2)
    run_p.add_argument("--quick", action="store_true", help="shorter measurements (noisier)")
    m_p = sub.add_parser("measure", help="only the measurements, as JSON")
    m_p.add_argument("--json", type=Path, required=True)
    m_p.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    try:
        if a.command == "preflight":
            for g in preflight():
                print(f"found {g['name']} (compute capability {g['compute_cap']}, {g['memory.total']} MiB, "
                      f"driver {g['driver_version']})")
            return 0
        if a.command == "measure":
            a.json.write_text(json.dumps(measure(quick=a.quick), indent=2, default=str) + "\n")
            return 0
        preflight()
        require_tensorflow_gpu()
        a.out.mkdir(parents=True, exist_ok=True)
        steps = plan(sys.executable, a.out, a.jobs)
        codes = run_plan(steps)
        results = notebook_results([s.junit for s in steps if s.junit])
        mjson = a.out / "measured.json"
        proc = subprocess.run([sys.executable, "-m", "gpucourse.gpureport", "measure", "--json", str(mjson)]
                              + (["--quick"] if a.quick else []), cwd=str(ROOT))
        if proc.returncode != 0:
            print("the measurements failed; the report has the test results only", file=sys.stderr)
            measured = {"gpu": {k: None for k in ("name", "compute_capability", "memory_mib", "driver", "count")},
                        "tensorflow": {"version": None, "cuda": None, "cudnn": None}, "datasheet": None,
                        "matmul": [], "ratios": [], "benchmark": [], "date": datetime.date.today().isoformat()}
            measured["gpu"]["name"] = preflight()[0]["name"]
        else:
            measured = json.loads(mjson.read_text())
        a.report.write_text(format_report(measured, results, codes))
        print(f"report written to {a.report}; commit it as docs/gpu-reports/<gpu>-<date>.md")
        return 0 if all(c == 0 for c in codes.values()) and proc.returncode == 0 else 1
    except NoGpuError as exc:
        print(str(exc), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
