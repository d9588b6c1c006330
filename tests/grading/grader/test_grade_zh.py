"""A zh-CN lab gets the same marks as the English lab for the same code, and its feedback is in Chinese.

The submission is lab 01 with the solution's code cells, one answer wrong (q4) and one left as a stub
(q5), so the feedback has something to say. It is graded twice by the grader's Python API: as the
English lab with ``GPUCOURSE_LANG=en``, and as the zh-CN lab (``labs/zh-CN``, its markdown in Chinese)
placed in a ``zh-CN`` folder with ``GPUCOURSE_LANG=zh_CN``. One kernel each.
"""

from pathlib import Path

import nbformat
import pytest

from gpucourse.grading.grader.runner import grade_notebook

ROOT = Path(__file__).resolve().parents[3]
NAME = "01_device_detection.ipynb"
BREAK = '''
def visible_gpu_count(value, physical):
    return physical  # wrong: ignores CUDA_VISIBLE_DEVICES


def cuda_versions(info):
    raise NotImplementedError("TODO")
'''


def _cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def _submission(lab: Path, dest: Path) -> Path:
    """``lab`` with the solution's code in its code cells (labgen keeps every code cell, in order) + BREAK."""
    solution = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    nb = nbformat.read(lab, as_version=4)
    code = [c.source for c in solution.cells if c.cell_type == "code"]
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == len(cells), "the lab and its solution have different code cells: run `make labs`"
    for cell, src in zip(cells, code):
        cell.source = src
    nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(BREAK))
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


@pytest.mark.slow
def test_the_zh_lab_gets_the_same_marks_as_the_english_one_and_chinese_feedback(tmp_path, monkeypatch):
    english = _submission(ROOT / "labs" / NAME, tmp_path / "en" / NAME)
    chinese = _submission(ROOT / "labs" / "zh-CN" / NAME, tmp_path / "zh-CN" / NAME)
    monkeypatch.setenv("GPUCOURSE_LANG", "en")
    en = grade_notebook(english, timeout=300)
    monkeypatch.setenv("GPUCOURSE_LANG", "zh_CN")
    zh = grade_notebook(chinese, timeout=300)

    assert en.status == zh.status == "graded", (en.table(), zh.table())
    marks = lambda rep: [(r["key"], r["status"], r["points"], r["max_points"]) for r in rep.items]  # noqa: E731
    assert marks(en) == marks(zh), (en.table(), zh.table())
    assert (en.score, en.max_score) == (zh.score, zh.max_score)
    status = {r["key"]: r["status"] for r in zh.items}
    assert status["q4"] == "fail" and status["q5"] == "todo" and status["q1"] == "pass", zh.table()
    assert 0 < zh.score < zh.max_score

    fed_back = {r["key"]: r for r in zh.items}
    assert "visible_gpu_count(" in fed_back["q4"]["message"] and "应为" in fed_back["q4"]["message"], zh.table()
    assert fed_back["q5"]["message"].startswith("尚未作答"), zh.table()
    assert all(_cjk(r["title"]) for r in zh.items), zh.table()
    assert not any(_cjk(r["message"] + r["title"]) for r in en.items), en.table()


# ----------------------------------------------------------------------------- fast: no kernel


@pytest.fixture
def lang(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUCOURSE_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_the_language_follows_the_variable_else_the_notebooks_folder(lang, tmp_path):
    from gpucourse.grading.items import language

    assert language() == "en"
    (tmp_path / "labs" / "zh-CN").mkdir(parents=True)
    lang.chdir(tmp_path / "labs" / "zh-CN")  # where Jupyter starts a zh notebook's kernel
    assert language() == "zh_CN"
    lang.setenv("GPUCOURSE_LANG", "en")  # the variable wins
    assert language() == "en"
    lang.chdir(tmp_path)
    for value in ("zh_CN", "zh-CN", "zh"):
        lang.setenv("GPUCOURSE_LANG", value)
        assert language() == "zh_CN"
    lang.delenv("GPUCOURSE_LANG")
    lang.setenv("JPY_SESSION_NAME", "/home/me/course/labs/zh-CN/01_device_detection.ipynb")
    assert language() == "zh_CN"


def test_check_prints_chinese_in_a_zh_folder_with_the_same_points(lang, tmp_path, capsys):
    from gpucourse.grading import Checker

    ns = {"summarise_devices": lambda devices: {}}  # wrong on purpose: fails, 0 points
    results = {}
    for folder in ("en", "zh-CN"):
        (tmp_path / folder).mkdir()
        lang.chdir(tmp_path / folder)
        check = Checker("01")
        check("q1", ns)
        check("q2", {})
        check.summary()
        results[folder] = ([(r.key, r.status, r.points) for r in check.rows()], capsys.readouterr().out)
    (en_rows, en_out), (zh_rows, zh_out) = results["en"], results["zh-CN"]
    assert en_rows == zh_rows and en_rows[0][1] == "fail" and en_rows[1][1] == "todo"
    assert "Score: 0/12" in en_out and "Lab 01" in en_out and "expected" in en_out
    assert "得分：0/12" in zh_out and "实验 01" in zh_out and "应为" in zh_out and "尚未作答" in zh_out
    assert "summarise_devices 按类型统计设备数量" in zh_out and "❌ q1 (0/2)" in zh_out


def test_a_translation_with_wrong_fields_falls_back_to_english(lang, monkeypatch):
    from gpucourse.grading import messages

    lang.setenv("GPUCOURSE_LANG", "zh_CN")
    monkeypatch.setitem(messages._CATALOGUES, "zh_CN", {"Score: {got}/{total}": "得分：{points}/{total}"})
    assert messages.tr("Score: {got}/{total}", got=1, total=2) == "Score: 1/2"
    assert messages.tr("no such message") == "no such message"


def test_the_catalogue_is_complete_and_read_alike_by_the_grader_and_by_gettext_tools(tmp_path):
    import shutil
    import subprocess

    from gpucourse.grading import messages
    from gpucourse.tools import i18n

    assert i18n.check_catalogue() == [], "run `python -m gpucourse.i18n messages` and translate what it added"
    text = i18n.CATALOGUE.read_text(encoding="utf-8")
    by_tools = {e.msgid: e.msgstr for e in i18n.read_po(text) if e.translated and e.msgid}
    assert messages._read_catalogue(text) == by_tools and len(by_tools) >= 50
    if shutil.which("msgfmt"):  # --check verifies that every translation keeps the English {fields}
        res = subprocess.run(["msgfmt", "--check", "-o", str(tmp_path / "m.mo"), str(i18n.CATALOGUE)],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
