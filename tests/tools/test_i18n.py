"""gpucourse.i18n: the translated editions are built from English + PO files and never drift.

The drift test runs over the real editions (every ``notebooks/zh-CN/*.po`` and ``labs/zh-CN/*.po``,
notebook 01 and lab 01 so far) without a kernel: it compares texts and stored outputs. The unit
tests use the tiny fixture in ``tests/tools/fixtures/i18n`` (an English notebook, its PO file and its built
edition), copied to a temporary folder and changed there.
"""

import shutil
from pathlib import Path

import nbformat
import pytest

from gpucourse.tools import i18n
from gpucourse.colab import colab_url, kaggle_url

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "i18n"
TINY = "notebooks/01_tiny.ipynb"
TINY_PO = "notebooks/zh-CN/01_tiny.po"
TINY_ZH = "notebooks/zh-CN/01_tiny.ipynb"


# ----------------------------------------------------------------------------- the real editions


def test_every_edition_is_translated_current_and_built_from_its_english_notebook():
    pos = i18n.editions(ROOT)
    assert pos, "no PO file under notebooks/zh-CN or labs/zh-CN: the zh pilot (topic 01) is missing"
    problems = i18n.check(ROOT)
    assert not problems, ("the zh-CN edition is out of step with the English (README, 'Translations'):\n"
                          + "\n".join(map(str, problems)))


