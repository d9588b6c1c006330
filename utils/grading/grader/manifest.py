"""Seal the grader's results, and find any change made to them later: ``gpucourse-grade verify OUT/``.

:func:`seal` is the last thing the grader writes: ``MANIFEST.json`` beside the results, with the
SHA-256 of every result file and an HMAC-SHA256 of that list, keyed by a secret of the machine's
grading account (:func:`key_path`: ``$GPUCOURSE_GRADING_KEY``, else
``~/.config/gpucourse/grading.key``, made on first use, mode 0600). The sandboxed kernel never
sees the key (it is mounted over, and belongs to another user). :func:`verify` recomputes every
digest and the HMAC and names each result file that was changed, removed or added, a manifest
that was rewritten without the key, and every *practice* grade in the folder (:func:`practice_marks`:
a mark from a kernel that was not isolated enough is not one to upload).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from .report import is_practice

__all__ = ["MANIFEST", "key_path", "practice_marks", "seal", "verify"]

MANIFEST = "MANIFEST.json"
KEY_ENV = "GPUCOURSE_GRADING_KEY"


def key_path() -> Path:
    """Where this machine's grading key lives (``$GPUCOURSE_GRADING_KEY`` or ``~/.config/gpucourse/grading.key``)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    return Path("~/.config/gpucourse/grading.key").expanduser()


def _key(create: bool) -> bytes | None:
    path = key_path()
    if not path.is_file():
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip().encode()


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mac(key: bytes, files: dict, complete: bool) -> str:
    body = json.dumps({"files": files, "complete": complete}, sort_keys=True).encode()
    return hmac.new(key, body, "sha256").hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name != MANIFEST)


def seal(folder: Path | str, files=None) -> Path:
    """Write ``folder/MANIFEST.json`` for every file in ``folder`` (or only ``files``, added to a valid manifest)."""
    folder = Path(folder)
    key = _key(create=True)
    if files is None:
        names, complete = _files(folder), True
        listed = {}
    else:
        names, complete = [Path(f).resolve().relative_to(folder.resolve()).as_posix() for f in files], False
        listed = {}
        if not verify(folder) and (folder / MANIFEST).is_file():  # keep what an intact manifest lists
            listed = json.loads((folder / MANIFEST).read_text())["files"]
    listed.update({name: _digest(folder / name) for name in names})
    manifest = {"algorithm": "sha256", "complete": complete, "files": listed,
                "hmac": _mac(key, listed, complete)}
    out = folder / MANIFEST
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    return out


def verify(folder: Path | str) -> list[str]:
    """What changed in ``folder`` since it was sealed, one line per file, then one line per practice grade
    (:func:`practice_marks`); empty: intact, and every grade in it is a mark to upload."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return [f"{path}: missing (the grader writes it last; without it nothing can be checked)"]
    try:
        manifest = json.loads(path.read_text())
        files, complete, mac = dict(manifest["files"]), bool(manifest["complete"]), str(manifest["hmac"])
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path}: unreadable ({type(exc).__name__}: {exc})"]
    problems = []
    key = _key(create=False)
    if key is None:
        problems.append(f"{path}: cannot be authenticated: no grading key at {key_path()} "
                        f"(set {KEY_ENV} to the key file of the machine that graded)")
    elif not hmac.compare_digest(mac, _mac(key, files, complete)):
        problems.append(f"{path}: changed after grading (its HMAC does not match the grading key)")
    for name, want in sorted(files.items()):
        p = folder / name
        if not p.is_file():
            problems.append(f"{p}: removed after grading")
        elif _digest(p) != want:
            problems.append(f"{p}: changed after grading")
    if complete:
        problems += [f"{folder / name}: added after grading" for name in _files(folder) if name not in files]
    return problems + practice_marks(folder)


def practice_marks(folder: Path | str) -> list[str]:
    """One line per submission graded as *practice* in ``folder`` (its kernel was not isolated enough for a
    mark to upload: see :func:`gpucourse.grading.grader.runner.summative`): the rows of its
    ``gradebook.json``, every single report (``gpucourse-grade x.ipynb --out folder``) beside it, and a
    Gradescope ``results.json`` (its ``extra_data``)."""
    folder = Path(folder)
    found = []
    for path in sorted(folder.glob("*.json")):
        if path.name == MANIFEST:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if path.name == "gradebook.json" and isinstance(data, list):
            rows = data
        elif isinstance(data, dict) and isinstance(data.get("extra_data"), dict):  # Gradescope's results.json
            rows = [{**data["extra_data"], "learner": "the submission"}]
        else:
            rows = [data]
        for r in rows:
            if is_practice(r):
                who = r.get("learner") or Path(str(r.get("submission") or path.stem)).name
                found.append(f"{path}: {who} was graded as practice ({r.get('reason') or 'weak isolation'}): "
                             "not a mark to upload; grade again with bubblewrap or in a container per submission")
    return found
