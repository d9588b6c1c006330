"""Execute a submitted lab notebook in a fresh kernel and grade it.

How a submission is graded:

1. The notebook is read; unreadable JSON is ``malformed`` and a notebook
   with no code is ``empty``.
2. Its source is scanned for tampering patterns: assignments to attributes of
   imported modules, ``setattr`` on them, ``sys.modules`` or ``builtins``
   edits, and so on. These are reported as flags for the instructor.
3. A fresh kernel starts in a temporary folder. A hidden *guard* cell runs
   first and snapshots the identity of every function in the libraries the
   tests rely on. Then the submission's code cells run, in order, with a
   wall-clock budget for the whole notebook. Errors in a cell do not stop the
   run: later cells may still define what is graded.
4. A hidden *postlude* cell builds fresh copies of the grading code and of each
   test file from their text, read by the grader before the submission ran (so a
   submission that redefined ``check``, patched the grading module or rewrote a
   test file on disk gains nothing, and hidden tests are never visible to it), asks the guard whether any watched function
   was replaced, and runs every item against the submission's variables.
   If anything was tampered with, all marks are withheld and the report
   says what was patched.

A timeout, a dead kernel or a broken test file is reported with a clear
status and reason and never raises out of :func:`grade_notebook`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .items import ItemResult, items_in, lab_test_path, load_test_source

__all__ = ["GradeReport", "grade_notebook", "lab_of", "scan_source"]

ITEMS_PY = Path(__file__).resolve().parent / "items.py"
DEFAULT_TIMEOUT_S = 300

#: Libraries whose functions the guard watches for monkey-patching.
WATCHED_MODULES = (
    "builtins", "math", "random", "json", "numpy", "numpy.testing", "numpy.random",
    "tensorflow", "tensorflow.config", "tensorflow.config.experimental", "tensorflow.debugging",
    "tensorflow.distribute", "tensorflow.data", "tensorflow.dtypes",
    "keras", "keras.mixed_precision", "keras.optimizers",
    "gpucourse", "gpucourse.grading", "gpucourse.grading.items", "gpucourse.grading.checker",
    "gpucourse.devices", "gpucourse.placement", "gpucourse.memory", "gpucourse.distribute",
    "gpucourse.precision", "gpucourse.xla", "gpucourse.pipeline", "gpucourse.profiling", "gpucourse.timing",
)

#: Attributes the kernel itself swaps on every execution (ipykernel redirects input() per request).
KERNEL_SWAPPED = (("builtins", "input"), ("builtins", "raw_input"), ("builtins", "getpass"))

_GUARD_CODE = r'''
def _gpucourse_install_guard(guard_name, module_names, skip):
    import importlib, sys, types
    modules, watched = {}, {}
    for name in module_names:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        modules[name] = mod
        for attr, obj in list(vars(mod).items()):
            if (attr.startswith("__") or isinstance(obj, types.ModuleType) or not callable(obj)
                    or (name, attr) in skip):
                continue
            watched[(name, attr)] = (obj, getattr(obj, "__code__", None))

    def compare():
        problems = []
        for name, mod in modules.items():
            if sys.modules.get(name) is not mod:
                problems.append(f"sys.modules[{name!r}] was replaced")
        for (name, attr), (obj, code) in watched.items():
            current = vars(modules[name]).get(attr)
            if current is not obj:
                problems.append(f"{name}.{attr} was replaced or deleted")
            elif code is not None and getattr(obj, "__code__", None) is not code:
                problems.append(f"the code of {name}.{attr} was replaced")
        return problems

    guard = types.ModuleType(guard_name)
    guard.compare = compare
    sys.modules[guard_name] = guard

_gpucourse_install_guard(%(guard)r, %(modules)r, %(skip)r)
del _gpucourse_install_guard
'''

_POSTLUDE_CODE = r'''
def _gpucourse_postlude(items_path, items_src, guard_name, tests, result_path):
    import json, sys, types
    items = types.ModuleType(guard_name + "_items")
    items.__file__ = items_path
    sys.modules[items.__name__] = items
    exec(compile(items_src, items_path, "exec"), items.__dict__)
    hidden = {"In", "Out", "get_ipython", "exit", "quit"}
    ns = items.Namespace({k: v for k, v in globals().items() if not k.startswith("_") and k not in hidden})
    guard = sys.modules.get(guard_name)
    tampering = guard.compare() if guard is not None else ["the grader's guard was removed from sys.modules"]
    out = {"tampering": tampering, "results": [], "test_errors": []}
    for source, path, text in tests:
        try:
            module = items.load_test_source(text, path)
            found = items.items_in(module)
        except Exception as exc:
            out["test_errors"].append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        for item_spec, fn in found:
            row = items.run_item(item_spec, fn, ns).to_dict()
            row["source"] = source
            out["results"].append(row)
    import hashlib
    text = json.dumps(out)
    with open(result_path, "w") as fh:
        fh.write(text)
    print("GPUCOURSE_RESULT_SHA256", hashlib.sha256(text.encode()).hexdigest())

_gpucourse_postlude(%(items_py)r, %(items_src)r, %(guard)r, %(tests)r, %(result)r)
del _gpucourse_postlude
'''


@dataclass
class GradeReport:
    """The outcome of grading one submission."""

    submission: str
    lab: str | None
    status: str  # graded | tampered | timeout | crashed | malformed | empty | error
    reason: str = ""
    score: int = 0
    max_score: int = 0
    items: list[dict] = field(default_factory=list)
    cell_errors: list[dict] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    learner: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """Human-readable report: items, total, and anything the instructor should look at."""
        head = f"Lab {self.lab or '??'}: {Path(self.submission).name}"
        if self.learner:
            head += f" ({self.learner})"
        lines = [head, f"status: {self.status}" + (f": {self.reason}" if self.reason else "")]
        width = max([len(r["key"]) for r in self.items] + [4])
        for r in self.items:
            mark = {"pass": "pass", "fail": "FAIL", "todo": "todo", "error": "ERROR"}.get(r["status"], r["status"])
            src = "" if r.get("source", "public") == "public" else f" [{r['source']}]"
            lines.append(f"  {r['key']:<{width}}  {r['points']:>2}/{r['max_points']:<2}  {mark:<5}  {r['title']}{src}")
            if r.get("message"):
                lines.append(" " * (width + 17) + r["message"].replace("\n", "\n" + " " * (width + 17)))
        lines.append(f"  {'total':<{width}}  {self.score:>2}/{self.max_score:<2}")
        for e in self.cell_errors:
            lines.append(f"  cell {e['cell']} raised {e['ename']}: {e['evalue']}")
        for f in self.flags:
            lines.append(f"  flag: {f}")
        for t in self.tampering:
            lines.append(f"  tampering: {t}")
        return "\n".join(lines)


def lab_of(nb, path: str | Path) -> str | None:
    """Which lab a notebook belongs to: its ``gpucourse.lab`` metadata, else a ``NN_`` file-name prefix."""
    meta = (nb.get("metadata", {}) or {}).get("gpucourse", {}) if nb is not None else {}
    lab = meta.get("lab") if isinstance(meta, dict) else None
    if isinstance(lab, str) and re.fullmatch(r"\d\d", lab):
        return lab
    m = re.match(r"(\d\d)[_-]", Path(path).name)
    return m.group(1) if m else None


_SUSPICIOUS_NAMES = {"sys.modules", "builtins", "__builtins__", "gc.get_objects", "gc.get_referrers",
                     "sys._getframe", "inspect.currentframe", "ctypes"}


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def scan_source(sources: list[str]) -> list[str]:
    """Flag code that patches libraries or the grader (a report for humans, not a verdict)."""
    flags: list[str] = []
    imported: set[str] = set()
    trees = []
    for i, src in enumerate(sources, 1):
        try:
            tree = ast.parse(_strip_magics(src))
        except SyntaxError:
            continue
        trees.append((i, tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported |= {a.asname or a.name for a in node.names}
    for i, tree in trees:
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for t in targets:
                name = _dotted(t)
                if isinstance(t, ast.Attribute) and name and name.split(".")[0] in imported:
                    flags.append(f"code cell {i} assigns to {name} (patching an imported module)")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
                if node.args and (_dotted(node.args[0]) or "").split(".")[0] in imported:
                    flags.append(f"code cell {i} calls {node.func.id} on {_dotted(node.args[0])}")
            name = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
            if name in _SUSPICIOUS_NAMES:
                flags.append(f"code cell {i} uses {name}")
            if isinstance(node, ast.Name) and node.id.startswith("_gpucourse"):
                flags.append(f"code cell {i} refers to the grader's internals ({node.id})")
    return sorted(set(flags), key=flags.index)


def _strip_magics(src: str) -> str:
    """Blank out IPython magics and shell escapes so the source parses as Python."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())


