"""GLOSSARY.zh-CN.md is enforced: no rejected variant of a term anywhere in the Chinese edition.

The glossary's two tables are the rules, and this file holds none of its own (one source of truth): a row of
"术语" names a term, its rendering and, as code spans, the variants to reject (a literal string, or ``re:`` and
a Python regular expression; ``例:`` spans are sample sentences the row must reject), optionally only where the
English source matches a pattern ("仅当英文含"); a row of "上下文规则" rejects a word in a sentence that names
one of some words but none of others (显存 beside CPU, 内存 or 主机, with no GPU).

What is checked: the prose of every translation the edition is built from, ``notebooks/zh-CN/*.po`` and
``labs/zh-CN/*.po`` (the zh notebooks are built from them, and ``tests/test_i18n.py`` keeps the two identical),
``check()``'s feedback catalogue ``utils/grading/locale/zh_CN.po`` and ``README.zh-CN.md``. Code, code spans, link
targets, math, ``{placeholders}`` and quoted or emphasised text without a Chinese character are skipped. A hit
names the term, the file, the line, the notebook cell (or the message) and the rendering to use.

Every file must be free of violations: there is no list of tolerated ones (issue 33 applied the glossary to
the whole edition, the labs and the catalogue included).

Conventions of the glossary's "其他约定" are checked here too: a tutorial points to the zh lab first, then the
English one; every zh lab opens with the glossary's feedback-language note, word for word; and a Chinese feedback
message that the grader appends to another sentence does not start with the English separator space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpucourse import i18n

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "GLOSSARY.zh-CN.md"

CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[^\n]*$", re.S | re.M)
_SKIPPED = [
    re.compile(r"``.+?``|`[^`\n]+`"),  # code spans
    re.compile(r"\]\([^)\s]*\)"),  # link targets
    re.compile(r"<[^>\n]+>"),  # HTML tags and autolinks
    re.compile(r"https?://\S+"),  # bare URLs
    re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S),  # math
]
#: A ``{placeholder}`` of a feedback message, checked as a run of U+E000 (a rule can see that one stood there).
_PLACEHOLDER = re.compile(r"(?<!\{)\{\w*[^{}\n]*\}(?!\})")
#: Quoted, bold or italic text: skipped when it has no Chinese character (an English UI label or quotation).
_QUOTED = re.compile(r"“[^”\n]*”|\"[^\"\n]*\"|\*\*[^*\n]+\*\*|\*[^*\n]+\*")
_SENTENCE = re.compile(r"[^。！？；\n]+")


def prose(text: str) -> str:
    """``text`` with everything the glossary does not govern blanked out (same length, same line breaks)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    text = _FENCE.sub(blank, text)
    for pattern in _SKIPPED:
        text = pattern.sub(blank, text)
    text = _PLACEHOLDER.sub(lambda m: "\ue000" * len(m.group(0)), text)
    return _QUOTED.sub(lambda m: m.group(0) if CJK.search(m.group(0)) else blank(m), text)


# ----------------------------------------------------------------------------- the glossary's tables


@dataclass
class Rule:
    """One row of the glossary: ``term`` is its first column, ``use`` its rendering."""

    term: str
    use: str
    rejects: list[re.Pattern]
    examples: list[str]  # sentences the row must reject (its 例: spans)
    literals: list[str]  # the rejected variants written as plain text
    english: re.Pattern | None = None  # check only entries whose English matches
    unless: list[re.Pattern] | None = None  # context rules: the words that make the sentence a GPU sentence
    triggers: list[re.Pattern] | None = None  # context rules: the words that make 显存 suspect


def _cells(row: str) -> list[str]:
    """The cells of one markdown table row (``\\|`` is a literal bar, as in GitHub's tables)."""
    parts = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _tables(text: str) -> dict[str, list[list[str]]]:
    """{section heading: the rows of the first table under it}."""
    tables = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        rows = [line for line in body.splitlines() if line.startswith("|")]
        if len(rows) >= 2:
            tables[heading.strip()] = [_cells(r) for r in rows[2:]]
    return tables


