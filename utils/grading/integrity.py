"""Integrity of a graded run: what the guard watches, the static scan, and the verdict on the guard's records.

Three jobs, all on the grader's side:

* :func:`guard_config` says what the kernel-side guard records and wraps for a lab, including the
  lab's *answer-bearing* course helpers (a test file may list them in ``ANSWER_HELPERS``;
  :data:`ANSWER_HELPERS` holds the course's defaults).
* :func:`scan_source` reads the submission's code (never runs it) and flags, for a human, the
  primitives a cheat needs: dynamic code, introspection, patching modules or classes, late action,
  grader internals, and course helpers the lab's own notebook does not use.
* :func:`assess` turns the guard's records (:mod:`gpucourse.grading.channel`) into tampering
  (all marks withheld), items whose marks are withheld, and flags for review.
"""

from __future__ import annotations

import ast
import importlib
import re
import threading
import time
from dataclasses import dataclass, field

__all__ = ["ANSWER_HELPERS", "Assessment", "assess", "check_helper_name", "guard_config", "helper_items",
           "scan_source"]

#: Course helpers that compute an item's answer, per lab and item. Calling one from the learner's
#: code withholds that item's marks (or the marks of the item being graded at that moment); importing
#: one is flagged. A test file may extend this with ``ANSWER_HELPERS = {"q1": ["gpucourse.x.f"]}``.
#:
#: Rules: list every binding a learner could reach (a name re-exported by another module, such as
#: ``gpucourse.precision.simulate_loss_scale`` or ``gpucourse.bottleneck._union_us``, is a separate
#: attribute: the guard wraps each binding on its own); list private functions too; never list what the
#: lab's own notebook calls (``solutions/NN_*.ipynb``), or the solution would lose marks. The kernel
#: guard wraps functions; a class (``xla._HloCounts``) is only caught by the static scan.
#: ``tests/grading/test_integrity.py`` checks that every name resolves and that aliases are complete.
ANSWER_HELPERS = {
    "01": {"q4": ("gpucourse.multiworker.visible_gpu_ids",)},  # CUDA_VISIBLE_DEVICES read like CUDA: len() is q4
    "02": {"q1": ("gpucourse.placement.short_device", "gpucourse.placement.devices_of"),
           "q3": ("gpucourse.placement.attempt",)},  # fn() under tf.device with soft placement off, restored
    "03": {"q1": ("gpucourse.memory.estimate_state", "gpucourse.memory_explorer.estimate_state")},
    "04": {"q1": ("gpucourse.distribute.global_batch_size", "gpucourse.distribute._replicas_of",
                  "gpucourse.distribute.per_replica_batch_size"),
           "q2": ("gpucourse.distribute.per_replica_batch_size",),
           "q3": ("gpucourse.distribute._mse_replica_step",),  # the replica step of q3, compute_average_loss and all
           "q4": ("gpucourse.multiworker.tf_config",)},
    "05": {"q2": ("gpucourse.precision_scaling._next",
                  "gpucourse.precision_scaling.simulate_loss_scale", "gpucourse.precision.simulate_loss_scale",
                  "gpucourse.precision_scaling.loss_scale_trace", "gpucourse.precision.loss_scale_trace",
                  "gpucourse.precision_scaling.scale_trajectory", "gpucourse.precision.scale_trajectory")},
    "06": {"q2": ("gpucourse.xla._hlo_proto", "gpucourse.xla._HloCounts"),  # the optimized HLO's opcodes
           "q4": ("gpucourse.xla.padding_cost",)},  # the smallest bucket that holds a length, ValueError beyond
    "07": {"q1": ("gpucourse.simulate._bound_s",),
           "q2": ("gpucourse._simparts._with_options", "gpucourse.simulate._with_options")},  # no injected prefetch
    "08": {"q1": ("gpucourse.profiling.step_breakdown",),
           "q2": ("gpucourse.profiling._union_us", "gpucourse.bottleneck._union_us"),  # the union of busy spans
           "q3": ("gpucourse.simulate._bound_s",),  # steps x step_s / bound, for a long epoch
           "q5": ("gpucourse.bottleneck.classify", "gpucourse.bottleneck.group_shares",
                  "gpucourse.bottleneck.format_rows", "gpucourse.bottleneck._step_table")},
    "09": {"q1": ("gpucourse.mfu.matmul_cost",),  # OpCost.intensity: FLOPs per byte of a matmul
           "q2": ("gpucourse.roofline.Roof",),  # Roof.bound: memory or compute (a class: the static scan only)
           "q3": ("gpucourse.mfu.dense_train_flops",),
           "q4": ("gpucourse.mfu.mfu", "gpucourse.scaling.train_flops")},  # 6 x params x tokens, over the peak
}

