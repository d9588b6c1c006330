"""Run Python code in fresh processes and read one JSON answer back: the course's probes.

TensorFlow reads device settings and environment variables once, when its
runtime starts, and some settings cannot be undone in a running kernel. The
notebooks therefore ask *fresh* processes what a setting would do. Every probe
goes through :func:`run` (or :func:`run_many`, several at once), which

* starts ``sys.executable -c code`` with the kernel's environment, plus the
  caller's variables, minus variables the course's setup cell added by itself
  (so a probe "without memory growth" really runs without it);
* gives the probe a prelude with ``emit(obj)``, which prints one tagged JSON line;
* always has a timeout, and turns a crash or a timeout into :class:`ProbeError`
  with the last lines of the probe's stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from . import _validate

__all__ = ["Probe", "ProbeError", "PRELUDE", "TAG", "base_env", "run", "run_many"]

TAG = "GPUCOURSE_JSON "

#: Code placed before every probe: ``emit(obj)`` prints the answer the caller reads back.
PRELUDE = (
    "import json as _gpucourse_json\n"
    "def emit(obj):\n"
    f"    print({TAG!r} + _gpucourse_json.dumps(obj), flush=True)\n"
)

#: Environment variable naming the variables the setup cell set on the learner's behalf.
from .colab import SET_BY_COURSE  # noqa: E402  (one definition, shared with the setup cell)


class ProbeError(RuntimeError):
    """A probe process failed, timed out or printed no answer."""


@dataclass
class Probe:
    """One probe: ``code`` run with ``args`` and extra ``env``; ``label`` names it in errors."""

    code: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    label: str = "probe"
    extra: dict = field(default_factory=dict)


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The kernel's environment without course-set variables, with quiet TensorFlow logs, plus ``extra``."""
    env = dict(os.environ)
    for name in filter(None, env.pop(SET_BY_COURSE, "").split(",")):
        env.pop(name, None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env.update(_validate.env_vars("env", extra))
    return env


def _answer(label: str, proc_out: str, proc_err: str, returncode: int):
    for line in reversed(proc_out.splitlines()):
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    tail = "\n".join(proc_err.strip().splitlines()[-8:])
    raise ProbeError(f"{label}: the fresh process printed no answer (exit code {returncode}).\n{tail}")


def _command(probe: Probe) -> list[str]:
    _validate.text("code", probe.code)
    args = [str(a) for a in probe.args]
    return [sys.executable, "-c", PRELUDE + probe.code, *args]


def run(code: str, *args, env: Mapping[str, str] | None = None, timeout: float = 120, label: str = "probe"):
    """Run ``code`` in a fresh Python and return what it passed to ``emit``."""
    _validate.seconds("timeout", timeout, allow_zero=False)
    probe = Probe(code, args, env, label)
    try:
        proc = subprocess.run(_command(probe), env=base_env(env), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"{label}: the fresh process did not finish within {timeout:g} s") from None
    return _answer(label, proc.stdout, proc.stderr, proc.returncode)


def run_many(probes: Sequence[Probe], timeout: float = 120) -> list:
    """Run several probes at once; one answer (or the :class:`ProbeError`) per probe, in order.

    All probes share one deadline, so ``timeout`` bounds the whole call.
    """
    _validate.seconds("timeout", timeout, allow_zero=False)
    probes = list(probes)
    for p in probes:
        if not isinstance(p, Probe):
            raise TypeError(f"run_many takes Probe objects, got {type(p).__name__}")
    procs = [subprocess.Popen(_command(p), env=base_env(p.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for p in probes]
    deadline = time.monotonic() + timeout
    results: list = []
    for p, proc in zip(probes, procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append(ProbeError(f"{p.label}: the fresh process did not finish within {timeout:g} s"))
            continue
        try:
            results.append(_answer(p.label, out, err, proc.returncode))
        except ProbeError as exc:
            results.append(exc)
    return results
