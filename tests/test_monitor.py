"""gpucourse.monitor: the live utilisation monitor (widget and text), its sources, and the utilisation explorer."""

import sys
import time
import types

import pytest

from gpucourse import monitor, simulate


def test_import_does_not_import_tensorflow(fresh_python):
    out = fresh_python("import sys\nfrom gpucourse import monitor\nprint('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_sparkline():
    assert monitor.sparkline([0, 50, 100]) == "▁▅█"
    assert monitor.sparkline([]) == ""
    with pytest.raises(TypeError):
        monitor.sparkline(["high"])
    with pytest.raises(ValueError, match="top"):
        monitor.sparkline([1], top=0)


def test_monitor_text_mode_samples_in_background(capsys):
    values = iter(range(0, 1000, 10))
    mon = monitor.UtilisationMonitor({"fake": lambda: next(values), "broken": lambda: 1 / 0},
                                     interval_s=0.02, use_widgets=False)
    assert mon.widget is None
    with mon:
        assert mon.running
        time.sleep(0.2)
    assert not mon.running
    out = capsys.readouterr().out
    assert "text mode" in out and "fake: mean" in out and "broken: no samples (ZeroDivisionError" in out
    summary = mon.summary()
    assert summary["fake"]["samples"] >= 3 and "broken" not in summary


def test_monitor_degrades_to_text_without_ipywidgets(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets now raises ImportError
    mon = monitor.UtilisationMonitor({"fake": lambda: 50.0}, interval_s=0.05)
    assert mon.widget is None
    mon.start()
    mon.stop()
    assert "fake: mean 50%" in capsys.readouterr().out
    with pytest.raises(ValueError, match="ipywidgets is not installed"):
        monitor.UtilisationMonitor({"fake": lambda: 1.0}, use_widgets=True)


def test_monitor_widget_updates():
    import ipywidgets

    mon = monitor.UtilisationMonitor({"fake": lambda: 42.0}, interval_s=0.05, use_widgets=True)
    assert isinstance(mon.widget, ipywidgets.VBox) and "gpucourse-monitor" in mon.widget._dom_classes
    mon.start(show=False)
    mon.stop()
    assert mon._bars["fake"].value == 42.0 and mon._values["fake"].value == "42%"
    assert mon._status.value.startswith("stopped")


@pytest.mark.parametrize("kwargs, exc", [
    ({"sources": {}}, ValueError), ({"sources": [float]}, TypeError), ({"sources": {"x": 3}}, TypeError),
    ({"sources": {"x": float}, "interval_s": 0}, ValueError), ({"sources": {"x": float}, "interval_s": "1"}, TypeError),
    ({"sources": {"x": float}, "use_widgets": "y"}, TypeError), ({"sources": {"x": float}, "history": 0}, ValueError),
])
def test_monitor_bad_input(kwargs, exc):
    with pytest.raises(exc):
        monitor.UtilisationMonitor(**kwargs)


def test_default_sources_report_a_percentage():
    sources = monitor.default_sources()
    assert sources
    for fn in sources.values():
        assert 0 <= fn() <= 100


def test_device_source_follows_the_simulated_device():
    dev = simulate.Device(0.05)
    source = monitor.device_source(dev, window_s=0.2)
    assert source() == 0.0
    for _ in range(4):
        dev.run()
    assert source() > 90  # the last 0.2 s were all steps
    time.sleep(0.25)
    assert source() < 10
    with pytest.raises(TypeError, match="Device"):
        monitor.device_source(lambda: 1)
    with pytest.raises(ValueError, match="window_s"):
        monitor.device_source(dev, window_s=0)


def test_nvml_source_reopens_after_close(monkeypatch):
    """A monitor's stop() closes NVML; sampling again (a restarted monitor) must reopen it, not fail."""
    calls = {"init": 0, "shutdown": 0}
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.__setitem__("init", calls["init"] + 1)
    fake.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=42)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = monitor._NvmlGpu(0)
    assert gpu() == 42.0
    gpu.close()
    gpu.close()  # idempotent: one shutdown per init
    assert gpu() == 42.0
    gpu.close()
    assert calls == {"init": 2, "shutdown": 2}


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


def test_utilisation_view_measures_and_draws():
    from gpucourse.explore import View

    view = monitor.utilisation_view(parallel_calls=4, steps=6, plot=True)
    assert isinstance(view, View) and view.text.startswith("utilisation: ") and "4 parallel calls" in view.text
    assert "best possible" in view.text and "x the bound" in view.text and view.figure is not None
    with pytest.raises(ValueError, match="parallel_calls"):
        monitor.utilisation_view(0)
    with pytest.raises(TypeError, match="parallel_calls"):
        monitor.utilisation_view(None)


def test_explorer_widget_measures_on_run_and_keeps_its_values(monkeypatch):
    import ipywidgets

    from gpucourse import explore

    monkeypatch.delenv("GPUCOURSE_STATIC", raising=False)
    monkeypatch.setattr(explore, "_display", lambda obj: None)
    monkeypatch.setitem(explore._STATE, "08-utilisation", {})
    ex = monitor.utilisation_explorer(steps=6)
    assert isinstance(ex, explore.Explorer) and ex.manual and ex.show() is None
    box = ex.widget
    assert "gpucourse-explorer" in box._dom_classes
    parts = list(_walk(box))
    slider = next(w for w in parts if isinstance(w, ipywidgets.IntSlider))
    prefetch = next(w for w in parts if isinstance(w, ipywidgets.Checkbox))
    button = next(w for w in parts if isinstance(w, ipywidgets.Button))
    status = next(w for w in parts if "gpucourse-explorer-status" in w._dom_classes)
    assert button.description == "Run" and (slider.min, slider.max, slider.value) == (1, 8, 1)
    assert "utilisation: " in status.value and "1 parallel call " in status.value  # measured once when shown
    before = status.value
    slider.value, prefetch.value = 4, True
    assert status.value == before  # manual: nothing measured until Run
    button.click()
    assert status.value != before and "% with 4 parallel calls + prefetch" in status.value
    again = monitor.utilisation_explorer(steps=6)  # the cell re-run: the explorer starts where it was
    assert again.values == {"parallel_calls": 4, "prefetch": True}


def test_explorer_static_fallback(monkeypatch, capsys):
    from gpucourse import explore

    monkeypatch.setenv("GPUCOURSE_STATIC", "1")
    monkeypatch.setattr(explore, "_display", lambda obj: None)
    monkeypatch.setitem(explore._STATE, "08-utilisation", {})
    ex = monitor.utilisation_explorer(max_parallel=4, steps=4)
    ex.show()
    out = capsys.readouterr().out
    assert ex.widget is None and "parallel_calls=1, prefetch=False" in out and "parallel_calls=4, prefetch=True" in out
    assert out.count("utilisation: ") == 2 and "% with 4 parallel calls + prefetch" in out
    with pytest.raises(ValueError, match="max_parallel"):
        monitor.utilisation_explorer(max_parallel=1)


@pytest.mark.parametrize("count, env, found", [
    (1, {}, []),
    (2, {}, ["PCI bus order"]),
    (2, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, []),
    (2, {"CUDA_DEVICE_ORDER": "pci_bus_id "}, []),
    (1, {"CUDA_VISIBLE_DEVICES": "1"}, ["CUDA_VISIBLE_DEVICES='1'"]),
    (3, {"CUDA_VISIBLE_DEVICES": "2,0"}, ["PCI bus order", "renumbers TensorFlow's GPUs but not NVML's"]),
    (0, {"CUDA_VISIBLE_DEVICES": "0"}, []),
])
def test_gpu_numbering_note(count, env, found):
    note = monitor.gpu_numbering_note(count, env)
    assert (note == "") == (not found)
    for text in found:
        assert text in note and note.startswith("GPU n (NVML) may not be TensorFlow's /GPU:n")


def test_gpu_numbering_note_bad_input():
    with pytest.raises(ValueError, match="gpu_count"):
        monitor.gpu_numbering_note(-1, {})
    with pytest.raises(TypeError, match="environ"):
        monitor.gpu_numbering_note(2, ["CUDA_DEVICE_ORDER"])


def test_monitor_shows_the_numbering_note_for_default_sources(monkeypatch):
    monkeypatch.setattr(monitor, "default_sources", lambda: {"GPU 0 (NVML)": lambda: 5.0, "GPU 1 (NVML)": lambda: 7.0})
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    mon = monitor.UtilisationMonitor(interval_s=0.05, use_widgets=False)
    mon.sample()
    assert mon.to_text().splitlines()[0].startswith("GPU n (NVML) may not be")
    assert "PCI bus order" in mon.to_text()
    assert monitor.UtilisationMonitor({"x": lambda: 1.0}, use_widgets=False).note == ""


def test_sm_share_counts_sm_time_not_any_kernel():
    # back-to-back kernels on 1 of 40 SMs: NVML would read 100%, the SMs are 2.5% busy
    tiny = [(i * 0.01, (i + 1) * 0.01, 1) for i in range(100)]
    assert monitor.sm_share(tiny, 0.0, 1.0, 40) == pytest.approx(0.025)
    # full-GPU kernels, one partly outside the window: SM-time adds up, (0.3 + 0.1) x 40 of 1 s x 40
    assert monitor.sm_share([(0.0, 0.3, 40), (0.9, 1.5, 40)], 0.0, 1.0, 40) == pytest.approx(0.4)
    assert monitor.sm_share([(0.0, 1.0, 40), (0.0, 1.0, 40)], 0.0, 1.0, 40) == 1.0  # capped
    assert monitor.sm_share([], 0.0, 2.0, 80) == 0.0
    assert not hasattr(monitor, "utilisation_readings")  # the any-kernel share of spans is lab 08's q2


@pytest.mark.parametrize("args, exc, match", [
    (([], 1.0, 1.0, 40), ValueError, "window is empty"),
    (([], 0.0, 1.0, 0), ValueError, "sm_count"),
    (("kernels", 0.0, 1.0, 40), TypeError, "kernels"),
    (([(0.0, 1.0)], 0.0, 1.0, 40), TypeError, r"kernels\[0\]"),
    (([(0.0, 1.0, 41)], 0.0, 1.0, 40), ValueError, "sms_used"),
    (([(1.0, 0.5, 1)], 0.0, 1.0, 40), ValueError, "end"),
])
def test_sm_share_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        monitor.sm_share(*args)


def _fake_nvidia_smi(tmp_path, script):
    """A folder holding an executable `nvidia-smi` shell script, to put on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return str(folder)


def test_nvidia_smi_missing_says_what_it_means(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without nvidia-smi: every CPU-only machine
    with pytest.raises(FileNotFoundError, match="No such file or directory"):
        subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv"])  # the snippet: no hint
    with pytest.raises(FileNotFoundError) as err:
        monitor.read_nvidia_smi_utilisation()
    msg = str(err.value)
    assert "nvidia-smi is not on this machine's PATH" in msg and "NVIDIA driver" in msg
    assert "Change runtime type" in msg and "UtilisationMonitor()" in msg


def test_nvidia_smi_readings_are_parsed(tmp_path, monkeypatch):
    folder = _fake_nvidia_smi(tmp_path, 'test "$1" = "--query-gpu=index,utilization.gpu" || exit 3\n'
                                        'printf "0, 45\\n1, [N/A]\\n\\n2, 100\\n"\n')
    monkeypatch.setenv("PATH", folder)
    assert monitor.read_nvidia_smi_utilisation() == {0: 45.0, 1: None, 2: 100.0}


def test_nvidia_smi_failures_are_explained(tmp_path, monkeypatch):
    import subprocess

    folder = _fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the '
                                        'NVIDIA driver."\nexit 9\n')
    monkeypatch.setenv("PATH", folder)
    with pytest.raises(RuntimeError, match=r"installed but failed \(exit 9\).*couldn't communicate"):
        monitor.read_nvidia_smi_utilisation()

    def hang(*args, timeout=None, **kwargs):
        raise subprocess.TimeoutExpired(args[0], timeout)

    monkeypatch.setattr(monitor.subprocess, "run", hang)
    with pytest.raises(RuntimeError, match="did not answer within timeout_s=2 s"):
        monitor.read_nvidia_smi_utilisation(timeout_s=2)
    monkeypatch.setattr(monitor.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], 0, "GPU 0: Tesla T4\n", ""))
    with pytest.raises(RuntimeError, match="unexpected line from nvidia-smi: 'GPU 0: Tesla T4'"):
        monitor.read_nvidia_smi_utilisation()
    with pytest.raises(ValueError, match="timeout_s"):
        monitor.read_nvidia_smi_utilisation(timeout_s=0)


@pytest.mark.gpu
def test_nvidia_smi_reads_every_gpu():
    from gpucourse.devices import nvml_gpus

    readings = monitor.read_nvidia_smi_utilisation()
    assert sorted(readings) == sorted(g.index for g in nvml_gpus())
    assert all(v is None or 0 <= v <= 100 for v in readings.values())
