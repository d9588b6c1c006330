"""The explorer scaffolding: validation, remembered state, widgets built and updated, static fallback."""

import pytest

from gpucourse import explore
from gpucourse.explore import Explorer, View, checkbox, dropdown, slider


def _update(n=4, on=True, mode="a"):
    return View(f"n={n} on={on} mode={mode}")


def _explorer(name, **kw):
    return Explorer(name, _update, [slider("n", 1, 10, 4), checkbox("on", True), dropdown("mode", ["a", "b"])], **kw)


def test_controls_validate():
    with pytest.raises(ValueError, match="low must be < high"):
        slider("n", 5, 1, 3)
    with pytest.raises(ValueError, match="n must be <= 10"):
        slider("n", 1, 10, 11)
    with pytest.raises(ValueError, match="must be one of"):
        dropdown("m", ["a"], "z")
    with pytest.raises(TypeError):
        checkbox("c", 1)
    assert slider("x", 0.0, 1.0, 0.5).kind == "float" and slider("k", 1, 9, 3).kind == "int"


def test_render_remembers_values_across_reruns():
    ex = _explorer("t-remember")
    assert ex.render({"n": 7}).text == "n=7 on=True mode=a"
    again = _explorer("t-remember")  # the cell is run again: same name, fresh object
    assert again.values == {"n": 7, "on": True, "mode": "a"} == explore.state_of("t-remember")
    with pytest.raises(ValueError, match="unknown control"):
        again.render({"m": 1})
    with pytest.raises(ValueError):
        again.render({"n": 0})


def test_update_must_return_a_view():
    ex = Explorer("t-bad", lambda n=1: "text", [slider("n", 1, 3, 1)])
    with pytest.raises(TypeError, match="must return a View"):
        ex.render()


def test_widgets_update_on_change_and_show_errors():
    pytest.importorskip("ipywidgets")
    ex = _explorer("t-widget")
    box = ex._build(__import__("ipywidgets"))
    status = box.children[0]
    assert "gpucourse-explorer" in box._dom_classes and "update 1" in status.value
    slider_widget = ex.inputs["n"]
    assert box.children[1].children[0].children == (box.children[1].children[0].children[0], slider_widget)
    slider_widget.value = 9
    assert "update 2" in status.value and "n=9" in status.value
    assert explore.state_of("t-widget")["n"] == 9


def test_labels_sit_above_controls_of_one_width_in_a_grid():
    """A label beside a slider squeezed its track to 1 px: labels go above, every control is CONTROL_WIDTH wide."""
    w = pytest.importorskip("ipywidgets")
    ex = Explorer("t-layout", _update, [slider("n", 1, 10, 4, label="a long label " * 5), checkbox("on", True),
                                        dropdown("mode", ["a", "b"])])
    box = ex._build(w)
    grid = box.children[1]
    assert isinstance(grid, w.GridBox) and explore.CONTROL_WIDTH in grid.layout.grid_template_columns
    slider_cell = grid.children[0]
    label, ctl = slider_cell.children
    assert "a long label" in label.value and ctl is ex.inputs["n"]
    assert ctl.description == "" and ctl.layout.width == explore.CONTROL_WIDTH
    assert ex.inputs["mode"].layout.width == explore.CONTROL_WIDTH
    assert grid.children[1] is ex.inputs["on"] and ex.inputs["on"].description == "on"


def test_manual_explorer_updates_on_run_only():
    pytest.importorskip("ipywidgets")
    ex = _explorer("t-manual", manual=True)
    box = ex._build(__import__("ipywidgets"))
    ex.inputs["n"].value = 2
    assert ex.updates == 1  # not re-run by the slider
    ex.inputs["Run"].click()
    assert ex.updates == 2 and "n=2" in box.children[0].value


def test_static_fallback_prints_current_values_and_presets(monkeypatch, capsys):
    monkeypatch.setenv("GPUCOURSE_STATIC", "1")
    ex = _explorer("t-static", presets=[{"n": 2}, {"mode": "b"}])
    assert ex.show() is None
    out = capsys.readouterr().out
    assert "n=4 on=True mode=a" in out and "n=2 on=True mode=a" in out and "n=4 on=True mode=b" in out


def test_a_graded_run_measures_nothing(monkeypatch, capsys):
    monkeypatch.setenv("GPUCOURSE_GRADING", "1")
    ex = _explorer("t-graded", presets=[{"n": 2}])
    assert ex.show() is None and ex.updates == 0 and ex.widget is None
    assert "not run while grading" in capsys.readouterr().out
