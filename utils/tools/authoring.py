"""Authoring tool: build course notebooks from percent-format source, execute and store them.

Course notebooks are ordinary ``.ipynb`` files and can be edited in JupyterLab.
For writing a new one from scratch, percent-format text is quicker::

    # %% [markdown]
    # # 04 Distribution
    # Objective ...
    # %%
    import tensorflow as tf

``build`` turns that into a notebook and inserts, identically everywhere, the
Open-in-Colab badge (after the first heading) and the setup cell (as the
first code cell), so no notebook can forget them.

    python -m gpucourse.authoring build src.py notebooks/04_distribution.ipynb --execute
    python -m gpucourse.authoring execute solutions/04_distribution.ipynb

To edit an existing notebook as text, ``export`` it to percent format (without
the badge and setup cell, which ``build`` adds back), edit, and build again::

    python -m gpucourse.authoring export notebooks/04_distribution.ipynb /tmp/04.py
    python -m gpucourse.authoring build /tmp/04.py notebooks/04_distribution.ipynb --execute
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..colab import SETUP_CELL, badge

__all__ = ["from_percent", "to_percent", "build", "export", "execute", "main"]

ROOT = Path(__file__).resolve().parents[2]
_TF_LOG_LINE = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages|To enable the following instructions|"
                          r".*oneDNN custom operations|.*cpu_feature_guard)")


def from_percent(text: str, rel_path: str, kind: str | None = None):
    """Parse percent-format ``text`` into a notebook for ``rel_path`` (e.g. 'notebooks/01_x.ipynb')."""
    import nbformat

    cells, kind_now, buf = [], None, []

    def flush():
        if kind_now is None:
            return
        body = "\n".join(buf).strip("\n")
        if kind_now == "markdown":
            body = "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif body.strip():
            cells.append(nbformat.v4.new_code_cell(body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind_now, buf = ("markdown" if "[markdown]" in line else "code"), []
        else:
            buf.append(line)
    flush()
    if not cells or cells[0].cell_type != "markdown" or not cells[0].source.startswith("# "):
        raise ValueError("the first cell must be markdown starting with a '# Title' line")
    title, _, rest = cells[0].source.partition("\n")
    cells[0].source = f"{title}\n\n{badge(rel_path)}\n{rest}"
    cells.insert(1, nbformat.v4.new_code_cell(SETUP_CELL))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    m = re.match(r"(\d\d)_", Path(rel_path).name)
    if kind and m:
        nb.metadata["gpucourse"] = {"lab": m.group(1), "kind": kind}
    return nb


def to_percent(nb) -> str:
    """Percent-format text of ``nb`` that :func:`from_percent` turns back into the same cells.

    The badge line of the first cell and the setup cell are left out: ``from_percent`` inserts them.
    """
    from ..colab import SETUP_CELL

    parts = []
    for i, cell in enumerate(nb.cells):
        src = cell.source
        if cell.cell_type == "code":
            if src == SETUP_CELL:
                continue
            parts.append("# %%\n" + src)
            continue
        if i == 0:
            title, _, rest = src.partition("\n")
            rest = rest.lstrip("\n")
            lines = rest.split("\n")
            if lines and lines[0].startswith("[![Open In"):
                lines = lines[1:]
            src = title + "\n" + "\n".join(lines) if lines else title
        body = "\n".join(("# " + ln) if ln else "#" for ln in src.split("\n"))
        parts.append("# %% [markdown]\n" + body)
    return "\n\n".join(parts) + "\n"


def export(src: Path, dest: Path) -> Path:
    """Write ``src`` (a notebook) as percent-format text to ``dest``."""
    import nbformat

    dest.write_text(to_percent(nbformat.read(src, as_version=4)))
    return dest


def build(src: Path, dest: Path) -> Path:
    """Write the notebook built from percent-format ``src`` to ``dest``."""
    import nbformat

    rel = dest.resolve().relative_to(ROOT).as_posix()
    kind = {"solutions": "solution", "labs": "lab"}.get(dest.resolve().parent.name)
    nb = from_percent(src.read_text(), rel, kind)
    nbformat.write(nb, dest)
    return dest


def execute(path: Path, timeout: int = 600) -> Path:
    """Run a notebook in its own folder and store its outputs (TensorFlow's C++ log lines dropped)."""
    import nbformat
    from nbclient import NotebookClient

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.resolve().parent)}}).execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.outputs:
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                out["text"] = "".join(ln for ln in out["text"].splitlines(True) if not _TF_LOG_LINE.match(ln))
                if not out["text"].strip():
                    continue
            kept.append(out)
        cell.outputs = kept
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucourse.authoring")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="percent-format source -> .ipynb")
    b.add_argument("src", type=Path)
    b.add_argument("dest", type=Path)
    b.add_argument("--execute", action="store_true", help="also run it and store outputs")
    x = sub.add_parser("export", help=".ipynb -> percent-format source (badge and setup cell left out)")
    x.add_argument("src", type=Path)
    x.add_argument("dest", type=Path)
    e = sub.add_parser("execute", help="run a notebook and store its outputs")
    e.add_argument("paths", type=Path, nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.src, a.dest)
        if a.execute:
            execute(a.dest)
        print(f"wrote {a.dest}")
    elif a.cmd == "export":
        export(a.src, a.dest)
        print(f"wrote {a.dest}")
    else:
        for p in a.paths:
            execute(p)
            print(f"executed {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
