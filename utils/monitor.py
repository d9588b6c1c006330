"""Watch how busy the hardware is while something runs: the GPU (NVML), the CPU (psutil), or the simulated one.

One job, reading utilisation and showing it:

* :class:`UtilisationMonitor` samples sources in a background thread into an
  ipywidgets panel that updates while your training cell runs, and falls back
  to text (with a :func:`sparkline`) without ipywidgets. :func:`default_sources`
  picks NVML for each NVIDIA GPU, else the CPU load; :func:`device_source`
  turns a :class:`gpucourse.simulate.Device` into a source.
* :func:`read_nvidia_smi_utilisation` asks ``nvidia-smi`` the same number, the
  way scripts in circulation do (``subprocess.run(["nvidia-smi", ...])``), and
  says clearly that a machine without ``nvidia-smi`` has no NVIDIA driver.
* What the numbers mean: NVML's reading (``nvidia-smi``'s GPU-Util) is the
  share of time *any* kernel ran; :func:`sm_share` is the other reading, the
  share of the GPU's SM-time kernels kept busy; :func:`gpu_numbering_note` says
  when NVML's GPU numbers differ from TensorFlow's.
* :func:`utilisation_explorer` (a :class:`gpucourse.explore.Explorer`) reads
  the utilisation of the simulated capstone pipeline at the parallelism you
  pick; :func:`utilisation_view` is its update function.

Only ipywidgets API common to 7.7 (Colab) and 8 is used. Importing this module
never imports TensorFlow.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from typing import Callable, Mapping, Sequence

from . import _validate
from .explore import Explorer, View, checkbox, slider
from .simulate import AUGMENT_S, LOAD_S, STEP_S, STEPS, Device, Pipeline

__all__ = ["NVIDIA_SMI_QUERY", "UtilisationMonitor", "default_sources", "device_source", "gpu_numbering_note",
           "read_nvidia_smi_utilisation", "sm_share", "sparkline", "utilisation_explorer", "utilisation_view"]

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], top: float = 100.0) -> str:
    """A one-line text chart of percentages: [0, 50, 100] -> '▁▅█'."""
    _validate.real("top", top, 0.0, strict_min=True)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"values must be numbers, got {v!r}")
        frac = min(max(v / top, 0.0), 1.0)
        out.append(_SPARK[min(int(frac * len(_SPARK)), len(_SPARK) - 1)])
    return "".join(out)


class _NvmlGpu:
    """Utilisation of one GPU through NVML (what nvidia-smi shows)."""

    def __init__(self, index: int):
        import pynvml

        self._nvml = pynvml
        self._index = index
        self._handle = None
        self._open()

    def _open(self) -> None:
        self._nvml.nvmlInit()  # reference-counted by NVML: each init is paired with one shutdown
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self._index)

    def __call__(self) -> float:
        if self._handle is None:  # closed by a monitor's stop(); a restarted monitor reopens it
            self._open()
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def close(self) -> None:
        if self._handle is None:
            return
        self._handle = None
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


class _CpuLoad:
    """System-wide CPU load since the previous call (psutil)."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point

    def __call__(self) -> float:
        return float(self._psutil.cpu_percent(interval=None))


def default_sources() -> dict[str, Callable[[], float]]:
    """What to monitor on this machine: each NVIDIA GPU through NVML, else the CPU load through psutil.

    NVML reads NVIDIA GPUs only: with an Apple GPU (tensorflow-metal) this is the CPU load, and its name says so.
    """
    from .devices import nvml_gpus

    sources: dict[str, Callable[[], float]] = {}
    for gpu in nvml_gpus():
        try:
            sources[f"GPU {gpu.index} (NVML)"] = _NvmlGpu(gpu.index)
        except Exception:
            continue
    if not sources:
        try:
            sources["CPU load (psutil)"] = _CpuLoad()
        except ImportError:
            pass
    return sources


#: The query: one line per GPU, e.g. ``0, 45`` (``[N/A]`` where the driver has no reading, e.g. on a MIG slice).
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits")


