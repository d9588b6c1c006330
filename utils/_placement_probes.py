"""Topic 02 in fresh processes: which calls make placement logging too late, and what switching it off does.

:func:`probe_order` runs code in a fresh TensorFlow process *before* switching the placement log on, and
reports whether the log still works (for eager ops and for a ``tf.function`` traced afterwards);
:func:`probe_logging` also runs the switch-off probe: what ``set_log_device_placement(False)`` really does in a
started runtime (it switches soft placement off, in TF 2.21). The probes' logs are read with
:func:`gpucourse.placement.parse_placement_log`. :mod:`gpucourse.placement` re-exports every name here, and
notebooks write ``placement.<name>``. Importing this module never imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import _probe, _validate

if TYPE_CHECKING:
    from .placement import PlacementLog

__all__ = ["OrderProbe", "SwitchOffProbe", "probe_logging", "probe_order"]


def _parse(text: str = "") -> PlacementLog:
    """``text`` read by :func:`gpucourse.placement.parse_placement_log` (empty: an empty log). Looked up on use:
    :mod:`gpucourse.placement` imports this module at its top."""
    from .placement import parse_placement_log

    return parse_placement_log(text)


# Both probes run with gpucourse._probe: a fresh Python, emit() answers, a timeout.
_ORDER_PROBE = r"""
import sys, tensorflow as tf
from tensorflow.python.eager import context
from gpucourse import devices
from gpucourse.logcapture import capture_output
exec(sys.argv[1])
tf.debugging.set_log_device_placement(True)
flag, started = tf.debugging.get_log_device_placement(), devices.runtime_initialized()
config_flag = context.context().config.log_device_placement  # the ConfigProto new tf.functions get
with capture_output() as out:
    tf.sqrt(tf.constant([4.0, 9.0]))
@tf.function
def traced_after(t):                           # traced only now, after the call
    return tf.sqrt(t) + 1.0
with capture_output() as fn_out:
    traced_after(tf.constant([4.0, 9.0]))
emit({"flag": bool(flag), "started": started, "config_flag": bool(config_flag), "log": out.text,
      "function_log": fn_out.text})
"""

_SWITCH_OFF_PROBE = r"""
import tensorflow as tf
from tensorflow.python.eager import context
from gpucourse import placement
from gpucourse.logcapture import capture_output
placement.start_logging()
tf.constant(1.0) + 1.0                        # the runtime starts, AddV2 is logged
tf.debugging.set_log_device_placement(False)  # meant: "stop the log"
with capture_output() as out:
    tf.constant(2.0) + 1.0
@tf.function
def traced_after(t):                          # traced only now, after the call
    return tf.sqrt(t) + 1.0
with capture_output() as fn_out:
    traced_after(tf.constant([4.0, 9.0]))
missing = f"/GPU:{len(tf.config.list_physical_devices('GPU'))}"  # a GPU this machine does not have
fn_log = placement.parse_placement_log(fn_out.text)
facts = {"log_flag": bool(tf.debugging.get_log_device_placement()),
         "soft_flag": bool(tf.config.get_soft_device_placement()),
         "config_flag": bool(context.context().config.log_device_placement),
         "still_logging": any(r.op_type == "AddV2" for r in placement.parse_placement_log(out.text).executed),
         "function_placed": any(r.op_type == "AddV2" for r in fn_log.placed),
         "function_called": any(r.is_function_call for r in fn_log.executed),
         "effective_soft": placement.effective_soft_placement(), "device": missing, "error": None}
with capture_output():
    try:
        with tf.device(missing):
            tf.matmul(tf.ones((2, 2)), tf.ones((2, 2)))
    except tf.errors.InvalidArgumentError as err:
        facts["error"] = err.message
