"""README.zh-CN.md stays in step with README.md, section by section.

The PO drift check (``tests/test_i18n.py``) keeps the zh notebooks in step; the README is written by hand, so this
test compares the two files' structure. Both are cut at their ``#``/``##`` headings (the part before the first
``##`` is a section too) and must have the same sections in the same order, and each pair of sections:

* the same headings below it (count and levels);
* the same tables, each with the same number of rows;
* the same link targets. A link to a zh edition (``notebooks/zh-CN/01_x.ipynb``, its Colab/Kaggle badge) counts as
  the English one, the other README counts as this one, and an in-page anchor counts as the heading it names
  (and must name one: a renamed heading breaks it);
* the same fenced code blocks (the commands), except that a ``# comment`` after a command may be translated;
* every ``code span`` of the English section, in the Chinese one (it may have more, e.g. a Chinese message).

The Chinese may add prose (the edition's status, where its notebooks are, its feedback language), but no link or
table. A section may stay English only by a deliberate pointer: list its English heading in
:data:`ENGLISH_ONLY`, and the Chinese section must then link to that section of README.md
(``README.md#anchor``); nothing else of it is compared.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Sections README.zh-CN.md leaves in English on purpose, {English heading: why}: the Chinese section is a
#: pointer to README.md's. None today: every section is translated.
ENGLISH_ONLY: dict[str, str] = {}

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_SPAN = re.compile(r"`([^`]+)`")  # a span may wrap a line, as in CommonMark
_CJK = re.compile(r"[\u3400-\u9fff]")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters of any script kept), spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _without_code(text: str) -> str:
    """``text`` with its fenced code blocks blanked out (same length, same line breaks)."""
    return _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def sections(text: str) -> list[tuple[str, str]]:
    """[(heading, body)] cut at the ``##`` headings outside code blocks; the part before the first one (the
    ``#`` title and the introduction) is the first section, named by the title."""
    cuts = [0] + [m.start() for m in re.finditer(r"^## ", _without_code(text), re.M) if m.start() > 0]
    out = []
    for start, end in zip(cuts, cuts[1:] + [len(text)]):
        body = text[start:end]
        first = re.search(r"^#+ (.*)$", _without_code(body), re.M)
        out.append((first.group(1).strip() if first else "", body))
    return out


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every heading outside code blocks."""
    return [(len(m.group(1)), m.group(2).strip()) for m in re.finditer(r"^(#{1,6}) (.+)$", _without_code(text), re.M)]


def tables(body: str) -> list[int]:
    """The number of rows (header and rule excluded) of each table in ``body``."""
    counts, run = [], 0
    for line in _without_code(body).splitlines() + [""]:
        if line.startswith("|"):
            run += 1
        elif run:
            counts.append(run - 2)
            run = 0
    return counts


def links(body: str, anchors: dict[str, int]) -> set[str]:
    """The link targets of ``body``, normalised: zh editions as English paths, either README as README.md, an
    in-page anchor as ``#<number of the heading it names>`` (``#?name`` if it names none)."""
    out = set()
    for target in _LINK.findall(_without_code(body)):
        if target.startswith("#"):
            out.add(f"#{anchors[target[1:]]}" if target[1:] in anchors else f"#?{target[1:]}")
            continue
        target = target.replace("/zh-CN/", "/")
        out.add(re.sub(r"^README\.zh-CN\.md", "README.md", target))
    return out


