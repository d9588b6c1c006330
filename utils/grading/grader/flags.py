"""Review flags: a static scan of the submission's code, and the tripwire's records. Never a verdict.

Two jobs, both on the grader's side, both producing lines for a human to read (the gradebook's
``integrity`` column and the learner's feedback); no mark depends on them:

* :func:`scan_source` reads the submission's code (never runs it) and flags the primitives a cheat needs:
  dynamic code, introspection, patching modules or classes, late action, grader internals, the lab's
  answer-bearing course helpers, and course modules the lab's own notebook does not use;
* :func:`tripwire_flags` turns what the kernel's tripwire reported (:mod:`gpucourse.grading.kernel.tripwire`)
  into flags, and says so when it fell silent.

:func:`lab_rules` reads what a lab forbids from its test files: ``ANSWER_HELPERS`` (dotted names of course
helpers, besides those marked ``@answers`` in the course itself) and ``FORBIDDEN_MODULES``.
"""

from __future__ import annotations

import ast
import importlib
import threading
import time
from pathlib import Path

__all__ = ["GRADER_MODULES", "check_helper_name", "lab_rules", "parse_python", "scan_source", "tripwire_flags"]

_GRADING = Path(__file__).resolve().parent.parent


def _grader_modules() -> tuple[str, ...]:
    """The grader's own modules and the tests, derived from the folders: a submission has no use for them."""
    names = ["gpucourse.labtests", "gpucourse.grading.protocol", "gpucourse.grading.items"]
    for folder in ("grader", "kernel"):
        names.append(f"gpucourse.grading.{folder}")
        names += [f"gpucourse.grading.{folder}.{p.stem}" for p in sorted((_GRADING / folder).glob("*.py"))
                  if p.stem != "__init__"]
    return tuple(names)


#: Modules of the grader itself (and the tests): a submission has no business importing them.
GRADER_MODULES = _grader_modules()


def lab_rules(lab: str | None, modules=()) -> tuple[dict[str, list[str]], list[str]]:
    """``(helpers, forbidden)`` for a lab: dotted helper -> item keys it answers, and forbidden module names.

    The helpers are those marked ``@answers(lab, ...)`` in the course (read from its source) and each test
    file's ``ANSWER_HELPERS`` (a dict ``{item key: [dotted names]}`` or a plain list); the forbidden modules
    each test file's ``FORBIDDEN_MODULES``. A name that is not a course function, class or module (a typo,
    a renamed helper, ``os.system``) raises ValueError naming the test file: it would protect nothing.
    """
    from .course_copy import disabled_helpers

    helpers: dict[str, list[str]] = {k: list(v) for k, v in (disabled_helpers(lab).items() if lab else [])}
    forbidden: list[str] = []
    for module in modules:
        where = getattr(module, "__file__", None) or getattr(module, "__name__", "a test file")
        extra = getattr(module, "ANSWER_HELPERS", None)
        if extra is not None:
            if not isinstance(extra, (dict, list, tuple)):
                raise ValueError(f"{where}: ANSWER_HELPERS must be a dict {{'q1': ['gpucourse.module.function']}} "
                                 f"or a list of such names, got {type(extra).__name__}")
            pairs = extra.items() if isinstance(extra, dict) else [(None, extra)]
            for key, names in pairs:
                if isinstance(names, str) or not isinstance(names, (list, tuple)):
                    raise ValueError(f"{where}: ANSWER_HELPERS[{key!r}] must be a list of dotted names like "
                                     f"['gpucourse.module.function'], got {names!r}")
                for name in names:
                    check_helper_name(name, where)
                    keys = helpers.setdefault(name, [])
                    if isinstance(key, str) and key not in keys:
                        keys.append(key)
        for name in getattr(module, "FORBIDDEN_MODULES", ()) or ():
            if not (isinstance(name, str) and name.startswith("gpucourse.")):
                raise ValueError(f"{where}: FORBIDDEN_MODULES lists {name!r}; write a course module like "
                                 "'gpucourse.mfu'")
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise ValueError(f"{where}: FORBIDDEN_MODULES lists {name!r}, which does not exist ({exc})") from None
            if name not in forbidden:
                forbidden.append(name)
    return helpers, forbidden


