"""The grader's side of each item: load the tests once per process, draw secret cases, judge observations.

Everything here runs in the grader's own process, out of the submission's reach:

* :func:`load_tests` builds each test file from the text read before the run, once per grader
  process (a batch reuses its workers, so a judge's caches, e.g. lab 01's fresh-process probes,
  survive from one submission to the next);
* :func:`make_plan` draws every split item's cases with a seed from :mod:`secrets`, so the cases
  differ from those of the learner's own ``check()`` and from one submission to the next;
* :func:`judge` turns an observation into a verdict with the grader's copy of the item;
* :func:`warm_up` imports TensorFlow in a background thread, while the kernel runs, when a judge
  (or what it calls) imports it;
* :func:`kernel_source` is the part of a test file the kernel needs: its ``@in_kernel`` functions and
  what they use. Items (``cases``, ``observe``, ``judge``) and every helper only they use are left out,
  so a test's reference code never enters the submission's kernel; so are its imports of the grader-side
  modules of ``gpucourse.labtests`` (a lab's judges and reference answers), which the kernel's course copy
  does not have.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import secrets
import threading
from dataclasses import dataclass, field

from ..items import ItemResult, ItemSpec, is_split, items_in, judge_item, load_test_source, make_cases
from .flags import parse_python

__all__ = ["PlanEntry", "judge", "kernel_source", "load_tests", "make_plan", "needs_tensorflow", "warm_up"]

_MODULES: dict[tuple[str, str], object] = {}
_LOCK = threading.Lock()


def load_tests(tests: list[tuple[str, str, str]]) -> list[tuple[str, str, object]]:
    """``(source, path, module or the exception that loading raised)`` for each ``(source, path, text)``."""
    out = []
    for source, path, text in tests:
        key = (path, hashlib.sha256(text.encode()).hexdigest())
        with _LOCK:
            module = _MODULES.get(key)
            if module is None:
                try:
                    module = load_test_source(text, path)
                    items_in(module)  # duplicate keys raise here, once
                except Exception as exc:  # a broken test file is the instructor's problem, reported as such
                    module = exc
                _MODULES[key] = module
        out.append((source, path, module))
    return out


@dataclass
class PlanEntry:
    source: str
    key: str
    spec: ItemSpec
    obj: object
    split: bool
    cases: list | None = None
    error: str = ""  # the grader could not draw cases (a bug in the test file)
    row: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.source}:{self.key}"


def make_plan(loaded: list[tuple[str, str, object]], seed: int | None = None) -> tuple[list[PlanEntry], list[str]]:
    """Every item of every loaded test file, with fresh cases for split items; and load errors."""
    rng = secrets.SystemRandom()
    entries, errors = [], []
    for source, path, module in loaded:
        if isinstance(module, Exception):
            errors.append(f"{path}: {type(module).__name__}: {module}")
            continue
        for spec, obj in items_in(module):
            entry = PlanEntry(source, spec.key, spec, obj, is_split(obj))
            if entry.split:
                try:
                    entry.cases = make_cases(obj, rng.getrandbits(64) if seed is None else seed)
                except Exception as exc:
                    entry.error = f"{type(exc).__name__}: {exc}"[:300]
            entries.append(entry)
    return entries, errors


def row(entry: PlanEntry, result: ItemResult, trust: str) -> dict:
    return result.to_dict() | {"source": entry.source, "trust": trust}


def judge(entry: PlanEntry, payload: dict | None) -> dict:
    """The item's row from what the kernel sent for it (``None``: nothing arrived)."""
    spec = entry.spec
    if entry.error:
        return row(entry, ItemResult(spec.key, spec.title, 0, spec.points, "error",
                                     f"The check could not build its test cases ({entry.error}). Tell your "
                                     "instructor."), "split")
    if not isinstance(payload, dict):
        return row(entry, ItemResult(spec.key, spec.title, 0, spec.points, "error",
                                     "The grader received no observation for this item (the run stopped first)."),
                   "split" if entry.split else "inline")
    if "error" in payload:
        return row(entry, ItemResult(spec.key, spec.title, 0, spec.points, "error", str(payload["error"])[:500]),
                   "split" if entry.split else "inline")
    if entry.split:
        return row(entry, judge_item(spec, entry.obj, entry.cases, payload.get("observed")), "split")
    res = payload.get("result")
    if not isinstance(res, dict) or res.get("status") not in ("pass", "fail", "todo", "error"):
        return row(entry, ItemResult(spec.key, spec.title, 0, spec.points, "error",
                                     "The grader received an unreadable result for this item."), "inline")
    status = res["status"]
    message = res.get("message", "") if isinstance(res.get("message", ""), str) else ""
    # Points come from the grader's own spec, never from the kernel's row.
    return row(entry, ItemResult(spec.key, spec.title, spec.points if status == "pass" else 0, spec.points,
                                 status, message[:2000]), "inline")


_TF_NAMES = ("tensorflow", "keras")


def _imports_tf(node) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import) and any(a.name.split(".")[0] in _TF_NAMES for a in sub.names):
            return True
        if isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] in _TF_NAMES:
            return True
        if isinstance(sub, ast.ImportFrom) and sub.module == "gpucourse" and any(a.name == "_tf" for a in sub.names):
            return True
    return False


