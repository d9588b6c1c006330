"""The static scan and the verdict on the guard's records, without a kernel."""

import importlib
import pkgutil
import types
from pathlib import Path

import nbformat
import pytest

import gpucourse

from gpucourse.colab import SETUP_CELL
from gpucourse.grading.channel import Record
from gpucourse.grading.integrity import (ANSWER_HELPERS, answer_helpers, assess, guard_config, helper_items,
                                         scan_source)
from gpucourse.grading.items import items_in, lab_ids, lab_test_path, load_test_file

ROOT = Path(__file__).resolve().parents[2]


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
    ("import atexit\natexit.register(print)", "imports atexit (late action (atexit))"),
    ("import threading", "imports threading (late action (threads))"),
    ("from multiprocessing import Process", "imports multiprocessing (processes)"),
    ("f = lambda: 1\nf.__code__", "uses .__code__"),
    ("import sys\nsys.audit('gpucourse.observed', 'q1', '{}')", "uses .audit (audit hooks)"),
    ("_gpucourse_guard = 1", "refers to _gpucourse_guard"),
])
def test_scan_flags_primitives_a_cheat_needs(src, fragment):
    assert fragment in _flags(src)


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


def test_answer_helpers_map_to_items_and_merge_the_test_files_lists():
    class Module:
        ANSWER_HELPERS = {"q9": ["gpucourse.xla.break_even_calls"]}

    class Listed:
        ANSWER_HELPERS = ["gpucourse.xla.variants"]

    got = helper_items("06", [Module, Listed])
    assert got["gpucourse.xla.break_even_calls"] == ["q9"] and got["gpucourse.xla.padding_cost"] == ["q4"]
    assert got["gpucourse.xla._hlo_proto"] == ["q2"]
    assert got["gpucourse.xla.variants"] == []
    assert set(answer_helpers("07")) == {n for names in ANSWER_HELPERS["07"].values() for n in names}


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
        helper_items("01", [load_test_file(path)])
    text = str(err.value)
    assert str(path) in text and fragment in text, text
    if isinstance(listed, dict) and isinstance(listed["h1"], list):
        assert repr(listed["h1"][0]) in text and ("fix the spelling" in text or "gpucourse.module.function" in text
                                                  or "list the function" in text)
    with pytest.raises(ValueError, match="guard_config: ANSWER_HELPERS lists 'gpucourse.xla.padding_cots'"):
        guard_config(None, ["gpucourse.xla.padding_cots"], [], [], [])


def test_the_cli_refuses_a_hidden_test_with_a_misspelt_helper(tmp_path, capsys):
    from gpucourse.grading.cli import main

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


# --------------------------------------------------------------------------- the answer-helper map is current


def _lab_modules() -> dict:
    return {lab: load_test_file(lab_test_path(lab)) for lab in lab_ids()}


def _resolve_helper(dotted: str):
    module, _, attr = dotted.rpartition(".")
    assert module.startswith("gpucourse."), f"{dotted}: answer helpers are course helpers (gpucourse.*)"
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise AssertionError(f"{dotted}: module {module} does not exist ({err})") from None
    assert hasattr(mod, attr), f"{dotted}: {module} has no attribute {attr!r} (renamed or moved?)"
    obj = getattr(mod, attr)
    assert isinstance(obj, (types.FunctionType, type)), f"{dotted} is a {type(obj).__name__}, not a function"
    return obj


def _all_lists() -> list[tuple[str, str, str, str]]:
    """(where, lab, item key or None, dotted name) for the central map and every lab test file's list."""
    out = [("integrity.ANSWER_HELPERS", lab, key, name)
           for lab, items in ANSWER_HELPERS.items() for key, names in items.items() for name in names]
    for lab, module in _lab_modules().items():
        extra = getattr(module, "ANSWER_HELPERS", None)
        pairs = extra.items() if isinstance(extra, dict) else [(None, extra or ())]
        out += [(f"lab{lab}.ANSWER_HELPERS", lab, key, name) for key, names in pairs for name in names]
    return out


def test_every_answer_helper_resolves_and_names_an_item_of_its_lab():
    labs = _lab_modules()
    assert set(ANSWER_HELPERS) <= set(labs), f"ANSWER_HELPERS names labs without tests: {set(ANSWER_HELPERS) - set(labs)}"
    keys = {lab: {spec.key for spec, _ in items_in(module)} for lab, module in labs.items()}
    for where, lab, key, name in _all_lists():
        _resolve_helper(name)
        assert key is None or key in keys[lab], f"{where}: lab {lab} has no item {key!r} (items: {sorted(keys[lab])})"


def test_every_binding_of_an_answer_helper_is_listed():
    """The guard wraps one module attribute per name: a re-export (``precision.simulate_loss_scale``,
    ``bottleneck._union_us``) left out of the list would be an unwatched way to the same answer."""
    modules = [importlib.import_module(f"gpucourse.{m.name}") for m in pkgutil.iter_modules(gpucourse.__path__)
               if m.name not in ("grading", "labtests", "authoring", "labgen", "benchmark")]
    by_lab: dict[str, set[str]] = {}
    for _, lab, _, name in _all_lists():
        by_lab.setdefault(lab, set()).add(name)
    for lab, names in by_lab.items():
        for name in sorted(names):
            obj = _resolve_helper(name)
            bindings = {f"{m.__name__}.{k}" for m in modules for k, v in vars(m).items() if v is obj}
            assert bindings <= names, f"lab {lab}: {name} is also reachable as {sorted(bindings - names)}; list those too"