def _max_score(tests: list[tuple[str, str, str]]) -> tuple[int, list[dict]]:
    """Total points, and placeholder rows, from the tests' source (used when the run never finished)."""
    total, rows = 0, []
    for source, path, text in tests:
        try:
            for spec, _ in items_in(load_test_source(text, path)):
                total += spec.points
                rows.append(ItemResult(spec.key, spec.title, 0, spec.points, "error", "not run").to_dict()
                            | {"source": source})
        except Exception:
            continue
    return total, rows


def grade_notebook(path: str | Path, lab: str | None = None, extra_tests=(), timeout: float = DEFAULT_TIMEOUT_S,
                   learner: str | None = None, kernel_name: str = "python3") -> GradeReport:
    """Grade one submitted notebook. Never raises for a bad submission; see the module docstring."""
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
        # Read once, before the submission runs: the same text gives the expected items and is what
        # the kernel executes, so a submission can neither rewrite the tests on disk nor read hidden ones.
        tests = [(source, str(path), path.read_text()) for source, path in paths]
        report.max_score, placeholder = _max_score(tests)
        code_cells = [(i, c) for i, c in enumerate(nb.cells, 1) if c.cell_type == "code" and c.source.strip()]
        if not code_cells:
            report.status, report.reason, report.items = "empty", "the notebook has no code to run", placeholder
            return report
        report.flags = scan_source([c.source for _, c in code_cells])
        _execute(report, code_cells, tests, timeout, kernel_name, placeholder)
    finally:
        report.duration_s = round(time.monotonic() - t0, 1)
    return report


