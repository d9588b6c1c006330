"""Review flags (the static scan, the tripwire's records) and the lab rules (answer helpers, forbidden modules),
without a kernel. No flag ever changes a mark; the rules are enforced by the graded kernel's course copy."""

import importlib
import pkgutil
import types
from pathlib import Path

import nbformat
import pytest

import gpucourse

from gpucourse._labrules import answers_of
from gpucourse.colab import SETUP_CELL
from gpucourse.grading.grader.course_copy import disabled_helpers
from gpucourse.grading.grader.flags import GRADER_MODULES, lab_rules, scan_source, tripwire_flags
from gpucourse.grading.items import items_in, lab_ids, lab_test_path, load_test_file

ROOT = Path(__file__).resolve().parents[3]


def _flags(*cells, **kw):
    return "\n".join(scan_source(list(cells), **kw))


def test_scan_flags_patching_modules_and_classes():
    text = _flags("import tensorflow as tf\nimport gpucourse.grading.items as gi\n"
                  "from gpucourse.grading import Checker",
                  "tf.config.list_physical_devices = lambda *a: []",
                  "gi.run_item = None\nsetattr(tf, 'device', None)\nimport sys\nsys.modules['x'] = 1",
                  "model = object()\nmodel.trainable = False\n%timeit 1",
                  "setattr(__import__('json'), 'dumps', None)\n__import__('os').replace = None")
    assert "assigns to tf.config.list_physical_devices" in text and "assigns to gi.run_item" in text
    assert "calls setattr on tf" in text and "assigns into sys.modules" in text
    assert "calls setattr on a computed object" in text and "assigns to .replace of __import__(...)" in text
    assert "imports the grader's internals (gpucourse.grading.items)" in text
    assert "model.trainable" not in text and "Checker" not in text


@pytest.mark.parametrize("src, fragment", [
    ("import sys\nsys._getframe(1).f_locals", "uses ._getframe (frame introspection)"),
    ("import inspect\ninspect.currentframe()", "imports inspect (frame introspection)"),
    ("x = getattr(__import__('sys'), '_get' + 'frame')", "calls getattr with a computed name"),
    ("import importlib\nimportlib.import_module('json')", "imports importlib (dynamic import)"),
    ("exec('1')", "calls exec() (dynamic code)"),
    ("import gc\ngc.get_objects()", "imports gc"),
    ("import ctypes", "imports ctypes"),
    ("from multiprocessing import Process", "imports multiprocessing (processes)"),
    ("f = lambda: 1\nf.__code__", "uses .__code__"),
    ("import sys\nsys.audit('gpucourse.observed', 'q1', '{}')", "uses .audit (audit hooks)"),
    ("_gpucourse_guard = 1", "refers to _gpucourse_guard"),
])
def test_scan_flags_primitives_a_cheat_needs(src, fragment):
    assert fragment in _flags(src)


def test_a_thread_or_an_atexit_hook_is_not_flagged_by_the_scan():
    """Nothing is read after the checks and every process is killed first; the tripwire reports threads left
    running. Importing threading for honest work is no reason for review."""
    assert _flags("import threading, atexit\nthreading.Thread(target=print).start()") == ""


def test_scan_knows_the_lab_template_and_answer_helpers():
    template = [SETUP_CELL,
                "import tensorflow as tf\nfrom gpucourse import devices\nfrom gpucourse.grading import Checker",
                "def f():\n    raise NotImplementedError"]
    clean = _flags(SETUP_CELL, template[1], "def f():\n    return devices.describe([])", lab="01", template=template)
    assert clean == ""
    text = _flags(SETUP_CELL, "from gpucourse import pipeline\nfrom gpucourse.multiworker import visible_gpu_ids",
                  "import gpucourse.multiworker as m\nm.visible_gpu_ids('0', 2)", lab="01", template=template)
    assert "imports gpucourse.pipeline, which this lab's notebook does not use" in text
    assert "imports gpucourse.multiworker.visible_gpu_ids, a course helper that answers an item" in text
    assert "calls gpucourse.multiworker.visible_gpu_ids, a course helper" in text
    assert "cell 1 " not in text and "cell 2 " in text  # the untouched setup cell is not scanned


