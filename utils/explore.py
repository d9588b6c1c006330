"""Interactive explorers for the tutorials: controls in, a picture and a line of text out.

An explorer is a pure *update* function plus a list of controls::

    from gpucourse.explore import Explorer, View, slider, checkbox

    def update(batch=64, prefetch=True):           # unit-testable without a browser
        fig = draw_timeline(...)
        return View(f"ratio to the bound: {r:.2f}x", fig)

    Explorer("pipeline", update, [slider("batch", 8, 256, 64, step=8), checkbox("prefetch", True)],
             title="Pipeline builder").show()

* With ipywidgets (7.7 on Colab, 8.x elsewhere; only API common to both is
  used) it shows the controls, a status line and an output area, and calls
  ``update`` whenever a control changes (or when *Run* is pressed, for
  explorers that measure and take a second or more: ``manual=True``).
* It **keeps its state when the cell is re-run**: the last values of each
  named explorer are remembered for the kernel's lifetime.
* Without a widget front end (ipywidgets missing, the course website, a plain
  ``jupyter nbconvert``; or ``GPUCOURSE_STATIC=1``) it falls back to a static
  view: ``update`` run for the current values, plus each ``presets`` entry,
  printed and drawn one after the other.
* While the grader runs a lab (``GPUCOURSE_GRADING=1``) an explorer prints one
  line and measures nothing: nobody sees it, and the grader checks the
  learner's functions, never an explorer.

For the browser test: the root box has the CSS class ``gpucourse-explorer``,
every control ``gpucourse-explorer-control``, the status line
``gpucourse-explorer-status`` (its text changes on every update) and the output
area ``gpucourse-explorer-output``.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import _validate

__all__ = ["CONTROL_WIDTH", "Control", "Explorer", "View", "checkbox", "dropdown", "slider", "state_of"]

#: The width of every slider and dropdown, its label above it: a slider's track keeps at least
#: 150 px beside its readout (the browser test measures it), and a grid puts as many per row as fit.
CONTROL_WIDTH = "320px"

#: Last values of every explorer shown in this kernel, by name (what survives re-running a cell).
_STATE: dict[str, dict[str, Any]] = {}


@dataclass
class View:
    """What an update shows: one line (or a few) of text, and optionally a matplotlib figure."""

    text: str
    figure: Any = None


@dataclass
class Control:
    """One control: ``kind`` is 'int', 'float', 'bool' or 'choice'."""

    name: str
    kind: str
    value: Any
    low: float | None = None
    high: float | None = None
    step: float | None = None
    options: Sequence = field(default_factory=tuple)
    label: str = ""

    def check(self, value):
        """``value`` if it is valid for this control, else TypeError/ValueError naming the control."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise TypeError(f"{self.name} must be True or False, got {value!r}")
            return value
        if self.kind == "choice":
            return _validate.one_of(self.name, value, self.options)
        if self.kind == "int":
            return _validate.whole(self.name, value, int(self.low), int(self.high))
        return _validate.real(self.name, value, self.low, self.high)


def slider(name: str, low, high, value, step=None, label: str = "") -> Control:
    """An int slider if all of ``low, high, value, step`` are ints, else a float slider."""
    _validate.text("name", name)
    nums = [v for v in (low, high, value, step) if v is not None]
    kind = "int" if all(isinstance(v, int) and not isinstance(v, bool) for v in nums) else "float"
    for arg, v in (("low", low), ("high", high), ("value", value)):
        _validate.real(arg, v)
    if not low < high:
        raise ValueError(f"slider {name!r}: low must be < high, got low={low}, high={high}")
    c = Control(name, kind, value, low, high, step if step is not None else (1 if kind == "int" else (high - low) / 100),
                label=label or name)
    c.check(value)
    return c


def checkbox(name: str, value: bool, label: str = "") -> Control:
    """A checkbox (True/False)."""
    _validate.text("name", name)
    c = Control(name, "bool", value, label=label or name)
    c.check(value)
    return c


def dropdown(name: str, options: Sequence, value=None, label: str = "") -> Control:
    """A choice among ``options`` (strings or numbers); ``value`` defaults to the first."""
    _validate.text("name", name)
    options = list(options)
    if not options:
        raise ValueError(f"dropdown {name!r} needs at least one option")
    c = Control(name, "choice", options[0] if value is None else value, options=tuple(options), label=label or name)
    c.check(c.value)
    return c


def state_of(name: str) -> dict[str, Any]:
    """The values the explorer ``name`` last showed in this kernel (empty if never shown)."""
    return dict(_STATE.get(name, {}))


def _widgets():
    if os.environ.get("GPUCOURSE_STATIC") == "1":
        return None
    try:
        import ipywidgets
    except ImportError:
        return None
    return ipywidgets


def _display(obj) -> None:
    from IPython.display import display

    display(obj)