def check_helper_name(name, where: str = "ANSWER_HELPERS") -> None:
    """Raise ValueError unless ``name`` is the dotted name of a course function or class."""
    module, _, attr = name.rpartition(".") if isinstance(name, str) else ("", "", "")
    if not (module == "gpucourse" or module.startswith("gpucourse.")) or not attr:
        raise ValueError(f"{where}: ANSWER_HELPERS lists {name!r}, which is not a course helper; the grader only "
                         "disables functions of the course package: write 'gpucourse.module.function'")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{where}: ANSWER_HELPERS lists {name!r}, which does not exist ({exc}), so it would "
                         "protect nothing; fix the spelling or use the helper's current module") from None
    if not callable(obj):
        raise ValueError(f"{where}: ANSWER_HELPERS lists {name!r}, a {type(obj).__name__}, not a function or "
                         "class; list the function that computes the answer")


# --------------------------------------------------------------------------- static scan

_SUSPICIOUS_ATTRS = {
    "_getframe": "frame introspection", "_current_frames": "frame introspection", "f_back": "frame introspection",
    "f_locals": "frame introspection", "f_globals": "frame introspection", "tb_frame": "frame introspection",
    "gi_frame": "frame introspection", "currentframe": "frame introspection", "stack": None,
    "__closure__": "introspection", "__code__": "introspection", "__globals__": "introspection",
    "__wrapped__": "introspection", "__subclasses__": "introspection", "__builtins__": "builtins",
    "settrace": "tracing", "setprofile": "tracing", "addaudithook": "audit hooks", "audit": "audit hooks",
    "modules": None, "fork": "processes", "_exit": "processes", "kill": "processes", "dup2": "file descriptors",
}
#: (Threads, tasks and atexit hooks are no longer scanned for: nothing is read after the checks, every process
#: is killed first, and the tripwire reports the threads a submission really left running.)
_SUSPICIOUS_MODULES = {
    "inspect": "frame introspection", "gc": "object walks (gc)", "ctypes": "raw memory (ctypes)",
    "multiprocessing": "processes", "subprocess": "processes", "signal": "signals", "builtins": "builtins",
    "importlib": "dynamic import", "trace": "tracing", "sys.monitoring": "tracing",
}
_DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "breakpoint"}


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _computed_module(node) -> str | None:
    """'__import__(...)' for a module or class reached by a call or ``sys.modules[...]``, else None."""
    if isinstance(node, ast.Call):
        fname = _dotted(node.func) or ""
        if fname in ("__import__", "importlib.import_module", "import_module", "getattr", "type", "vars"):
            return f"{fname}(...)"
    if isinstance(node, ast.Subscript) and (_dotted(node.value) or "").endswith("sys.modules"):
        return "sys.modules[...]"
    return None


def strip_magics(src: str) -> str:
    """Blank out IPython magics and shell escapes so the source parses as Python."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())


def _course_imports(tree) -> dict[str, str]:
    """alias -> dotted course module or name, for `import gpucourse.x as y` / `from gpucourse import x`."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "gpucourse":
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else "gpucourse"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gpucourse" and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _resolve(name: str | None, aliases: dict[str, str]) -> str | None:
    """'xla.padding_cost' with xla -> gpucourse.xla gives 'gpucourse.xla.padding_cost'."""
    if not name:
        return None
    head, _, rest = name.partition(".")
    if head not in aliases:
        return None
    return aliases[head] + ("." + rest if rest else "")


_AST_LOCK = threading.Lock()


