"""Grade one submitted lab notebook: :func:`grade_notebook`.

How a submission is graded (each step lives in its own module):

1. The notebook is read; unreadable JSON is ``malformed``, a notebook with no code ``empty``. The
   lab's tests (public and hidden) are read as text *now*, before any submitted code runs, and
   loaded in the grader's process (:mod:`.judge`); every split item draws fresh cases from a secret
   seed. The submission's source is scanned for review flags (:mod:`.integrity`).
2. A fresh kernel runs (:mod:`.execute`): first the guard (:mod:`.kernel_guard`), which records the
   libraries the observations rely on, connects to the grader's socket (:mod:`.channel`) and
   installs an audit hook (for a lab with an item that kills a process, the standby of
   :mod:`.kernel_standby` is forked first, before the guard); then the submission's code cells; then
   the observation driver (:mod:`.kernel_observe`), which calls the learner's functions on the
   grader's cases and sends back plain observations through the hook. The driver's config (the
   cases) is in its cell only sealed with the guard's channel key, and the grader's cells are kept
   out of the kernel's input history: a cell's source is readable by the submission, the key is
   not. The kernel and every process it started are killed.
3. The grader judges each observation with its own copy of the tests (:mod:`.judge`), and turns the
   guard's records into tampering (all marks withheld), withheld items, and flags (:mod:`.integrity`).

Expected answers and verdicts of split items never exist in the submission's kernel. Inline items
(a plain ``fn(ns)``, the older form, still accepted for hidden tests) are judged inside the kernel
and marked ``trust: inline``. A timeout, a dead kernel or a broken test file gets a clear status and
reason; :func:`grade_notebook` never raises for a bad submission.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

from . import judge as judging
from .channel import Channel
from .execute import Cell, run_cells
from .integrity import assess, guard_config, helper_items, scan_source
from .items import ITEM_TIMEOUT_S, LABTESTS_DIR, ItemResult, lab_test_path
from .kernel_guard import seal
from .kernel_observe import DRIVER_FILENAME
from .kernel_standby import STANDBY_FILENAME
from .report import GradeReport
from .seal import key_path

__all__ = ["DEFAULT_TIMEOUT_S", "GradeReport", "find_template", "grade_notebook", "lab_of", "scan_source"]

HERE = Path(__file__).resolve().parent
ITEMS_PY, GUARD_PY, OBSERVE_PY = HERE / "items.py", HERE / "kernel_guard.py", HERE / "kernel_observe.py"
STANDBY_PY = HERE / "kernel_standby.py"
DEFAULT_TIMEOUT_S = 300
GUARD_CONNECT_S = 5

_GUARD_CELL = """\
def _gpucourse_guard(src, config, standby_src):
    standby = None
    if standby_src:  # forked before the guard, handed to it alone (see kernel_standby)
        s = {{"__name__": "gpucourse_standby"}}
        exec(compile(standby_src, {standby_filename!r}, "exec"), s)
        standby = s["start"]()
    g = {{"__name__": "gpucourse_guard"}}
    exec(compile(src, {filename!r}, "exec"), g)
    g["install"](config, globals(), standby)
_gpucourse_guard({src!r}, {config!r}, {standby_src!r})
del _gpucourse_guard
"""

# The config (the items' cases) travels sealed with the guard's channel key: a cell's source is readable by the
# submission (In, linecache, IPython's events), the key only by the guard (kernel_guard.seal).
_OBSERVE_CELL = """\
def _gpucourse_observe(src, sealed):
    g = {{"__name__": "gpucourse_observe"}}
    exec(compile(src, {filename!r}, "exec"), g)
    g["run_sealed"](bytes.fromhex(sealed), globals())
_gpucourse_observe({src!r}, {sealed!r})
del _gpucourse_observe
"""


def lab_of(nb, path: str | Path) -> str | None:
    """Which lab a notebook belongs to: its ``gpucourse.lab`` metadata, else a ``NN_`` file-name prefix."""
    meta = (nb.get("metadata", {}) or {}).get("gpucourse", {}) if nb is not None else {}
    lab = meta.get("lab") if isinstance(meta, dict) else None
    if isinstance(lab, str) and re.fullmatch(r"\d\d", lab):
        return lab
    m = re.match(r"(\d\d)[_-]", Path(path).name)
    return m.group(1) if m else None


def find_template(lab: str | None) -> list[str] | None:
    """Code cells of the lab's own notebook (``labs/NN_*.ipynb`` next to the package), if present."""
    import os

    import nbformat

    if not lab:
        return None
    folders = [Path(os.environ["GPUCOURSE_LABS_DIR"])] if os.environ.get("GPUCOURSE_LABS_DIR") else []
    folders.append(HERE.parent.parent / "labs")
    for folder in folders:
        found = sorted(folder.glob(f"{lab}_*.ipynb"))
        if found:
            try:
                nb = nbformat.read(found[0], as_version=4)
            except Exception:  # noqa: S112
                continue
            return [c.source for c in nb.cells if c.cell_type == "code"]
    return None