def read_nvidia_smi_utilisation(timeout_s: float = 10.0) -> dict[int, float | None]:
    """Each GPU's utilisation in % as ``nvidia-smi`` reports it, ``{index: percent}`` (``None``: no reading).

    Runs :data:`NVIDIA_SMI_QUERY`. The number is NVML's GPU-Util (the share of the last sample period in which
    any kernel ran), in NVML's PCI-bus numbering (see :func:`gpu_numbering_note`).

    Raises:
        FileNotFoundError: ``nvidia-smi`` is not on the PATH. It comes with the NVIDIA driver, so the machine
            has no NVIDIA GPU set up (a laptop, or a CPU runtime on Colab or Kaggle). A bare
            ``subprocess.run(["nvidia-smi", ...])`` raises the same error with only "No such file or
            directory"; this message says what it means and what to use instead.
        RuntimeError: ``nvidia-smi`` ran but failed (a driver that is installed but not loaded, a timeout),
            with its own output.
    """
    timeout_s = _validate.seconds("timeout_s", timeout_s, allow_zero=False)
    try:
        proc = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise FileNotFoundError(
            "nvidia-smi is not on this machine's PATH, so there is no GPU utilisation to read: nvidia-smi comes "
            "with the NVIDIA driver (an Apple GPU under tensorflow-metal has neither: nvidia-smi and NVML cannot "
            "read it), and a machine without it (a laptop, a CPU runtime on Colab or Kaggle) has "
            "no NVIDIA GPU that TensorFlow could use either. On Colab choose Runtime > Change runtime type > a "
            "GPU; to watch this machine anyway, use monitor.UtilisationMonitor(), which reads the CPU load "
            "when there is no GPU.") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"nvidia-smi did not answer within timeout_s={timeout_s:g} s: the driver may be "
                           "busy or hung; try it in a terminal, or pass a longer timeout_s") from None
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise RuntimeError(f"nvidia-smi is installed but failed (exit {proc.returncode}): {output[:500]!r}. "
                           "The NVIDIA driver is installed but not working (not loaded, or a version mismatch "
                           "after an update: a reboot usually helps); TensorFlow will not see the GPU either")
    readings = {}
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            index = int(parts[0])
            value = None if parts[1].startswith("[") else float(parts[1])  # "[N/A]", "[Not Supported]"
        except (IndexError, ValueError):
            raise RuntimeError(f"unexpected line from nvidia-smi: {line!r} (expected 'index, percent')") from None
        readings[index] = value
    return readings


def gpu_numbering_note(gpu_count: int, environ: Mapping[str, str] | None = None) -> str:
    """Why ``GPU n (NVML)`` may not be TensorFlow's ``/GPU:n``, or ``""`` when they agree.

    NVML (and ``nvidia-smi``) numbers GPUs in PCI bus order and sees every GPU. CUDA, and so TensorFlow,
    numbers them fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set before TensorFlow starts, and
    only counts the ones ``CUDA_VISIBLE_DEVICES`` lists, in that list's order.
    """
    gpu_count = _validate.whole("gpu_count", gpu_count, 0)
    env = os.environ if environ is None else environ
    if not isinstance(env, Mapping):
        raise TypeError(f"environ must be a dict of environment variables or None, got {type(env).__name__}")
    reasons = []
    if gpu_count > 1 and env.get("CUDA_DEVICE_ORDER", "").strip().upper() != "PCI_BUS_ID":
        reasons.append("NVML numbers GPUs in PCI bus order, CUDA (and TensorFlow) fastest first unless "
                       "CUDA_DEVICE_ORDER=PCI_BUS_ID is set before TensorFlow starts")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if gpu_count > 0 and visible is not None:
        reasons.append(f"CUDA_VISIBLE_DEVICES={visible!r} renumbers TensorFlow's GPUs but not NVML's")
    if not reasons:
        return ""
    return "GPU n (NVML) may not be TensorFlow's /GPU:n: " + "; ".join(reasons) + "."


