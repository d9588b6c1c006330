"""Generate ``labs/`` from ``solutions/``: one source of truth for every lab.

Markers in a solution notebook:

``### BEGIN SOLUTION`` ... ``### END SOLUTION``
    In code cells: the lines between are removed from the lab. Lines inside
    the region written as ``# STUB: <code>`` become ``<code>`` in the lab
    (e.g. ``# STUB: answer = None``). A region without STUB lines becomes
    ``raise NotImplementedError("TODO")``. The stub keeps the marker's indentation.
    In markdown cells the region is simply removed.
``<!-- SOLUTION ONLY -->`` anywhere in a markdown cell
    The whole cell is left out of the lab.
``# NBVAL_CHECK_OUTPUT``
    Removed in the lab: labs are stored without outputs.
``(solution)`` in the first heading
    Becomes ``(lab)``; the Colab and Kaggle badges are pointed at the lab.

Outputs and execution counts are cleared, and the notebook metadata gets
``"gpucourse": {"lab": "NN", "kind": "lab"}`` so the grader knows the lab.

    python -m gpucourse.labgen            # write labs/ from solutions/
    python -m gpucourse.labgen --check    # exit 1 if labs/ is out of date
    python -m gpucourse.labgen --only 03  # just one lab (others may be mid-edit)
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

__all__ = ["generate_lab", "lab_path_for", "strip_solution", "main"]

BEGIN, END, STUB = "### BEGIN SOLUTION", "### END SOLUTION", "# STUB:"
SOLUTION_ONLY = "<!-- SOLUTION ONLY -->"
ROOT = Path(__file__).resolve().parents[2]


def strip_solution(source: str, markdown: bool = False, where: str = "") -> str:
    """Replace every solution region of one cell's source by its stub."""
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    for n, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if region is not None:
                raise ValueError(f"{where} line {n}: nested {BEGIN}")
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if region is None:
                raise ValueError(f"{where} line {n}: {END} without {BEGIN}")
            if not markdown:
                stubs = [r.strip()[len(STUB):].strip() for r in region if r.strip().startswith(STUB)]
                out += [indent + s for s in stubs] or [indent + 'raise NotImplementedError("TODO")']
            region = None
        elif region is not None:
            region.append(line)
        elif stripped != "# NBVAL_CHECK_OUTPUT":
            out.append(line)
    if region is not None:
        raise ValueError(f"{where}: {BEGIN} without {END}")
    return "\n".join(out)


def lab_path_for(solution: Path) -> Path:
    """solutions/01_device_detection.ipynb -> labs/01_device_detection.ipynb"""
    return solution.parent.parent / "labs" / solution.name


def generate_lab(solution: Path):
    """Return the lab notebook (an nbformat node) generated from ``solution``."""
    import nbformat

    nb = nbformat.read(solution, as_version=4)
    m = re.match(r"(\d\d)_", solution.name)
    if not m:
        raise ValueError(f"{solution.name}: solution names must start with the lab number, e.g. 01_...")
    lab = copy.deepcopy(nb)
    cells = []
    for i, cell in enumerate(nb.cells, 1):
        if cell.cell_type == "markdown" and SOLUTION_ONLY in cell.source:
            continue
        new = copy.deepcopy(cell)
        new.source = strip_solution(cell.source, markdown=cell.cell_type == "markdown",
                                    where=f"{solution.name} cell {i}")
        if cell.cell_type == "code":
            new.outputs, new.execution_count = [], None
            new.metadata.pop("execution", None)
        cells.append(new)
    if cells and cells[0].cell_type == "markdown":
        from ..colab import colab_url, kaggle_url

        title = cells[0].source.replace("(solution)", "(lab)", 1)
        for url in (colab_url, kaggle_url):
            title = title.replace(url(f"solutions/{solution.name}"), url(f"labs/{solution.name}"))
        cells[0].source = title
    lab.cells = cells
    lab.metadata["gpucourse"] = {"lab": m.group(1), "kind": "lab"}
    lab.metadata.pop("widgets", None)
    return lab


def render(nb) -> str:
    """The exact text a notebook is stored as (what ``--check`` compares)."""
    import nbformat

    return nbformat.writes(nb) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucourse.labgen", description="Generate labs/ from solutions/.")
    ap.add_argument("--check", action="store_true", help="only report labs that differ; exit 1 if any")
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    ap.add_argument("--only", metavar="NN", help="only the lab with this number, e.g. 03")
    a = ap.parse_args(argv)
    pattern = f"{a.only.zfill(2)}_*.ipynb" if a.only else "[0-9][0-9]_*.ipynb"
    solutions = sorted((a.root / "solutions").glob(pattern))
    if a.only and not solutions:
        ap.error(f"no solution notebook matches solutions/{pattern}")
    stale = []
    for sol in solutions:
        text = render(generate_lab(sol))
        dest = lab_path_for(sol)
        if not dest.is_file() or dest.read_text() != text:
            stale.append(dest)
            if not a.check:
                dest.parent.mkdir(exist_ok=True)
                dest.write_text(text)
    for p in stale:
        print(("out of date: " if a.check else "wrote ") + str(p.relative_to(a.root)))
    if a.check and stale:
        print("run `make labs` (python -m gpucourse.labgen) to regenerate them from solutions/")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