def _placeholder(plan, reason: str) -> list[dict]:
    return [judging.row(e, ItemResult(e.key, e.spec.title, 0, e.spec.points, "error", reason),
                        "split" if e.split else "inline") for e in plan]


def _thaw(value):
    """An observation as the guard sent it (plain data), with non-finite floats (``{"__float__": "nan"}``)
    turned back into floats."""
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and value.get("__float__") in ("nan", "inf", "-inf"):
            return float(value["__float__"])
        return {k: _thaw(v) for k, v in value.items()}
    return value


def grade_notebook(path: str | Path, lab: str | None = None, extra_tests=(), timeout: float = DEFAULT_TIMEOUT_S,
                   learner: str | None = None, kernel_name: str = "python3", conceal=()) -> GradeReport:
    """Grade one submitted notebook. Never raises for a bad submission; see the module docstring.

    ``conceal``: more files or folders the kernel must not see (the grader's output folder); the
    hidden test files and the grading key are always concealed.
    """
    import nbformat

    path = Path(path)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    extra = [Path(p) for p in extra_tests]
    for p in extra:
        if not p.is_file():
            raise FileNotFoundError(f"extra test file not found: {p}")
    report = GradeReport(str(path), lab, "error", learner=learner)
    t0 = time.monotonic()
    try:
        if not path.is_file():
            report.status, report.reason = "malformed", "file not found"
            return report
        try:
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
        except Exception as exc:
            report.status, report.reason = "malformed", f"not a readable notebook ({type(exc).__name__}: {exc})"[:500]
            return report
        report.lab = lab = lab or lab_of(nb, path)
        if lab is None:
            report.reason = "cannot tell which lab this is: pass --lab NN"
            return report
        try:
            paths = [("public", lab_test_path(lab))] + [(f"hidden:{p.name}", p.resolve()) for p in extra]
        except ValueError as exc:
            report.reason = str(exc)
            return report
        # Read once, before the submission runs: the same text is judged here and observed in the
        # kernel, so a submission can neither rewrite the tests on disk nor read hidden ones early.
        tests = [(source, str(p), p.read_text()) for source, p in paths]
        loaded = judging.load_tests(tests)
        plan, load_errors = judging.make_plan(loaded)
        report.max_score = sum(e.spec.points for e in plan)
        report.items = _placeholder(plan, "not run")
        if load_errors:
            report.reason = "a test file failed to load: " + "; ".join(load_errors)
            return report
        code = [(i, c.source) for i, c in enumerate(nb.cells, 1) if c.cell_type == "code" and c.source.strip()]
        if not code:
            report.status, report.reason = "empty", "the notebook has no code to run"
            return report
        try:
            helpers = helper_items(lab, [m for _, _, m in loaded])
        except ValueError as exc:  # a hidden test's misspelt helper would protect nothing: say so, grade nothing
            report.reason = f"a test file's ANSWER_HELPERS is wrong: {exc}"
            return report
        report.flags = scan_source([s for _, s in code], lab, find_template(lab), helpers, [i for i, _ in code])
        judging.warm_up([t for _, _, t in tests])
        hide = [p for _, p in paths[1:]] + [key_path(), *conceal]
        _run(report, code, tests, plan, helpers, timeout, kernel_name, hide)
    finally:
        report.duration_s = round(time.monotonic() - t0, 1)
    return report


def _cells(code, tests, plan, helpers, address, output=()):
    """The run's cells (the driver's cell still without its config), the config text and its digest."""
    guard_src, driver_src, standby_src = GUARD_PY.read_text(), OBSERVE_PY.read_text(), STANDBY_PY.read_text()
    # The driver is the grader's code compiled from known text (once); under the driver's or the standby's
    # name, code compiled from any other text, or run or made otherwise, is reported.
    config = guard_config(address, helpers,
                          [p for _, p, _ in tests] + [str(ITEMS_PY), DRIVER_FILENAME, STANDBY_FILENAME],
                          [DRIVER_FILENAME, STANDBY_FILENAME], [hashlib.sha256(driver_src.encode()).hexdigest()],
                          [p for _, p, _ in tests] + [str(q) for q in sorted(LABTESTS_DIR.glob("lab*.py"))],
                          output)
    kernel_tests = [[source, path, judging.kernel_source(text)] for source, path, text in tests]
    observe = {"items_src": ITEMS_PY.read_text(), "items_path": str(ITEMS_PY), "tests": kernel_tests,
               "plan": [e.to_kernel() for e in plan if not e.error], "timeout_s": ITEM_TIMEOUT_S}
    with_standby = any(e.spec.worker for e in plan if not e.error)
    if with_standby:  # its workers run the cells again
        observe["cells"] = [src for _, src in code]
    setup = _GUARD_CELL.format(filename="<gpucourse-guard>", src=guard_src, config=config,
                               standby_filename=STANDBY_FILENAME, standby_src=standby_src if with_standby else "")
    cells = [Cell("grader setup", setup)]
    cells += [Cell(f"cell {i}", src, submission=True) for i, src in code]
    config_text = json.dumps(observe, allow_nan=True)
    # The driver's cell, completed by seal_driver_cell once the guard's key is known (the text whose digest
    # the guard accepts is kept here until then).
    cells.append(Cell("grader checks", driver_src))
    return cells, config_text, hashlib.sha256(config_text.encode()).hexdigest()