def sm_share(kernels: Sequence, start_s: float, end_s: float, sm_count: int) -> float:
    """Share of a GPU's SM-time that kernels described as ``(start_s, end_s, sms_used)`` kept busy in a window.

    SMs used x time, added up over the kernels (clipped to the window), divided by ``sm_count`` x window and
    capped at 1. This is *not* what ``nvidia-smi``'s GPU-Util reports (NVML's
    ``nvmlDeviceGetUtilizationRates(...).gpu``: the share of time at least one kernel ran, however few
    SMs it used): a kernel on one SM of a T4's 40 counts as 1/40 here.
    """
    start_s = _validate.real("start_s", start_s)
    end_s = _validate.real("end_s", end_s)
    if end_s <= start_s:
        raise ValueError(f"the window is empty: end_s={end_s:g} must be after start_s={start_s:g}")
    sm_count = _validate.whole("sm_count", sm_count, 1, what="the GPU's number of SMs, e.g. 40 on a T4")
    if isinstance(kernels, (str, bytes)) or not isinstance(kernels, Sequence):
        raise TypeError(f"kernels must be a list of (start_s, end_s, sms_used), got {type(kernels).__name__}")
    sm_time = 0.0
    for i, k in enumerate(kernels):
        if not isinstance(k, Sequence) or len(k) != 3:
            raise TypeError(f"kernels[{i}] must be (start_s, end_s, sms_used), got {k!r}")
        s = _validate.real(f"kernels[{i}] start", k[0])
        e = _validate.real(f"kernels[{i}] end", k[1], s)
        sms = _validate.whole(f"kernels[{i}] sms_used", k[2], 1, sm_count)
        sm_time += max(0.0, min(e, end_s) - max(s, start_s)) * sms
    return min(1.0, sm_time / (sm_count * (end_s - start_s)))


def _widgets():
    try:
        import ipywidgets
    except ImportError:
        return None
    return ipywidgets