def _pattern(span: str, where: str) -> re.Pattern:
    try:
        return re.compile(span[3:] if span.startswith("re:") else re.escape(span))
    except re.error as e:
        raise ValueError(f"{GLOSSARY.name}, {where}: {span!r} is not a regular expression ({e})") from None


def read_rules(text: str) -> list[Rule]:
    """The rules of a glossary's text: its "术语" table, then its "上下文规则" table."""
    tables = _tables(text)
    missing = [t for t in ("术语", "上下文规则") if t not in tables]
    if missing:
        raise ValueError(f"{GLOSSARY.name} has no table under '## {missing[0]}' (the test reads its rules from there)")
    rules = []
    for cells in tables["术语"]:
        if len(cells) != 5:
            raise ValueError(f"{GLOSSARY.name}: a row of '术语' needs 5 cells, got {len(cells)}: {cells}")
        term, use, reject, english, _source = cells
        spans = _spans(reject)
        variants = [s for s in spans if not s.startswith("例:")]
        examples = [s[2:] for s in spans if s.startswith("例:")]
        literals = [s for s in variants if not s.startswith("re:")]
        condition = _pattern(_spans(english)[0], term) if _spans(english) else None
        rules.append(Rule(term, use, [_pattern(s, term) for s in variants], examples, literals, condition))
    for cells in tables["上下文规则"]:
        if len(cells) != 4:
            raise ValueError(f"{GLOSSARY.name}: a row of '上下文规则' needs 4 cells, got {len(cells)}: {cells}")
        word, triggers, unless, example = cells
        use = f"{word} 只用于 GPU：主机内存写“内存”，或在句中点明 GPU"
        examples = [s[2:] for s in _spans(example) if s.startswith("例:")]
        rules.append(Rule(f"{word}（上下文规则）", use, [re.compile(re.escape(word))], examples, [],
                          triggers=[_pattern(s, word) for s in _spans(triggers)],
                          unless=[_pattern(s, word) for s in _spans(unless)]))
    return rules


# ----------------------------------------------------------------------------- checking text


@dataclass
class Hit:
    file: str
    line: int
    where: str
    term: str
    found: str
    use: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.where}): {self.found!r} — {self.term}: write {self.use}"


def find(text: str, rules: list[Rule], english: str | None = None) -> list[tuple[int, str, Rule]]:
    """(offset, rejected text, rule) of every violation in ``text`` (its English source: ``english``)."""
    plain = prose(text)
    out = []
    for rule in rules:
        if rule.english is not None and (english is None or not rule.english.search(english)):
            continue
        if rule.triggers is not None:
            for s in _SENTENCE.finditer(plain):
                sentence = s.group(0)
                if (rule.rejects[0].search(sentence) and any(t.search(sentence) for t in rule.triggers)
                        and not any(u.search(sentence) for u in rule.unless)):
                    m = rule.rejects[0].search(sentence)
                    out.append((s.start() + m.start(), sentence.strip(), rule))
            continue
        for pattern in rule.rejects:
            out += [(m.start(), text[m.start():m.end()].strip() or m.group(0), rule) for m in pattern.finditer(plain)]
    return sorted(out, key=lambda hit: hit[0])


def _po_units(po: Path):
    """(first line of the msgstr's text in the file, msgstr, msgid, where) of every translated entry."""
    text = po.read_text(encoding="utf-8")
    entries = i18n.read_po(text, po.name)
    assert i18n.render_po(entries) == text, f"{po} is not as `python -m gpucourse.i18n update` writes it"
    line = 1
    for e in entries:
        block = i18n.render_po([e])
        lines = block.splitlines()
        if e.msgid and not e.obsolete and e.msgstr:
            at = next(i for i, s in enumerate(lines) if s.startswith("msgstr "))
            first = line + at + (1 if lines[at] == 'msgstr ""' else 0)
            where = e.extracted[0] if e.extracted else "message"
            if po.name == "zh_CN.po":
                where = f"message {e.msgid[:50]!r}"
            yield first, e.msgstr, e.msgid, where
        line += len(lines) + 1