def _labtests_modules(tree) -> list[str]:
    """The ``gpucourse.labtests`` modules a test file imports at its top (a lab's grader-side parts)."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and _is_labtests(node.module or ""):
            names += [node.module] if node.module != _LABTESTS else [f"{_LABTESTS}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if _is_labtests(a.name)]
    return names


def _module_imports_tf(name: str) -> bool:
    """True if the course module ``name`` imports TensorFlow or Keras anywhere in its source."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
        text = open(spec.origin, encoding="utf-8").read() if spec and spec.origin else ""
        return any(_imports_tf(n) for n in ast.walk(parse_python(text)) if isinstance(n, (ast.Import, ast.ImportFrom)))
    except (ImportError, OSError, SyntaxError, SystemError, ValueError):
        return False


@functools.lru_cache(maxsize=64)
def needs_tensorflow(text: str) -> bool:
    """True if the test file's ``cases``/``observe``/``judge`` (or module code they call) import TensorFlow or Keras.

    What an ``@in_kernel`` function imports (and what only it calls) does not count: it runs in the learner's kernel.

    A lab's grader-side module that the file imports from ``gpucourse.labtests`` (its judges, its reference
    answers) counts as a whole: if it imports TensorFlow or Keras anywhere, a judge may need it.
    """
    try:
        tree = parse_python(text)
    except (SyntaxError, SystemError):  # SystemError: see parse_python
        return False
    if any(_imports_tf(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))):
        return True
    if any(_module_imports_tf(name) for name in _labtests_modules(tree)):
        return True
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    todo = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        todo += [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in ("cases", "observe", "judge")]
    seen = set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen or _is_kernel_function(fn):  # an @in_kernel function runs in the kernel, not here
            continue
        seen.add(id(fn))
        if _imports_tf(fn):
            return True
        todo += [funcs[n.id] for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in funcs]
    return False


_WARM = {"thread": None}


def warm_up(texts: list[str]) -> threading.Thread | None:
    """Import TensorFlow in a background thread, once per process, if a judge will need it."""
    if _WARM["thread"] is not None or not any(needs_tensorflow(t) for t in texts):
        return _WARM["thread"]

    def load():
        try:
            import tensorflow  # noqa: F401
        except Exception:  # noqa: S110 (the judge that needs it will report the problem)
            pass

    _WARM["thread"] = threading.Thread(target=load, name="gpucourse-warm-tf", daemon=True)
    _WARM["thread"].start()
    return _WARM["thread"]


def _is_kernel_function(node) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        getattr(d, "id", getattr(d, "attr", "")) == "in_kernel" for d in node.decorator_list)


#: The package of the lab tests: the graded kernel's course copy has none of it (``course_copy.EXCLUDED``).
_LABTESTS = "gpucourse.labtests"


def _is_labtests(module: str) -> bool:
    return module == _LABTESTS or module.startswith(_LABTESTS + ".")


def _imports_labtests(node) -> bool:
    """True for a top-level import of ``gpucourse.labtests`` or modules of it only (grader-side code). A statement
    that imports other modules too is kept whole: the kernel needs those."""
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and _is_labtests(node.module or "")
    return isinstance(node, ast.Import) and all(_is_labtests(a.name) for a in node.names)


@functools.lru_cache(maxsize=64)
def kernel_source(text: str) -> str:
    """``text`` with only what the kernel runs, every kept line at its old line number.

    Kept: imports, the module's other statements that are not definitions (constants), the functions
    marked ``@in_kernel`` and every module-level function, class or constant they use. Everything else
    (the items, the judges' helpers, imports of ``gpucourse.labtests``, which the kernel's copy of the course
    does not have) becomes blank lines. A file that does not parse is returned as it is (the kernel reports
    the error when it loads it).
    """
    try:
        tree = parse_python(text)
    except (SyntaxError, SystemError):  # SystemError: see parse_python
        return text
    defined: dict[str, list] = {}  # every module-level definition of a name (a name may be bound twice)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for sub in ast.walk(t):  # `A, (B, C) = ...` and `[A, *B] = ...` bind every name in them
                    if isinstance(sub, ast.Name):
                        defined.setdefault(sub.id, []).append(node)

    def is_root(n) -> bool:
        if _is_kernel_function(n):
            return True
        if _imports_labtests(n):  # the lab's judges and reference answers: grader-side, never the kernel's
            return False
        if isinstance(n, (ast.Assign, ast.AnnAssign)):  # a constant a kernel function may use is reached below
            return False
        return not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))

    keep, todo = set(), [n for n in tree.body if is_root(n)]
    while todo:
        node = todo.pop()
        if id(node) in keep:
            continue
        keep.add(id(node))
        todo += [d for sub in ast.walk(node) if isinstance(sub, ast.Name) for d in defined.get(sub.id, ())]
    lines = text.splitlines()
    blank: set[int] = set()
    for node in tree.body:
        if id(node) not in keep:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            blank |= set(range(first, node.end_lineno))
    return "\n".join("" if i in blank else line for i, line in enumerate(lines)) + "\n"
