"""The timing claims notebook 07 makes in its text still hold on a busy machine (issue 21, item 2).

A learner's live run differs from the stored one: on a busy 2-core machine the medians move by half. So
the text claims only what the notebook's own measurement keeps showing under load, and these tests run
that measurement (the cells' code, not the whole notebook) with CPU-burning processes beside it:

* section 3: ``timing.compare`` of ``pipeline.VARIANTS`` as the notebook runs it (1 warm-up, 3 repeats,
  interleaved), then every claim of :func:`gpucourse.pipeline.variant_claims`, the function whose verdicts
  the notebook prints under its table;
* section 4's GIL claims (a sleeping stage gains from 4 threads, a pure-Python one never keeps more than one
  core busy) are judged in a way no load can decide: ``tests/test_simulate.py``'s
  ``test_a_stage_holding_the_gil_does_not_run_in_parallel`` (best-of-3 wall times, and CPU time);
* notebook 08 section 10: the capstone's variants side by side: parallel maps keep the device busier than
  the sequential pipeline (the checked cell) and than prefetch alone, and get closer to the epoch bound;
  prefetch alone does not beat its best utilisation by more than "a few points" (6 at most).

The burners are pure-Python busy loops that end by themselves after a minute and are killed when the test
ends, whatever happens. The load tests are marked slow: about 30 s together on an otherwise idle 2-core machine.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

#: CPU-burning processes beside each measurement: with the 2 cores of CI that is a load of about 4.
BURNERS = 3


@contextmanager
def burners(n: int = BURNERS, seconds: float = 60.0, import_tf: bool = True):
    """``n`` processes spinning a pure-Python loop for at most ``seconds``; always killed on the way out.

    TensorFlow is imported first (``import_tf``), outside the load: its import is not what the claims are about.
    """
    if import_tf:
        import tensorflow  # noqa: F401
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs), "a burner process exited at once"
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(timeout=10)


def test_burners_load_the_machine_and_are_gone_afterwards():
    with burners(2, seconds=5, import_tf=False) as procs:
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)


@pytest.mark.slow
def test_section_3_claims_hold_under_load():
    from gpucourse import pipeline, timing

    w = pipeline.WORKLOAD.workload()
    best = pipeline.WORKLOAD.replace(interleave=4, parallel=8, prefetch=True).bound()
    runs = {name: [] for name in pipeline.VARIANTS}

    def epoch(name):  # as the notebook's cell
        runs[name].append(w.run(**pipeline.VARIANTS[name]))

    with burners():
        cmp = timing.compare({name: functools.partial(epoch, name) for name in pipeline.VARIANTS}, warmup=1,
                             repeats=3, bound_s=best)
    own_bounds = {name: runs[name][-1].bound_s for name in pipeline.VARIANTS}
    claims = pipeline.variant_claims(cmp, own_bounds)
    failed = [claim for claim, holds in claims.items() if not holds]
    detail = "\n".join(f"{n:18s} best/own {cmp[n].min_s / own_bounds[n]:.2f}  times "
                       f"{[round(t * 1e3) for t in cmp[n].times_s]} ms" for n in pipeline.VARIANTS)
    assert not failed, f"claims of notebook 07 section 3 that failed under load: {failed}\n{cmp.table()}\n{detail}"
    assert len(claims) >= 5


def test_variant_claims_rejects_bad_input():
    from gpucourse import pipeline, timing

    fake = timing.Comparison([timing.Timing(n, [0.5]) for n in pipeline.VARIANTS])
    with pytest.raises(TypeError, match="comparison"):
        pipeline.variant_claims({"naive": 1}, {n: 0.2 for n in pipeline.VARIANTS})
    with pytest.raises(ValueError, match="own_bounds_s has no bound"):
        pipeline.variant_claims(fake, {"naive": 0.8})
    # all equal: nothing beats anything, so the ordering claims fail; the function does not pretend
    claims = pipeline.variant_claims(fake, {n: 0.5 for n in pipeline.VARIANTS}, cores=2)
    assert not claims["each pipeline that decodes in parallel beats each one that decodes one record at a time"]
    assert claims["no pipeline beats its own bound"]
    assert not claims["on 1-2 cores, + parallel decode stays above its own bound x 1.25 (the default pool)"]
    assert len(pipeline.variant_claims(fake, {n: 0.5 for n in pipeline.VARIANTS}, cores=8)) == len(claims) - 1


@pytest.mark.slow
def test_notebook_08_capstone_claims_hold_under_load():
    import statistics

    from gpucourse import simulate, timing

    capstone = simulate.Pipeline(stages=(("load", simulate.LOAD_S), ("augment", simulate.AUGMENT_S)),
                                 step_s=simulate.STEP_S, n=12)  # the notebook's
    variants = {"sequential": {}, "prefetch": {"prefetch": True},
                "parallel x4 + prefetch": {"parallel": 4, "prefetch": True}}  # AUTOTUNE left out: no claim
    work = capstone.workload()
    runs = {name: [] for name in variants}

    def epoch(name):
        return lambda: runs[name].append(work.run(**variants[name]))

    epoch_bound = capstone.replace(parallel=4, prefetch=True).bound()
    with burners():
        comparison = timing.compare({name: epoch(name) for name in variants}, warmup=1, repeats=2,
                                    bound_s=epoch_bound, bound_label="epoch bound")
    utilisation = {name: statistics.median(r.utilisation for r in runs[name][1:]) for name in variants}
    best = {name: runs[name][-1].best_utilisation for name in variants}
    detail = f"{comparison.table()}\nutilisation {utilisation}\nbest {best}"
    # the checked cell: "parallel x4 + prefetch busier than sequential: True"
    assert utilisation["parallel x4 + prefetch"] > utilisation["sequential"], detail
    # "Parallel maps attack the real problem ... and get far closer to the epoch bound"
    assert utilisation["parallel x4 + prefetch"] > utilisation["prefetch"], detail
    assert comparison["parallel x4 + prefetch"].min_s < comparison["prefetch"].min_s, detail
    # "Prefetch alone ... cannot beat its bound"; "can sit a few points *above* the best on a busy machine" (read as
    # at most 6: beside these burners one run measured 3.9 points over, when the text still said "a point or two")
    assert utilisation["prefetch"] <= best["prefetch"] + 0.06, detail
