"""The notebook slicer the browser test uses (tests/notebook_slice.py): pure Python, no kernel, no browser."""

from pathlib import Path

import nbformat
import pytest

from tests.notebook_slice import WIDGET_VIEW, cell_names, slice_cells, sliced_copy, strip_magics, target_cells

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_names_read_before_bound_are_needed_and_local_ones_are_not():
    defines, reads = cell_names("import numpy as np\nx = np.ones(3)\ny = x + z\n")
    assert defines == {"np", "x", "y"}
    assert reads == {"z"}  # np and x come from this cell


def test_function_bodies_read_module_names_but_not_their_own_locals():
    defines, reads = cell_names("def f(a):\n    b = a * scale\n    return b + offset\n")
    assert defines == {"f"}
    assert reads == {"scale", "offset"}
    assert cell_names("g = lambda t: t * k\n")[1] == {"k"}
    assert cell_names("out = [v * w for v in data]\n")[1] == {"w", "data"}
    assert cell_names("def f():\n    global counter\n    counter = 1\n")[0] == {"f", "counter"}


def test_changing_an_object_in_place_defines_it_again():
    assert cell_names("runs['a'] = 1")[0] == {"runs"}
    assert cell_names("cfg.depth = 3")[0] == {"cfg"}
    assert cell_names("facts.update(x=1)")[0] == {"facts"}
    # a method call on a module changes nothing the slice tracks
    assert cell_names("plt.show()", modules={"plt"})[0] == set()
    assert cell_names("import matplotlib.pyplot as plt\nplt.show()")[0] == {"plt"}


def test_magics_are_blanked_and_unparseable_cells_are_none():
    assert strip_magics("if x:\n    %pip install y\nz = 1") == "if x:\n    pass\nz = 1"
    assert cell_names("%load_ext tensorboard\n!ls\nlog = 'x'\n") == ({"log"}, set())
    assert cell_names("x = (") is None


def test_slice_follows_def_use_chains_transitively():
    sources = ["setup()",             # 0: always kept
               "a = 1",               # 1: superseded by 3
               "unrelated = 5",       # 2
               "a = 2\nb = 10",       # 3
               "b += a",              # 4: reads and changes b
               "c = b * 2",           # 5
               "print(unrelated)",    # 6
               "show(c)"]             # 7: the target
    assert slice_cells(sources, [7]) == {0, 3, 4, 5, 7}


def test_slice_keeps_in_place_changes_and_unparseable_cells():
    sources = ["setup()", "runs = {}", "runs['x'] = 1", "show(runs)"]
    assert slice_cells(sources, [3]) == {0, 1, 2, 3}
    # a cell that does not parse might define anything: kept when a later kept cell reads a name past it
    sources = ["setup()", "runs = {}", "%%bash\necho (", "show(runs)", "%%html\n<b"]
    assert slice_cells(sources, [3]) == {0, 1, 2, 3}
    assert slice_cells(sources, [4]) == {0, 2, 4}
    assert slice_cells(["setup()", "x = ("], [1]) == {0, 1}


def _code(src, outputs=()):
    return nbformat.v4.new_code_cell(src, outputs=list(outputs))


def test_targets_are_widget_outputs_and_explorer_code():
    widget = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "m"}, "text/plain": "VBox()"})
    cells = [_code("setup()"), _code("monitor_run()", [widget]), _code("plt.show()"),
             _code("x = topic.fusion_explorer()"), _code("# explorer in a comment only\ny = 1")]
    assert target_cells(cells) == [1, 3]


def test_sliced_copy_clears_only_the_kept_cells():
    plot = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T"), _code("setup()"),
                                         _code("x = 1"), _code("plot()", [plot]), _code("e = Explorer(x)")])
    nb.cells[3].execution_count = 3
    nb.metadata["widgets"] = {"state": {}}
    sliced, kept = sliced_copy(nb)
    assert kept == [1, 2, 4]
    assert sliced.cells[3].outputs == [plot] and sliced.cells[3].execution_count == 3
    assert all(sliced.cells[i].outputs == [] for i in kept)
    assert "widgets" not in sliced.metadata and "widgets" in nb.metadata  # the original is untouched
    assert [c.source for c in sliced.cells] == [c.source for c in nb.cells]


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_every_tutorial_slice_keeps_setup_and_every_widget(path):
    nb = nbformat.read(path, as_version=4)
    _, kept = sliced_copy(nb)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    widgets = [i for i in code if any(WIDGET_VIEW in o.get("data", {}) for o in nb.cells[i].outputs)]
    assert kept[0] == code[0], "the setup cell must run first"
    assert set(widgets) <= set(kept)
    assert all(cell_names(nb.cells[i].source) is not None for i in code), "a tutorial cell does not parse"
    assert len(kept) <= len(code) // 2, f"the slice keeps {len(kept)} of {len(code)} code cells"
