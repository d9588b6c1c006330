"""gpucourse._validate, the one validation policy, and the helpers that route through it.

Policy: a wrong *type* raises TypeError, a right type with a bad value raises
ValueError, and the message names the argument, the value and what to pass.
Nothing here imports TensorFlow.
"""

import math

import numpy as np
import pytest

from gpucourse import _validate as V


# --------------------------------------------------------------------------- whole


def test_whole_accepts_ints_and_numpy_ints_and_returns_int():
    assert V.whole("n", 3) == 3
    got = V.whole("n", np.int64(4))
    assert got == 4 and type(got) is int
    assert V.whole("n", 0, minimum=0) == 0
    assert V.whole("n", -5, minimum=None) == -5


@pytest.mark.parametrize("bad", [True, False, np.bool_(True)])
def test_whole_rejects_bool_as_a_type_error(bad):
    with pytest.raises(TypeError, match=r"repeats must be a whole number \(int\), got (np\.)?(True|False)"):
        V.whole("repeats", bad)


@pytest.mark.parametrize("bad", [2.0, 2.5, "3", None, [1]])
def test_whole_rejects_other_types(bad):
    with pytest.raises(TypeError, match=f"repeats must be a whole number.*got {repr(bad).replace('[', '.').replace(']', '.')}"):
        V.whole("repeats", bad)


def test_whole_bounds_are_value_errors_naming_argument_value_and_hint():
    with pytest.raises(ValueError, match=r"repeats must be >= 1, got 0 \(timed runs\)"):
        V.whole("repeats", 0, what="timed runs")
    with pytest.raises(ValueError, match=r"size must be <= 8192, got 9000"):
        V.whole("size", 9000, 16, 8192)
    assert V.whole("size", 8192, 16, 8192) == 8192 and V.whole("size", 16, 16, 8192) == 16


# --------------------------------------------------------------------------- real and seconds


def test_real_accepts_ints_floats_numpy_and_returns_float():
    assert V.real("x", 1) == 1.0 and type(V.real("x", 1)) is float
    assert V.real("x", np.float32(0.5)) == 0.5