def code_blocks(body: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced block, a trailing ``# comment`` dropped from each line."""
    blocks = []
    for lang, code in _FENCE.findall(body):
        lines = [re.sub(r"\s+#\s.*$", "", line).rstrip() for line in code.splitlines()]
        blocks.append((lang, [line for line in lines if line.strip()]))
    return blocks


def code_spans(body: str) -> set[str]:
    return {" ".join(s.split()) for s in _SPAN.findall(_without_code(body))}


def compare(english: str, chinese: str, english_only: dict[str, str] | None = None) -> list[str]:
    """Every way ``chinese`` (README.zh-CN.md) has drifted from ``english`` (README.md); empty if in step."""
    english_only = ENGLISH_ONLY if english_only is None else english_only
    en_secs, zh_secs = sections(english), sections(chinese)
    en_heads, zh_heads = headings(english), headings(chinese)
    en_anchors = {slug(h): i for i, (_, h) in enumerate(en_heads)}
    zh_anchors = {slug(h): i for i, (_, h) in enumerate(zh_heads)}
    problems = []
    if [lvl for lvl, _ in en_heads] != [lvl for lvl, _ in zh_heads]:
        problems.append("the headings differ: README.md has " + ", ".join(f"{'#' * lvl} {h}" for lvl, h in en_heads)
                        + "; README.zh-CN.md has " + ", ".join(f"{'#' * lvl} {h}" for lvl, h in zh_heads))
    if len(en_secs) != len(zh_secs):
        problems.append(f"README.md has {len(en_secs)} sections, README.zh-CN.md {len(zh_secs)}: "
                        f"{[h for h, _ in en_secs]} vs {[h for h, _ in zh_secs]}")
        return problems
    for (en_h, en_body), (zh_h, zh_body) in zip(en_secs, zh_secs):
        where = f"section {en_h!r} (README.zh-CN.md: {zh_h!r})"
        if en_h in english_only:
            pointer = f"README.md#{slug(en_h)}"
            if pointer not in _LINK.findall(zh_body):
                problems.append(f"{where} is listed as English-only ({english_only[en_h]}) but does not link to "
                                f"{pointer}")
            continue
        if not _CJK.search(_SPAN.sub("", _without_code(zh_body))):
            problems.append(f"{where} is in English: translate it, or list it in ENGLISH_ONLY with a pointer")
        en_levels = [lvl for lvl, _ in headings(en_body)]
        if en_levels != [lvl for lvl, _ in headings(zh_body)]:
            problems.append(f"{where}: its headings differ ({en_levels} levels in README.md)")
        if tables(en_body) != tables(zh_body):
            problems.append(f"{where}: tables with {tables(en_body)} rows in README.md, {tables(zh_body)} in "
                            "README.zh-CN.md")
        en_links, zh_links = links(en_body, en_anchors), links(zh_body, zh_anchors)
        broken = sorted(t for t in en_links | zh_links if t.startswith("#?"))
        if broken:
            problems.append(f"{where}: in-page links to no heading: {broken}")
        if en_links - zh_links:
            problems.append(f"{where}: links missing in README.zh-CN.md: {sorted(en_links - zh_links)}")
        if zh_links - en_links:
            problems.append(f"{where}: links README.md does not have: {sorted(zh_links - en_links)}")
        if code_blocks(en_body) != code_blocks(zh_body):
            problems.append(f"{where}: code blocks differ:\nREADME.md: {code_blocks(en_body)}\n"
                            f"README.zh-CN.md: {code_blocks(zh_body)}")
        lost = sorted(s for s in code_spans(en_body) - code_spans(zh_body)
                      if s.replace("/zh-CN/", "/") not in {z.replace("/zh-CN/", "/") for z in code_spans(zh_body)})
        if lost:
            problems.append(f"{where}: code spans missing in README.zh-CN.md: {lost}")
    return problems


# ----------------------------------------------------------------------------- the real READMEs


def test_the_chinese_readme_is_in_step_with_the_english_one():
    english = (ROOT / "README.md").read_text(encoding="utf-8")
    chinese = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    problems = compare(english, chinese)
    assert not problems, ("README.zh-CN.md has drifted from README.md (translate the change, or list a section "
                          "in ENGLISH_ONLY with a pointer):\n" + "\n".join(problems))


def test_english_only_sections_name_real_sections():
    english = (ROOT / "README.md").read_text(encoding="utf-8")
    names = [h for h, _ in sections(english)]
    for heading in ENGLISH_ONLY:
        assert heading in names, f"ENGLISH_ONLY lists {heading!r}, which is no section of README.md"


# ----------------------------------------------------------------------------- the comparison itself

EN = """# Course

**English** | [简体中文](README.zh-CN.md)

Intro, see [Start](#start).

## Start

```bash
make lab     # opens notebook 01
```

Run `make test` too.

| a | b |
|---|---|
| 1 | [nb](notebooks/01_x.ipynb) |
| 2 | two |

## Checking a GPU: `make test-gpu`

Run `make test-gpu` on a GPU.
"""

ZH = """# 课程

[English](README.md) | 简体中文

> 中文版的状态：全部翻译。

简介，见[开始](#开始)。

## 开始

```bash
make lab     # 打开笔记本 01
```

也运行 `make test`。

| a | b |
|---|---|
| 1 | [笔记本](notebooks/zh-CN/01_x.ipynb) |
| 2 | 二 |

## 检查 GPU：`make test-gpu`

在 GPU 上运行 `make test-gpu`。
"""


def test_a_translated_readme_in_step_passes():
    assert compare(EN, ZH, {}) == []
    assert slug("Checking a GPU: `make test-gpu`") == "checking-a-gpu-make-test-gpu"
    assert slug("Colab 与 Kaggle") == "colab-与-kaggle"


def test_a_missing_section_fails():
    zh = ZH.split("## 检查 GPU")[0]
    assert any("2 sections" in p or "3 sections" in p for p in compare(EN, zh, {}))


def _drift(old: str, new: str) -> str:
    return "\n".join(compare(EN, ZH.replace(old, new), {}))


def test_a_table_row_a_link_a_command_or_a_code_span_that_drifted_fails():
    assert "tables with [2] rows in README.md, [1]" in _drift("| 2 | 二 |\n", "")
    assert "links missing in README.zh-CN.md: ['notebooks/01_x.ipynb']" in _drift(
        "[笔记本](notebooks/zh-CN/01_x.ipynb)", "笔记本")
    assert "code blocks differ" in _drift("make lab     #", "make lab TF=gpu #")
    assert "code spans missing in README.zh-CN.md: ['make test']" in _drift("也运行 `make test`。", "也运行测试。")
    assert "links README.md does not have: ['docs/x.md']" in _drift("二 |", "[二](docs/x.md) |")


def test_an_anchor_to_a_renamed_heading_fails():
    problems = compare(EN, ZH.replace("## 开始", "## 入门"), {})
    assert any("in-page links to no heading" in p and "#?开始" in p for p in problems)


def test_a_section_left_in_english_needs_its_listing_and_a_pointer():
    first = ZH.split("## 检查 GPU")[0]
    untranslated = first + "## Checking a GPU: `make test-gpu`\n\nRun `make test-gpu` on a GPU.\n"
    assert any("is in English" in p for p in compare(EN, untranslated, {}))
    pointer = first + "## 检查 GPU\n\n见[英文 README](README.md#checking-a-gpu-make-test-gpu)。\n"
    assert compare(EN, pointer, {}), "a pointer instead of the section fails unless the section is listed"
    listed = {"Checking a GPU: `make test-gpu`": "instructors only"}
    assert compare(EN, pointer, listed) == []
    assert any("does not link to README.md#checking-a-gpu-make-test-gpu" in p
               for p in compare(EN, untranslated, listed))


@pytest.mark.parametrize("path", ["README.md", "README.zh-CN.md"])
def test_every_in_page_link_of_both_readmes_names_a_heading(path):
    text = (ROOT / path).read_text(encoding="utf-8")
    anchors = {slug(h) for _, h in headings(text)}
    for target in re.findall(r"\]\(#([^)]+)\)", _without_code(text)):
        assert target in anchors, f"{path} links to #{target}, which is no heading"