#: Modules of the grader itself: a submission has no business importing them.
GRADER_MODULES = ("gpucourse.grading.items", "gpucourse.grading.runner", "gpucourse.grading.judge",
                  "gpucourse.grading.integrity", "gpucourse.grading.execute", "gpucourse.grading.channel",
                  "gpucourse.grading.kernel_guard", "gpucourse.grading.kernel_observe", "gpucourse.grading.report",
                  "gpucourse.grading.gradebook", "gpucourse.labtests")


def helper_items(lab: str | None, modules=()) -> dict[str, list[str]]:
    """Dotted helper name -> the public item keys it answers: the defaults plus each test file's list.

    A test file's ``ANSWER_HELPERS`` is a dict ``{item key: [dotted names]}`` or a plain list (then
    the helpers answer no particular item: their use is withheld only while an item is graded).
    A name that is not a course function or class (a typo, a renamed helper, ``os.system``) raises
    ValueError naming the test file: the guard would otherwise protect nothing, silently.
    """
    out: dict[str, list[str]] = {}
    for key, names in ANSWER_HELPERS.get(lab or "", {}).items():
        for name in names:
            out.setdefault(name, []).append(key)
    for module in modules:
        extra = getattr(module, "ANSWER_HELPERS", None)
        if extra is None:
            continue
        where = getattr(module, "__file__", None) or getattr(module, "__name__", "a test file")
        if not isinstance(extra, (dict, list, tuple)):
            raise ValueError(f"{where}: ANSWER_HELPERS must be a dict {{'q1': ['gpucourse.module.function']}} or a "
                             f"list of such names, got {type(extra).__name__}")
        pairs = extra.items() if isinstance(extra, dict) else [(None, extra)]
        for key, names in pairs:
            if isinstance(names, str) or not isinstance(names, (list, tuple)):
                raise ValueError(f"{where}: ANSWER_HELPERS[{key!r}] must be a list of dotted names like "
                                 f"['gpucourse.module.function'], got {names!r}")
            for name in names:
                check_helper_name(name, where)
                keys = out.setdefault(name, [])
                if isinstance(key, str) and key not in keys:
                    keys.append(key)
    return out


def check_helper_name(name, where: str = "ANSWER_HELPERS") -> None:
    """Raise ValueError unless ``name`` is the dotted name of a course function or class."""
    module, _, attr = name.rpartition(".") if isinstance(name, str) else ("", "", "")
    if not (module == "gpucourse" or module.startswith("gpucourse.")) or not attr:
        raise ValueError(f"{where}: ANSWER_HELPERS lists {name!r}, which is not a course helper; the guard only "
                         "watches functions of the course package: write 'gpucourse.module.function'")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{where}: ANSWER_HELPERS lists {name!r}, which does not exist ({exc}), so the guard "
                         "would protect nothing; fix the spelling or use the helper's current module "
                         "(see gpucourse.grading.integrity.ANSWER_HELPERS for the live names)") from None
    if not callable(obj):
        raise ValueError(f"{where}: ANSWER_HELPERS lists {name!r}, a {type(obj).__name__}, not a function or "
                         "class; list the function that computes the answer")


def answer_helpers(lab: str | None, modules=()) -> tuple[str, ...]:
    """The lab's answer-bearing helpers (dotted names)."""
    return tuple(helper_items(lab, modules))