@pytest.mark.parametrize("bad", [True, "1.0", None, 1j])
def test_real_rejects_bool_strings_and_complex_as_type_errors(bad):
    with pytest.raises(TypeError, match=r"x must be a real number, got"):
        V.real("x", bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_real_rejects_nan_and_inf_as_value_errors(bad):
    with pytest.raises(ValueError, match=r"x must be a finite number, got (nan|inf|-inf)"):
        V.real("x", bad)


def test_real_finite_false_allows_inf_but_never_nan():
    assert V.real("x", math.inf, finite=False) == math.inf
    with pytest.raises(ValueError, match="finite"):
        V.real("x", math.nan, finite=False)


def test_real_bounds_inclusive_and_strict():
    assert V.real("q", 0.0, 0.0, 100.0) == 0.0 and V.real("q", 100, 0.0, 100.0) == 100.0
    with pytest.raises(ValueError, match=r"q must be <= 100, got 101"):
        V.real("q", 101, 0.0, 100.0)
    with pytest.raises(ValueError, match=r"q must be >= 0, got -1"):
        V.real("q", -1, 0.0, 100.0)
    with pytest.raises(ValueError, match=r"rate must be > 0, got 0"):
        V.real("rate", 0, 0.0, strict_min=True)


def test_seconds_zero_allowed_or_not():
    assert V.seconds("timeout", 0) == 0.0
    with pytest.raises(ValueError, match=r"timeout must be > 0, got 0 \(a duration in seconds\)"):
        V.seconds("timeout", 0, allow_zero=False)
    with pytest.raises(ValueError, match=r"timeout must be >= 0, got -2"):
        V.seconds("timeout", -2)
    with pytest.raises(TypeError, match="timeout"):
        V.seconds("timeout", "10")


# --------------------------------------------------------------------------- text, one_of, env_vars, callable_


def test_text():
    assert V.text("label", "a") == "a"
    with pytest.raises(TypeError, match=r"label must be a string, got 3 of type int"):
        V.text("label", 3)
    with pytest.raises(ValueError, match=r"label must be a non-empty string, got '  '"):
        V.text("label", "  ")


def test_one_of_lists_the_options_and_the_value():
    assert V.one_of("kind", "op", ["op", "tensor"]) == "op"
    with pytest.raises(ValueError, match=r"kind must be one of 'op', 'tensor'; got 'eager'"):
        V.one_of("kind", "eager", ["op", "tensor"])


def test_env_vars():
    assert V.env_vars("env", None) == {}
    assert V.env_vars("env", {"A": "1"}) == {"A": "1"}
    for bad in ({"A": 1}, ["A=1"], {1: "x"}):
        with pytest.raises(TypeError, match=r"env must be a dict of str -> str"):
            V.env_vars("env", bad)


def test_callable_():
    assert V.callable_("fn", len) is len
    with pytest.raises(TypeError, match=r"fn must be callable \(a function\), got int"):
        V.callable_("fn", 3)


# --------------------------------------------------------------------------- mapping and sequence


def test_mapping_type_vs_empty():
    d = {"a": 1}
    assert V.mapping("ys", d) is d
    with pytest.raises(TypeError, match=r"ys must be a dict like \{label: values\}, got \[1, 2\] of type list"):
        V.mapping("ys", [1, 2], "{label: values}")
    with pytest.raises(TypeError, match="of type str"):
        V.mapping("ys", "abc")
    with pytest.raises(ValueError, match=r"ys must be a non-empty dict like \{label: values\}, got \{\}"):
        V.mapping("ys", {}, "{label: values}")


def test_sequence_accepts_ordered_collections_and_returns_a_list():
    assert V.sequence("v", [1, 2]) == [1, 2]
    assert V.sequence("v", (1, 2)) == [1, 2]
    assert V.sequence("v", range(3)) == [0, 1, 2]
    assert V.sequence("v", np.array([1.5, 2.5])) == [1.5, 2.5]
    assert V.sequence("v", (i for i in (4, 5))) == [4, 5]


@pytest.mark.parametrize("bad", ["abc", b"abc", {"a": 1}, {1, 2}, 3, None])
def test_sequence_rejects_strings_dicts_sets_and_scalars_as_type_errors(bad):
    with pytest.raises(TypeError, match=rf"values must be a list of numbers, got .* of type {type(bad).__name__}"):
        V.sequence("values", bad, "numbers")


def test_sequence_empty_is_a_value_error():
    with pytest.raises(ValueError, match=r"values must be a non-empty list of numbers, got an empty list"):
        V.sequence("values", [], "numbers")
    with pytest.raises(ValueError, match="empty tuple"):
        V.sequence("values", (), "numbers")


def test_long_values_are_shortened_in_messages():
    with pytest.raises(TypeError) as info:
        V.mapping("ys", list(range(1000)))
    assert len(str(info.value)) < 200 and "..." in str(info.value)


# --------------------------------------------------------------------------- helpers that route through the policy


class _FakeTfFunction:
    """Enough of a tf.function for count_traces' argument checks (no TensorFlow imported)."""

    def __call__(self, *args):
        return None

    def experimental_get_tracing_count(self):
        return 1


def _entry_points():
    """(helper, call with a wrong type, call with an empty collection) for each routed argument."""
    from gpucourse import latency, placement, plots, scaling, startup, timing, xla

    calib = dict(params=1000, per_replica_batch=8, step_s=0.01, big_step_s=0.02, big_factor=2,
                 bytes_per_step=4000.0, shared=True)
    return {
        "plots.ratio_bars values": (lambda: plots.ratio_bars([1.0]), lambda: plots.ratio_bars({})),
        "plots.lines ys": (lambda: plots.lines([1], [1]), lambda: plots.lines([1], {})),
        "plots.timeline events": (lambda: plots.timeline("abc"), lambda: plots.timeline([])),
        "timing.percentile values": (lambda: timing.percentile("abc", 50), lambda: timing.percentile([], 50)),
        "timing.compare candidates": (lambda: timing.compare([len]), lambda: timing.compare({})),
        "latency.measure_latency batch_sizes": (lambda: latency.measure_latency(lambda b: len, 8),
                                                lambda: latency.measure_latency(lambda b: len, [])),
        "placement.probe_order befores": (lambda: placement.probe_order(["x = 1"]),
                                          lambda: placement.probe_order({})),
        "scaling.calibrate allreduce_s": (lambda: scaling.calibrate("m", allreduce_s=[0.1], **calib),
                                          lambda: scaling.calibrate("m", allreduce_s={}, **calib)),
        "scaling.scaling_rows throughputs": (lambda: scaling.scaling_rows([1, 2]), lambda: scaling.scaling_rows({})),
        "scaling.scaling_table rows": (lambda: scaling.scaling_table("rows"), lambda: scaling.scaling_table([])),
        "scaling.scaling_update profiles": (lambda: scaling.scaling_update(["cpu"]),
                                            lambda: scaling.scaling_update({})),
        "startup.measure_threading settings": (lambda: startup.measure_threading([(1, 1)]),
                                               lambda: startup.measure_threading({})),
        "xla.count_traces inputs": (lambda: xla.count_traces(_FakeTfFunction(), 5),
                                    lambda: xla.count_traces(_FakeTfFunction(), [])),
        "xla.padding_cost lengths": (lambda: xla.padding_cost("12", [8]), lambda: xla.padding_cost([], [8])),
        "xla.padding_cost buckets": (lambda: xla.padding_cost([3], 8), lambda: xla.padding_cost([3], [])),
        "xla.run_probes jobs": (lambda: xla.run_probes(3), lambda: xla.run_probes([])),
    }


ENTRY_POINTS = sorted(_entry_points())


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_each_helper_raises_type_error_for_a_wrong_type_and_value_error_when_empty(name):
    import matplotlib

    matplotlib.use("Agg")
    wrong_type, empty = _entry_points()[name]
    argument = name.split()[-1]
    with pytest.raises(TypeError, match=argument):
        wrong_type()
    with pytest.raises(ValueError, match=f"{argument}.*non-empty|non-empty.*{argument}"):
        empty()


def test_percentile_reports_the_bad_element_and_accepts_numpy_arrays():
    from gpucourse import timing

    assert timing.percentile(np.array([1.0, 3.0]), 50) == 2.0
    with pytest.raises(TypeError, match="each value must be a real number, got 'a'"):
        timing.percentile([1.0, "a"], 50)
    with pytest.raises(ValueError, match="finite"):
        timing.percentile([1.0, math.nan], 50)


def test_timeline_events_type_vs_order():
    import matplotlib

    matplotlib.use("Agg")
    from gpucourse import plots

    with pytest.raises(TypeError, match=r"\(lane, start_s, end_s\)"):
        plots.timeline([("a", 0.0)])
    with pytest.raises(TypeError, match="start_s"):
        plots.timeline([("a", "0", 1.0)])
    with pytest.raises(ValueError, match="end at or after its start"):
        plots.timeline([("a", 2.0, 1.0)])