def parse_python(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(text, filename)``, safe from CPython 3.11's shared AST state: every parse in the grader's
    process goes through here (the submission's cells, the test files, the course's source in course_copy).

    CPython 3.11 keeps the AST builder's recursion depth in state shared by the threads of a process, so a
    parse that overlaps another one (a second grading thread, or a library's, e.g. AutoGraph) can fail with
    ``SystemError: AST constructor recursion depth mismatch``. The grader's own parses take one lock, and a
    parse hit by a library's is tried again; a ``SyntaxError`` is the caller's to handle, as with ``ast.parse``.
    """
    for attempt in range(5):
        try:
            with _AST_LOCK:
                return ast.parse(text, filename)
        except SystemError:
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def template_imports(sources: list[str]) -> set[str]:
    """Course modules and names the lab's own notebook imports (what a submission may use freely)."""
    names = set()
    for src in sources:
        try:
            tree = parse_python(strip_magics(src))
        except SyntaxError:
            continue
        names |= set(_course_imports(tree).values())
    return names


def scan_source(sources: list[str], lab: str | None = None, template: list[str] | None = None,
                helpers=(), numbers: list[int] | None = None) -> list[str]:
    """Flags for a human: code that could patch, introspect or act late (a report, never a verdict).

    ``template`` is the lab's own notebook: cells left exactly as given are not scanned, and course
    modules it imports may be used. ``helpers`` are the lab's answer-bearing course helpers.
    ``numbers`` are the cells' numbers in the notebook (default: 1, 2, ...), used in the flags.
    """
    from ...colab import SETUP_CELL

    template = template or []
    unchanged = {s.strip() for s in template} | {SETUP_CELL.strip()}
    allowed = template_imports(template) if template else None
    helpers = set(helpers) if helpers else set(lab_rules(lab)[0])
    flags: list[str] = []
    parsed = []
    for i, src in zip(numbers or range(1, len(sources) + 1), sources):
        if src.strip() in unchanged:
            continue
        try:
            parsed.append((i, parse_python(strip_magics(src))))
        except SyntaxError:
            continue
    imported = set()
    aliases: dict[str, str] = {}
    for _, tree in parsed:
        aliases |= _course_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported |= {a.asname or a.name for a in node.names}
    for i, tree in parsed:
        def flag(text, i=i):
            flags.append(f"cell {i} {text}")

        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for mod in mods:
                    top = mod.split(".")[0]
                    if mod in _SUSPICIOUS_MODULES or top in _SUSPICIOUS_MODULES:
                        flag(f"imports {mod} ({_SUSPICIOUS_MODULES.get(mod) or _SUSPICIOUS_MODULES[top]})")
                    if mod.startswith(GRADER_MODULES) or mod in GRADER_MODULES:
                        flag(f"imports the grader's internals ({mod})")
                if isinstance(node, ast.ImportFrom) and node.module == "gpucourse.grading":
                    for a in node.names:
                        if a.name not in ("Checker",):
                            flag(f"imports the grader's internals (gpucourse.grading.{a.name})")
                names = (list(_course_imports(ast.Module(body=[node], type_ignores=[])).values()))
                for dotted in names:
                    if dotted in helpers:
                        flag(f"imports {dotted}, a course helper that answers an item of this lab")
                    elif allowed is not None and dotted != "gpucourse" and dotted not in allowed and not (
                            dotted.startswith("gpucourse.grading")) and dotted.rsplit(".", 1)[0] not in allowed:
                        flag(f"imports {dotted}, which this lab's notebook does not use")
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for t in targets:
                name = _dotted(t)
                if isinstance(t, ast.Attribute) and name and name.split(".")[0] in imported:
                    flag(f"assigns to {name} (patching an imported module or class)")
                elif isinstance(t, ast.Attribute) and _computed_module(t.value):
                    flag(f"assigns to .{t.attr} of {_computed_module(t.value)} (patching a module or class)")
                elif isinstance(t, ast.Subscript) and _dotted(t.value) in ("sys.modules", "__builtins__"):
                    flag(f"assigns into {_dotted(t.value)}")
            if isinstance(node, ast.Call):
                fname = _dotted(node.func)
                if fname in ("setattr", "delattr", "object.__setattr__", "type.__setattr__", "object.__delattr__"):
                    target = node.args[0] if node.args else None
                    tname = _dotted(target) if target is not None else None
                    if tname is None or tname.split(".")[0] in imported or _computed_module(target):
                        flag(f"calls {fname} on {tname or 'a computed object'} (patching a module or class)")
                elif fname in _DYNAMIC_CALLS:
                    flag(f"calls {fname}() (dynamic code)")
                elif fname == "getattr" and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
                    flag("calls getattr with a computed name")
                resolved = _resolve(fname, aliases)
                if resolved in helpers:
                    flag(f"calls {resolved}, a course helper that answers an item of this lab")
            if isinstance(node, ast.Attribute):
                reason = _SUSPICIOUS_ATTRS.get(node.attr)
                dotted = _dotted(node) or ""
                if reason:
                    flag(f"uses .{node.attr} ({reason})")
                elif node.attr == "modules" and dotted.endswith("sys.modules"):
                    flag("uses sys.modules")
                resolved = _resolve(dotted, aliases)
                if resolved in helpers and not isinstance(getattr(node, "ctx", None), ast.Store):
                    flag(f"uses {resolved}, a course helper that answers an item of this lab")
            if isinstance(node, ast.Name) and (node.id.startswith("_gpucourse") or node.id == "__builtins__"):
                flag(f"refers to {node.id}")
    return list(dict.fromkeys(flags))


# --------------------------------------------------------------------------- the tripwire's records

#: What each tripwire category means, for the reader of a flag.
MEANING = {"introspection": "read frames or walked objects", "dynamic-code": "ran dynamically built code",
           "signal-handler": "set a Python signal handler", "profiler": "set a profiler or tracer",
           "ctypes": "called ctypes, which can rewrite any memory",
           "memory": "opened a process's memory (/proc/<pid>/mem)", "process": "started or signalled a process",
           "audit-hook": "added an audit hook", "threads": "left threads running",
           "silenced": "the tripwire fell silent", "tripwire-error": "an error inside the tripwire"}


def tripwire_flags(connections: list[list], problems=(), calls: int | None = None) -> list[str]:
    """Review flags from the tripwire's records: one list of ``(kind, body)`` per kernel started.

    ``calls``: how many calls the agents answered; the agent raises a look before and after each, so fewer
    looks than ``2 * calls`` over all connections means the tripwire was silenced (a call whose kernel hung
    or died is not counted: it may lack its second look). ``problems``: what the
    listener refused (a connection with a wrong token or a broken frame).
    """
    flags: list[str] = [f"tripwire: {p}" for p in problems]
    looks = 0
    for records in connections:
        for kind, body in records:
            if kind == "broken":
                flags.append(f"tripwire: {MEANING['silenced']} (a record was forged or lost: {body})")
            elif kind == "flag" and isinstance(body, dict):
                category = str(body.get("category", ""))
                where = str(body.get("where", ""))[:160]
                flags.append(f"tripwire: {MEANING.get(category, category)}: {str(body.get('detail', ''))[:120]}"
                             + (f" at {where}" if where else ""))
            elif kind == "look" and isinstance(body, dict):
                looks += 1
                if body.get("signals"):
                    flags.append(f"tripwire: {MEANING['signal-handler']} (signals {', '.join(map(str, body['signals']))})")
                if body.get("profiler") or body.get("tracer"):
                    flags.append(f"tripwire: {MEANING['profiler']} while the checks ran")
                if body.get("threads"):
                    flags.append(f"tripwire: {MEANING['threads']}: {', '.join(map(str, body['threads']))[:160]}")
    if not connections:
        flags.append(f"tripwire: {MEANING['silenced']} (it never reported)")
    elif calls is not None and looks < 2 * calls:
        flags.append(f"tripwire: {MEANING['silenced']} ({looks} looks for {calls} calls)")
    return list(dict.fromkeys(flags))


def short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
