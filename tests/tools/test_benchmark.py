"""The benchmark script's plumbing (the measurements themselves are for reading, never asserted)."""

import inspect
import sys
import types

import pytest

from gpucourse.tools import benchmark


def _fake(monkeypatch, name, rows=None, exc=None):
    mod = types.ModuleType(name)

    def bench(quick=False):
        if exc:
            raise exc
        return rows
    mod.benchmark = bench
    monkeypatch.setitem(sys.modules, name, mod)


def test_collect_and_table(monkeypatch):
    good = [{"topic": "07 tf.data", "case": "naive", "median_s": 0.4, "bound_s": 0.2, "ratio_to_bound": 2.0,
             "speedup": 1.0, "note": ""},
            {"topic": "08 capstone", "case": "tuned", "median_s": 1.2, "bound_s": 1.1, "ratio_to_bound": 1.09,
             "speedup": 1.8, "note": "", "utilisation": 0.93}]
    _fake(monkeypatch, "fake_ok", good)
    _fake(monkeypatch, "fake_bad", exc=RuntimeError("boom"))
    _fake(monkeypatch, "fake_short", [{"topic": "x"}])
    rows = benchmark.collect(sources=[("fake_ok", "ok"), ("fake_bad", "bad"), ("fake_short", "short")],
                             echo=lambda *_: None)
    assert [r["case"] for r in rows] == ["naive", "tuned", "ERROR", "ERROR"]
    assert "boom" in rows[2]["note"] and "lacks" in rows[3]["note"]
    table = benchmark.format_table(rows)
    assert "2.00x" in table and "400.0 ms" in table and "93%" in table and "1.20 s" in table


@pytest.mark.parametrize("module", [m for m, _ in benchmark.SOURCES])
def test_every_source_exposes_benchmark(module):
    import importlib

    fn = importlib.import_module(module).benchmark
    assert "quick" in inspect.signature(fn).parameters
