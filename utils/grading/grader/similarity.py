"""Find similar submissions in a batch, for a human to review: ``similarity.csv`` and ``similarity.html``.

What is compared: the code cells of each learner's notebook, in notebook order, with every other
learner's and with the lab's public solution (``solutions/NN_*.ipynb``). The comparison is
copydetect's (https://github.com/blingenf/copydetect): winnowing fingerprints (Schleimer, Wilkerson
and Aiken, SIGMOD 2003) of the code after Pygments has tokenized it, with every name replaced by
``V``/``F``/``O``, every string by ``S`` and comments and whitespace dropped. So renaming variables and
functions, rewording comments and messages or moving cells around does not hide a copy, while two
different ways to write an answer share only short idioms. The lab's template (the code cells of
``labs/NN_*.ipynb``, as every learner got them) never counts: its lines (whitespace aside) are left out
of every document, so no fingerprint runs from given code into an answer, and it is copydetect's
*boilerplate*, so a fingerprint that occurs in it is dropped. Two labs nobody touched score 0.

For a pair (a, b), ``share_a`` is the fraction of a's fingerprinted code (template left out) that also
occurs in b, ``share_b`` the other way round, and ``score`` the larger of the two; ``shared_tokens`` is
copydetect's count of what they share, in characters of tokenized code. A pair is listed when
its score is above ``threshold`` (default :data:`DEFAULT_THRESHOLD`, 0.6). Every fingerprint is kept
(copydetect's noise and guarantee thresholds are equal, window 1), so the same batch always gives the
same pairs and scores.

:func:`write_similarity` is what ``gpucourse-grade <folder>`` calls once every kernel is dead and
before the results are sealed: it writes ``similarity.csv`` (one row per pair: the two names, the
scores, the shared token count and the shared lines of each side, as ``cell N line M: code``; cells
count from 1 over all the notebook's cells) and copydetect's HTML report ``similarity.html`` (both
sides of every pair, shared code highlighted). These are flags for a human: nothing here reads or
changes a score. copydetect is imported lazily; without it (or if anything here fails) the grader says
so and grades the batch as before, without a similarity report.
"""

from __future__ import annotations

import csv
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..._validate import real

__all__ = ["CSV_NAME", "DEFAULT_THRESHOLD", "HTML_NAME", "INSTALL", "SOLUTION", "Pair",
           "find_similar", "find_solution", "notebook_cells", "write_similarity"]

#: Pairs whose score (the larger share) is above this are listed.
DEFAULT_THRESHOLD = 0.6
#: The length, in characters of tokenized code, of a fingerprint (copydetect's default noise threshold).
NOISE = 25
#: How the public solution is named in the report.
SOLUTION = "(public solution)"
CSV_NAME, HTML_NAME = "similarity.csv", "similarity.html"
#: The dependency line (pyproject's ``[project.optional-dependencies]`` / ``pip install``).
INSTALL = "copydetect>=0.5,<0.6"
#: Code beyond this many characters of one notebook is not compared (a padded notebook cannot stall the grader).
MAX_CHARS = 200_000
#: The repository this package is in (``utils/grading/grader/`` is three folders below it).
ROOT = Path(__file__).resolve().parents[3]
HEADER = ["learner_a", "learner_b", "score", "share_a", "share_b", "shared_tokens", "shared_lines_a",
          "shared_lines_b"]


@dataclass(frozen=True)
class Pair:
    """Two submissions with code in common: ``a`` < ``b`` (the public solution is always ``b``)."""

    a: str
    b: str
    share_a: float
    share_b: float
    shared_tokens: int
    lines_a: tuple[str, ...]
    lines_b: tuple[str, ...]

    @property
    def score(self) -> float:
        return max(self.share_a, self.share_b)

    def row(self) -> list:
        return [self.a, self.b, f"{self.score:.3f}", f"{self.share_a:.3f}", f"{self.share_b:.3f}",
                self.shared_tokens, "\n".join(self.lines_a), "\n".join(self.lines_b)]


def notebook_cells(source) -> list[tuple[int, str]]:
    """``(cell number, code)`` of every code cell, numbered from 1 over all cells.

    ``source`` is a notebook path, a notebook (``nbformat`` node or dict), or a list of code strings
    (numbered 1, 2, ...). Raises ``ValueError`` naming the file if it is not a notebook.
    """
    if isinstance(source, (list, tuple)):
        return [(i, str(code)) for i, code in enumerate(source, 1)]
    if isinstance(source, (str, Path)):
        import nbformat

        try:
            source = nbformat.read(Path(source), as_version=4)
        except Exception as exc:
            raise ValueError(f"{source} is not a readable notebook: {type(exc).__name__}: {exc}") from None
    if not isinstance(source, dict) or not isinstance(source.get("cells"), list):
        raise TypeError(f"source must be a notebook path, a notebook or a list of code strings, got "
                        f"{type(source).__name__}")
    out = []
    for i, cell in enumerate(source["cells"], 1):
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            code = cell.get("source", "")
            out.append((i, "".join(code) if isinstance(code, list) else str(code)))
    return out