@pytest.mark.parametrize("po", i18n.editions(ROOT), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_an_edition_has_the_english_code_and_outputs_and_chinese_markdown_and_its_own_badges(po):
    english = nbformat.read(i18n.english_for(po), as_version=4)
    zh = nbformat.read(i18n.zh_path_for(po), as_version=4)
    assert [c.cell_type for c in zh.cells] == [c.cell_type for c in english.cells]
    for en_cell, zh_cell in zip(english.cells, zh.cells):
        if en_cell.cell_type == "code":
            assert (zh_cell.source, zh_cell.get("outputs")) == (en_cell.source, en_cell.get("outputs"))
        else:
            assert any("\u4e00" <= ch <= "\u9fff" for ch in zh_cell.source), f"not Chinese: {zh_cell.source[:80]!r}"
    rel = i18n.zh_path_for(po).relative_to(ROOT).as_posix()
    assert colab_url(rel) in zh.cells[0].source and kaggle_url(rel) in zh.cells[0].source
    assert zh.metadata["gpucourse"]["lang"] == "zh-CN"
    for key in ("lab", "kind"):
        assert zh.metadata["gpucourse"].get(key) == english.metadata.get("gpucourse", {}).get(key)


def _code_spans(text: str) -> set:
    """Code spans and fenced blocks of markdown; a span may wrap a line (and a '> ' quote marker), as in CommonMark."""
    import re

    fence = re.compile(r"^```.*?^```", re.S | re.M)
    prose = re.sub(r"\n>[ ]?", "\n", fence.sub("", text))
    return set(fence.findall(text)) | {"`" + " ".join(s.split()) + "`" for s in re.findall(r"`([^`]+)`", prose)}


def test_the_edition_keeps_every_code_identifier_of_the_english_markdown():
    """A technical edit keeps code font: every `...` span of an English cell is in its translation."""
    import re

    for po in i18n.editions(ROOT):
        for e in i18n.read_po(po.read_text(encoding="utf-8")):
            if not e.msgctxt or e.obsolete:
                continue
            missing = sorted(_code_spans(e.msgid) - _code_spans(e.msgstr))
            # a path may point at the zh edition instead (labs/zh-CN/NN_...)
            missing = [m for m in missing if re.sub(r"/(\d\d_)", r"/zh-CN/\1", m) not in e.msgstr]
            assert not missing, f"{po.name} {e.extracted}: code spans lost in the translation: {missing}"


def test_a_dropped_code_span_is_caught():
    assert _code_spans("the `Executing\nop` lines and `tf.function`") == {"`Executing op`", "`tf.function`"}
    assert _code_spans("the `Executing op` lines") - _code_spans("日志行") == {"`Executing op`"}


# ----------------------------------------------------------------------------- fixture


@pytest.fixture
def tiny(tmp_path):
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _edit_english(root: Path, cell: int, text: str) -> None:
    path = root / TINY
    nb = nbformat.read(path, as_version=4)
    nb.cells[cell - 1].source = text
    path.write_text(nbformat.writes(nb) + "\n")


def test_the_fixture_edition_is_in_step(tiny):
    assert i18n.check(tiny) == []
    nb = nbformat.read(tiny / TINY_ZH, as_version=4)
    assert nb.cells[0].source.startswith("# 01 小例子")
    assert colab_url(TINY_ZH) in nb.cells[0].source and colab_url(TINY) not in nb.cells[0].source
    # a link to a notebook that has no zh edition yet goes to the English one; an URL stays
    assert "](../02_other.ipynb)" in nb.cells[2].source and "](https://example.org/guide)" in nb.cells[2].source


def test_a_changed_english_cell_fails_naming_notebook_cell_and_english_text(tiny):
    _edit_english(tiny, 3, "See [topic 02](02_other.ipynb), the [guide](https://example.org/guide) and the FAQ.")
    problems = i18n.check(tiny)
    kinds = {(p.notebook, p.cell, p.kind) for p in problems}
    assert (TINY, 3, "outdated") in kinds, problems
    text = "\n".join(map(str, problems))
    assert f"{TINY} cell 3" in text and "and the FAQ" in text and "changed since it was translated" in text
    assert (TINY, None, "stale") in kinds  # and the stored edition is no longer what the build gives


def test_update_marks_the_changed_cell_fuzzy_with_the_old_english_and_keeps_the_old_translation(tiny):
    _edit_english(tiny, 3, "See [topic 02](02_other.ipynb), the [guide](https://example.org/guide) and the FAQ.")
    assert i18n.main(["update", "--root", str(tiny)]) == 0
    entries = i18n.read_po((tiny / TINY_PO).read_text(encoding="utf-8"))
    changed = next(e for e in entries if e.msgid.endswith("and the FAQ."))
    assert changed.fuzzy and changed.msgstr.startswith("参见") and changed.previous.endswith("/guide).")
    assert changed.msgctxt == i18n.cell_hash(changed.msgid)
    problems = i18n.check(tiny)
    assert [(p.cell, p.kind) for p in problems if p.cell] == [(3, "fuzzy")]
    # the build does not use a fuzzy translation: the cell stays English until it is revised
    i18n.main(["build", "--root", str(tiny)])
    assert "and the FAQ" in nbformat.read(tiny / TINY_ZH, as_version=4).cells[2].source
    # the translator revises it and clears the flag: in step again
    changed.msgstr = "参见[主题 02](02_other.ipynb)、[指南](https://example.org/guide)和常见问题。"
    changed.flags, changed.previous = [], None
    i18n.write_po(tiny / TINY_PO, entries)
    i18n.main(["build", "--root", str(tiny)])
    assert i18n.check(tiny) == []


def test_a_new_english_cell_is_missing_until_translated(tiny):
    path = tiny / TINY
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("## Exercises\n\n1. Count again."))
    path.write_text(nbformat.writes(nb) + "\n")
    i18n.main(["update", "--root", str(tiny)])
    problems = [p for p in i18n.check(tiny) if p.cell]
    assert [(p.cell, p.kind) for p in problems] == [(4, "missing")]
    assert "no translation yet" in str(problems[0]) and "Count again" in str(problems[0])


def test_a_removed_english_cell_becomes_obsolete_and_is_reused_when_the_cell_comes_back(tiny):
    path = tiny / TINY
    nb = nbformat.read(path, as_version=4)
    removed = nb.cells.pop(2)
    path.write_text(nbformat.writes(nb) + "\n")
    i18n.main(["update", "--root", str(tiny)])
    text = (tiny / TINY_PO).read_text(encoding="utf-8")
    assert '#~ msgstr "参见' in text
    nb.cells.append(removed)
    path.write_text(nbformat.writes(nb) + "\n")
    i18n.main(["update", "--root", str(tiny)])
    i18n.main(["build", "--root", str(tiny)])
    assert i18n.check(tiny) == []