def test_lab_rules_merge_the_courses_marks_with_the_test_files_lists():
    class Module:
        ANSWER_HELPERS = {"q9": ["gpucourse.xla.break_even_calls"]}
        FORBIDDEN_MODULES = ("gpucourse.mfu",)

    class Listed:
        ANSWER_HELPERS = ["gpucourse.xla.variants"]

    helpers, forbidden = lab_rules("06", [Module, Listed])
    assert helpers["gpucourse.xla.break_even_calls"] == ["q9"] and helpers["gpucourse.xla.padding_cost"] == ["q4"]
    assert helpers["gpucourse.xla._hlo_proto"] == ["q2"]  # marked @answers("06", "q2") in gpucourse.xla
    assert helpers["gpucourse.xla.variants"] == [] and forbidden == ["gpucourse.mfu"]
    assert set(lab_rules("07")[0]) == set(disabled_helpers("07")) == {"gpucourse.simulate._bound_s"}


@pytest.mark.parametrize("listed, fragment", [
    ({"h1": ["gpucourse.distribute.visible_gpu_ids"]}, "does not exist"),  # moved to gpucourse.multiworker
    ({"h1": ["gpucourse.xla.padding_cots"]}, "does not exist"),  # a typo
    ({"h1": ["gpucourse.no_such_module.f"]}, "does not exist"),
    ({"h1": ["os.system"]}, "not a course helper"),
    ({"h1": ["gpucourse.memory.MiB"]}, "not a function or class"),
    ({"h1": "gpucourse.xla.padding_cost"}, "must be a list"),
    ("gpucourse.xla.padding_cost", "must be a dict"),
])
def test_a_test_files_helper_that_does_not_resolve_is_refused(tmp_path, listed, fragment):
    """A hidden test's misspelt helper would silently protect nothing: the grader refuses the file."""
    path = tmp_path / "hidden_lab01.py"
    path.write_text(f"ANSWER_HELPERS = {listed!r}\n")
    with pytest.raises(ValueError) as err:
        lab_rules("01", [load_test_file(path)])
    text = str(err.value)
    assert str(path) in text and fragment in text, text
    if isinstance(listed, dict) and isinstance(listed["h1"], list):
        assert repr(listed["h1"][0]) in text and ("fix the spelling" in text or "gpucourse.module.function" in text
                                                  or "list the function" in text)


@pytest.mark.parametrize("listed, fragment", [(["gpucourse.no_such"], "does not exist"), (["os"], "write a course module")])
def test_a_test_files_forbidden_module_that_does_not_resolve_is_refused(tmp_path, listed, fragment):
    path = tmp_path / "hidden_lab09.py"
    path.write_text(f"FORBIDDEN_MODULES = {listed!r}\n")
    with pytest.raises(ValueError, match=fragment):
        lab_rules("09", [load_test_file(path)])


