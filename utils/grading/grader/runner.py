"""Grade one submitted lab notebook: :func:`grade_notebook`. The steps, each in its own module:

1. **Read.** The notebook is read (unreadable JSON is ``malformed``, a notebook without code ``empty``).
   The lab's tests, public and hidden, are read as text now, before anything runs, and loaded here
   (:mod:`.judge`); every split item draws fresh cases from a secret seed. The submission's source is
   scanned for review flags (:mod:`.flags`).
2. **Copy the course.** The graded kernel imports a generated copy of the course package: no tests, no
   grader, the lab's answer-bearing helpers disabled and its forbidden modules unimportable
   (:mod:`.course_copy`).
3. **Run the cells.** A fresh kernel starts locked down (:mod:`.sandbox`, :mod:`.seccomp`), runs the
   tripwire, the submission's cells and the agent (:mod:`.session`).
4. **Observe.** Each item's ``observe`` runs here, in the trusted process, calling the learner's code in
   the kernel through the agent; each item has its own time limit, and a kernel that hangs or dies is
   started again for the next item (:mod:`.observer`).
5. **Kill.** Every process of the run is killed before anything is judged or written.
6. **Judge.** Each observation is judged with the grader's copy of the tests (:mod:`.judge`); the
   tripwire's records become review flags, never a verdict (:mod:`.flags`). The mark is *summative* only
   when the kernel's isolation allows it (:func:`summative`), else ``practice``.

:func:`grade_notebook` never raises for a bad submission. See ``docs/grading-architecture.md``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from ..items import ITEM_TIMEOUT_S, ItemResult, KernelLost, lab_test_path
from . import judge as judging
from . import sandbox as sandboxing
from .course_copy import make_copy
from .flags import lab_rules, scan_source, tripwire_flags
from .manifest import key_path
from .observer import RemoteNamespace, observe_plan
from .report import GradeReport
from .session import KernelSession, Listener, kernel_env

__all__ = ["CONTAINER_ENV", "DEFAULT_TIMEOUT_S", "GradeReport", "find_template", "grade_notebook", "lab_of",
           "scan_source", "summative"]

HERE = Path(__file__).resolve().parent
#: Seconds for the submission's cells (each item then has its own :data:`ITEM_TIMEOUT_S`).
DEFAULT_TIMEOUT_S = 300
#: Set to ``per-submission`` by a grading image that runs each submission in a container of its own
#: (the Gradescope bundle's ``run_autograder`` does): then a kernel without bubblewrap is still summative.
CONTAINER_ENV = "GPUCOURSE_CONTAINER"
_CELL_RESTARTS = 2


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
    import nbformat

    if not lab:
        return None
    folders = [Path(os.environ["GPUCOURSE_LABS_DIR"])] if os.environ.get("GPUCOURSE_LABS_DIR") else []
    folders.append(HERE.parents[2] / "labs")
    for folder in folders:
        found = sorted(folder.glob(f"{lab}_*.ipynb"))
        if found:
            try:
                nb = nbformat.read(found[0], as_version=4)
            except Exception:  # noqa: S112
                continue
            return [c.source for c in nb.cells if c.cell_type == "code"]
    return None


def summative(box, seccomp_on: bool) -> tuple[bool, str]:
    """Whether a mark from this kernel may be uploaded, and why (or why not).

    Summative grading needs the kernel to see nothing but what it needs (bubblewrap's allow-list) with the
    seccomp filter on, or a container of its own per submission (``GPUCOURSE_CONTAINER=per-submission``,
    set by the Gradescope bundle). Anything weaker is practice: the kernel could read other files of this
    machine (another checkout of the course, the original package) or reach the network.
    """
    container = os.environ.get(CONTAINER_ENV, "") == "per-submission"
    if box.allow_list and seccomp_on:
        return True, "the kernel saw only the allow-list, with the seccomp filter on"
    if container and seccomp_on:
        return True, f"a container per submission ({CONTAINER_ENV}=per-submission), with the seccomp filter on"
    missing = [] if box.allow_list or container else ["bubblewrap's allow-list (or a container per submission)"]
    missing += [] if seccomp_on else ["the seccomp filter"]
    return False, "practice only: without " + " and without ".join(missing)


def _placeholder(plan, reason: str) -> list[dict]:
    return [judging.row(e, ItemResult(e.key, e.spec.title, 0, e.spec.points, "error", reason),
                        "split" if e.split else "inline") for e in plan]


def grade_notebook(path: str | Path, lab: str | None = None, extra_tests=(), timeout: float = DEFAULT_TIMEOUT_S,
                   learner: str | None = None, kernel_name: str = "python3", conceal=(),
                   item_timeout: float = ITEM_TIMEOUT_S) -> GradeReport:
    """Grade one submitted notebook. Never raises for a bad submission; see the module docstring.

    ``timeout``: seconds for the submission's cells; ``item_timeout``: seconds for each item. ``conceal``:
    more files or folders the kernel must not see, where the sandbox would otherwise show them.
    """
    import nbformat

    path = Path(path)
    for name, value in (("timeout", timeout), ("item_timeout", item_timeout)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    extra = [Path(p) for p in extra_tests]
    for p in extra:
        if not p.is_file():
            raise FileNotFoundError(f"extra test file not found: {p}")
    report = GradeReport(str(path), lab, "error", learner=learner)
    t0 = time.monotonic()
    try:
        # 1. Read.
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
            helpers, forbidden = lab_rules(lab, [m for _, _, m in loaded])
        except ValueError as exc:  # a hidden test's misspelt helper would protect nothing: say so, grade nothing
            report.reason = f"a test file's lab rules are wrong: {exc}"
            return report
        report.flags = scan_source([s for _, s in code], lab, find_template(lab), helpers, [i for i, _ in code])
        judging.warm_up([t for _, _, t in tests])
        # 2. Copy the course.
        course = make_copy(lab, {k: tuple(v) for k, v in helpers.items()}, forbidden)
        hide = [p for _, p in paths[1:]] + [key_path(), *conceal]
        _run(report, code, tests, plan, course, timeout, item_timeout, kernel_name, hide)
    finally:
        report.duration_s = round(time.monotonic() - t0, 1)
    return report


def _run(report: GradeReport, code, tests, plan, course: Path, timeout, item_timeout, kernel_name, hide) -> None:
    """Steps 3 to 6 for one submission (the kernel and its sandbox live only inside this function)."""
    workdir = Path(tempfile.mkdtemp(prefix="gpucourse-grade-"))
    box = sandboxing.choose(workdir, course, hide)
    listener = Listener(workdir, box.uid)
    env = kernel_env({sandboxing.TOKEN_ENV: box.token, "IPYTHONDIR": str(workdir / ".ipython")})
    if box.level != "none":
        env["HOME"] = str(workdir)  # the grader's home is not the kernel's
        env.update(sandboxing.furnish_home(workdir, box.uid))  # Matplotlib's font list: no rescan of the fonts
    if not box.allow_list:  # no mount namespace: the copy goes first on the import path (the original stays readable)
        env["PYTHONPATH"] = os.pathsep.join([str(course)] + [p for p in [env.get("PYTHONPATH", "")] if p])
    cells = [(f"cell {i}", src) for i, src in code]
    modules = {path: f"<gpucourse-tests-{source}>" for source, path, _ in tests}
    texts = [{"module": modules[path], "path": modules[path], "text": judging.kernel_source(text)}
             for source, path, text in tests]
    session = KernelSession(workdir, box, listener, env, cells, timeout, kernel_name, modules=texts)
    fresh_sessions: list[KernelSession] = []
    report.isolation = box.describe()
    observed: dict = {}
    try:
        t0 = time.monotonic()
        started = _start(session)
        if started is not None:
            report.status, report.reason = "error", started
            report.items = _placeholder(plan, f"not graded: {started}")
            return
        report.timings.update(session.run.timings)

        def fresh(ns):
            return lambda: _FreshProcess(workdir, box, listener, env, cells, timeout, kernel_name, texts, ns,
                                         modules, fresh_sessions)

        t1 = time.monotonic()
        observed = observe_plan(session, plan, modules, item_timeout, fresh=fresh)
        report.timings["checks"] = round(time.monotonic() - t1, 2)
        session.stop_agent()
        report.timings["run"] = round(time.monotonic() - t0, 2)
    finally:
        for other in fresh_sessions:
            other.kill()
        session.kill()
        listener.close()
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.with_suffix(".log").unlink(missing_ok=True)
    report.timings["kernel cpu"] = round(session.cpu_s + sum(other.cpu_s for other in fresh_sessions), 2)
    report.cell_errors = session.run.cell_errors
    notes = []
    if session.run.stopped_at:
        notes.append(f"{session.run.stopped_at} was still running when the {timeout:g} s for the cells ran out: "
                     "it was stopped, and the cells after it were not run")
    if session.run.died_at:
        notes.append(f"the kernel died while running {session.run.died_at}: the cells were run again without it")
    if session.left_running:
        report.flags.append(f"left {len(session.left_running)} process(es) running after the checks (all killed "
                            "before any result was written): " + ", ".join(session.left_running[:3]))
    if session.survivors:  # never seen: SIGKILL cannot be refused. Then no result of this run can be trusted.
        report.items = _placeholder(plan, "not graded: processes of the run survived the grader's kill")
        report.status, report.reason = "error", "processes of the run could not be killed: " + ", ".join(session.survivors)
        return
    # 6. Judge.
    t_judge = time.monotonic()
    report.flags = list(dict.fromkeys(report.flags + tripwire_flags(listener.tripwires, listener.problems,
                                                                    session.calls)))
    report.items = [judging.judge(e, observed.get(e.name)) for e in plan]
    report.score = sum(r["points"] for r in report.items)
    ok, why = summative(box, session.seccomp)
    report.mode = "summative" if ok else "practice"
    report.status = "graded"
    report.reason = "; ".join(notes + ([] if ok else [why]))
    report.timings["judging"] = round(time.monotonic() - t_judge, 2)


def _start(session: KernelSession) -> str | None:
    """Start the kernel (again without a cell that killed it, up to twice); why it could not, or None."""
    for attempt in range(_CELL_RESTARTS + 1):
        try:
            session.start()
            return None
        except KernelLost as exc:
            session.kill()
            if not session.run.died_at or attempt == _CELL_RESTARTS:
                return str(exc)
    return "the kernel could not be started"


class _FreshProcess:
    """``with ns.fresh_process() as other:`` a second kernel that ran the submission's cells again.

    ``other`` is a namespace over it, as ``ns`` is over the graded kernel, plus ``other.kill()``: SIGKILL of
    that kernel and every process it started, at once. A call waiting on it then raises
    :class:`~gpucourse.grading.items.ProcessKilled`. The second kernel shares the graded kernel's scratch
    folder (its working folder), as two runs of one job share a disk.
    """

    def __init__(self, workdir, box, listener, env, cells, timeout, kernel_name, texts, ns, modules, registry):
        left = max(1.0, ns._clock.deadline - time.monotonic())  # its cells count against the item's time
        self.session = KernelSession(workdir, box, listener, env, cells, min(timeout, left), kernel_name,
                                     modules=texts, tripwire=False)
        self.ns, self.modules, self.registry = ns, modules, registry

    def __enter__(self):
        self.registry.append(self.session)
        try:
            self.session.start()
        except KernelLost as exc:
            self.session.kill_tree()
            raise KernelLost(f"the fresh process did not start: {exc}") from None
        other = RemoteNamespace(self.session, self.ns._clock, self.modules)
        other.kill = self.kill
        return other

    def kill(self) -> None:
        if self.session.link is not None:
            self.session.link.killed = True
        self.session.kill_tree()

    def __exit__(self, *exc) -> bool:
        self.kill()
        return False