class _Code:
    """One document: the code cells joined, lines given by the template left out, and where each line came from."""

    def __init__(self, name: str, cells: list[tuple[int, str]], given: frozenset = frozenset()):
        self.name = name
        parts, self.lines, at = [], [], 0  # lines: (start, end, "cell N line M: code")
        for number, code in cells:
            for m, line in enumerate(code.split("\n"), 1):
                if _key(line) in given:  # the template's own line, as given
                    continue
                if at + len(line) > MAX_CHARS:  # the rest of this notebook is not compared
                    break
                parts.append(line)
                self.lines.append((at, at + len(line), f"cell {number} line {m}: {line.rstrip()}"))
                at += len(line) + 1
            else:
                continue
            break
        self.text = "\n".join(parts)

    @property
    def keys(self) -> frozenset:
        return frozenset(_key(self.text[s:e]) for s, e, _ in self.lines) - {""}

    def shared(self, slices) -> tuple[str, ...]:
        """The non-blank lines that overlap copydetect's copied slices (start and end arrays)."""
        spans = sorted(zip((int(s) for s in slices[0]), (int(e) for e in slices[1])))
        return tuple(label for start, end, label in self.lines
                     if self.text[start:end].strip() and any(s < end and e > start for s, e in spans))


def _key(line: str) -> str:
    return "".join(line.split())


def _documents(notebooks: dict, template, solution) -> tuple[list[_Code], _Code | None]:
    """Each learner's code (then the solution's), template lines left out; and the template's code."""
    if not isinstance(notebooks, dict):
        raise TypeError(f"notebooks must be a dict {{learner: notebook}}, got {type(notebooks).__name__}")
    given = _Code("template", notebook_cells(template)) if template is not None else None
    keys = given.keys if given else frozenset()
    codes = [_Code(str(name), notebook_cells(nb), keys) for name, nb in sorted(notebooks.items())]
    if solution is not None:
        codes.append(_Code(SOLUTION, notebook_cells(solution), keys))
    return codes, given


def _fingerprint(copydetect, code: _Code, boilerplate):
    return copydetect.CodeFingerprint(f"{code.name}.py", NOISE, 1, boilerplate, language="python",
                                      fp=io.StringIO(code.text))


def find_similar(notebooks: dict, template=None, solution=None, threshold: float = DEFAULT_THRESHOLD) -> list[Pair]:
    """The pairs of ``notebooks`` (``{learner: notebook}``, see :func:`notebook_cells`) scoring above ``threshold``.

    ``template``: the lab as given to learners (its lines are left out and its fingerprints are
    copydetect's boilerplate); ``solution``: the public solution, compared with every learner as
    :data:`SOLUTION`. Sorted by score, highest first. Needs copydetect (``ImportError`` naming the
    install line otherwise).
    """
    threshold = _threshold(threshold)
    codes, given = _documents(notebooks, template, solution)
    return _compare(codes, given, threshold)


def _threshold(value) -> float:
    return real("threshold", value, 0.0, 1.0, what="the share of a submission's code found in another, 0 to 1")


def _compare(codes: list[_Code], given: _Code | None, threshold: float) -> list[Pair]:
    copydetect = _import_copydetect()
    import numpy as np

    boilerplate = np.array([], dtype=np.int64)
    if given is not None:
        boilerplate = np.array(sorted(_fingerprint(copydetect, given, None).hashes), dtype=np.int64)
    prints = [_fingerprint(copydetect, c, boilerplate) for c in codes]
    pairs = []
    for i, (a, fa) in enumerate(zip(codes, prints)):
        for b, fb in zip(codes[i + 1:], prints[i + 1:]):
            tokens, (share_a, share_b), (slices_a, slices_b) = copydetect.compare_files(fa, fb)
            if max(share_a, share_b) > threshold:
                pairs.append(Pair(a.name, b.name, float(share_a), float(share_b), int(tokens),
                                  a.shared(slices_a), b.shared(slices_b)))
    return sorted(pairs, key=lambda p: (-round(p.score, 3), p.a, p.b))


def find_solution(lab: str | None) -> Path | None:
    """The lab's public solution notebook (``solutions/NN_*.ipynb`` next to the package), if present."""
    if not lab:
        return None
    found = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
    return found[0] if found else None


