"""gpucourse.grading.grader.course_copy: the course as a graded kernel sees it.

Each test imports the copy in a fresh interpreter (``PYTHONPATH``, as at the ``user``/``none`` sandbox levels;
bubblewrap mounts the same folder over the package).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gpucourse.grading.grader import course_copy
from gpucourse.grading.grader.course_copy import disabled_helpers, make_copy
from gpucourse.grading.grader.sandbox import package_folder


def _in_copy(copy: Path, code: str) -> str:
    """Run ``code`` with only the copy importable as ``gpucourse`` (the editable install's finder is left out)."""
    run = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = [{str(copy)!r}]\n" + code],
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_a_marked_helper_raises_the_labs_rule_and_the_rest_of_its_module_works():
    out = _in_copy(make_copy("08"), """
from gpucourse import bottleneck
try:
    bottleneck.classify([])
except Exception as exc:
    print(type(exc).__name__, exc)
print(bottleneck.INPUT_BOUND_SHARE > 0)
""")
    assert out.startswith("LabRuleError gpucourse.bottleneck.classify computes the answer of lab 08 (q5)"), out
    assert out.strip().endswith("True")


def test_a_helper_marked_for_another_lab_runs():
    assert _in_copy(make_copy("01"), "from gpucourse import bottleneck\nprint(bottleneck.classify.__name__)") == \
        "classify\n"


def test_line_numbers_are_kept_so_tracebacks_point_at_the_right_lines():
    copy = make_copy("08") / "gpucourse" / "bottleneck.py"
    original = (package_folder() / "bottleneck.py").read_text().splitlines()
    assert len(copy.read_text().splitlines()) == len(original)
    marked = next(i for i, line in enumerate(original) if line.startswith("def classify("))
    assert copy.read_text().splitlines()[marked] == original[marked]


def test_the_tests_the_grader_and_the_tools_are_not_in_the_copy():
    copy = make_copy("03") / "gpucourse"
    assert not (copy / "labtests").exists() and not (copy / "grading" / "grader").exists()
    assert not (copy / "tools").exists()
    assert (copy / "grading" / "items.py").is_file() and (copy / "grading" / "checker.py").is_file()


def test_a_forbidden_module_and_every_course_module_that_imports_it_raise_on_import():
    out = _in_copy(make_copy("09", forbidden=("gpucourse.mfu",)), """
for name in ("gpucourse.mfu", "gpucourse.scaling"):
    try:
        __import__(name)
        print(name, "imported")
    except Exception as exc:
        print(name, type(exc).__name__, exc)
""")
    assert "gpucourse.mfu LabRuleError lab 09 forbids gpucourse.mfu: in the graded kernel it cannot be imported" in out
    assert "gpucourse.scaling imported" in out  # scaling does not import mfu at its top


def test_a_test_files_extra_helper_is_disabled_too():
    out = _in_copy(make_copy("06", {"gpucourse.xla.variants": ("h1",)}), """
from gpucourse import xla
try:
    xla.variants(len)
except Exception as exc:
    print(type(exc).__name__, str(exc)[:60])
""")
    assert out.startswith("LabRuleError gpucourse.xla.variants computes the answer of lab 06 (h1)"), out


def test_a_marked_class_can_be_neither_made_nor_used():
    assert "gpucourse.xla._HloCounts" in disabled_helpers("06")
    out = _in_copy(make_copy("06"), """
from gpucourse import xla
try:
    xla._HloCounts("HloModule m")
except Exception as exc:
    print(type(exc).__name__)
""")
    assert out == "LabRuleError\n"


def test_the_copy_is_made_once_per_lab_and_rules():
    assert make_copy("05") == make_copy("05") != make_copy("05", forbidden=("gpucourse.mfu",))


def test_the_marks_are_parsed_once_and_again_after_a_file_changes(tmp_path, monkeypatch):
    """Every grade asks for the lab's marked helpers: the course is parsed once per process, not per submission,
    and again when a file changes."""
    root = tmp_path / "gpucourse"
    root.mkdir()
    (root / "__init__.py").write_text("")
    helpers = root / "helpers.py"
    helpers.write_text("@answers('03', 'q2')\ndef measure(x):\n    return x\n")
    parsed, parse = [], ast.parse
    monkeypatch.setattr(course_copy.ast, "parse", lambda text, name="<unknown>", *a, **k: (
        parsed.append(name), parse(text, name, *a, **k))[1])
    assert disabled_helpers("03", root) == {"gpucourse.helpers.measure": ("q2",)} and len(parsed) == 2
    disabled_helpers("03", root).clear()  # a caller's copy: the next grade still gets the marks
    assert disabled_helpers("03", root) == {"gpucourse.helpers.measure": ("q2",)}
    assert disabled_helpers("04", root) == {} and len(parsed) == 2
    helpers.write_text("@answers('04')\ndef measure(x):\n    return x + 1\n")
    assert disabled_helpers("03", root) == {} and disabled_helpers("04", root) == {"gpucourse.helpers.measure": ()}
    assert len(parsed) == 4


def test_every_parse_of_the_course_holds_the_graders_ast_lock(tmp_path, monkeypatch):
    """CPython 3.11's AST builder is not safe across threads (see flags.parse_python): with two submissions graded
    in two threads, reading the marks outside the grader's lock failed the other thread's parse (SystemError)."""
    from gpucourse.grading.grader import flags

    root = tmp_path / "gpucourse"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "helpers.py").write_text("@answers('03', 'q2')\ndef measure(x):\n    return x\n")
    held, parse = [], ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: (held.append(flags._AST_LOCK.locked()), parse(*a, **k))[1])
    assert disabled_helpers("03", root) == {"gpucourse.helpers.measure": ("q2",)}
    course_copy._rewrite(root / "helpers.py", "gpucourse.helpers", "03", {}, set())  # what make_copy does per file
    assert len(held) == 3 and all(held), f"a parse outside the lock: {held}"