def guard_config(address: str | None, helpers, grader_files, driver_files, driver_sha256, protected=(),
                 output=()) -> dict:
    """What :func:`gpucourse.grading.kernel_guard.install` needs (see its docstring).

    Every helper must name a course function or class (:func:`check_helper_name`), else ValueError.
    """
    helpers = list(helpers)
    for name in helpers:
        check_helper_name(name, "guard_config")
    # The guard wraps a helper only if its module is loaded when it installs: import every helper's module.
    preload = sorted({name.rpartition(".")[0] for name in helpers if name.startswith("gpucourse.")})
    return {"address": address, "answer_helpers": helpers, "grader_files": list(grader_files),
            "driver_files": list(driver_files), "driver_sha256": list(driver_sha256),
            "protected_files": list(protected), "output_roots": [str(p) for p in output], "preload": preload,
            "course_modules": course_modules()}


def course_modules() -> list[str]:
    """Every helper module of the course (so a module added later is watched too), not the authoring tools."""
    import pkgutil

    import gpucourse

    tools = ("authoring", "labgen", "benchmark")
    names = [m.name for m in pkgutil.iter_modules(gpucourse.__path__) if m.name not in tools and not m.ispkg]
    return ["gpucourse." + n for n in names + ["grading", "grading.items", "grading.checker", "labtests"]]


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
_SUSPICIOUS_MODULES = {
    "inspect": "frame introspection", "gc": "object walks (gc)", "ctypes": "raw memory (ctypes)",
    "atexit": "late action (atexit)", "threading": "late action (threads)", "_thread": "late action (threads)",
    "multiprocessing": "processes", "subprocess": "processes", "signal": "signals", "builtins": "builtins",
    "importlib": "dynamic import", "concurrent": "late action (threads)", "asyncio": "late action (tasks)",
    "trace": "tracing", "sys.monitoring": "tracing",
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


def parse_python(text: str) -> ast.Module:
    """``ast.parse(text)``, safe from CPython 3.11's shared AST state.

    CPython 3.11 keeps the AST builder's recursion depth in state shared by the threads of a process, so a
    parse that overlaps another one (a second grading thread, or a library's, e.g. AutoGraph) can fail with
    ``SystemError: AST constructor recursion depth mismatch``. The grader's own parses take one lock, and a
    parse hit by a library's is tried again; a ``SyntaxError`` is the caller's to handle, as with ``ast.parse``.
    """
    for attempt in range(5):
        try:
            with _AST_LOCK:
                return ast.parse(text)
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
    from ..colab import SETUP_CELL

    template = template or []
    unchanged = {s.strip() for s in template} | {SETUP_CELL.strip()}
    allowed = template_imports(template) if template else None
    helpers = set(helpers) or set(answer_helpers(lab))
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


# --------------------------------------------------------------------------- the guard's records

#: Runtime categories (the guard's reports) and what they cost.
TAMPER = {"ctypes": "used ctypes, which can rewrite any memory",
          "forged": "sent messages that only the grader's checks may send",
          "audit-hook": "tried to install its own audit hook",
          "memory": "opened a process's memory (/proc/<pid>/mem), which can read or rewrite anything",
          "install-write": "wrote into the Python installation",
          "output-write": "tried to write the grader's results (its output folder, hidden tests or key)"}
INTROSPECTION = ("introspection",)
FLAG = {"dynamic-code": "ran dynamically built code", "process": "started or signalled a process",
        "atexit": "registered an atexit hook (it never runs: the grader kills the kernel)",
        "helper": "called a course helper that answers an item"}


@dataclass
class Assessment:
    tampering: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    withheld: dict[str, str] = field(default_factory=dict)  # "source:key" -> reason
    inline_withheld: str = ""  # reason to withhold every inline item
    observed: dict[str, list[str]] = field(default_factory=dict)  # "source:key" -> payload texts
    complete: bool = False  # the end record arrived, in order


def _where(text: str) -> str:
    name, _, line = str(text).rpartition(":")
    return f"in `{name}`, line {line}" if name and line.isdigit() else ""


def assess(records, problems: list[str], plan_names: list[str], config_digest: str | None = None,
           helpers: dict[str, list[str]] | None = None) -> Assessment:
    """Verdicts from the guard's records (see :mod:`gpucourse.grading.kernel_guard` for their kinds).

    ``helpers`` maps an answer-bearing helper to the public items it answers (:func:`helper_items`).
    """
    a = Assessment(tampering=[f"{p}" for p in problems])
    phases = []
    for rec in records:
        kind, detail = rec.kind, rec.detail
        if kind == "changed":
            phase, changes = detail
            for what, name in changes:
                if what == "import-system":
                    a.flags.append(f"{name} ({'during ' + phase if phase != 'submission' else 'by the submission'})")
                elif what == "added":
                    a.tampering.append(f"added {name}")
                else:
                    a.tampering.append(f"{name} was replaced")
        elif kind == "event":
            phase, category, what, where = detail
            at = _where(where)
            item = phase[len("item:"):] if phase.startswith("item:") else None
            label = f"{what} {at}".strip()
            if category in TAMPER:
                a.tampering.append(f"{TAMPER[category]} ({label})")
            elif category in INTROSPECTION:
                a.flags.append(f"inspected the running program: {label}")
                if item:  # a check's own state (counted calls, the functions it hands over) lives in frames
                    a.withheld.setdefault(item, (
                        f"Marks withheld: while this item was graded your code inspected the running program "
                        f"({label}), which can reach the check's own state. Solve the item without sys._getframe, "
                        "inspect, gc or tracing."))
                a.inline_withheld = a.inline_withheld or (
                    f"Marks withheld: your code inspected the running program ({label}), which can read a "
                    "check's expected answers. Solve the item without sys._getframe, inspect, gc or tracing.")
            elif category == "reads-tests":
                if item:
                    a.withheld.setdefault(item, f"Marks withheld: while this item was graded your code read the "
                                                f"checks' own files ({at}). Solve the item without them.")
                a.flags.append(f"read the lab's test files: {what.rsplit('/', 1)[-1]} {at}".strip())
            elif category == "helper-copy":  # a fresh copy of a module that holds answer-bearing helpers
                names = str(what).split()
                for name in names:
                    targets = [item] if item else [f"public:{k}" for k in (helpers or {}).get(name, [])]
                    for target in targets:
                        a.withheld.setdefault(target, (
                            f"Marks withheld: your code loaded a fresh copy of the course module that holds "
                            f"{name} ({at}), a course helper that computes this item's answer. Write the "
                            "function yourself."))
                a.flags.append(f"loaded a fresh copy of a course module holding {', '.join(names)} {at}".strip())
            elif category == "helper":
                targets = [item] if item else [f"public:{k}" for k in (helpers or {}).get(what, [])]
                for target in targets:
                    a.withheld.setdefault(target, (
                        f"Marks withheld: your code called {what} ({at}), a course helper that computes "
                        "this item's answer. Write the function yourself."))
                a.flags.append(f"called {what} while {item} was graded ({at})" if item else f"called {what} ({at})")
            else:
                a.flags.append(f"{FLAG.get(category, category)}: {label}")
        elif kind == "threads":
            a.flags.append("left threads running after the checks (they were killed): " + ", ".join(
                _where(w) or w for w in detail))
        elif kind == "atexit":
            a.flags.append(f"registered {detail[1]} atexit hook(s) without atexit.register")
        elif kind == "guard-error":
            a.flags.append(f"the grader's guard failed on a {detail[0]} event; review this submission")
        elif kind == "phase":
            phases.append(tuple(detail))
        elif kind == "observed":
            a.observed.setdefault(detail[0], []).append(detail[1])
        elif kind == "end":
            a.complete = True
    begins = [p for p in phases if p[0] == "begin"]
    if (len(begins) > 1 or (phases and phases[0][0] != "begin")
            or (a.complete and phases[1:] != [("item", n) for n in plan_names])):
        a.tampering.append("the grader's checks did not run in the grader's order (forged phase messages)")
    if config_digest is not None and begins and begins[0][1] != config_digest:
        a.tampering.append("the kernel received other tests or cases than the grader sent")
    for name, texts in a.observed.items():
        if len(texts) != 1 or name not in plan_names:
            a.tampering.append(f"the grader received {len(texts)} observations for {name} (forged messages)")
    a.tampering = list(dict.fromkeys(a.tampering))
    a.flags = list(dict.fromkeys(a.flags))
    return a


def short(text: str, limit: int = 160) -> str:
    text = re.sub(r"\s+", " ", str(text))
    return text if len(text) <= limit else text[:limit] + "..."
