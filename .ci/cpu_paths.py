"""`make test-cpu-paths`: the tutorials' checked outputs again, on CPU code paths unlike the default.

CPUs differ in their kernels: oneDNN, OpenBLAS and Eigen pick code by instruction set, so a float printed
by a checked cell (`# NBVAL_CHECK_OUTPUT`) on the machine that stored it can differ on a learner's laptop,
on Colab or on a GPU. This runs the tutorials under nbval once per path (:func:`plan`); any difference in a
checked cell fails. A notebook is left out of a path only for a reason that is not about its outputs
(:data:`BFLOAT16`, :data:`NEEDS_ONEDNN`), and the run prints it.

    python .ci/cpu_paths.py            # every path (what CI runs)
    python .ci/cpu_paths.py --list     # the plan only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

AVX2 = ("oneDNN capped at AVX2, OpenBLAS on Haswell kernels", {"ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"})
AVX512 = ("oneDNN capped at AVX512_CORE, OpenBLAS on Haswell kernels",
          {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "OPENBLAS_CORETYPE": "Haswell"})
ONEDNN_OFF = ("oneDNN off (TensorFlow's Eigen kernels)", {"TF_ENABLE_ONEDNN_OPTS": "0"})

#: Notebooks that compute in bfloat16. On a CPU with AVX-512, TensorFlow 2.21 crashes (SIGSEGV) on a
#: bfloat16 matmul when oneDNN is capped below AVX512_CORE, so there they take :data:`AVX512` instead of
#: :data:`AVX2` (still another path than the default on CPUs with AVX512_BF16, VNNI or AMX).
BFLOAT16 = {"05": "mixed_bfloat16 training steps", "09": "bfloat16 matmuls on the roofline"}
#: Notebooks left out of :data:`ONEDNN_OFF`: TensorFlow keeps CPU allocator statistics only with oneDNN on.
NEEDS_ONEDNN = {"03": "measures CPU memory with the allocator statistics (its checked cells are exact "
                      "arithmetic, the same on every kernel)"}


def has_avx512() -> bool:
    """Whether this CPU has AVX-512 (Linux: /proc/cpuinfo's flags)."""
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text(errors="replace").split()
    except OSError:
        return False


def plan(notebooks: list[Path], avx512: bool) -> list[tuple[str, dict, list[Path], list[str]]]:
    """[(path name, environment, notebooks to run, notes on what was left out and why)] for this CPU."""
    crash = [nb for nb in notebooks if avx512 and nb.name[:2] in BFLOAT16]
    steps = [(*AVX2, [nb for nb in notebooks if nb not in crash],
              [f"{nb.name[:2]} ({BFLOAT16[nb.name[:2]]}): TensorFlow 2.21 crashes on bfloat16 matmuls with oneDNN "
               "capped at AVX2 on an AVX-512 CPU; it runs on the AVX512_CORE path" for nb in crash])]
    if crash:
        steps.append((*AVX512, crash, []))
    steps.append((*ONEDNN_OFF, [nb for nb in notebooks if nb.name[:2] not in NEEDS_ONEDNN],
                  [f"{nb.name[:2]}: {NEEDS_ONEDNN[nb.name[:2]]}" for nb in notebooks if nb.name[:2] in NEEDS_ONEDNN]))
    return steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the plan and stop")
    ap.add_argument("--jobs", default=os.environ.get("JOBS", "2"))
    args = ap.parse_args(argv)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    failed = []
    for name, env, run, notes in plan(notebooks, has_avx512()):
        print(f"== {name}: {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
        for note in notes:
            print(f"   left out {note}", flush=True)
        if args.list or not run:
            continue
        cmd = [sys.executable, "-m", "pytest", "-n", str(args.jobs), "--dist", "loadfile", "-p", "no:cacheprovider",
               "-q", *[str(nb.relative_to(ROOT)) for nb in run]]
        if subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}).returncode != 0:
            failed.append(name)
    if failed:
        print(f"checked outputs differ on: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