def seal_driver_cell(cell: Cell, config_text: str, key: bytes) -> None:
    """Give the driver's cell (holding the driver's text) its config, sealed with the guard's channel key."""
    sealed = seal(key, config_text.encode(), hashlib.shake_256, int.from_bytes)
    cell.source = _OBSERVE_CELL.format(filename=DRIVER_FILENAME, src=cell.source, sealed=sealed.hex())


def _run(report: GradeReport, code, tests, plan, helpers, timeout, kernel_name, hide=()) -> None:
    channel = Channel().start()
    try:
        cells, config_text, config_digest = _cells(code, tests, plan, helpers, channel.address, hide)

        def before(index, cell):
            if index == 1 and not channel.wait_connected(GUARD_CONNECT_S):
                raise RuntimeError("the grader's guard did not connect")
            if cell.label == "grader checks":
                key = channel.wait_key(GUARD_CONNECT_S)
                if key is None:
                    raise RuntimeError("the grader's guard sent no key")
                seal_driver_cell(cell, config_text, key)

        run = run_cells(cells, timeout, kernel_name, before_cell=before, stop=channel.tampered,
                        reach=[channel.folder], hide=hide)
        channel.wait_end(60)  # the kernel is dead: this only waits for the reader to reach its end
    finally:
        channel.close()
    report.cell_errors = run.cell_errors
    report.timings = dict(run.timings)
    report.isolation = run.isolation
    if run.left_running:
        report.flags.append(f"left {len(run.left_running)} process(es) running after the checks (all killed "
                            "before any result was written): " + ", ".join(run.left_running[:3]))
    if run.survivors:  # never seen: SIGKILL cannot be refused. Then no result of this run can be trusted.
        report.items = _placeholder(plan, "not graded: processes of the run survived the grader's kill")
        report.status = "error"
        report.reason = "processes of the run could not be killed: " + ", ".join(run.survivors)
        return
    t_judge = time.monotonic()
    kernel_plan = [e for e in plan if not e.error]
    problems = list(channel.problems)
    if channel.closed_early and run.status == "ok" and "grader checks" not in run.errors:
        # the kernel lived on and the checks ran to their end, but the channel was closed under them
        problems.append("the grader's channel was closed before the checks ended")
    found = assess(channel.records, problems if channel.connected else [], [e.name for e in kernel_plan],
                   config_digest, helpers)
    report.flags = list(dict.fromkeys(report.flags + found.flags))
    report.tampering = found.tampering
    if run.status != "ok":
        report.items = _placeholder(plan, f"not graded: the run ended early ({run.status})")
        if report.tampering:  # seen by the guard: the run was stopped, or the patch broke the kernel itself
            report.status = "tampered"
            why = f"the grader stopped the run in {run.last_cell}" if run.stopped else run.reason
            report.reason = f"the submission changed what the grader relies on; all marks withheld ({why})"
        else:
            report.status, report.reason = run.status, run.reason
        return
    if "grader setup" in run.errors or not channel.connected:
        why = run.errors.get("grader setup", "it never connected")
        report.status, report.reason = "error", f"the grader's guard failed to start ({why})"
        report.items = _placeholder(plan, "not graded: the grader's guard failed")
        return
    rows = []
    for e in plan:
        texts = found.observed.get(e.name, [])
        payload = None
        if len(texts) == 1:
            payload = _thaw(texts[0])
        r = judging.judge(e, payload)
        held = found.withheld.get(e.name) or (found.inline_withheld if not e.split else "")
        if held and r["status"] == "pass":
            r.update(status="withheld", points=0, message=held)
        rows.append(r)
    report.items = rows
    if report.tampering:
        report.status = "tampered"
        report.reason = "the submission changed what the grader relies on; all marks withheld"
        if not found.complete and run.errors.get("grader checks"):
            report.reason += f" (the checks stopped: {run.errors['grader checks']})"[:300]
        for r in report.items:
            if r["status"] == "pass":
                r.update(status="withheld", message="Marks withheld: the submission changed what the grader "
                                                    "relies on (see the end of this report).")
            r["points"] = 0
    elif not found.complete:
        why = run.errors.get("grader checks") or "the kernel stopped sending"
        report.status, report.reason = "error", f"the grader's checks did not finish ({why})"[:500]
        for r in report.items:
            r["points"] = 0
    else:
        report.status = "graded"
    report.score = sum(r["points"] for r in report.items)
    report.timings["judging"] = round(time.monotonic() - t_judge, 2)