def test_the_cli_refuses_a_hidden_test_with_a_misspelt_helper(tmp_path, capsys):
    from gpucourse.grading.grader.cli import main

    hidden = tmp_path / "hidden.py"
    hidden.write_text("ANSWER_HELPERS = {'h1': ['gpucourse.distribute.visible_gpu_ids']}\n")
    nb = tmp_path / "sub.ipynb"
    nb.write_text("{}")
    for argv in ([str(nb), "--lab", "01", "--extra-tests", str(hidden)],
                 ["gradescope", "--lab", "01", "--extra-tests", str(hidden), "--out", str(tmp_path / "g.zip")]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "'gpucourse.distribute.visible_gpu_ids', which does not exist" in capsys.readouterr().err
    assert not (tmp_path / "g.zip").exists()


# --------------------------------------------------------------------------- the marks are current


def _lab_modules() -> dict:
    return {lab: load_test_file(lab_test_path(lab)) for lab in lab_ids()}


def test_every_mark_names_an_item_of_its_lab_and_sits_on_a_function_with_a_body():
    """A mark for a lab or item that does not exist would protect nothing; the course copy replaces a marked
    function's body, so it must have one of its own (not a one-line ``def``)."""
    keys = {lab: {spec.key for spec, _ in items_in(module)} for lab, module in _lab_modules().items()}
    marked = [(lab, name, items) for lab in keys for name, items in disabled_helpers(lab).items()]
    assert marked, "no helper is marked @answers: the course copy would disable nothing"
    for lab, name, items in marked:
        assert set(items) <= keys[lab], f"{name}: lab {lab} has no item {sorted(set(items) - keys[lab])}"
        module, _, attr = name.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        assert any(m_lab == lab for m_lab, _ in answers_of(obj)), f"{name}: the runtime mark is missing"


def test_the_static_mark_reader_finds_every_runtime_mark():
    """The course copy reads the marks from the source (no import); every marked object must be found there."""
    modules = [importlib.import_module(f"gpucourse.{m.name}") for m in pkgutil.iter_modules(gpucourse.__path__)
               if not m.ispkg and m.name not in ("authoring", "labgen", "benchmark", "gpureport", "i18n")]
    found = {name for lab in lab_ids() for name in disabled_helpers(lab)}
    for module in modules:
        for attr, obj in vars(module).items():
            if answers_of(obj) and getattr(obj, "__module__", "") == module.__name__:
                assert f"{module.__name__}.{attr}" in found or getattr(obj, "__name__", attr) != attr, \
                    f"{module.__name__}.{attr} is marked at run time but not found in its source"


@pytest.mark.parametrize("lab", lab_ids())
def test_no_lab_solution_uses_its_answer_helpers(lab):
    """A helper the lab's own solution calls must not be listed: the solution would lose those marks."""
    nb = nbformat.read(next((ROOT / "solutions").glob(f"{lab}_*.ipynb")), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    helpers, _ = lab_rules(lab, [load_test_file(lab_test_path(lab))])
    flags = [f for f in scan_source(code, lab, helpers=helpers) if "course helper that answers" in f]
    assert flags == []


def _bindings(dotted: str) -> set[str]:
    """Every ``gpucourse.<module>.<name>`` bound to the helper ``dotted`` (a re-export is the same object)."""
    module, _, attr = dotted.rpartition(".")
    obj = getattr(importlib.import_module(module), attr)
    out = {dotted}
    for m in pkgutil.iter_modules(gpucourse.__path__):
        if not m.ispkg and m.name not in ("authoring", "labgen", "benchmark", "gpureport", "i18n"):
            mod = importlib.import_module(f"gpucourse.{m.name}")
            out |= {f"gpucourse.{m.name}.{k}" for k, v in vars(mod).items() if v is obj}
    return out


def _item_texts(lab: str) -> dict[str, str]:
    """The markdown of each item of the lab's solution: from its "## qN" heading to the next heading."""
    nb = nbformat.read(next((ROOT / "solutions").glob(f"{lab}_*.ipynb")), as_version=4)
    texts, key = {}, None
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        head = cell.source.split("\n", 1)[0]
        if head.startswith("## "):
            key = head[3:].split(":")[0].split()[0] if head[3:].startswith("q") else None
        if key:
            texts[key] = texts.get(key, "") + "\n" + cell.source
    return texts


@pytest.mark.parametrize("lab", lab_ids())
def test_every_item_with_answer_helpers_says_so_in_the_lab(lab):
    """A learner is told, in the item's own text, which course helper answers it (issue 32: lab 08 q1 could be
    answered with profiling.step_breakdown and never said so): each public helper is named as module.function,
    an item with private helpers only names their module, and the text says what the grader does."""
    texts = _item_texts(lab)
    by_item: dict[str, list[str]] = {}
    for name, keys in lab_rules(lab, [load_test_file(lab_test_path(lab))])[0].items():
        for key in keys:
            by_item.setdefault(key, []).append(name)
    for key, names in sorted(by_item.items()):
        text = texts.get(key, "")
        assert text, f"lab {lab}: no '## {key}' section in the solution"
        public = {n.rsplit(".", 1)[1]: n for n in names if not n.rsplit(".", 1)[1].startswith("_")}
        for attr, name in public.items():
            shown = {f"{b.rsplit('.', 2)[-2]}.{attr}" for b in _bindings(name)}  # its module, or one re-exporting it
            assert any(s in text for s in shown), f"lab {lab} {key}: the text should name {' or '.join(shown)}"
        if not public:
            modules = {n.rsplit(".", 2)[-2] for n in names}
            assert any(f"gpucourse.{m}" in text for m in modules), f"lab {lab} {key}: name gpucourse.{modules}"
        assert "In the graded kernel" in text, f"lab {lab} {key}: say what the grader does (the helper does not run there)"


# --------------------------------------------------------------------------- the tripwire's records


def test_each_tripwire_flag_becomes_one_review_line_with_its_place():
    records = [("look", {"at": 1, "signals": [], "threads": [], "profiler": False, "tracer": False}),
               ("flag", {"category": "ctypes", "detail": "ctypes.call_function", "where": "/tmp/ipykernel_1/2.py:3 f"}),
               ("flag", {"category": "introspection", "detail": "sys._getframe", "where": "cell.py:1 g"}),
               ("look", {"at": 1, "signals": [], "threads": [], "profiler": False, "tracer": False})]
    flags = tripwire_flags([records], calls=1)
    assert flags == ["tripwire: called ctypes, which can rewrite any memory: ctypes.call_function at "
                     "/tmp/ipykernel_1/2.py:3 f", "tripwire: read frames or walked objects: sys._getframe at cell.py:1 g"]


def test_a_look_reports_signal_handlers_profilers_and_threads():
    look = {"at": 2, "signals": ["14"], "threads": ["worker"], "profiler": True, "tracer": False}
    flags = tripwire_flags([[("look", look), ("look", look)]], calls=1)
    assert "tripwire: set a Python signal handler (signals 14)" in flags
    assert "tripwire: set a profiler or tracer while the checks ran" in flags
    assert "tripwire: left threads running: worker" in flags


@pytest.mark.parametrize("connections, calls, fragment", [
    ([], 3, "never reported"),                                     # no connection at all
    ([[("look", {})]], 3, "1 looks for 3 calls"),                  # looks suppressed
    ([[("broken", "frame 4 has a wrong MAC")]], 0, "a record was forged or lost: frame 4 has a wrong MAC"),
])
def test_a_silenced_tripwire_is_itself_a_flag(connections, calls, fragment):
    flags = tripwire_flags(connections, calls=calls)
    assert any("the tripwire fell silent" in f and fragment in f for f in flags), flags


def test_a_quiet_tripwire_gives_no_flag():
    look = {"at": 1, "signals": [], "threads": [], "profiler": False, "tracer": False}
    assert tripwire_flags([[("look", look), ("look", look)]], calls=1) == []


def test_the_grader_modules_are_derived_from_its_folders():
    assert "gpucourse.grading.grader.runner" in GRADER_MODULES and "gpucourse.grading.kernel.agent" in GRADER_MODULES
    assert "gpucourse.grading.items" in GRADER_MODULES  # check()'s plumbing: a submission imports the Checker only


def test_a_parse_hit_by_cpython_311s_shared_ast_state_is_tried_again(monkeypatch):
    """Two threads parsing at once can make CPython 3.11's AST builder raise SystemError; the scan must not."""
    import ast

    from gpucourse.grading.grader import flags as integrity

    real, calls = ast.parse, []

    def flaky(text, *a, **k):
        calls.append(text)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=147, after=201)")
        return real(text, *a, **k)

    monkeypatch.setattr(integrity.ast, "parse", flaky)
    assert isinstance(integrity.parse_python("x = 1"), ast.Module) and len(calls) == 2
    with pytest.raises(SyntaxError):
        integrity.parse_python("x = = 1")