def _kernel_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["MPLBACKEND"] = "Agg"
    env["GPUCOURSE_GRADING"] = "1"
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _forged(raw: str, outcome: dict, postlude_cell, placeholder: list[dict]) -> bool:
    """True if the result file is not what the postlude wrote, or its items are not the tests' items.

    The postlude prints the SHA-256 of the JSON it wrote; that output reached the grader over
    the kernel's messages as the cell ran, so code left running by the submission (a thread
    watching the folder) cannot change it afterwards.
    """
    import hashlib

    printed = "".join(o.get("text", "") for o in postlude_cell.get("outputs", []) if o.get("output_type") == "stream")
    digests = [ln.split()[-1] for ln in printed.splitlines() if ln.startswith("GPUCOURSE_RESULT_SHA256 ")]
    if digests != [hashlib.sha256(raw.encode()).hexdigest()]:
        return True
    expected = sorted((r["source"], r["key"], r["max_points"]) for r in placeholder)
    got = sorted((r.get("source"), r.get("key"), r.get("max_points")) for r in outcome.get("results", []))
    return bool(expected) and got != expected


def _execute(report: GradeReport, code_cells, tests, timeout, kernel_name, placeholder) -> None:
    """Run guard + submission + postlude in one fresh kernel; fill in ``report``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    token = uuid.uuid4().hex[:12]
    guard = f"_gpucourse_guard_{token}"
    workdir = Path(tempfile.mkdtemp(prefix="gpucourse-grade-"))
    result_path = workdir / f"result-{token}.json"
    cells = [nbformat.v4.new_code_cell(_GUARD_CODE % {"guard": guard, "modules": WATCHED_MODULES,
                                                                 "skip": KERNEL_SWAPPED})]
    cells += [nbformat.v4.new_code_cell(c.source) for _, c in code_cells]
    cells.append(nbformat.v4.new_code_cell(_POSTLUDE_CODE % {
        "items_py": str(ITEMS_PY), "items_src": ITEMS_PY.read_text(), "guard": guard, "tests": tests,
        "result": str(result_path)}))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                            startup_timeout=120, resources={"metadata": {"path": str(workdir)}})
    deadline = time.monotonic() + timeout
    labels = ["grader setup"] + [f"cell {i}" for i, _ in code_cells] + ["grader tests"]
    current = 0
    try:
        with client.setup_kernel(env=_kernel_env()):
            for current, cell in enumerate(cells):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CellTimeoutError(f"time limit of {timeout:g} s reached")
                client.timeout = max(1, int(left))
                client.execute_cell(cell, current)
                for out in cell.get("outputs", []):
                    if out.get("output_type") == "error" and 0 < current < len(cells) - 1:
                        report.cell_errors.append({"cell": labels[current].split()[-1], "ename": out.get("ename"),
                                                   "evalue": str(out.get("evalue"))[:300]})
    except CellTimeoutError:
        report.status = "timeout"
        report.reason = f"{labels[current]} was still running when the {timeout:g} s time limit ran out"
        report.items = placeholder
        return
    except DeadKernelError:
        report.status = "crashed"
        report.reason = f"the kernel died while running {labels[current]} (out of memory, os._exit, a segfault...)"
        report.items = placeholder
        return
    except Exception as exc:  # kernel failed to start, zmq trouble, ...
        report.status = "error"
        report.reason = f"grading failed in {labels[current]}: {type(exc).__name__}: {exc}"[:500]
        report.items = placeholder
        return
    finally:
        raw = result_path.read_text() if result_path.is_file() else None
        shutil.rmtree(workdir, ignore_errors=True)

    outcome = json.loads(raw) if raw is not None else None
    if outcome is not None and _forged(raw, outcome, cells[-1], placeholder):
        report.status, report.items = "tampered", placeholder
        report.reason = "the test results were altered after the tests ran; all marks withheld"
        report.tampering = ["the result file does not match what the grader's tests produced"]
        return

    if outcome is None:
        errs = [o for o in cells[-1].get("outputs", []) if o.get("output_type") == "error"]
        why = f"{errs[0].get('ename')}: {errs[0].get('evalue')}" if errs else "no result was written"
        report.status, report.reason, report.items = "error", f"the grader's tests did not run ({why})", placeholder
        return
    report.items = outcome["results"]
    report.tampering = outcome["tampering"]
    if outcome["test_errors"]:
        report.status = "error"
        report.reason = "a test file failed to load: " + "; ".join(outcome["test_errors"])
    elif report.tampering:
        report.status = "tampered"
        report.reason = "the submission replaced library or grader functions; all marks withheld"
    else:
        report.status = "graded"
    report.score = 0 if report.tampering else sum(r["points"] for r in report.items)
    if report.tampering:
        for r in report.items:
            r["points"] = 0
    report.max_score = sum(r["max_points"] for r in report.items) or report.max_score