tf.config.set_soft_device_placement(True)     # the repair
facts["repaired"] = placement.effective_soft_placement()
emit(facts)
"""

#: The probes run side by side next to the kernel: on a GPU, memory growth keeps each from reserving it all.
_PROBE_ENV = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}


@dataclass
class OrderProbe:
    """What one fresh process logged when ``before`` ran ahead of ``set_log_device_placement(True)``."""

    label: str
    before: str
    flag: bool  # what tf.debugging.get_log_device_placement() claimed afterwards
    runtime_started: bool  # whether ``before`` had already started the runtime
    log: PlacementLog  # what the eager ``tf.sqrt`` that ran afterwards logged
    config_flag: bool = False  # log_device_placement in the ConfigProto new tf.functions are given
    function_log: PlacementLog = field(default_factory=_parse)  # a tf.function traced afterwards

    @property
    def logged(self) -> bool:
        """True if the ``Sqrt`` op that ran afterwards appeared in the log."""
        return any(r.op_type == "Sqrt" for r in self.log)

    @property
    def function_logged(self) -> bool:
        """True if the placer printed the nodes of the ``tf.function`` traced afterwards (its ``AddV2``)."""
        return any(r.op_type == "AddV2" for r in self.function_log.placed)


@dataclass
class SwitchOffProbe:
    """What ``set_log_device_placement(False)`` did in a fresh process whose runtime had started."""

    log_flag: bool  # tf.debugging.get_log_device_placement() afterwards
    soft_flag: bool  # tf.config.get_soft_device_placement() afterwards
    config_flag: bool  # log_device_placement in the ConfigProto new tf.functions are given
    still_logging: bool  # the next op was still logged
    function_placed: bool  # the placer still printed the nodes of a tf.function traced afterwards
    function_called: bool  # and its call still logged an ``Executing op __inference_...`` line
    effective_soft: bool  # the runtime really fell back (effective_soft_placement())
    device: str  # a device this machine does not have
    error: str | None  # what tf.device(device) raised, None if the op ran
    repaired: bool  # effective soft placement after tf.config.set_soft_device_placement(True)

    def to_text(self) -> str:
        err = (self.error or "").split(" Supported device types")[0]
        rows = [("tf.debugging.get_log_device_placement()", str(self.log_flag)),
                ("the next op is still logged", str(self.still_logging)),
                ("a tf.function traced now: its nodes still placed in the log", str(self.function_placed)),
                ("tf.config.get_soft_device_placement()", str(self.soft_flag)),
                ("soft placement really on (effective_soft_placement)", str(self.effective_soft)),
                (f"with tf.device({self.device!r})", f"raises: {err}" if err else "runs"),
                ("after tf.config.set_soft_device_placement(True), really on", str(self.repaired))]
        width = max(len(k) for k, _ in rows)
        head = "after the first op, tf.debugging.set_log_device_placement(False), then:"
        return "\n".join([head] + [f"  {k:<{width}}  {v}" for k, v in rows])

    def __str__(self) -> str:
        return self.to_text()


def _check_befores(befores) -> dict:
    _validate.mapping("befores", befores, "{label: python code}")
    for label, code in befores.items():
        if not isinstance(label, str) or not isinstance(code, str):
            raise TypeError(f"labels and code must be strings, got {label!r}: {type(code).__name__}")
    return befores


def _order_result(label: str, code: str, answer) -> OrderProbe:
    if isinstance(answer, Exception):
        raise RuntimeError(f"probe {label!r} failed: {answer}") from answer
    return OrderProbe(label, code, answer["flag"], answer["started"], _parse(answer["log"]),
                      answer["config_flag"], _parse(answer["function_log"]))


def _run_probes(befores, switch_off: bool, timeout) -> tuple[list[OrderProbe], SwitchOffProbe | None]:
    befores = _check_befores(befores)
    _validate.seconds("timeout", timeout, allow_zero=False)
    probes = [_probe.Probe(_ORDER_PROBE, (code,), _PROBE_ENV, label) for label, code in befores.items()]
    if switch_off:
        probes.append(_probe.Probe(_SWITCH_OFF_PROBE, (), _PROBE_ENV, "set_log_device_placement(False)"))
    answers = _probe.run_many(probes, timeout=timeout)
    order = [_order_result(label, code, a) for (label, code), a in zip(befores.items(), answers)]
    if not switch_off:
        return order, None
    if isinstance(answers[-1], Exception):
        raise RuntimeError(f"the switch-off probe failed: {answers[-1]}") from answers[-1]
    return order, SwitchOffProbe(**answers[-1])


def probe_logging(befores: dict, timeout: float = 180) -> tuple[list[OrderProbe], SwitchOffProbe]:
    """Run :func:`probe_order`'s probes and the switch-off probe side by side in fresh processes.

    Returns ``(order probes, switch-off probe)``. The switch-off probe starts
    logging, runs an op, calls ``tf.debugging.set_log_device_placement(False)``
    and reports the log flag, whether the log carried on (for eager ops and
    for a ``tf.function`` traced afterwards), the soft-placement
    setting, whether the runtime really still falls back (it does not, in TF
    2.21), what a missing device then raises, and whether
    ``tf.config.set_soft_device_placement(True)`` repairs it.
    """
    return _run_probes(befores, True, timeout)


def probe_order(befores: dict, timeout: float = 180) -> list[OrderProbe]:
    """For each ``{label: code}``, run ``code`` in a fresh process, *then* switch logging on, then run one op.

    Then it traces a new ``tf.function``: its ConfigProto says
    ``log_device_placement=True``, but TF 2.21's eager runtime replaces that
    with its own flag (``KernelAndDeviceFunc::InstantiateFunc``, in
    ``core/common_runtime/eager/kernel_and_device.cc``): see ``function_logged``.

    The processes run in parallel: which calls make the log too late, without a kernel restart.
    """
    return _run_probes(befores, False, timeout)[0]
