"""The trusted observer: each item's ``observe`` runs here, against the graded kernel, with its own time limit.

:class:`RemoteNamespace` is what ``observe(ns, case)`` gets from the grader. It has the methods of the
learner-side :class:`gpucourse.grading.items.Namespace`, but every one of them is a request to the kernel's
agent over a :class:`.link.Link`:

* ``ns.function(name)(*args)`` calls the learner's function with plain arguments. A function of the check
  among them stays here: the learner's code gets a stand-in that calls back, so the check's counts,
  call logs and clocks live in this process, out of the learner's reach.
* ``ns.kernel(fn, *args)`` runs a test file's ``@in_kernel`` function in the kernel (live TensorFlow
  objects); its result is the learner's word.
* ``ns.fresh_process()`` starts another kernel that runs the submission's cells again, for a check that
  kills a process for real (lab 04 q5).

:func:`observe_plan` observes every item of the plan in turn. Each item has its own deadline: a call that
runs past it is interrupted, and a kernel that does not stop, or dies, is started again for the next item.
A ``BaseException`` of the learner's code fails only the item it happened in.
"""

from __future__ import annotations

import time

from .. import items as items_module
from .. import protocol
from ..items import (Fail, ItemTimeout, KernelLost, NotDefined, RaisedInKernel,
                     RaisedNotImplementedInKernel, tr)
from .link import CallTimeout

__all__ = ["RemoteNamespace", "observe_plan"]


class _Clock:
    """The deadline of the item being observed."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds


class RemoteNamespace:
    """The learner's variables in the graded kernel, seen from the observer (see the module docstring)."""

    def __init__(self, session, clock: _Clock, modules: dict, fresh=None):
        self._session, self._clock, self._modules = session, clock, modules
        self._fresh = fresh

    # -- requests

    def _request(self, body: dict):
        link = self._session.link
        if link is None:
            raise KernelLost("the kernel is not running")
        try:
            answer = link.call(body, self._clock.deadline)
        except CallTimeout as timeout:
            answer = self._interrupt(link, timeout.args[0])
        if "raised" in answer:
            spec = answer["raised"] if isinstance(answer["raised"], dict) else {}
            mro = spec.get("mro") or []
            if "NotImplementedError" in mro:
                raise RaisedNotImplementedInKernel(spec)
            raise RaisedInKernel(spec)
        return protocol.unpack_tuples(answer.get("ok"))

    def _interrupt(self, link, call_id: int) -> dict:
        """The item's time is up: interrupt the call; if it does not stop, the kernel is started again."""
        from .session import INTERRUPT_GRACE_S

        self._session.interrupt()
        try:
            link.wait(call_id, time.monotonic() + INTERRUPT_GRACE_S)
        except (CallTimeout, KernelLost):
            self._session.restart_later = True
        raise ItemTimeout()  # the item's message says the time is up (an observe may add how far the code got)

    def _kind(self, name: str) -> str:
        return self._request({"op": "kind", "name": name})

    # -- the Namespace interface

    def __contains__(self, name: str) -> bool:
        return self._kind(name) != "missing"

    def value(self, name: str):
        kind = self._kind(name)
        if kind == "missing":
            raise NotDefined(tr("Not attempted: `{name}` is not defined yet. Run the cell above first (the one that "
                                "defines `{name}`, and the cells before it).", name=name))
        if kind == "function":
            return _RemoteFunction(self, name)
        return self._request({"op": "value", "name": name})

    def function(self, name: str):
        kind = self._kind(name)
        if kind == "missing":
            self.value(name)  # the learner-facing "not defined yet"
        if kind != "function":
            raise Fail(tr("`{name}` should be a function, but it is a {kind}.", name=name, kind=kind))
        return _RemoteFunction(self, name)

    def kernel(self, fn, *args, **kwargs):
        """Run the test file's ``@in_kernel`` function ``fn`` in the kernel; its plain result."""
        if not items_module.is_kernel_function(fn):
            raise TypeError(f"ns.kernel runs a function marked @in_kernel, got {fn!r}")
        source = self._modules.get(fn.__code__.co_filename)
        if source is None:
            raise TypeError(f"{fn.__name__} is not a function of a test file the kernel loaded")
        link = self._session.link
        return self._request({"op": "fixture", "module": source, "name": fn.__name__,
                              "args": link.pack(list(args)), "kwargs": link.pack(kwargs)})

    @property
    def fresh_process(self):
        return self._fresh


class _RemoteFunction:
    """The learner's function ``name`` in the graded kernel: calling it sends the call there."""

    def __init__(self, ns: RemoteNamespace, name: str):
        self._ns, self.__name__ = ns, name

    def __call__(self, *args, **kwargs):
        link = self._ns._session.link
        if link is None:
            raise KernelLost("the kernel is not running")
        return self._ns._request({"op": "call", "name": self.__name__, "args": link.pack(list(args)),
                                  "kwargs": link.pack(kwargs)})

    def __repr__(self) -> str:
        return f"<the learner's function {self.__name__} in the graded kernel>"


def observe_plan(session, plan, modules: dict, item_timeout_s: float, fresh=None, on_item=None) -> dict:
    """``{entry name: payload}`` for every entry of ``plan`` (:class:`.judge.PlanEntry`), observed in ``session``.

    A payload is ``{"observed": ...}`` (split items, see :func:`gpucourse.grading.items.observe_item`),
    ``{"result": ...}`` (inline items, judged here) or ``{"error": reason}``. ``modules`` maps a test file's
    path to the key the kernel loaded it under. ``fresh(ns)``, if given, makes ``ns.fresh_process``.
    A kernel that dies or hangs is started again before the next item.
    """
    out = {}
    for entry in plan:
        if on_item is not None:
            on_item(entry)
        if entry.error:
            continue
        if getattr(session, "restart_later", False) or session.link is None or session.link.closed.is_set():
            session.restart_later = False
            try:
                session.restart()
            except KernelLost as exc:
                out[entry.name] = {"error": f"the kernel could not be started again ({exc})"}
                continue
        clock = _Clock(getattr(entry, "timeout_s", None) or item_timeout_s)
        ns = RemoteNamespace(session, clock, modules)
        if fresh is not None:
            ns._fresh = fresh(ns)
        try:
            if entry.split:
                out[entry.name] = {"observed": items_module.observe_item(entry.obj, ns, entry.cases, clock.seconds,
                                                                         alarm=False)}
            else:
                out[entry.name] = {"result": items_module.run_item(entry.spec, entry.obj, ns, clock.seconds,
                                                                   alarm=False).to_dict()}
        except KernelLost as exc:  # (ProcessKilled of a fresh process is the check's to catch)
            session.restart_later = True
            out[entry.name] = {"observed": {"status": "error", "case": 0, "message": tr(
                "The kernel stopped while this item ran your code ({why}): look for os._exit, a crash or memory "
                "use that grows without end.", why=str(exc))}}
    return out

