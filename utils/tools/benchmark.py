"""Benchmark script: the thread-pool, tf.data, XLA, capstone and roofline measurements, as ratios to their bounds.

    python -m gpucourse.benchmark            # full run (about a minute on 2 CPU cores)
    python -m gpucourse.benchmark --quick    # shorter runs, noisier numbers
    python -m gpucourse.benchmark --json results.json

Each topic module exposes ``benchmark(quick) -> list[dict]``. Its rows have the keys ``topic``, ``case``,
``median_s``, ``bound_s``, ``ratio_to_bound``, ``speedup`` and ``note``; the capstone rows also have
``utilisation``. The roofline rows (topic 09) give the best matmul of each dtype and the memory
bandwidth; their bound is the data sheet's peak on a GPU the course knows (none on a CPU). All
measurements run one after the other (in this process, except the thread-pool rows, which need
fresh processes because thread pools are fixed when TensorFlow starts), so the ratios compare like
with like. They are deliberately not part of the test suite: timings are for
reading, not for asserting.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

__all__ = ["SOURCES", "REQUIRED_KEYS", "collect", "format_table", "main"]

#: (module, what it measures), run in this order.
SOURCES = (
    ("gpucourse.startup", "01 thread pools: intra/inter-op settings vs one thread"),
    ("gpucourse.pipeline", "07 tf.data: pipelines vs max(producer, consumer)"),
    ("gpucourse.xla", "06 XLA: eager vs tf.function vs jit_compile"),
    ("gpucourse.simulate", "08 capstone: accelerator utilisation, slow vs tuned"),
    ("gpucourse.roofline", "09 roofline: best matmul per dtype and memory bandwidth, vs the data sheet"),
)
REQUIRED_KEYS = ("topic", "case", "median_s", "bound_s", "ratio_to_bound", "speedup", "note")


def collect(quick: bool = False, sources=SOURCES, echo=print) -> list[dict]:
    """Run every source's ``benchmark(quick)`` and return all rows; a failing source becomes an error row."""
    rows: list[dict] = []
    for module_name, what in sources:
        echo(f"running {what} ...")
        t0 = time.perf_counter()
        try:
            got = importlib.import_module(module_name).benchmark(quick=quick)
            for row in got:
                missing = [k for k in REQUIRED_KEYS if k not in row]
                if missing:
                    raise ValueError(f"row {row!r} lacks {missing}")
            rows.extend(got)
        except Exception as exc:  # keep going: one broken topic should not hide the others
            rows.append({"topic": module_name, "case": "ERROR", "median_s": None, "bound_s": None,
                         "ratio_to_bound": None, "speedup": None, "note": f"{type(exc).__name__}: {exc}"})
        echo(f"  done in {time.perf_counter() - t0:.1f} s")
    return rows


def _fmt(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "s":
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "%":
        return f"{value:.0%}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """Plain-text table: topic, case, median, bound, ratio to bound, speedup, utilisation, note."""
    head = ["topic", "case", "median", "bound", "/ bound", "speedup", "util", "note"]
    body = [[str(r.get("topic", "")), str(r.get("case", "")), _fmt(r.get("median_s"), "s"),
             _fmt(r.get("bound_s"), "s"), _fmt(r.get("ratio_to_bound"), "x"), _fmt(r.get("speedup"), "x"),
             _fmt(r.get("utilisation"), "%"), str(r.get("note", ""))] for r in rows]
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucourse.benchmark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    a = ap.parse_args(argv)
    from .._tf import tf as _tf

    tf = _tf()
    gpus = tf.config.list_physical_devices("GPU")
    print(f"TensorFlow {tf.__version__} on {platform.machine()} with "
          f"{len(gpus)} GPU(s)" + ("" if gpus else " (CPU path)"))
    rows = collect(quick=a.quick)
    print()
    print(format_table(rows))
    print("\n'/ bound' is measured time over the theoretical best (1.00 = at the limit); "
          "'speedup' is against each topic's baseline.")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"rows written to {a.json}")
    return 1 if any(r["case"] == "ERROR" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