class UtilisationMonitor:
    """Sample utilisation sources in a background thread and show them live.

    Each source is a zero-argument callable returning a percentage (0-100).
    With ipywidgets, every source gets a row (label, progress bar, value) that
    updates while your training cell runs; without it, :meth:`stop` prints a
    text summary with a sparkline. Use it as a context manager::

        with UtilisationMonitor() as mon:   # NVML on a GPU, CPU load otherwise
            model.fit(...)
        mon.summary()

    Only ipywidgets API common to 7.7 (Colab) and 8 is used.
    """

    def __init__(self, sources: Mapping[str, Callable[[], float]] | None = None, interval_s: float = 0.25,
                 use_widgets: bool | None = None, history: int = 240):
        self.note = ""
        if sources is None:
            sources = default_sources()
            self.note = gpu_numbering_note(sum(1 for name in sources if name.endswith("(NVML)")))
        if not isinstance(sources, Mapping):
            raise TypeError("sources must be a {name: callable returning a percentage} dict, "
                            f"got {type(sources).__name__}")
        if not sources:
            raise ValueError("sources is empty: give at least one {name: callable returning a percentage}")
        bad = [k for k, fn in sources.items() if not isinstance(k, str) or not callable(fn)]
        if bad:
            raise TypeError(f"sources must map names (str) to callables; not for {bad!r}")
        self.sources = dict(sources)
        self.interval_s = _validate.seconds("interval_s", interval_s, allow_zero=False)
        self.history = _validate.whole("history", history)
        if use_widgets is not None and not isinstance(use_widgets, bool):
            raise TypeError(f"use_widgets must be True, False or None (automatic), got {use_widgets!r}")
        w = _widgets()
        if use_widgets and w is None:
            raise ValueError("use_widgets=True but ipywidgets is not installed: pip install 'ipywidgets>=7.7'")
        self._w = w if (use_widgets is None or use_widgets) else None
        self.samples: dict[str, list[tuple[float, float]]] = {k: [] for k in self.sources}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self.widget = self._build() if self._w is not None else None

    # -- display
    def _build(self):
        w = self._w
        self._bars, self._values = {}, {}
        rows = [w.HTML(value="<b>utilisation monitor</b>" + (f"<br><i>{self.note}</i>" if self.note else ""))]
        for name in self.sources:
            self._bars[name] = w.FloatProgress(value=0.0, min=0.0, max=100.0)
            self._values[name] = w.Label(value="-")
            rows.append(w.HBox([w.Label(value=name), self._bars[name], self._values[name]]))
        self._status = w.Label(value="not started")
        rows.append(self._status)
        box = w.VBox(rows)
        box.add_class("gpucourse-monitor")
        return box

    def _show(self, name: str, value: float) -> None:
        if self.widget is not None:
            self._bars[name].value = max(0.0, min(100.0, value))
            self._values[name].value = f"{value:.0f}%"

    # -- sampling
    def sample(self) -> dict[str, float]:
        """Read every source once, record and show the values. A failing source is reported, not raised."""
        now = time.perf_counter() - self._t0
        got = {}
        for name, fn in self.sources.items():
            try:
                value = float(fn())
            except Exception as err:  # a monitor must never break the training it watches
                self.errors[name] = f"{type(err).__name__}: {err}"
                continue
            got[name] = value
            series = self.samples[name]
            series.append((now, value))
            del series[:-self.history]
            self._show(name, value)
        return got

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self, show: bool = True) -> "UtilisationMonitor":
        """Start sampling in a background thread (and display the widget when ``show``)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("this monitor is already running; call stop() first")
        self._stop.clear()
        if self.widget is not None:
            self._status.value = f"sampling every {self.interval_s:g} s"
            if show:
                from IPython.display import display

                display(self.widget)
        elif show:
            print(f"monitoring {', '.join(self.sources)} every {self.interval_s:g} s "
                  "(text mode: ipywidgets not available)")
        self._thread = threading.Thread(target=self._loop, name="gpucourse-utilisation-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, show: bool = True) -> dict[str, dict[str, float]]:
        """Stop the thread (waits for it), take a last sample and return :meth:`summary`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(2.0, 4 * self.interval_s))
            self._thread = None
        self.sample()
        summary = self.summary()
        if self.widget is not None:
            self._status.value = "stopped: " + "; ".join(f"{k} mean {v['mean']:.0f}%" for k, v in summary.items())
        elif show:
            print(self.to_text())
        for fn in self.sources.values():
            close = getattr(fn, "close", None)
            if callable(close):
                close()
        return summary

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def summary(self) -> dict[str, dict[str, float]]:
        """Per source: mean, max and number of samples."""
        out = {}
        for name, series in self.samples.items():
            vals = [v for _, v in series]
            if vals:
                out[name] = {"mean": statistics.fmean(vals), "max": max(vals), "samples": len(vals)}
        return out

    def to_text(self) -> str:
        """The samples as text: one line per source with mean, max and a sparkline (and the numbering note)."""
        lines = [self.note] if self.note else []
        for name, series in self.samples.items():
            vals = [v for _, v in series]
            if not vals:
                lines.append(f"{name}: no samples" + (f" ({self.errors[name]})" if name in self.errors else ""))
                continue
            lines.append(f"{name}: mean {statistics.fmean(vals):.0f}%, max {max(vals):.0f}% over "
                         f"{len(vals)} samples  {sparkline(vals[-60:])}")
        return "\n".join(lines)

    def __enter__(self) -> "UtilisationMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"UtilisationMonitor(sources={list(self.sources)}, interval_s={self.interval_s}, "
                f"running={self.running})")