def write_similarity(submissions, out, lab: str | None = None, threshold: float = DEFAULT_THRESHOLD,
                     echo=print) -> list[Pair] | None:
    """Write ``similarity.csv`` and ``similarity.html`` for a batch into ``out``; never raises.

    ``submissions``: ``(learner, notebook path)`` pairs (unreadable notebooks are skipped and named);
    ``lab`` (e.g. ``"03"``; default: from the notebooks) picks the template and the public solution.
    Returns the pairs listed, or ``None`` when there is no report (the reason is echoed): copydetect
    missing, or anything failing here. Old reports in ``out`` are removed first, so a report on disk
    is always this batch's.
    """
    out = Path(out)
    for name in (CSV_NAME, HTML_NAME):
        (out / name).unlink(missing_ok=True)
    try:
        _import_copydetect()
    except ImportError as exc:
        echo(f"similarity report skipped: {exc}")
        return None
    try:
        return _write(list(submissions), out, lab, threshold, echo)
    except Exception as exc:  # a flag for a human must never cost the batch its grades
        for name in (CSV_NAME, HTML_NAME):
            (out / name).unlink(missing_ok=True)
        echo(f"similarity report skipped: it failed with {type(exc).__name__}: {exc}")
        return None


def _write(submissions, out: Path, lab, threshold, echo) -> list[Pair]:
    from .runner import find_template, lab_of

    notebooks, skipped, labs = {}, [], []
    for learner, path in submissions:
        if path is None:
            continue
        try:
            notebooks[str(learner)] = nb = _read(path)
        except ValueError:
            skipped.append(str(learner))
            continue
        labs += [lab_of(nb, path)] if lab_of(nb, path) else []
    if skipped:
        echo(f"similarity: not compared (not a readable notebook): {', '.join(skipped)}")
    if lab is None and labs:  # the batch's most common lab
        lab = max(sorted(set(labs)), key=labs.count)
    template, solution = find_template(lab), find_solution(lab)
    if template is None:
        echo(f"similarity: no template for lab {lab} (labs/{lab}_*.ipynb): its given code counts as shared")
    if solution is None:
        echo(f"similarity: no public solution for lab {lab} (solutions/{lab}_*.ipynb): learners compared "
             f"with each other only")
    codes, given = _documents(notebooks, template, solution)
    pairs = _compare(codes, given, threshold)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / CSV_NAME, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        w.writerows(p.row() for p in pairs)
    html = _html(codes, given, threshold)
    if html is not None:
        (out / HTML_NAME).write_text(html, encoding="utf-8")
    listed = ", ".join(f"{p.a}~{p.b} {p.score:.2f}" for p in pairs[:5]) + (" ..." if len(pairs) > 5 else "")
    echo(f"similarity: {len(pairs)} pair(s) above {threshold:g} in {out / CSV_NAME}"
         + (f": {listed}" if pairs else "") + " (flags for review; no score changed)")
    return pairs


def _read(path):
    import nbformat

    try:
        return nbformat.read(Path(path), as_version=4)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable notebook: {exc}") from None


def _html(codes: list[_Code], given: _Code | None, threshold: float) -> str | None:
    """copydetect's own HTML report of the same documents and thresholds (``None`` with fewer than two)."""
    copydetect = _import_copydetect()
    if len(codes) < 2:
        return None
    with tempfile.TemporaryDirectory(prefix="gpucourse-similarity-") as tmp:
        root = Path(tmp)
        det = copydetect.CopyDetector(noise_t=NOISE, guarantee_t=NOISE, display_t=threshold, autoopen=False,
                                      silent=True, force_language="python", out_file=str(root / HTML_NAME))
        for code in codes:  # every document is compared both ways, as in the CSV
            path = _file_name(root, code.name)
            path.write_text(code.text, encoding="utf-8")
            det.add_file(str(path), type="testref")
        if given is not None:
            (root / "template").mkdir()
            path = root / "template" / "template.py"
            path.write_text(given.text, encoding="utf-8")
            det.add_file(str(path), type="boilerplate")
        det.test_files.sort()
        det.ref_files.sort()
        det.run()
        html = det.generate_html_report(output_mode="return")
    return html.replace(str(root) + "/", "") if html else None


def _file_name(folder: Path, learner: str) -> Path:
    """``folder/<learner>.py``, the name made safe for a file and distinct from the others."""
    stem = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in learner).strip("._") or "learner"
    path, n = folder / f"{stem}.py", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}~{n}.py"
    return path


def _import_copydetect():
    try:
        import copydetect
    except ImportError as exc:
        raise ImportError(f"the similarity report needs copydetect, which is not installed ({exc}); install it "
                          f"with: pip install '{INSTALL}'") from None
    return copydetect
