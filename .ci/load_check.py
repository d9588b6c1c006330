#!/usr/bin/env python
"""Re-validate the timing-graded lab items under CPU load: correct answers pass every run, wrong ones fail.

The course promises that a timing-graded item passes a correct answer 10 times out of 10 on a busy 2-core
machine. This script checks it: it starts ``--burners`` CPU-burning processes (``while True: pass``,
always killed on the way out), and for each item of ``--items`` (by default lab 07 q3 and lab 08 q4):

* one fresh kernel executes the lab's solution (its code cells without the ``check(...)`` calls, as
  ``tests/labtests/item_fixtures.py`` does), then, with the burners running,
* runs the item on the solution ``--runs`` times, each time with fresh random cases, the way ``check()``
  and the grader run it (``make_cases`` -> ``observe_item`` -> ``judge_item``), and
* runs it once on every wrong-answer fixture of that item (``tests/labtests/fixtures/labNN/<item>_*.py``,
  executed on top of the solution, the kernel's globals restored afterwards), comparing the verdict with
  the fixture's golden ``.expected.json``.

It prints one line per run as it goes, then a table with the measured margin beside each limit, and exits
1 if a correct answer failed even once or a wrong answer passed (2 for bad arguments). A wrong answer
that fails with another message than its golden one is shown as such, without failing the check.

Not part of ``make test``: it takes minutes and keeps every core busy on purpose. Run it by hand::

    .venv/bin/python .ci/load_check.py                 # 10 runs, 3 burners, 07:q3 and 08:q4
    .venv/bin/python .ci/load_check.py --runs 3 --burners 0 --items 08:q4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "labtests" / "fixtures"
LABTESTS = ROOT / "utils" / "labtests"
DEFAULT_ITEMS = "07:q3,08:q4"
_MARK = "GPUCOURSE_LOADCHECK "

# --------------------------------------------------------------------------- arguments


def _whole(flag: str, low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number from {low} to {high}, got {text!r}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be from {low} to {high}, got {value}")
        return value

    return parse


def _items(text: str) -> list[tuple[str, str]]:
    """'07:q3,08:q4' -> [('07', 'q3'), ('08', 'q4')]; each lab must have public tests."""
    out = []
    for part in [p.strip() for p in text.split(",")]:
        m = re.fullmatch(r"(\d\d):(q\d+)", part)
        if not m:
            raise argparse.ArgumentTypeError(f"--items must be a comma-separated list of LAB:ITEM such as "
                                             f"{DEFAULT_ITEMS!r}, got {text!r} (bad part {part!r})")
        if not (LABTESTS / f"lab{m[1]}.py").is_file():
            labs = sorted(p.stem[3:] for p in LABTESTS.glob("lab[0-9][0-9].py"))
            raise argparse.ArgumentTypeError(f"--items names lab {m[1]!r}, which has no public tests "
                                             f"(utils/labtests/lab{m[1]}.py); labs with tests: {labs}")
        if (m[1], m[2]) not in out:
            out.append((m[1], m[2]))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="load_check.py", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 all as expected, 1 a correct answer failed or a wrong one passed, 2 bad arguments.")
    parser.add_argument("--runs", type=_whole("--runs", 1, 1000), default=10,
                        help="runs of each item on the solution (default 10)")
    parser.add_argument("--burners", type=_whole("--burners", 0, 64), default=3,
                        help="CPU-burning processes running while the items run (default 3; 0 for a quiet run)")
    parser.add_argument("--items", type=_items, default=_items(DEFAULT_ITEMS),
                        help=f"comma-separated LAB:ITEM list (default {DEFAULT_ITEMS})")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the kernel side

# --------------------------------------------------------------------------- the margin, from an observation

#: The items whose observation shows a margin: the reference module with the item's summary and limits.
MEASURED = {("07", "q3"): "_lab07_reference", ("08", "q4"): "_lab08_reference"}


def margin(lab: str, key: str, case: dict, seen: dict) -> dict:
    """The best run's utilisation and first-element time beside the item's limits, as the judge picks the best
    run: one whose first element came in time, then the highest utilisation. It only informs (judge_item's
    verdict is the result); an observation of another shape raises."""
    import importlib

    ref = importlib.import_module(f"gpucourse.labtests.{MEASURED[(lab, key)]}")
    if (lab, key) == ("07", "q3"):
        summary, target = ref.q3_summary, ref.Q3_UTILISATION
        limit = ref.Q3_STARTUP * (case["read_s"] + case["decode_s"])
    else:
        summary, target = ref.q4_summary, ref.UTILISATION_TARGET
        limit = ref.STARTUP_FACTOR * (case["load_s"] + case["augment_s"])
    runs = [summary(run, case) for run in seen["runs"]]
    if not runs:
        raise ValueError(f"lab {lab} {key}: the observation holds no run")
    startup, util = max(runs, key=lambda run: (run[0] <= limit, run[1]))
    return {"value": util, "text": f"util {util:.1%} (>= {target:.0%}), first {startup * 1e3:.0f} ms "
                                   f"(<= {limit * 1e3:.0f})"}


# --------------------------------------------------------------------------- the kernel side

# Defined once in each lab's kernel, after the solution ran. An item of MEASURED sends its first case and
# observation back, and the margin is read here with `margin`.
_HARNESS = r'''
def _lc_setup(lab):
    global _lc_module, _lc_items
    from gpucourse.grading.items import items_in, lab_test_path, load_test_file
    _lc_module = load_test_file(lab_test_path(lab))
    _lc_items = {spec.key: (spec, obj) for spec, obj in items_in(_lc_module)}


def _lc_run(lab, key, seed, name=None, source=None, measured=False):
    import json, time
    from gpucourse.grading.items import Namespace, is_split, judge_item, make_cases, observe_item, run_item
    g = globals()
    before = dict(g)
    out = {"observed": None}
    try:
        if source is not None:
            exec(compile(source, name, "exec"), g)
        spec, obj = _lc_items[key]
        ns = Namespace({k: v for k, v in g.items() if not k.startswith("_")})
        t0 = time.perf_counter()
        if is_split(obj):
            cases = make_cases(obj, seed)
            observed = observe_item(obj, ns, cases)
            result = judge_item(spec, obj, cases, observed)
            if observed.get("status") == "ok" and measured:
                out["observed"] = {"case": cases[0], "seen": observed["seen"][0]}
        else:
            result = run_item(spec, obj, ns, seed=seed)
        out.update(status=result.status, message=result.message, seconds=time.perf_counter() - t0)
    except BaseException as exc:
        out.update(status="harness-error", message=f"{type(exc).__name__}: {exc}", seconds=0.0)
    finally:
        for k in list(g):
            if k not in before:
                del g[k]
        g.update(before)
    print(@MARK@ + json.dumps(out, default=repr))
'''.replace("@MARK@", repr(_MARK))


class LabKernel:
    """A fresh kernel that executed ``lab``'s solution; ``run(...)`` runs one item in it."""

    def __init__(self, lab: str):
        import nbformat
        from nbclient import NotebookClient

        found = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
        if len(found) != 1:
            raise SystemExit(f"load_check: no single solution notebook for lab {lab} in solutions/: {found}")
        sol = nbformat.read(found[0], as_version=4)
        self.nb = nbformat.v4.new_notebook()
        self.lab = lab
        self._cells = [c.source for c in sol.cells
                       if c.cell_type == "code" and "check(" not in c.source and "check.summary" not in c.source]
        env = dict(os.environ, MPLBACKEND="Agg")
        env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.pop("PYTEST_CURRENT_TEST", None)
        self.client = NotebookClient(self.nb, timeout=1800, kernel_name="python3", allow_errors=False,
                                     resources={"metadata": {"path": str(found[0].parent)}})
        self._env = env
        self._ctx = None

    def __enter__(self):
        # The kernel process's own stderr (TensorFlow's C++ start-up lines, ipykernel warnings) goes to a log
        # file; what the cells print comes back through the kernel protocol as usual.
        self.log = Path(tempfile.gettempdir()) / f"load_check_lab{self.lab}_kernel.log"
        self._log = self.log.open("w")
        self._ctx = self.client.setup_kernel(env=self._env, stderr=self._log)
        self._ctx.__enter__()
        for source in self._cells + [_HARNESS, f"_lc_setup({self.lab!r})"]:
            self._execute(source)
        return self

    def __exit__(self, *exc):
        try:
            return self._ctx.__exit__(*exc)
        finally:
            self._log.close()

    def _execute(self, source: str) -> str:
        import nbformat

        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")

    def run(self, key: str, seed: int, fixture: Path | None = None) -> dict:
        """One run of ``key``: its status, message and seconds, and for an item of MEASURED on the solution,
        ``measure`` (the margin) or ``measure_error`` (why none could be read)."""
        measured = fixture is None and (self.lab, key) in MEASURED
        args = [self.lab, key, seed] + ([fixture.name, fixture.read_text()] if fixture else [None, None])
        text = self._execute(f"_lc_run(*{args + [measured]!r})")
        lines = [ln for ln in text.splitlines() if ln.startswith(_MARK)]
        if not lines:
            return {"status": "harness-error", "message": f"no answer from the kernel: {text[-500:]!r}",
                    "seconds": 0.0, "measure": None}
        res = json.loads(lines[-1][len(_MARK):])
        res["measure"], observed = None, res.pop("observed", None)
        if observed is not None:
            try:
                res["measure"] = margin(self.lab, key, observed["case"], observed["seen"])
            except Exception as exc:  # the margin only informs, but a reader that no longer fits must show
                res["measure_error"] = f"{type(exc).__name__}: {exc}"
        return res


