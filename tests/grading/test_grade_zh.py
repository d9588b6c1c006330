"""A zh-CN lab gets the same marks as the English lab for the same code, and its feedback is in Chinese.

The submission is lab 01 with the solution's code cells, one answer wrong (q4) and one left as a stub
(q5), so the feedback has something to say. It is graded twice by the grader's Python API: as the
English lab with ``GPUCOURSE_LANG=en``, and as the zh-CN lab (``labs/zh-CN``, its markdown in Chinese)
placed in a ``zh-CN`` folder with ``GPUCOURSE_LANG=zh_CN``. One kernel each.
"""

from pathlib import Path

import nbformat
import pytest

from gpucourse.grading.runner import grade_notebook

ROOT = Path(__file__).resolve().parents[2]
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