def check_file(path: Path, rules: list[Rule], root: Path = ROOT) -> list[Hit]:
    rel = path.relative_to(root).as_posix()
    hits = []
    if path.suffix == ".po":
        for first, msgstr, msgid, where in _po_units(path):
            for offset, found, rule in find(msgstr, rules, msgid):
                hits.append(Hit(rel, first + msgstr.count("\n", 0, offset), where, rule.term, found, rule.use))
    else:
        text = path.read_text(encoding="utf-8")
        for offset, found, rule in find(text, rules):
            line = text.count("\n", 0, offset) + 1
            heading = ([h for h in re.findall(r"^#+ .*$", text[:offset], re.M)] or ["(top)"])[-1]
            hits.append(Hit(rel, line, f"section {heading!r}", rule.term, found, rule.use))
    return hits


def edition_files(root: Path = ROOT) -> list[Path]:
    """Every file the glossary governs."""
    return [*i18n.editions(root), root / "utils" / "grading" / "locale" / "zh_CN.po", root / "README.zh-CN.md"]


# ----------------------------------------------------------------------------- the real edition


@pytest.fixture(scope="module")
def rules() -> list[Rule]:
    return read_rules(GLOSSARY.read_text(encoding="utf-8"))


def test_the_glossary_settles_every_term_the_review_found_inconsistent(rules):
    terms = " ".join(r.term for r in rules)
    for term in ("kernel", "batch size", "dtype", "raise", "clip", "flush to zero", "model FLOPs utilisation",
                 "memory-bound / compute-bound", "slot", "profiler", "expected", "with sparsity", "ranges",
                 "N times", "显存"):
        assert term in terms, f"{GLOSSARY.name} has no row for {term!r}"
    for rule in rules:
        assert rule.rejects, f"{GLOSSARY.name}: the row {rule.term!r} rejects nothing"


def test_every_rule_rejects_its_own_examples_and_the_renderings_pass(rules):
    for rule in rules:
        unconditional = replace(rule, english=None)
        if rule.triggers or len(rule.literals) < len(rule.rejects):
            assert rule.examples, f"{GLOSSARY.name}: {rule.term!r} has a regular expression but no 例: sentence"
        for example in rule.examples:
            assert find(example, [unconditional]), (
                f"{GLOSSARY.name}: the rule {rule.term!r} does not reject its own example {example!r}")
        for text in rule.literals:  # a plain variant is found in running text, not hidden by a skipped part
            assert find(f"这里写了{text}。", [unconditional]), (rule.term, text)
    others = [r for r in rules if not r.triggers]
    renderings = "\n".join(r.use for r in others)
    assert not [(found, r.term) for _, found, r in find(renderings, others)], (
        "a rendering in the glossary is rejected by the glossary itself")