@pytest.mark.parametrize("lab", lab_ids())
def test_no_lab_solution_uses_its_answer_helpers(lab):
    """A helper the lab's own solution calls must not be listed: the solution would lose those marks."""
    nb = nbformat.read(next((ROOT / "solutions").glob(f"{lab}_*.ipynb")), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    helpers = helper_items(lab, [load_test_file(lab_test_path(lab))])
    flags = [f for f in scan_source(code, lab, helpers=helpers) if "course helper that answers" in f]
    assert flags == []


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
    for name, keys in helper_items(lab, [load_test_file(lab_test_path(lab))]).items():
        for key in keys:
            by_item.setdefault(key, []).append(name)
    for key, names in sorted(by_item.items()):
        text = texts.get(key, "")
        assert text, f"lab {lab}: no '## {key}' section in the solution"
        public = {n.rsplit(".", 1)[1]: n for n in names if not n.rsplit(".", 1)[1].startswith("_")}
        for attr in public:
            shown = {f"{n.rsplit('.', 2)[-2]}.{attr}" for n in names if n.endswith("." + attr)}
            assert any(s in text for s in shown), f"lab {lab} {key}: the text should name {' or '.join(shown)}"
        if not public:
            modules = {n.rsplit(".", 2)[-2] for n in names}
            assert any(f"gpucourse.{m}" in text for m in modules), f"lab {lab} {key}: name gpucourse.{modules}"
        assert "withholds" in text or "flags" in text, f"lab {lab} {key}: say what the grader does"


def test_guard_config_preloads_every_helpers_module():
    config = guard_config(None, ["gpucourse.multiworker.visible_gpu_ids", "gpucourse.xla._HloCounts",
                                 "gpucourse.bottleneck._union_us"], [], [], [])
    assert config["preload"] == ["gpucourse.bottleneck", "gpucourse.multiworker", "gpucourse.xla"]
    course = config["course_modules"]  # listed by the grader: the guard itself imports the standard library only
    assert {"gpucourse.memory", "gpucourse.monitor", "gpucourse.labtests", "gpucourse.grading.items"} <= set(course)
    assert "gpucourse.authoring" not in course and "gpucourse.labgen" not in course


def _rec(kind, detail, seq=[0]):
    seq[0] += 1
    return Record(seq[0], kind, detail)


def test_assess_sorts_records_into_tampering_withheld_and_flags():
    plan = ["public:q1", "public:q2", "hidden:h.py:h1"]
    records = [
        _rec("ready", (1, 2, 3)),
        _rec("event", ("submission", "dynamic-code", "exec", "cell:3")),
        _rec("event", ("item:public:q2", "helper", "gpucourse.xla.padding_cost", "answer:2")),
        _rec("event", ("item:hidden:h.py:h1", "introspection", "sys._getframe", "secret:5")),
        _rec("phase", ("begin", "")), _rec("phase", ("item", "public:q1")), _rec("observed", ("public:q1", "{}")),
        _rec("phase", ("item", "public:q2")), _rec("observed", ("public:q2", "{}")),
        _rec("phase", ("item", "hidden:h.py:h1")), _rec("observed", ("hidden:h.py:h1", "{}")),
        _rec("threads", ("loop:9",)), _rec("end", (1.0,)),
    ]
    a = assess(records, [], plan)
    assert a.complete and a.tampering == []
    assert "public:q2" in a.withheld and "padding_cost" in a.withheld["public:q2"]
    early = assess([_rec("event", ("submission", "helper", "gpucourse.xla.padding_cost", "cell:4"))], [], plan,
                   helpers={"gpucourse.xla.padding_cost": ["q4"]})
    assert list(early.withheld) == ["public:q4"]
    assert early.flags == ["called gpucourse.xla.padding_cost (in `cell`, line 4)"]
    assert "inspected the running program" in a.inline_withheld
    text = "\n".join(a.flags)
    assert "ran dynamically built code: exec in `cell`, line 3" in text
    assert "left threads running after the checks (they were killed): in `loop`, line 9" in text


def test_assess_withholds_for_replacements_forgeries_and_disorder():
    plan = ["public:q1"]
    records = [_rec("changed", ("submission", (("replaced", "json.dumps"), ("added", "tf.Tensor.__eq__")))),
               _rec("event", ("submission", "forged", "gpucourse.observed", "cell:1")),
               _rec("event", ("submission", "ctypes", "ctypes.string_at", "cell:2")),
               _rec("phase", ("begin", "")), _rec("phase", ("item", "public:q1")),
               _rec("observed", ("public:q1", "{}")), _rec("observed", ("public:q1", "{}")), _rec("end", (1.0,))]
    a = assess(records, ["a record the grader's guard did not write arrived on its channel"], plan)
    text = "\n".join(a.tampering)
    for fragment in ("json.dumps was replaced", "added tf.Tensor.__eq__", "sent messages that only the grader",
                     "used ctypes", "did not write", "2 observations for public:q1"):
        assert fragment in text
    disorder = assess([_rec("phase", ("item", "public:q1")), _rec("phase", ("begin", "")), _rec("end", (1,))], [], plan)
    assert any("did not run in the grader's order" in t for t in disorder.tampering)
    other = assess([_rec("phase", ("begin", "abc")), _rec("phase", ("item", "public:q1")),
                    _rec("observed", ("public:q1", "{}")), _rec("end", (1,))], [], plan, config_digest="def")
    assert other.tampering == ["the kernel received other tests or cases than the grader sent"]


def test_a_parse_hit_by_cpython_311s_shared_ast_state_is_tried_again(monkeypatch):
    """Two threads parsing at once can make CPython 3.11's AST builder raise SystemError; the scan must not."""
    import ast

    from gpucourse.grading import integrity

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