def test_changed_code_or_outputs_in_the_edition_fail_naming_the_cell(tiny):
    path = tiny / TINY_ZH
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs[0].text = "3\n"
    path.write_text(nbformat.writes(nb) + "\n")
    assert [(p.cell, p.kind) for p in i18n.check(tiny)] == [(2, "outputs")]
    nb.cells[1].source = "print(len([1, 2, 3]))"
    path.write_text(nbformat.writes(nb) + "\n")
    problems = i18n.check(tiny)
    assert [(p.cell, p.kind) for p in problems] == [(2, "code")]
    assert "print(len([1, 2]))" in str(problems[0])


def test_a_zh_notebook_without_its_po_file_fails(tiny):
    shutil.copy(tiny / TINY_ZH, tiny / "notebooks" / "zh-CN" / "05_gone.ipynb")
    problems = i18n.check(tiny)
    assert [(p.notebook, p.kind) for p in problems] == [("notebooks/zh-CN/05_gone.ipynb", "orphan")]
    assert "without its PO file" in str(problems[0])


def test_an_edited_english_code_cell_makes_the_edition_stale(tiny):
    _edit_english(tiny, 2, "print(len([1, 2, 3]))")
    assert {p.kind for p in i18n.check(tiny)} == {"code"}


def test_checks_messages_are_read_from_every_module_that_writes_them():
    """check()'s catalogue reads every module of labtests/ that calls tr: a lab's items and the grader-side modules
    its judges live in (lab 03's among them), each lab's own file first."""
    package = ROOT / "utils"
    writers = {p.relative_to(package).as_posix() for p in (package / "labtests").glob("*.py")
               if "tr(" in p.read_text(encoding="utf-8")}
    assert {"labtests/lab01.py", "labtests/_lab03_judges.py"} <= writers <= set(i18n.MESSAGE_SOURCES)
    order = [s for s in i18n.MESSAGE_SOURCES if s in ("labtests/lab03.py", "labtests/_lab03_judges.py",
                                                      "labtests/lab04.py")]
    assert order == ["labtests/lab03.py", "labtests/_lab03_judges.py", "labtests/lab04.py"]
    moved = {m for m, where in i18n.extract_messages([package / s for s in i18n.MESSAGE_SOURCES])
             if where == "labtests/_lab03_judges.py"}
    assert "for {desc}: expected {want}, got {got}.{hint}" in moved  # lab 03 q2's verdict, in its judges' module


def test_po_text_round_trips_and_gettext_reads_it(tmp_path):
    entries = i18n.read_po((FIXTURE / TINY_PO).read_text(encoding="utf-8"))
    assert i18n.render_po(entries) == (FIXTURE / TINY_PO).read_text(encoding="utf-8")
    tricky = i18n.Entry(msgid='a "quoted" \\ back\tslash\nline', msgstr="引号 \"x\"\n第二行", msgctxt="abc")
    back = i18n.read_po(i18n.render_po([tricky]))[0]
    assert (back.msgid, back.msgstr, back.msgctxt) == (tricky.msgid, tricky.msgstr, tricky.msgctxt)
    msgfmt = shutil.which("msgfmt")
    if msgfmt:  # GNU gettext accepts the files as they are written
        import subprocess

        for po in [FIXTURE / TINY_PO, *i18n.editions(ROOT)]:
            res = subprocess.run([msgfmt, "--check", "-o", str(tmp_path / "out.mo"), str(po)],
                                 capture_output=True, text=True)
            assert res.returncode == 0, res.stderr


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="source must be"):
        i18n.cell_hash(None)
    with pytest.raises(ValueError, match="line 1: cannot read"):
        i18n.read_po("nonsense here\n")
    with pytest.raises(SystemExit):
        i18n.main(["translate"])
    with pytest.raises(ValueError, match="notebook must be a notebook under notebooks or labs/"):
        i18n.main(["update", "solutions/01_device_detection.ipynb", "--root", str(ROOT)])


def test_the_chinese_readme_links_every_zh_edition_with_badges_and_only_files_that_exist():
    import re

    text = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    for po in i18n.editions(ROOT):
        rel = i18n.zh_path_for(po).relative_to(ROOT).as_posix()
        assert f"]({rel})" in text and colab_url(rel) in text and kaggle_url(rel) in text, rel
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not re.match(r"[a-z]+:", target):
            assert (ROOT / target).exists(), f"README.zh-CN.md links to {target}, which does not exist"