def device_source(device: Device, window_s: float = 0.5) -> Callable[[], float]:
    """A monitor source: percent of the last ``window_s`` seconds ``device`` was busy."""
    if not isinstance(device, Device):
        raise TypeError(f"device must be a gpucourse.simulate.Device, got {type(device).__name__}")
    window_s = _validate.seconds("window_s", window_s, allow_zero=False)

    def busy_percent() -> float:
        now = time.perf_counter()
        spans = list(device.spans[-(int(window_s / device.step_s) + 2 if device.step_s else len(device.spans)):])
        if device.busy_since is not None:
            spans.append((device.busy_since, now))
        # a device runs one step at a time, so its spans never overlap: clip each to the window and add up
        busy = sum(max(0.0, min(e, now) - max(s, now - window_s)) for s, e in spans)
        return 100.0 * min(busy / window_s, 1.0)

    return busy_percent


# --------------------------------------------------------------------------- the explorer


def utilisation_view(parallel_calls: int = 1, prefetch: bool = False, steps: int = STEPS, step_s: float = STEP_S,
                     load_s: float = LOAD_S, augment_s: float = AUGMENT_S, plot: bool = False):
    """Measure the capstone pipeline (``map(load)`` then ``map(augment)``, both with ``parallel_calls``).

    Returns a :class:`gpucourse.explore.View` whose text starts with
    ``"utilisation: <n>%"`` (steps x step time / time), then the best the run
    could reach (its bound); with ``plot``, the run's timeline as its figure.
    About ``steps x step_s`` plus start-up: ~0.6 s for the default 24 steps.
    """
    k = _validate.whole("parallel_calls", parallel_calls, 1)
    run = Pipeline(stages=(("load", load_s), ("augment", augment_s)), step_s=step_s, n=_validate.whole("steps", steps),
                   parallel=k, prefetch=prefetch).run()
    calls = "call" if k == 1 else "calls"
    text = (f"utilisation: {run.utilisation:.0%} with {k} parallel {calls}{' + prefetch' if prefetch else ''} "
            f"({run.steady_utilisation:.0%} after the first step); best possible {run.best_utilisation:.0%}, "
            f"measured {run.ratio:.2f}x the bound of {run.bound_s * 1e3:.0f} ms")
    figure = None
    if plot:
        import matplotlib.pyplot as plt

        from .plots import timeline

        ax = timeline(run.timeline, title=f"{k} parallel {calls}: who was busy when")
        figure = ax.figure
        plt.close(figure)
    return View(text, figure)


class _ShowingExplorer(Explorer):
    """An :class:`~gpucourse.explore.Explorer` that also shows itself when it is a cell's last value."""

    def _ipython_display_(self):
        self.show()


def utilisation_explorer(max_parallel: int = 8, steps: int = STEPS, step_s: float = STEP_S,
                         load_s: float = LOAD_S, augment_s: float = AUGMENT_S) -> Explorer:
    """The explorer of notebook 08: pick ``num_parallel_calls`` (and prefetch), press Run, read the utilisation.

    It always measures the course's simulated pipeline (see :func:`utilisation_view`, its update function),
    never your own code; each measurement takes about a second. Call ``.show()`` on the result (as the
    last line of a cell, the result shows itself). It keeps its values when the cell is re-run; without
    widgets (or with ``GPUCOURSE_STATIC=1``) it prints the current setting and two presets instead.
    """
    max_parallel = _validate.whole("max_parallel", max_parallel, 2)
    _validate.whole("steps", steps)

    def update(parallel_calls: int, prefetch: bool):
        return utilisation_view(parallel_calls, prefetch, steps, step_s, load_s, augment_s, plot=True)

    controls = [slider("parallel_calls", 1, max_parallel, 1, label="num_parallel_calls (both maps)"),
                checkbox("prefetch", False, "prefetch(AUTOTUNE)")]
    presets = [{"parallel_calls": 1, "prefetch": False},
               {"parallel_calls": min(max_parallel, 4), "prefetch": True}]
    return _ShowingExplorer("08-utilisation", update, controls, manual=True, presets=presets,
                            title=(f"Utilisation explorer (device step {step_s * 1e3:.0f} ms, load "
                                   f"{load_s * 1e3:.0f} ms, augment {augment_s * 1e3:.0f} ms, {steps} steps)"))
