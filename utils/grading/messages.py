"""check()'s messages in the learner's language: :func:`tr`, a gettext-style lookup in ``locale/<lang>.po``.

Every learner-facing text of an item goes through :func:`tr` (msgid: the English text with ``{name}`` fields),
in the :func:`language` of the notebook: ``GPUCOURSE_LANG`` (``zh_CN``), else Chinese when the notebook is in
a ``zh-CN`` folder. Messages only: statuses and points never depend on the language. Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["LOCALE_DIR", "language", "tr"]

#: The message catalogues: ``zh_CN.po`` translates the English messages (gettext PO, msgid -> msgstr).
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
_CATALOGUES: dict = {}


def language() -> str:
    """``"zh_CN"`` or ``"en"``: ``GPUCOURSE_LANG`` if set (``zh_CN``, ``zh-CN``, ``zh``; anything else is
    English), else ``"zh_CN"`` when the notebook is in a ``zh-CN`` folder (Jupyter's ``JPY_SESSION_NAME``,
    or the kernel's working folder, which is the notebook's), else ``"en"``."""
    want = os.environ.get("GPUCOURSE_LANG", "").strip().lower()
    if want:
        return "zh_CN" if want.startswith("zh") else "en"
    places = [os.environ.get("JPY_SESSION_NAME", "")]
    try:
        places.append(os.getcwd())
    except OSError:  # the working folder was deleted
        pass
    return "zh_CN" if any("zh-CN" in Path(p).parts for p in places if p) else "en"


def _read_catalogue(text: str) -> dict:
    """msgid -> msgstr of the translated, non-fuzzy entries of PO ``text`` (gpucourse.i18n writes and checks it)."""
    table: dict = {}
    entry: dict = {}
    key = None
    for line in text.splitlines() + [""]:
        line = line.strip()
        if not line:
            if entry.get("msgid") and entry.get("msgstr") and not entry.get("fuzzy"):
                table[entry["msgid"]] = entry["msgstr"]
            entry, key = {}, None
        elif line.startswith("#"):  # comments, flags, obsolete entries (#~)
            entry["fuzzy"] = entry.get("fuzzy") or (line.startswith("#,") and "fuzzy" in line)
        elif line.split(" ", 1)[0] in ("msgctxt", "msgid", "msgstr"):
            key, _, rest = line.partition(" ")
            entry[key] = json.loads(rest)
        elif line.startswith('"') and key:
            entry[key] += json.loads(line)
    return table


def _catalogue(lang: str) -> dict:
    if lang not in _CATALOGUES:
        try:
            _CATALOGUES[lang] = _read_catalogue((LOCALE_DIR / f"{lang}.po").read_text(encoding="utf-8"))
        except (OSError, ValueError):  # no catalogue (an install without it), or an unreadable one: English
            _CATALOGUES[lang] = {}
    return _CATALOGUES[lang]


def tr(msgid: str, **fields) -> str:
    """``msgid`` in the learner's :func:`language`, then ``str.format(**fields)`` if fields are given.

    A message without a translation, or with a translation whose fields do not fit, stays English.
    """
    text = msgid if language() == "en" else _catalogue(language()).get(msgid, msgid)
    if not fields:
        return text
    try:
        return text.format(**fields)
    except (KeyError, IndexError, ValueError):
        return msgid.format(**fields)
