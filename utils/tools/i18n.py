"""Translated editions of the notebooks: PO files in, zh notebooks out, and the drift check.

One source of truth. A translated notebook is never edited by hand: it is *built* from its English
notebook plus one gettext PO file, e.g. ``notebooks/zh-CN/01_device_detection.po`` for
``notebooks/01_device_detection.ipynb`` (labs: ``labs/zh-CN/NN_*.po`` for the lab that ``labgen``
generated). In the PO file each English markdown cell is one entry::

    #. markdown cell 3 of notebooks/01_device_detection.ipynb
    msgctxt "5f2c0a9e41b7"          <- sha256 of the English cell source, first 12 hex digits
    msgid "## 1. Physical devices\\n..."  <- the English source
    msgstr "## 1. 物理设备\\n..."         <- the translation

The built notebook (``notebooks/zh-CN/01_device_detection.ipynb``) has the English notebook's code
cells and stored outputs, byte for byte, its markdown cells translated, the Colab/Kaggle badges
pointing at the translated notebook itself, and relative links that only exist beside the English
notebook pointed one folder up. A cell without a current translation keeps its English text (and
:func:`check` fails).

    python -m gpucourse.i18n update              # refresh every PO file from its English notebook
    python -m gpucourse.i18n update notebooks/02_placement_logging.ipynb   # start (or refresh) one
    python -m gpucourse.i18n build               # write the zh notebooks from English + PO
    python -m gpucourse.i18n check               # what is missing, outdated or stale; exit 1 if any
    python -m gpucourse.i18n messages            # refresh check()'s message catalogue from the code

``update`` works like ``msgmerge``: a new English cell gets an empty ``msgstr``; a changed cell gets
the old translation marked ``#, fuzzy`` with the old English as ``#| msgid`` (so the translator sees
what changed); entries whose English cell is gone become obsolete (``#~``). Any PO editor (Poedit,
Lokalize, Weblate) reads the files; a translator clears the fuzzy flag once the text is right.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CATALOGUE", "LANGS", "Entry", "Problem", "build_notebook", "cell_hash", "check", "check_catalogue",
           "editions", "english_for", "extract_messages", "main", "read_po", "render_po", "update_catalogue",
           "update_po", "write_po", "zh_path_for"]

ROOT = Path(__file__).resolve().parents[2]
#: Languages with an edition: the folder name beside the English notebooks.
LANGS = ("zh-CN",)
#: The folders whose notebooks may have editions (labs: the generated lab, not the solution).
FOLDERS = ("notebooks", "labs")
HASH_LEN = 12


def cell_hash(source: str) -> str:
    """The key of one English cell: the first 12 hex digits of the SHA-256 of its source."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a cell's text (str), got {type(source).__name__}")
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:HASH_LEN]


# ----------------------------------------------------------------------------- PO files


@dataclass
class Entry:
    """One PO entry (``msgctxt`` is the cell hash; the header entry has ``msgid == ""``)."""

    msgid: str
    msgstr: str = ""
    msgctxt: str | None = None
    flags: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)  # "# ..." translator comments, kept as written
    extracted: list[str] = field(default_factory=list)  # "#. ..." written by `update`
    previous: str | None = None  # "#| msgid": the English this (fuzzy) translation was made for
    obsolete: bool = False

    @property
    def fuzzy(self) -> bool:
        return "fuzzy" in self.flags

    @property
    def translated(self) -> bool:
        return bool(self.msgstr.strip()) and not self.fuzzy and not self.obsolete


