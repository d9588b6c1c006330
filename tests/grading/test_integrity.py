"""The static scan and the verdict on the guard's records, without a kernel."""

import pytest

from gpucourse.colab import SETUP_CELL
from gpucourse.grading.channel import Record
from gpucourse.grading.integrity import ANSWER_HELPERS, answer_helpers, assess, helper_items, scan_source


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
    text = _flags(SETUP_CELL, "from gpucourse import pipeline\nfrom gpucourse.distribute import visible_gpu_ids",
                  "import gpucourse.distribute as d\nd.visible_gpu_ids('0', 2)", lab="01", template=template)
    assert "imports gpucourse.pipeline, which this lab's notebook does not use" in text
    assert "imports gpucourse.distribute.visible_gpu_ids, a course helper that answers an item" in text
    assert "calls gpucourse.distribute.visible_gpu_ids, a course helper" in text
    assert "cell 1 " not in text and "cell 2 " in text  # the untouched setup cell is not scanned


def test_answer_helpers_map_to_items_and_merge_the_test_files_lists():
    class Module:
        ANSWER_HELPERS = {"q9": ["gpucourse.xla.parse_hlo", "os.system"]}

    class Listed:
        ANSWER_HELPERS = ["gpucourse.xla.variants"]

    got = helper_items("06", [Module, Listed])
    assert got["gpucourse.xla.parse_hlo"] == ["q1", "q2", "q9"] and got["gpucourse.xla.pad_to_bucket"] == ["q4"]
    assert got["gpucourse.xla.variants"] == [] and "os.system" not in got
    assert set(answer_helpers("07")) == {n for names in ANSWER_HELPERS["07"].values() for n in names}


def _rec(kind, detail, seq=[0]):
    seq[0] += 1
    return Record(seq[0], kind, detail)


def test_assess_sorts_records_into_tampering_withheld_and_flags():
    plan = ["public:q1", "public:q2", "hidden:h.py:h1"]
    records = [
        _rec("ready", (1, 2, 3)),
        _rec("event", ("submission", "dynamic-code", "exec", "cell:3")),
        _rec("event", ("item:public:q2", "helper", "gpucourse.xla.pad_to_bucket", "answer:2")),
        _rec("event", ("item:hidden:h.py:h1", "introspection", "sys._getframe", "secret:5")),
        _rec("phase", ("begin", "")), _rec("phase", ("item", "public:q1")), _rec("observed", ("public:q1", "{}")),
        _rec("phase", ("item", "public:q2")), _rec("observed", ("public:q2", "{}")),
        _rec("phase", ("item", "hidden:h.py:h1")), _rec("observed", ("hidden:h.py:h1", "{}")),
        _rec("threads", ("loop:9",)), _rec("end", (1.0,)),
    ]
    a = assess(records, [], plan)
    assert a.complete and a.tampering == []
    assert "public:q2" in a.withheld and "pad_to_bucket" in a.withheld["public:q2"]
    early = assess([_rec("event", ("submission", "helper", "gpucourse.xla.pad_to_bucket", "cell:4"))], [], plan,
                   helpers={"gpucourse.xla.pad_to_bucket": ["q4"]})
    assert list(early.withheld) == ["public:q4"]
    assert early.flags == ["called gpucourse.xla.pad_to_bucket (in `cell`, line 4)"]
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
