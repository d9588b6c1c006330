"""Compare the checked cells of a notebook run elsewhere with its stored outputs, exactly as nbval does.

`make test` runs every tutorial once, live in JupyterLab (``tests/test_browser.py``), and saves it. This
module then does nbval's own comparison on that saved run: the same cells (``# NBVAL_CHECK_OUTPUT`` or the
``nbval-check-output`` tag, as ``--nbval-lax`` picks them), nbval's own functions to merge streams, sanitise
(``tests/nbval_sanitize.cfg``) and compare, and the same output keys left out (nbval's defaults plus stderr,
as ``tests/nbval_hooks.py`` adds). A tutorial is then executed once per `make test`, not a second time by
nbval; `make test-cpu-paths` and `make test-colab` still run them under nbval itself.
"""

from __future__ import annotations

import copy
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import nbformat
from nbval.plugin import (IPyNbCell, coalesce_streams, find_comment_markers, find_metadata_tags,
                          get_sanitize_patterns, nocolors)

__all__ = ["SANITIZE", "SKIP_COMPARE", "checked_cells", "differences"]

SANITIZE = Path(__file__).resolve().parent / "nbval_sanitize.cfg"

#: What nbval leaves out of the comparison (``IPyNbFile.__init__`` without --nbval-nbdime), plus stderr
#: (``tests/nbval_hooks.py``). ``test_checked_outputs`` checks this against a real nbval collector.
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg", "stderr")


def _options(cell) -> dict:
    """nbval's options for ``cell``: its metadata tags, then its comment markers (``IPyNbFile.collect``)."""
    options = defaultdict(bool, find_metadata_tags(cell.metadata))
    options.update(dict(find_comment_markers(cell.source)))
    return options


def checked_cells(nb) -> list[int]:
    """Indices (in ``nb.cells``) of the code cells nbval compares under --nbval-lax: checked, not skipped, and
    run in the stored notebook."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        opts = _options(cell)
        if opts["check"] and not opts["skip"] and cell.execution_count is not None:
            out.append(i)
    return out


class _Comparer:
    """What nbval's ``IPyNbCell.compare_outputs`` reads of its cell, so that its own code does the comparing."""

    colors = nocolors
    sanitize = IPyNbCell.sanitize
    compare_outputs = IPyNbCell.compare_outputs

    def __init__(self, patterns: dict):
        self.parent = SimpleNamespace(sanitize_patterns=patterns, skip_compare=SKIP_COMPARE)
        self.comparison_traceback: list[str] = []

    def format_output_compare(self, key, left, right):
        self.comparison_traceback += [f" mismatch {key!r}", "  stored:", textwrap.indent(str(left), "    "),
                                      "  live:", textwrap.indent(str(right), "    ")]


def differences(stored, live, sanitize: Path = SANITIZE) -> list[str]:
    """One message per checked cell of ``stored`` whose outputs in ``live`` (the same notebook, run) differ, as
    nbval would report it; ``[]`` when they all agree. Both are notebooks (nbformat nodes or paths)."""
    stored = nbformat.read(stored, as_version=4) if isinstance(stored, (str, Path)) else stored
    live = nbformat.read(live, as_version=4) if isinstance(live, (str, Path)) else live
    if [c.source for c in stored.cells] != [c.source for c in live.cells]:
        return ["the run notebook's cells are not the stored notebook's (different sources or order)"]
    patterns = dict(get_sanitize_patterns(Path(sanitize).read_text()))
    found = []
    code_number = {i: n for n, i in enumerate(i for i, c in enumerate(stored.cells) if c.cell_type == "code")}
    for i in checked_cells(stored):
        ran = live.cells[i]
        if ran.execution_count is None:
            found.append(f"Cell {code_number[i]}: not run\n{stored.cells[i].source}")
            continue
        comparer = _Comparer(patterns)
        if not comparer.compare_outputs(coalesce_streams(copy.deepcopy(ran.outputs)),
                                        coalesce_streams(copy.deepcopy(stored.cells[i].outputs)),
                                        skip_compare=SKIP_COMPARE):
            found.append(f"Cell {code_number[i]} - Cell outputs differ\n{stored.cells[i].source}\n"
                         + "\n".join(comparer.comparison_traceback))
    return found