@pytest.mark.parametrize("path", edition_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_edition_uses_the_glossarys_renderings(path, rules):
    hits = check_file(path, rules)
    rel = path.relative_to(ROOT).as_posix()
    assert not hits, f"{rel} breaks {GLOSSARY.name} ({len(hits)}):\n" + "\n".join(str(h) for h in hits)


def test_tutorials_point_to_the_zh_lab_first_then_the_english_one():
    """The glossary's convention for lab pointers ("其他约定"): the zh lab, then 英文版: the English lab."""
    for po in (ROOT / "notebooks" / "zh-CN").glob("*.po"):
        for e in i18n.read_po(po.read_text(encoding="utf-8")):
            if not e.msgctxt or e.obsolete:
                continue
            for lab in sorted(set(re.findall(r"`labs/(\d\d_\w+\.ipynb)`", e.msgid))):
                pointer = f"`labs/zh-CN/{lab}`，英文版：`labs/{lab}`"
                assert pointer in e.msgstr, f"{po.name} {e.extracted}: the lab pointer must read {pointer!r}"


def _lab_note() -> str:
    text = GLOSSARY.read_text(encoding="utf-8")
    notes = re.findall(r"^ *> (检查结果会用中文显示：.*)$", text, re.M)
    assert len(notes) == 1, f"{GLOSSARY.name} must quote the labs' feedback-language note once (under 其他约定)"
    return notes[0].strip()


def test_every_zh_lab_opens_with_the_same_feedback_language_note():
    note = _lab_note()
    assert "`%env GPUCOURSE_LANG=zh_CN`" in note and "`check(...)`" in note
    labs = sorted((ROOT / "labs" / "zh-CN").glob("*.po"))
    assert len(labs) >= 9, f"expected the nine zh labs' PO files, found {[p.name for p in labs]}"
    for po in labs:
        first = next(e for e in i18n.read_po(po.read_text(encoding="utf-8")) if e.msgctxt and not e.obsolete)
        assert note in first.msgstr, (f"{po.name}: the first cell must carry the feedback-language note of "
                                      f"{GLOSSARY.name} word for word (review E6, T17):\n{note}")


def appended_with_a_space(entries) -> list[tuple[str, str]]:
    """(msgid, msgstr) of each message that the grader appends to a sentence (its English starts with one space)
    whose Chinese starts with a space too: after "。" that space shows as a gap in the middle of the text."""
    return [(e.msgid, e.msgstr) for e in entries
            if e.msgid and not e.obsolete and e.msgstr and re.match(r" \S", e.msgid) and e.msgstr[:1].isspace()]


def test_a_chinese_message_appended_to_another_does_not_start_with_the_english_space():
    catalogue = ROOT / "utils" / "grading" / "locale" / "zh_CN.po"
    entries = i18n.read_po(catalogue.read_text(encoding="utf-8"))
    assert sum(1 for e in entries if re.match(r" \S", e.msgid)) >= 20, "the catalogue has appended hints"
    bad = appended_with_a_space(entries)
    assert not bad, "drop the leading space of these translations (Chinese joins sentences without one):\n" + \
        "\n".join(f"{msgid!r} -> {msgstr!r}" for msgid, msgstr in bad)
    planted = [i18n.Entry(msgid=" That is the norm after clipping.", msgstr=" 这是裁剪之后的范数。"),
               i18n.Entry(msgid="  {opcode}: expected {want}", msgstr="  {opcode}：应为 {want}"),  # an indented line
               i18n.Entry(msgid=" Count the output too.", msgstr="输出也要计入。")]
    assert appended_with_a_space(planted) == [(" That is the norm after clipping.", " 这是裁剪之后的范数。")]


# ----------------------------------------------------------------------------- the check itself


def _po_with(tmp_path: Path, english: str, chinese: str) -> Path:
    po = tmp_path / "notebooks" / "zh-CN" / "01_tiny.po"
    po.parent.mkdir(parents=True)
    header = i18n.Entry(msgid="", msgstr="Language: zh_CN\n")
    ok = i18n.Entry(msgid="## Intro", msgstr="## 简介", msgctxt=i18n.cell_hash("## Intro"),
                    extracted=["markdown cell 1 of notebooks/01_tiny.ipynb"])
    e = i18n.Entry(msgid=english, msgstr=chinese, msgctxt=i18n.cell_hash(english),
                   extracted=["markdown cell 3 of notebooks/01_tiny.ipynb"])
    i18n.write_po(po, [header, ok, e])
    return po


def test_a_rejected_variant_fails_naming_term_file_line_and_cell(tmp_path, rules):
    po = _po_with(tmp_path, "Pick the batch size.\n\nThe step raises `ValueError`.",
                  "选择批大小。\n\n这一步会抛出 `ValueError`。")
    hits = check_file(po, rules, tmp_path)
    assert [(h.term, h.found) for h in hits] == [("raise（引发异常）", "抛出")]
    text = str(hits[0])
    po_lines = po.read_text(encoding="utf-8").splitlines()
    assert "抛出" in po_lines[hits[0].line - 1], (hits[0].line, po_lines)
    assert text.startswith("notebooks/zh-CN/01_tiny.po:") and "markdown cell 3" in text and "引发" in text


def test_code_links_placeholders_and_english_quotes_are_not_checked(rules):
    text = ("用 `kernel_size` 和 [链接](https://example.org/kernel) 设置，$x - 1$ 与 {kernel}；"
            "NVML 的定义是“one or more kernels was executing”，**GPU kernel stats** 也照原文。\n"
            "```python\nraise ValueError('抛出')  # 2x faster, 40-55%\n```\n")
    assert find(text, rules) == []
    assert [r.term for _, _, r in find("启动一个 kernel。", rules)] == [rules[0].term]


def test_a_rule_that_depends_on_the_english_checks_only_entries_whose_english_matches(rules):
    clip = next(r for r in rules if r.term == "clip")
    assert find("被截断的概率", [clip], "the clipped probabilities")
    assert not find("无效的编号会截断列表", [clip], "an invalid index truncates the list")
    assert not find("被截断的概率", [clip], None), "the README has no English per line: such rules skip it"


def test_the_times_rule_rejects_comparatives_but_keeps_ratios_and_doubling(rules):
    times = next(r for r in rules if r.term.startswith("N times"))
    for bad in ("比 TF32 高 2 倍", "峰值慢 8 倍", "字节数少了 11 倍", "提高了 2.8 倍", "快**至少 2 倍**",
                "与批大小大 `k` 倍时相同", "会让训练慢好几倍", "梯度大 10^4 倍", "更新大 {n} 倍", "提速 3 倍",
                "翻了 4 倍"):
        assert find(bad, [times]), bad
    for good in ("是 TF32 的 2 倍", "只有原来的 1/11", "获得 2 倍加速", "最多 2 倍", "至少 2 倍",
                 "扩大一倍", "把批大小翻倍", "大约 2 倍", "最大缓存的四倍", "是下界的 1.3 倍", "更新量是正确值的 {n} 倍"):
        assert not find(good, [times]), good


def test_half_width_marks_and_the_letter_x_around_placeholders_fail_but_code_like_lists_pass(rules):
    marks = next(r for r in rules if r.term.startswith("中文句子里的半角标点"))
    times = next(r for r in rules if r.term.startswith("Nx, a x b"))
    for bad in ("实际引发了 {raised}: {message}", "应返回一个字典（dict）: {got}", "实际得到: {got}", "原因是; {why}"):
        assert find(bad, [marks]), bad
    for good in ("实际引发了 {raised}：{message}", "对于 ({value}, {physical})，应为 {want}", "在每一步 k = 1, 2, ... 之后",
                 "LossScaleOptimizer(SGD({lr}), initial_scale={initial:g})", "{where}：应为 {want} 字节"):
        assert not find(good, [marks]), good
    for bad in ("{micro} x {steps} = {product}", "{k} x {head}，然后是 {rest}", "结果（m x n）要写入内存", "2 x params"):
        assert find(bad, [times]), bad
    for good in ("{micro} × {steps} = {product}", "和 x 的梯度", "把 x 与 y 对应", "y = 3 × x"):
        assert not find(good, [times]), good


def test_vram_in_a_cpu_sentence_fails_and_in_a_gpu_sentence_passes(rules):
    vram = next(r for r in rules if r.triggers)
    assert find("在 CPU 上，峰值显存就是进程占用的内存。", [vram])
    assert find("主机在这里分配显存。", [vram])
    assert not find("在内存（GPU 上即显存）与芯片之间搬运字节。", [vram])
    assert not find("CPU 上是内存；GPU 上是显存。", [vram]), "each sentence is judged on its own"
    assert not find("测量峰值显存。", [vram]), "a sentence without CPU or 内存 is left to the translator"


def test_the_rules_are_read_from_the_glossary_and_a_broken_table_is_refused(tmp_path):
    text = GLOSSARY.read_text(encoding="utf-8")
    rules = read_rules(text)
    batch = next(r for r in rules if r.term == "batch size")
    assert [p.pattern for p in batch.rejects] == [re.escape("批次大小"), re.escape("批量大小")]
    # a variant added to the glossary is rejected at once: the table is the only list
    more = read_rules(text.replace("`批次大小` `批量大小`", "`批次大小` `批量大小` `批尺寸`"))
    assert find("批尺寸为 32", more) and not find("批尺寸为 32", rules)
    with pytest.raises(ValueError, match="no table under '## 上下文规则'"):
        read_rules(text.split("## 上下文规则")[0])
    with pytest.raises(ValueError, match="is not a regular expression"):
        read_rules(text.replace("`re:(?<![A-Za-z0-9.])", "`re:(?<![A-Za-z0-9.]", 1))
