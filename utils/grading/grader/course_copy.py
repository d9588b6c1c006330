"""The course package as a graded kernel sees it: no tests, no grader, and no helper that answers the lab.

:func:`make_copy` writes, once per lab and process, a copy of the installed ``gpucourse`` package:

* without ``labtests/`` (the public tests), ``grading/grader/`` (this grader) and ``tools/`` (the
  maintainers' tools): the kernel has no use for them;
* every function or class marked ``@answers(lab, ...)`` for this lab (:mod:`gpucourse._labrules`), and every
  dotted name a test file lists in ``ANSWER_HELPERS``, keeps its signature but raises
  :class:`~gpucourse._labrules.LabRuleError` naming the lab's rule (a class: every method, and making one);
* every module a test file lists in ``FORBIDDEN_MODULES`` raises it on import (lab 09: ``gpucourse.mfu``,
  ``gpucourse.roofline``), and so does every course module that imports one at its top.

The sandbox mounts the copy where the package lives (:mod:`.sandbox`), so no import path, ``importlib``
trick or file read reaches the original. Line numbers are kept, so tracebacks point at the right lines.
"""

from __future__ import annotations

import ast
import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from .flags import parse_python
from .sandbox import package_folder

__all__ = ["EXCLUDED", "disabled_helpers", "make_copy", "rule_message"]

#: Folders of the package that never enter a graded kernel.
EXCLUDED = ("labtests", "tools", os.path.join("grading", "grader"))
_CACHE: dict = {}
_LOCK = threading.Lock()


def rule_message(lab: str, items, name: str) -> str:
    keys = ", ".join(items) if items else "its items"
    return (f"{name} computes the answer of lab {lab} ({keys}): in the graded kernel the course's copy of it "
            f"does not run. Write that part yourself (the lab's rules list the helpers it may not use).")