class Explorer:
    """Controls + an ``update(**values) -> View`` function, shown as widgets or as a static fallback."""

    def __init__(self, name: str, update: Callable[..., View], controls: Sequence[Control], title: str = "",
                 manual: bool = False, presets: Sequence[dict] = ()):
        self.name = _validate.text("name", name)
        self.update = _validate.callable_("update", update)
        controls = list(controls)
        if not controls or not all(isinstance(c, Control) for c in controls):
            raise TypeError("controls must be a non-empty list made with slider(), checkbox() or dropdown()")
        names = [c.name for c in controls]
        if len(set(names)) != len(names):
            raise ValueError(f"control names must be unique, got {names}")
        self.controls = controls
        self.title = title or name
        if not isinstance(manual, bool):
            raise TypeError(f"manual must be True or False, got {manual!r}")
        self.manual = manual
        self.presets = [self._merge(p) for p in presets]
        self.updates = 0
        self.widget = None
        self.inputs: dict = {}  # the built controls by name (after show())

    # ------------------------------------------------------------------ values

    def _merge(self, values: dict) -> dict:
        """Defaults, overridden by ``values``; every value checked against its control."""
        if not isinstance(values, dict):
            raise TypeError(f"values must be a dict of control name -> value, got {type(values).__name__}")
        by_name = {c.name: c for c in self.controls}
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise ValueError(f"unknown control(s) {unknown}; this explorer has {sorted(by_name)}")
        return {c.name: c.check(values.get(c.name, c.value)) for c in self.controls}

    @property
    def values(self) -> dict:
        """Current values: what was last shown in this kernel, else the defaults."""
        remembered = {k: v for k, v in _STATE.get(self.name, {}).items() if k in {c.name for c in self.controls}}
        try:
            return self._merge(remembered)
        except (TypeError, ValueError):  # the controls changed since: start from the defaults
            return self._merge({})

    def render(self, values: dict | None = None) -> View:
        """Run ``update`` for ``values`` (merged with the current ones) and remember them. No widgets needed."""
        merged = self._merge({**self.values, **(values or {})})
        view = self.update(**merged)
        if not isinstance(view, View):
            raise TypeError(f"the update function of explorer {self.name!r} must return a View, "
                            f"got {type(view).__name__}")
        _STATE[self.name] = merged
        self.updates += 1
        return view

    # ------------------------------------------------------------------ showing

    def show(self) -> None:
        """Display the explorer (widgets, or the static fallback); the widget is kept in ``self.widget``.

        Returns None, so that ``Explorer(...).show()`` as a cell's last line does not display it twice.
        """
        if os.environ.get("GPUCOURSE_GRADING") == "1":  # a graded run: no one looks, so measure nothing
            print(f"{self.title}: not run while grading (open the notebook to explore)")
            return None
        w = _widgets()
        if w is None:
            self.show_static()
            return None
        self.widget = self._build(w)
        _display(self.widget)
        return None

    def show_static(self) -> list[View]:
        """Print and draw ``update`` for the current values and every preset: the no-widget fallback."""
        import matplotlib.pyplot as plt

        views = []
        current = self.values
        for values in [current] + [p for p in self.presets if p != current]:
            view = self.render(values)
            settings = ", ".join(f"{k}={v}" for k, v in values.items())
            print(f"{self.title} [{settings}]\n  {view.text}")
            if view.figure is not None:
                _display(view.figure)
                plt.close(view.figure)
            views.append(view)
        _STATE[self.name] = current  # presets are shown, not remembered
        return views

    def _make_control(self, w, c: Control):
        """``(control, cell)``: the control, and the grid cell that shows it under its label.

        A label beside a slider takes the room of its track (a long one left 1 px to drag), so every
        label sits above its control, and every control gets :data:`CONTROL_WIDTH`.
        """
        if c.kind == "bool":
            ctl = w.Checkbox(value=c.value, description=c.label, indent=False, layout=w.Layout(width="auto"))
            ctl.add_class("gpucourse-explorer-control")
            return ctl, ctl
        layout = w.Layout(width=CONTROL_WIDTH)
        if c.kind == "choice":
            ctl = w.Dropdown(options=list(c.options), value=c.value, layout=layout)
        elif c.kind == "int":
            ctl = w.IntSlider(value=c.value, min=int(c.low), max=int(c.high), step=int(c.step),
                              continuous_update=False, layout=layout)
        else:
            ctl = w.FloatSlider(value=c.value, min=c.low, max=c.high, step=c.step, continuous_update=False,
                                readout_format=".3g", layout=layout)
        ctl.add_class("gpucourse-explorer-control")
        label = w.HTML(value=html.escape(c.label))
        label.add_class("gpucourse-explorer-label")
        return ctl, w.VBox([label, ctl])

    def _build(self, w):
        import matplotlib.pyplot as plt

        current = self.values
        made = {c.name: self._make_control(w, c) for c in self.controls}
        ctls = {name: ctl for name, (ctl, _) in made.items()}
        self.inputs = ctls  # by control name, for tests and for code that drives the explorer
        for c in self.controls:
            ctls[c.name].value = current[c.name]
        status = w.HTML(value="")
        status.add_class("gpucourse-explorer-status")
        out = w.Output()
        out.add_class("gpucourse-explorer-output")

        def refresh(_=None):
            values = {name: ctl.value for name, ctl in ctls.items()}
            try:
                view = self.render(values)
            except Exception as err:  # show, never raise into the widget machinery
                status.value = f"<b>{self.title}</b> (update {self.updates + 1}): {type(err).__name__}: {err}"
                return
            with out:
                out.clear_output(wait=True)
                print(view.text)
                if view.figure is not None:
                    _display(view.figure)
                    plt.close(view.figure)
            status.value = f"<b>{self.title}</b> (update {self.updates}): {view.text.splitlines()[0]}"

        cells = [cell for _, cell in made.values()]
        if self.manual:
            button = w.Button(description="Run")
            button.add_class("gpucourse-explorer-control")
            button.on_click(refresh)
            self.inputs = {**ctls, "Run": button}
            cells.append(button)
        else:
            for ctl in ctls.values():
                ctl.observe(refresh, names="value")
        grid = w.GridBox(cells, layout=w.Layout(
            grid_template_columns=f"repeat(auto-fill, minmax({CONTROL_WIDTH}, 1fr))", grid_gap="6px 24px",
            align_items="flex-end", width="100%"))
        box = w.VBox([status, grid, out])
        box.add_class("gpucourse-explorer")
        refresh()
        return box
