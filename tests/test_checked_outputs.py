"""tests/checked_outputs.py: nbval's comparison of checked cells, applied to a notebook run elsewhere."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import IPyNbFile

from tests.checked_outputs import SKIP_COMPARE, checked_cells, differences

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "notebooks" / "02_placement_logging.ipynb"


@pytest.fixture
def stored():
    return nbformat.read(TUTORIAL, as_version=4)


def _stdout(cell):
    return next(o for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _nbval_file(request) -> IPyNbFile:
    return IPyNbFile.from_parent(request.session, path=TUTORIAL)


def test_same_cells_and_keys_as_nbval(request, stored):
    """The cells compared and the keys left out are nbval's own (plus stderr, as tests/nbval_hooks.py adds)."""
    nbval_file = _nbval_file(request)
    assert set(SKIP_COMPARE) == set(nbval_file.skip_compare) | {"stderr"}
    checked_by_nbval = [item.cell_num for item in nbval_file.collect() if item.options["check"]]
    code = [i for i, c in enumerate(stored.cells) if c.cell_type == "code"]
    assert [code.index(i) for i in checked_cells(stored)] == checked_by_nbval
    assert len(checked_by_nbval) >= 5


def test_an_identical_run_has_no_differences(stored):
    assert differences(TUTORIAL, copy.deepcopy(stored)) == []


def test_a_changed_checked_output_is_reported(stored):
    live = copy.deepcopy(stored)
    i = next(i for i in checked_cells(stored) if any(o.output_type == "stream" for o in stored.cells[i].outputs))
    _stdout(live.cells[i]).text = _stdout(live.cells[i]).text.replace("True", "False", 1)
    found = differences(stored, live)
    assert len(found) == 1 and "Cell outputs differ" in found[0] and "mismatch 'stdout'" in found[0]
    assert stored.cells[i].source in found[0]


def test_what_nbval_ignores_is_ignored(stored):
    """Unchecked cells, stderr, timings (the sanitiser) and widget ids do not count; a missing output does."""
    live = copy.deepcopy(stored)
    checked = checked_cells(stored)
    unchecked = next(i for i, c in enumerate(stored.cells) if c.cell_type == "code" and i not in checked and c.outputs)
    live.cells[unchecked].outputs = []
    i = next(i for i in checked if any(o.output_type == "stream" for o in stored.cells[i].outputs))
    live.cells[i].outputs.append(nbformat.v4.new_output("stream", name="stderr", text="I0000 a log line\n"))
    _stdout(live.cells[i]).text += ""  # unchanged
    assert differences(stored, live) == []
    live.cells[i].outputs = [o for o in live.cells[i].outputs if o.name != "stdout"]
    assert len(differences(stored, live)) == 1


def test_timings_are_sanitised(stored):
    live, ref = copy.deepcopy(stored), copy.deepcopy(stored)
    i = checked_cells(stored)[0]
    ref.cells[i].outputs = [nbformat.v4.new_output("stream", name="stdout", text="took 12.5 ms\n")]
    live.cells[i].outputs = [nbformat.v4.new_output("stream", name="stdout", text="took 3 ms\n")]
    assert differences(ref, live) == []


def test_a_cell_not_run_or_other_cells_are_reported(stored):
    live = copy.deepcopy(stored)
    live.cells[checked_cells(stored)[0]].execution_count = None
    assert "not run" in differences(stored, live)[0]
    live = copy.deepcopy(stored)
    live.cells[checked_cells(stored)[0]].source += "\nprint(1)"
    assert "not the stored notebook's" in differences(stored, live)[0]
