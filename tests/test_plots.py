"""gpucourse.plots: each helper draws and returns its Axes; bad input is a clear error."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from gpucourse import plots, timing  # noqa: E402


def test_helpers_draw():
    ax = plots.ratio_bars({"naive": 1.9, "tuned": 1.05})
    assert len(ax.patches) == 2 and ax.get_xlabel() == "ratio"
    ax = plots.timeline([("input", 0.0, 0.1), ("train", 0.1, 0.3), ("input", 0.1, 0.2)])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["input", "train"]
    # slots of one stage share a colour; other stages get their own
    ax = plots.timeline([("decode #1", 0.0, 0.1), ("decode #2", 0.0, 0.1), ("device", 0.1, 0.2)])
    colours = [tuple(c.get_facecolor()[0]) for c in ax.collections]
    assert colours[0] == colours[1] != colours[2]
    ax = plots.lines([1, 2, 4], {"throughput": [1, 1.8, 3.1]}, xlabel="replicas")
    assert len(ax.lines) == 1
    cmp = timing.Comparison([timing.Timing("a", [0.01]), timing.Timing("b", [0.02])], "a", 0.005)
    ax = plots.comparison_bars(cmp)
    assert len(ax.patches) == 2


@pytest.mark.parametrize("bad, exc, match", [
    (lambda: plots.ratio_bars({}), ValueError, "values must be a non-empty dict"),
    (lambda: plots.ratio_bars([1.0]), TypeError, "values must be a dict"),
    (lambda: plots.ratio_bars({"a": "fast"}), TypeError, "numbers"),
    (lambda: plots.timeline([]), ValueError, "events must be a non-empty list"),
    (lambda: plots.timeline([("a", 1.0)]), TypeError, "lane, start_s, end_s"),
    (lambda: plots.timeline([("a", 1.0, 0.5)]), ValueError, "end at or after its start"),
    (lambda: plots.lines([1, 2], {"a": [1]}), ValueError, "has 1 values but x has 2"),
    (lambda: plots.lines([1, 2], [[1, 2]]), TypeError, "ys must be a dict"),
    (lambda: plots.label_log_axes("ax"), TypeError, "ax must be a matplotlib Axes"),
])
def test_bad_input(bad, exc, match):
    with pytest.raises(exc, match=match):
        bad()


def tick_labels(ax) -> list[str]:
    """Every non-empty tick label of ``ax`` (major and minor, both axes), as drawn."""
    ax.figure.canvas.draw()
    return [t.get_text() for axis in (ax.xaxis, ax.yaxis) for minor in (False, True)
            for t in axis.get_ticklabels(minor=minor) if t.get_text()]


def test_label_log_axes_writes_plain_numbers_and_leaves_linear_axes():
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    ax.plot([2.5, 7.0], [0.01, 300.0])
    ax.set_xscale("log")
    default = tick_labels(ax)
    assert any("mathdefault" in t for t in default)  # what matplotlib draws without the helper
    linear_before = [t.get_text() for t in ax.get_yticklabels()]
    assert plots.label_log_axes(ax) is ax
    labels = tick_labels(ax)
    assert not [t for t in labels if "$" in t], labels
    assert {"3", "4", "6"} <= set(labels)  # minor labels inside the one decade shown
    assert [t.get_text() for t in ax.get_yticklabels()] == linear_before
    plt.close(ax.figure)