# --------------------------------------------------------------------------- burners


class Burners:
    """``n`` processes spinning ``while True: pass`` while the block runs; always killed on the way out."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(0.5)
            dead = [p.pid for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"burner process(es) {dead} exited at once")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []

    def __exit__(self, *exc):
        self.stop()
        return False


# --------------------------------------------------------------------------- checking


def wrong_answers(lab: str, key: str) -> list[Path]:
    """The wrong-answer fixtures of ``lab``'s item ``key`` that have a golden verdict."""
    return sorted(p for p in (FIXTURES / f"lab{lab}").glob(f"{key}_*.py") if p.with_suffix(".expected.json").is_file())


def golden(result: dict, fixture: Path) -> bool:
    """Whether a fixture's verdict is its golden one: same status, every message fragment present."""
    want = json.loads(fixture.with_suffix(".expected.json").read_text())
    return result["status"] == want["status"] and all(f in result["message"] for f in want.get("message", []))


def check_items_exist(items) -> None:
    from gpucourse.grading.items import items_in, lab_test_path, load_test_file

    for lab, key in items:
        keys = [spec.key for spec, _ in items_in(load_test_file(lab_test_path(lab)))]
        if key not in keys:
            print(f"load_check.py: error: argument --items: {lab}:{key} is not an item of lab {lab}; its items: "
                  f"{keys}", file=sys.stderr)
            raise SystemExit(2)


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv=None) -> int:
    args = parse_args(argv)
    check_items_exist(args.items)
    rng = random.SystemRandom()
    rows, problems, notes = [], [], []
    started = time.time()
    print(f"load check: {args.runs} runs per item, {args.burners} burners, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    for lab in dict.fromkeys(lab for lab, _ in args.items):
        print(f"lab {lab}: executing the solution in a fresh kernel (its stderr: {tempfile.gettempdir()}/"
              f"load_check_lab{lab}_kernel.log) ...", flush=True)
        with LabKernel(lab) as kernel, Burners(args.burners):
            for key in [k for lb, k in args.items if lb == lab]:
                runs = []
                for i in range(args.runs):
                    seed = rng.randrange(2**32)
                    res = kernel.run(key, seed)
                    runs.append(res)
                    measure = (res["measure"] or {}).get("text", "") or res.get("measure_error", "")
                    if res.get("measure_error"):
                        notes.append(f"{lab}:{key} run {i + 1}: no margin read ({res['measure_error']})")
                    print(f"  {lab}:{key} solution run {i + 1:2}/{args.runs}: {res['status']:5} "
                          f"{res['seconds']:5.1f} s  {measure}  load {os.getloadavg()[0]:.1f}", flush=True)
                    if res["status"] != "pass":
                        problems.append(f"{lab}:{key} solution failed run {i + 1} (seed {seed}): "
                                        f"{_short(res['message'], 400)}")
                values = [r["measure"]["value"] for r in runs if r["measure"]]
                texts = {r["measure"]["value"]: r["measure"]["text"] for r in runs if r["measure"]}
                spread = ""
                if values:
                    lo, hi = min(values), max(values)
                    spread = texts[lo] if lo == hi else f"{texts[lo]} .. {texts[hi]}"
                passed = sum(r["status"] == "pass" for r in runs)
                rows.append((f"{lab}:{key}", "solution", f"{passed}/{args.runs} pass",
                             "yes" if passed == args.runs else "NO", spread))
                for fixture in wrong_answers(lab, key):
                    res = kernel.run(key, rng.randrange(2**32), fixture)
                    ok = res["status"] != "pass"
                    same = golden(res, fixture)
                    print(f"  {lab}:{key} {fixture.name}: {res['status']} {res['seconds']:.1f} s "
                          f"{_short(res['message'], 90)}", flush=True)
                    if not ok:
                        problems.append(f"{lab}:{key} wrong answer {fixture.name} passed")
                    elif not same:
                        notes.append(f"{lab}:{key} {fixture.name}: {res['status']} with another message than its "
                                     f"golden one: {_short(res['message'], 300)}")
                    rows.append((f"{lab}:{key}", fixture.stem, res["status"],
                                 ("yes" if same else "yes (other message)") if ok else "NO",
                                 _short(res["message"], 70)))
    header = ("item", "answer", "result", "as expected", "measured (lowest .. highest of the runs) / message")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    print()
    for row in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
    print(f"\n{len(rows)} rows in {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")
    for note in notes:
        print(f"note: {note}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("load check: " + ("FAILED" if problems else "OK: every correct answer passed every run and every wrong "
                                                      "answer failed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
