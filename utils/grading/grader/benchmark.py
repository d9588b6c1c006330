"""How long the grader takes per submission: ``python -m gpucourse.grading.grader.benchmark``.

Grades ``--copies`` copies of a lab's solution and as many of its unsolved notebook as one batch
with ``--jobs`` workers (what ``gpucourse-grade <folder> --jobs N`` does) and prints the wall time
per submission and the CPU seconds per submission (kernels included: on a machine other jobs
share, wall time says little, CPU time much more), plus the median seconds of each stage (kernel
start, the submission's cells, the checks, judging). The first submission of
each worker also pays for importing the tests and for judges' one-time probes; more copies spread
that cost.
Timings depend on the machine's load: run it on a quiet machine, more than once.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["measure", "main"]


def measure(lab: str = "01", copies: int = 3, jobs: int = 2, root: Path | None = None) -> dict:
    """Grade the copies as one batch; seconds per submission and per stage, and the verdicts."""
    from .cli import grade_batch

    root = root or Path(__file__).resolve().parents[3]  # the repository: utils/grading/grader/ is three below it
    sol = sorted((root / "solutions").glob(f"{lab}_*.ipynb"))
    unsolved = sorted((root / "labs").glob(f"{lab}_*.ipynb"))
    if not sol or not unsolved:
        raise SystemExit(f"lab {lab}: need solutions/{lab}_*.ipynb and labs/{lab}_*.ipynb under {root}")
    work = Path(tempfile.mkdtemp(prefix="gpucourse-bench-"))
    try:
        subs = work / "subs"
        subs.mkdir()
        for i in range(copies):
            shutil.copy(sol[0], subs / f"solution{i:02d}.ipynb")
            shutil.copy(unsolved[0], subs / f"unsolved{i:02d}.ipynb")
        t0, cpu0 = time.monotonic(), _children_cpu()
        rows = grade_batch(subs, work / "out", lab, jobs=jobs, echo=lambda *_: None)
        wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
        # A kernel in bubblewrap is killed with its sandbox, never waited for: its CPU time does not reach
        # this process's RUSAGE_CHILDREN. Add what the grader read just before the kill.
        cpu += sum((r.get("timings") or {}).get("kernel cpu", 0) for r in rows
                   if str(r.get("isolation", "")).startswith("bubblewrap"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stages: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.get("timings") or {}).items():
            stages.setdefault(k, []).append(v)
    verdicts = sorted({(r["learner"].rstrip("0123456789"), r["status"], r["score"], r["max_score"],
                        "; ".join(r["flags"] + ([r["reason"]] if r["reason"] else [])))
                       for r in rows})
    return {"lab": lab, "submissions": len(rows), "jobs": jobs, "wall_s": round(wall, 1),
            "isolation": sorted({str(r.get("isolation", "")).split(":")[0] for r in rows}),
            "per_submission_s": round(wall / len(rows), 2), "cpu_per_submission_s": round(cpu / len(rows), 2),
            "stage_median_s": {k: round(statistics.median(v), 2) for k, v in stages.items()},
            "verdicts": verdicts}


def _children_cpu() -> float:
    """CPU seconds (user + system) of every finished process this one started, kernels included."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucourse.grading.grader.benchmark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", default="01")
    ap.add_argument("--copies", type=int, default=3, help="copies of the solution and of the unsolved lab")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    res = measure(a.lab.zfill(2), a.copies, a.jobs)
    print(f"lab {res['lab']}: {res['submissions']} submissions, --jobs {res['jobs']}: {res['wall_s']} s in all, "
          f"{res['per_submission_s']} s per submission; {res['cpu_per_submission_s']} CPU-seconds per submission "
          f"(on {res['jobs']} idle cores: about {res['cpu_per_submission_s'] / res['jobs']:.1f} s per submission); "
          f"kernel isolation: {', '.join(res['isolation'])}")
    for k, v in res["stage_median_s"].items():
        print(f"  {k:<14} {v:>6.2f} s (median per submission)")
    kernel = res["stage_median_s"].get("kernel cpu")
    if kernel:
        print(f"  steady state (once every worker has loaded the tests and run the judges' one-time probes): "
              f"about {kernel:.1f} CPU-seconds per submission, {kernel / res['jobs']:.1f} s per submission on "
              f"{res['jobs']} idle cores")
    for v in res["verdicts"]:
        print(f"  {v[0]:<10} {v[1]:<9} {v[2]}/{v[3]}  {v[4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