def _unquote(text: str, where: str) -> str:
    text = text.strip()
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError(f"{where}: expected a quoted PO string, got {text[:60]!r}")
    out, i, body = [], 0, text[1:-1]
    escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "r": "\r"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            out.append(escapes.get(body[i + 1], "\\" + body[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("\r", "\\r") \
        .replace("\n", "\\n") + '"'


def read_po(text: str, where: str = "PO file") -> list[Entry]:
    """Parse PO text (the subset gettext tools write for singular messages) into entries, header first."""
    if not isinstance(text, str):
        raise TypeError(f"text must be the PO file's content (str), got {type(text).__name__}")
    entries: list[Entry] = []
    cur: Entry | None = None
    key = None  # the keyword the following continuation strings belong to
    prev_key = None  # the same for "#| msgid" continuation strings

    def finish():
        nonlocal cur
        if cur is not None:
            entries.append(cur)
        cur = None

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        at = f"{where} line {n}"
        if not line:
            finish()
            key = None
            continue
        obsolete = line.startswith("#~")
        if obsolete:
            line = line[2:].strip()
            if line.startswith("|"):  # "#~|" previous of an obsolete entry: not needed
                continue
        if line.startswith("#") and not obsolete:
            if cur is not None and key is not None:  # a comment after msgstr starts a new entry
                finish()
                key = None
            cur = cur or Entry(msgid="")
            if line.startswith("#,"):
                cur.flags += [f.strip() for f in line[2:].split(",") if f.strip()]
            elif line.startswith("#."):
                cur.extracted.append(line[2:].strip())
            elif line.startswith("#|"):
                rest = line[2:].strip()
                if rest.startswith("msgid "):
                    cur.previous, prev_key = _unquote(rest[6:], at), "previous"
                elif rest.startswith('"') and prev_key == "previous":
                    cur.previous = (cur.previous or "") + _unquote(rest, at)
            elif line.startswith("#:"):
                continue  # references are rewritten by `update`
            else:
                cur.comments.append(raw[1:].lstrip() if raw.startswith("# ") else raw[1:])
            continue
        m = re.match(r"(msgctxt|msgid|msgstr)\s+(\".*\")$", line)
        if m:
            kw, value = m.group(1), _unquote(m.group(2), at)
            if cur is not None and key == "msgstr" and kw != "msgstr":  # the next entry starts
                finish()
            cur = cur or Entry(msgid="")
            cur.obsolete = cur.obsolete or obsolete
            setattr(cur, kw, value)
            key = kw
        elif line.startswith('"') and key is not None and cur is not None:
            setattr(cur, key, getattr(cur, key) + _unquote(line, at))
        else:
            raise ValueError(f"{at}: cannot read {raw[:80]!r} (expected msgctxt, msgid, msgstr, a quoted "
                             "string or a comment)")
    finish()
    return entries


def _field(keyword: str, text: str, prefix: str = "") -> list[str]:
    if "\n" not in text.rstrip("\n") and len(text) < 70:
        return [f"{prefix}{keyword} {_quote(text)}"]
    parts = text.splitlines(keepends=True)
    return [f'{prefix}{keyword} ""'] + [f"{prefix}{_quote(p)}" for p in parts]


def render_po(entries: list[Entry]) -> str:
    """PO text for ``entries`` (one string per source line, so a diff shows the line that changed)."""
    blocks = []
    for e in entries:
        lines = [f"# {c}".rstrip() for c in e.comments] if not e.obsolete else []
        if not e.obsolete:
            lines += [f"#. {x}" for x in e.extracted]
            if e.flags:
                lines.append("#, " + ", ".join(dict.fromkeys(e.flags)))
            if e.previous is not None:
                lines += _field("msgid", e.previous, "#| ")
        pre = "#~ " if e.obsolete else ""
        if e.msgctxt is not None:
            lines += _field("msgctxt", e.msgctxt, pre)
        lines += _field("msgid", e.msgid, pre) + _field("msgstr", e.msgstr, pre)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def write_po(path: Path, entries: list[Entry]) -> None:
    Path(path).write_text(render_po(entries), encoding="utf-8")


def _header(lang: str, english: str) -> Entry:
    meta = (f"Project-Id-Version: gpucourse {english}\n"
            f"Language: {lang.replace('-', '_')}\n"
            "MIME-Version: 1.0\n"
            "Content-Type: text/plain; charset=UTF-8\n"
            "Content-Transfer-Encoding: 8bit\n"
            "Plural-Forms: nplurals=1; plural=0;\n")
    return Entry(msgid="", msgstr=meta, comments=[
        f"Translation of {english}, one entry per markdown cell (msgctxt: sha256 of the English source).",
        "Edit the msgstr texts only; `python -m gpucourse.i18n update` rewrites the rest."])


# ----------------------------------------------------------------------------- paths


def editions(root: Path = ROOT) -> list[Path]:
    """Every PO file of a translated edition, e.g. ``notebooks/zh-CN/01_device_detection.po``."""
    return sorted(p for folder in FOLDERS for lang in LANGS for p in (Path(root) / folder / lang).glob("*.po"))


def english_for(po: Path) -> Path:
    """``notebooks/zh-CN/01_x.po`` -> ``notebooks/01_x.ipynb``"""
    po = Path(po)
    return po.parent.parent / (po.stem + ".ipynb")


def zh_path_for(po: Path) -> Path:
    """``notebooks/zh-CN/01_x.po`` -> ``notebooks/zh-CN/01_x.ipynb``"""
    return Path(po).with_suffix(".ipynb")


def _rel(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return Path(path).as_posix()


def _markdown_cells(nb) -> list[tuple[int, str]]:
    """(1-based cell number, source) of every markdown cell."""
    return [(i, c.source) for i, c in enumerate(nb.cells, 1) if c.cell_type == "markdown"]


# ----------------------------------------------------------------------------- update


def update_po(english_nb, entries: list[Entry], name: str, lang: str = "zh-CN") -> list[Entry]:
    """Entries for ``english_nb`` (an nbformat node), reusing the translations in ``entries`` (msgmerge)."""
    wanted, seen = [], set()
    for number, src in _markdown_cells(english_nb):
        if cell_hash(src) not in seen:
            seen.add(cell_hash(src))
            wanted.append((cell_hash(src), src, f"markdown cell {number} of {name}"))
    return _merge(entries, wanted, _header(lang, name))


def _merge(entries: list[Entry], wanted: list[tuple[str | None, str, str]], header: Entry) -> list[Entry]:
    """msgmerge: one entry per ``(msgctxt, msgid, where)`` of ``wanted``, translations taken from ``entries``.

    An exact match keeps its translation (and flags); a new text takes the most similar translation
    without a text, marked fuzzy with the old English as ``previous``; leftovers become obsolete.
    """
    old = [e for e in entries if e.msgid != "" or e.msgctxt is not None]
    header = next((e for e in entries if e.msgid == "" and e.msgctxt is None), None) or header
    exact = {(e.msgctxt, e.msgid): e for e in old}
    current = {(ctxt, msgid) for ctxt, msgid, _ in wanted}
    spare = [e for e in old if (e.msgctxt, e.msgid) not in current and e.msgstr.strip()]
    out = [header]
    for ctxt, msgid, where in wanted:
        found = exact.get((ctxt, msgid))
        if found is not None:
            new = copy.deepcopy(found)
            new.obsolete, new.extracted = False, [where]
        else:
            new = Entry(msgid=msgid, msgctxt=ctxt, extracted=[where])
            best = max(spare, key=lambda e: difflib.SequenceMatcher(None, e.msgid, msgid).ratio(), default=None)
            if best is not None and difflib.SequenceMatcher(None, best.msgid, msgid).ratio() >= 0.5:
                spare.remove(best)
                new.msgstr, new.flags, new.previous = best.msgstr, ["fuzzy"], best.msgid
                new.comments = list(best.comments)
        out.append(new)
    for e in old:
        if (e.msgctxt, e.msgid) not in current and e.msgstr.strip():
            gone = copy.deepcopy(e)
            gone.obsolete, gone.flags, gone.previous = True, [], None
            out.append(gone)
    return out


# ----------------------------------------------------------------------------- check() messages

#: The message catalogue of what check() and the grader print (``gpucourse.grading.items.tr`` reads it).
CATALOGUE = Path(__file__).resolve().parents[1] / "grading" / "locale" / "zh_CN.po"


def _lab_message_sources() -> tuple[str, ...]:
    """Every module of ``labtests/``, read from the folder: each lab's items (``labNN.py``), then its grader-side
    modules (``_labNN_*.py``: the judges and their messages, the reference answers)."""
    files = [p.name for p in (Path(__file__).resolve().parents[1] / "labtests").glob("*.py") if p.name != "__init__.py"]
    return tuple(f"labtests/{name}" for name in sorted(files, key=lambda n: (n.lstrip("_")[:5], n.startswith("_"), n)))


#: The code whose messages are translated: the checker, and every lab's item feedback.
MESSAGE_SOURCES = ("grading/items.py", "grading/checker.py", "grading/grader/observer.py", *_lab_message_sources())


_FIELDS = re.compile(r"(?<!\{)\{(\w*)[^{}]*\}")


def extract_messages(paths) -> list[tuple[str, str]]:
    """(msgid, "file:line") of every message in ``paths``: ``tr("...")`` calls, ``@item(title=...)`` and
    the ``why`` of ``expect_raised``/``expect_raises`` (xgettext for this course)."""
    import ast

    found: dict[str, tuple] = {}
    for number, path in enumerate(paths):
        path = Path(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            args = {"tr": node.args[:1], "expect_raised": node.args[2:3], "expect_raises": node.args[2:3]}.get(name, [])
            wanted = {"item": "title", "expect_raised": "why", "expect_raises": "why"}.get(name)
            args = list(args) + [k.value for k in node.keywords if wanted and k.arg == wanted]
            for arg in args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value:
                    where = (number, node.lineno, f"{path.parent.name}/{path.name}")  # no line: no churn
                    found[arg.value] = min(found.get(arg.value, where), where)
    return [(msgid, where[2]) for msgid, where in sorted(found.items(), key=lambda kv: kv[1])]


def update_catalogue(catalogue: Path = CATALOGUE, sources=None) -> bool:
    """Refresh the catalogue from :data:`MESSAGE_SOURCES`; True if it changed."""
    sources = sources or [Path(__file__).resolve().parents[1] / s for s in MESSAGE_SOURCES]
    old = read_po(catalogue.read_text(encoding="utf-8"), catalogue.name) if catalogue.is_file() else []
    new = _merge(old, [(None, msgid, where) for msgid, where in extract_messages(sources)],
                 _header("zh_CN", "check() and grader messages"))
    for e in new[1:]:  # PO editors and `msgfmt --check` then verify that a translation keeps every {field}
        e.flags = [f for f in e.flags if f != "python-brace-format"]
        if not e.obsolete and _FIELDS.search(e.msgid):
            e.flags.append("python-brace-format")
    text = render_po(new)
    if catalogue.is_file() and catalogue.read_text(encoding="utf-8") == text:
        return False
    catalogue.parent.mkdir(parents=True, exist_ok=True)
    catalogue.write_text(text, encoding="utf-8")
    return True


def check_catalogue(catalogue: Path = CATALOGUE, sources=None) -> list[str]:
    """Messages of :data:`MESSAGE_SOURCES` without a current translation, or whose translation's
    ``{fields}`` differ from the English ones (then ``tr`` would print the English)."""
    sources = sources or [Path(__file__).resolve().parents[1] / s for s in MESSAGE_SOURCES]
    entries = {e.msgid: e for e in read_po(catalogue.read_text(encoding="utf-8"), catalogue.name)
               if not e.obsolete and e.msgctxt is None} if catalogue.is_file() else {}
    fields = _FIELDS
    out = []
    for msgid, where in extract_messages(sources):
        e = entries.get(msgid)
        if e is None or not e.msgstr.strip():
            out.append(f"{where}: message without a translation in {catalogue.name}: {msgid!r}")
        elif e.fuzzy:
            out.append(f"{where}: translation marked fuzzy in {catalogue.name} (the English changed): {msgid!r}")
        elif sorted(fields.findall(e.msgstr)) != sorted(fields.findall(msgid)):
            out.append(f"{where}: the translation's {{fields}} differ from the English: {msgid!r}")
    return out


# ----------------------------------------------------------------------------- build


_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def _fix_links(text: str, english_dir: Path, zh_dir: Path) -> str:
    """Relative link targets that exist beside the English notebook but not beside the edition: one folder up."""
    def fix(m):
        target = m.group(2)
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
            return m.group(0)
        if (zh_dir / path).exists() or not (english_dir / path).exists():
            return m.group(0)
        return m.group(1) + "../" + target + m.group(3)
    return _LINK.sub(fix, text)


def build_notebook(english_nb, entries: list[Entry], english_rel: str, zh_rel: str, root: Path = ROOT,
                   lang: str = "zh-CN"):
    """The edition of ``english_nb``: same code cells and outputs, markdown from the current translations.

    ``english_rel``/``zh_rel`` are the two notebooks' paths relative to the repository root (for the
    badges and links).
    """
    from ..colab import colab_url, kaggle_url

    table = {e.msgctxt: e.msgstr for e in entries if e.translated}
    nb = copy.deepcopy(english_nb)
    english_dir, zh_dir = (Path(root) / english_rel).parent, (Path(root) / zh_rel).parent
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        text = table.get(cell_hash(cell.source), cell.source)
        for url in (colab_url, kaggle_url):
            text = text.replace(url(english_rel), url(zh_rel))
        cell.source = _fix_links(text, english_dir, zh_dir)
    meta = dict(nb.metadata.get("gpucourse", {}))
    meta.update({"lang": lang, "translated_from": english_rel})
    nb.metadata["gpucourse"] = meta
    return nb


def render(nb) -> str:
    """The exact text a notebook is stored as (as ``labgen`` writes it)."""
    import nbformat

    return nbformat.writes(nb) + "\n"


def _load(po: Path, root: Path):
    import nbformat

    english = english_for(po)
    if not english.is_file():
        raise FileNotFoundError(f"{_rel(po, root)} translates {_rel(english, root)}, which does not exist: "
                                "rename the PO file after its English notebook, or delete it")
    return nbformat.read(english, as_version=4), read_po(po.read_text(encoding="utf-8"), _rel(po, root))


def _built(po: Path, root: Path):
    english_nb, entries = _load(po, root)
    return build_notebook(english_nb, entries, _rel(english_for(po), root), _rel(zh_path_for(po), root), root,
                          po.parent.name)


# ----------------------------------------------------------------------------- check


@dataclass
class Problem:
    """One reason an edition is out of step, addressed to the course author."""

    notebook: str  # the English notebook
    cell: int | None  # 1-based cell number in the English notebook
    kind: str  # "missing", "outdated", "fuzzy", "code", "outputs", "cells", "stale"
    english: str = ""

    def __str__(self) -> str:
        where = f"{self.notebook} cell {self.cell}" if self.cell else self.notebook
        text = " ".join(self.english.split())
        text = f": {text[:100]!r}" + ("..." if len(text) > 100 else "") if text else ""
        return f"{where}: {_KINDS[self.kind]}{text}"


_KINDS = {
    "missing": "no translation yet (fill in its msgstr)",
    "outdated": "the English text changed since it was translated (run `python -m gpucourse.i18n update`, "
                "then revise the fuzzy entry)",
    "fuzzy": "translation marked fuzzy: the English changed; revise the msgstr and remove the fuzzy flag",
    "code": "the edition's code cell differs from the English one (editions are built, never edited: "
            "run `python -m gpucourse.i18n build`)",
    "outputs": "the edition's stored outputs differ from the English ones (run `python -m gpucourse.i18n build`)",
    "cells": "the edition's cells do not match the English notebook's (run `python -m gpucourse.i18n build`)",
    "stale": "the edition is not what English + PO build (run `python -m gpucourse.i18n build`)",
    "orphan": "an edition without its PO file (nothing keeps it in step): restore the PO file, or delete the notebook",
}


def _code_problems(name: str, english_nb, zh_nb) -> list[Problem]:
    out = []
    if [c.cell_type for c in english_nb.cells] != [c.cell_type for c in zh_nb.cells]:
        return [Problem(name, None, "cells", f"{len(english_nb.cells)} cells in English, {len(zh_nb.cells)} "
                                             "in the edition")]
    for i, (en, zh) in enumerate(zip(english_nb.cells, zh_nb.cells), 1):
        if en.cell_type != "code":
            continue
        if en.source != zh.source:
            out.append(Problem(name, i, "code", en.source))
        elif (json.dumps(en.get("outputs", []), sort_keys=True) != json.dumps(zh.get("outputs", []), sort_keys=True)
              or en.get("execution_count") != zh.get("execution_count")):
            out.append(Problem(name, i, "outputs", en.source))
    return out


def check(root: Path = ROOT, pos: list[Path] | None = None) -> list[Problem]:
    """Every way the editions (all PO files under ``root``, or ``pos``) are out of step with the English."""
    import nbformat

    root = Path(root)
    problems: list[Problem] = []
    if pos is None:
        problems += [Problem(_rel(nb, root), None, "orphan") for folder in FOLDERS for lang in LANGS
                     for nb in sorted((root / folder / lang).glob("*.ipynb")) if not nb.with_suffix(".po").is_file()]
    for po in (editions(root) if pos is None else pos):
        english_nb, entries = _load(po, root)
        name = _rel(english_for(po), root)
        by_hash = {e.msgctxt: e for e in entries if not e.obsolete and e.msgctxt is not None}
        current = {cell_hash(src) for _, src in _markdown_cells(english_nb)}
        orphans = [e for e in by_hash.values() if e.msgctxt not in current and e.msgstr.strip()]
        for number, src in _markdown_cells(english_nb):
            e = by_hash.get(cell_hash(src))
            if e is not None and e.translated:
                continue
            if e is not None and e.fuzzy and e.msgstr.strip():
                problems.append(Problem(name, number, "fuzzy", src))
            elif e is None and orphans:
                problems.append(Problem(name, number, "outdated", src))
            else:
                problems.append(Problem(name, number, "missing", src))
        zh = zh_path_for(po)
        if not zh.is_file():
            problems.append(Problem(name, None, "stale", f"{_rel(zh, root)} does not exist"))
            continue
        zh_nb = nbformat.read(zh, as_version=4)
        found = _code_problems(name, english_nb, zh_nb)
        problems += found
        if not found and zh.read_text(encoding="utf-8") != render(_built(po, root)):
            problems.append(Problem(name, None, "stale", _rel(zh, root)))
    return problems


# ----------------------------------------------------------------------------- command line


def _po_for(english: Path, lang: str) -> Path:
    english = Path(english)
    if english.suffix != ".ipynb" or english.parent.name not in FOLDERS:
        raise ValueError(f"notebook must be a notebook under {' or '.join(FOLDERS)}/, like "
                         f"notebooks/02_placement_logging.ipynb, got {str(english)!r}")
    return english.parent / lang / (english.stem + ".po")


def main(argv=None) -> int:
    import nbformat

    ap = argparse.ArgumentParser(prog="python -m gpucourse.i18n", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("update", "build", "check", "messages"))
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="update: English notebooks to start or refresh (default: every one with a PO file)")
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    ap.add_argument("--lang", default=LANGS[0], choices=LANGS)
    a = ap.parse_intermixed_args(argv)
    root = a.root
    if a.notebooks:
        pos = [_po_for(n if n.is_absolute() or n.exists() else root / n, a.lang) for n in a.notebooks]
    else:
        pos = editions(root)
    if a.command == "messages":
        if update_catalogue():
            print(f"updated {_rel(CATALOGUE, root)}")
        return 0
    if a.command == "update":
        for po in pos:
            english = english_for(po)
            nb = nbformat.read(english, as_version=4)
            old = read_po(po.read_text(encoding="utf-8"), _rel(po, root)) if po.is_file() else []
            new = update_po(nb, old, _rel(english, root), po.parent.name)
            text = render_po(new)
            if not po.is_file() or po.read_text(encoding="utf-8") != text:
                po.parent.mkdir(parents=True, exist_ok=True)
                po.write_text(text, encoding="utf-8")
                print(f"updated {_rel(po, root)}")
        return 0
    if a.command == "build":
        for po in pos:
            text = render(_built(po, root))
            dest = zh_path_for(po)
            if not dest.is_file() or dest.read_text(encoding="utf-8") != text:
                dest.write_text(text, encoding="utf-8")
                print(f"wrote {_rel(dest, root)}")
        return 0
    problems = check(root, pos)
    for p in problems:
        print(p)
    if root == ROOT and not a.notebooks:
        problems += check_catalogue()
        print("\n".join(check_catalogue()) or f"{_rel(CATALOGUE, root)}: every message translated")
    for po in pos:
        entries = [e for e in read_po(po.read_text(encoding="utf-8")) if e.msgctxt and not e.obsolete]
        done = sum(e.translated for e in entries)
        print(f"{_rel(po, root)}: {done}/{len(entries)} cells translated")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