def _marks(node) -> list[tuple[str, tuple]]:
    """``[(lab, items)]`` of the ``@answers(lab, *items)`` decorators on a def or class."""
    found = []
    for deco in getattr(node, "decorator_list", []):
        if isinstance(deco, ast.Call) and getattr(deco.func, "id", getattr(deco.func, "attr", "")) == "answers":
            values = [a.value for a in deco.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if values:
                found.append((values[0], tuple(values[1:])))
    return found


def _module_name(rel: Path) -> str:
    """The dotted name of the course module at ``rel`` (a path inside the package): ``gpucourse.grading.items``."""
    return ".".join(("gpucourse",) + rel.with_suffix("").parts).removesuffix(".__init__")


def disabled_helpers(lab: str, root: Path | None = None) -> dict[str, tuple]:
    """``{"gpucourse.module.name": items}`` of the helpers marked ``@answers`` for ``lab`` (read from the source)."""
    return dict(_marks_by_lab(Path(root or package_folder())).get(lab, {}))


#: root -> (signature of its source files, {lab: {dotted name: items}}): every grade asks, parsing costs 0.3-0.5 s.
_MARKS: dict = {}


def _marks_by_lab(root: Path) -> dict[str, dict[str, tuple]]:
    """Every ``@answers`` mark under ``root``, by lab. The files are parsed once per process, and again only when
    one of them changed (its path, size or modification time), so a batch does not parse the course per
    submission."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not any(str(rel).startswith(e + os.sep) for e in EXCLUDED):
            stat = path.stat()
            files.append((path, rel, stat.st_size, stat.st_mtime_ns))
    signature = [(str(rel), size, mtime) for _, rel, size, mtime in files]
    with _LOCK:
        cached = _MARKS.get(root)
    if cached is not None and cached[0] == signature:
        return cached[1]
    by_lab: dict[str, dict[str, tuple]] = {}
    for path, rel, _, _ in files:
        tree = parse_python(path.read_text(), str(path))
        module = _module_name(rel)
        for node in tree.body:
            for mark_lab, items in _marks(node):
                by_lab.setdefault(mark_lab, {})[f"{module}.{node.name}"] = items
    with _LOCK:
        _MARKS[root] = (signature, by_lab)
    return by_lab


def _blank_body(lines: list[str], fn, message: str) -> None:
    """Replace ``fn``'s body by one ``raise`` on its first line (the other lines become blank)."""
    first, last = fn.body[0].lineno - 1, fn.body[-1].end_lineno - 1
    if fn.body[0].lineno == fn.lineno:
        raise ValueError(f"cannot disable the one-line function {fn.name}: give it a body of its own")
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    for i in range(first, last + 1):
        lines[i] = ""
    lines[first] = f"{indent}raise __import__('gpucourse._labrules', fromlist=['x']).LabRuleError({message!r})"


def _disable(lines: list[str], node, message: str) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        _blank_body(lines, node, message)
        return
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in methods:
        _blank_body(lines, fn, message)
    # and making one: a __new__ appended to the class's last line (a one-line def keeps the numbering)
    end = node.end_lineno - 1
    indent = " " * (node.col_offset + 4)
    lines[end] += (f"\n{indent}def __new__(cls, *a, **k): raise __import__('gpucourse._labrules', "
                   f"fromlist=['x']).LabRuleError({message!r})")


def _top_imports(tree, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules a module's top-level import statements may load."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out.add(name)
            out |= {f"{name}.{a.name}" for a in node.names}
    return out


def _rewrite(path: Path, module: str, lab: str, extra: dict, forbidden: set) -> None:
    text = path.read_text()
    tree = parse_python(text, str(path))
    imports = _top_imports(tree, module, path.name == "__init__.py")
    blocked = (module in forbidden and module) or next((m for m in forbidden if m in imports), None)
    if blocked:
        why = (f"lab {lab} forbids {blocked}: in the graded kernel it cannot be imported"
               + ("" if blocked == module else f" (nor {module}, which imports it)")
               + ". Write that part yourself.")
        path.write_text(f"raise __import__('gpucourse._labrules', fromlist=['x']).LabRuleError({why!r})\n")
        return
    lines = text.splitlines()
    changed = False
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        name = f"{module}.{node.name}"
        items = next((i for m_lab, i in _marks(node) if m_lab == lab), None)
        if items is None and name in extra:
            items = extra[name]
        if items is not None:
            _disable(lines, node, rule_message(lab, items, name))
            changed = True
    if changed:
        path.write_text("\n".join(lines) + "\n")


def make_copy(lab: str, extra_helpers: dict | None = None, forbidden=()) -> Path:
    """A folder holding ``gpucourse/``, the course as lab ``lab``'s graded kernel sees it (cached per process).

    ``extra_helpers``: ``{"gpucourse.module.name": items}`` from the test files' ``ANSWER_HELPERS``;
    ``forbidden``: module names from their ``FORBIDDEN_MODULES``. The folder is readable by every user and
    removed when the process ends.
    """
    extra = dict(extra_helpers or {})
    key = (lab, tuple(sorted((k, tuple(v)) for k, v in extra.items())), tuple(sorted(forbidden)))
    with _LOCK:
        if key in _CACHE and _CACHE[key].is_dir():
            return _CACHE[key]
        src = package_folder()
        out = Path(tempfile.mkdtemp(prefix=f"gpucourse-course-{lab}-"))
        atexit.register(shutil.rmtree, out, True)
        dst = out / "gpucourse"

        def ignore(folder, names):
            rel = Path(folder).relative_to(src)
            return [n for n in names if n == "__pycache__" or n.endswith(".pyc")
                    or str(rel / n) in EXCLUDED]

        shutil.copytree(src, dst, ignore=ignore)
        for path in sorted(dst.rglob("*.py")):
            rel = path.relative_to(dst)
            module = _module_name(rel)
            _rewrite(path, module, lab, extra, set(forbidden))
        for folder, dirs, files in os.walk(out):
            os.chmod(folder, 0o755)
            for f in files:
                os.chmod(os.path.join(folder, f), 0o644)
        _CACHE[key] = out
        return out
