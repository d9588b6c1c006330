"""Kernel side, last cell of a graded run: call the learner's code on the grader's cases, send plain observations.

This file runs inside the submission's kernel after all of the submission's cells. The grader reads
it as text and executes it under the file name :data:`DRIVER_FILENAME` in a private namespace (see
:mod:`gpucourse.grading.execute`); it is never imported there and uses the standard library only.
It is a real module so that it can be linted and unit-tested (``tests/grading/test_kernel_observe.py``).

The grader's cell calls :func:`run_sealed` with the config sealed with the guard's channel key (see
:func:`gpucourse.grading.kernel_guard.seal`): the guard unseals it, once, so the cases never appear in
a cell's source, which the submission can read. :func:`run` builds a fresh copy of
:mod:`gpucourse.grading.items` and of every test file from the text the grader read before the
submission ran (the submission can neither rewrite nor replace them), then, item by item:

* a *split* item (``cases``/``observe``/``judge``): ``observe_item`` calls the learner's code on the
  cases the grader drew with its secret seed and returns plain data (no expected answer exists in
  this process);
* an *inline* item (a plain ``fn(ns)``, e.g. an instructor's older hidden test): ``run_item``
  runs it here and its verdict travels back (the grader marks such verdicts as less trusted).

Every message goes out as an audit event (``sys.audit``) that the guard's hook, installed before
the submission ran, writes to the grader's socket: ``gpucourse.phase`` at the start, before each
item and at the end (each time, the hook compares everything it watches with its record), and
``gpucourse.observed`` with one item's observation as plain data (the guard copies and encodes it).
Nothing is written to a file or printed for the grader.
"""

from __future__ import annotations

__all__ = ["DRIVER_FILENAME", "HIDDEN_NAMES", "run", "run_sealed"]

#: File name the driver is compiled under; the guard accepts grader events only from code compiled so.
DRIVER_FILENAME = "<gpucourse-observe>"

#: Notebook variables that are IPython's, not the learner's.
HIDDEN_NAMES = ("In", "Out", "get_ipython", "exit", "quit")


def _remember(path: str, source: str) -> None:
    """Give linecache the source of a file the grader sent as text (mtime None: never checked on disk).

    Tracebacks and TensorFlow's AutoGraph (which reads a traced function's source through
    ``inspect``) then never open the test file. Such a read is made on the grader's behalf, yet
    perhaps with the learner's code on the stack (``tf.function(f).get_concrete_function()`` on the
    check's own ``f`` inside a learner's function): the guard would take it for the learner reading
    the tests. In the sandbox the file on disk is an empty stand-in anyway. (The modules built from
    such text then lose their ``__file__``: AutoGraph calls ``linecache.updatecache``, which reads
    the disk again, for any function whose file is some loaded module's ``__file__``.)
    """
    import linecache

    linecache.cache[path] = (len(source), None, source.splitlines(True), path)


def _fresh_module(name: str, path: str, source: str):
    import sys
    import types

    _remember(path, source)
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 (the grader's own code, read before the run)
    finally:
        sys.modules.pop(name, None)  # then out of the submission's reach (no search of sys.modules finds it)
    del module.__file__  # see _remember
    return module


def run(config_text: str, user_ns: dict, audit=None) -> dict:
    """Observe every item of the JSON ``config_text`` on the learner's variables in ``user_ns``.

    The config holds ``items_src``/``items_path`` (text and path of ``items.py``), ``tests`` (a list
    of ``[source, path, text]``), ``plan`` (a list of ``{"source", "key", "split", "cases"}`` in
    grading order) and ``timeout_s`` (per item). The first message carries the SHA-256 of
    ``config_text``, so the grader knows the kernel got its tests and cases unaltered. ``audit``
    defaults to ``sys.audit`` (tests pass a recorder). Returns what was sent, for tests.
    """
    import hashlib
    import json
    import sys
    import uuid

    audit = audit or sys.audit
    sent = {}
    audit("gpucourse.phase", "begin", hashlib.sha256(config_text.encode()).hexdigest())
    # A fresh decoder: json.loads would go through json._default_decoder, an instance the guard does not
    # watch (its class and module functions it does).
    config = json.JSONDecoder().decode(config_text)
    items = _fresh_module(f"_gpucourse_items_{uuid.uuid4().hex[:8]}", config["items_path"], config["items_src"])
    public = {k: v for k, v in user_ns.items() if not k.startswith("_") and k not in HIDDEN_NAMES}
    ns = items.Namespace(public, _worker(config, audit) if "cells" in config else None)

    # Test files import `gpucourse.grading.items`: let them find the fresh copy, not the kernel's.
    found, errors = {}, {}
    saved = sys.modules.get("gpucourse.grading.items")
    sys.modules["gpucourse.grading.items"] = items
    try:
        for source, path, text in config["tests"]:
            try:
                _remember(path, text)
                module = items.load_test_source(text, path)
                module.__dict__.pop("__file__", None)  # see _remember
                sys.modules.pop(module.__name__, None)  # out of the submission's reach, like the items copy
                found[source] = {spec.key: (spec, obj) for spec, obj in items.items_in(module)}
            except Exception as exc:
                errors[source] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if saved is not None:
            sys.modules["gpucourse.grading.items"] = saved
        else:
            sys.modules.pop("gpucourse.grading.items", None)

    timeout = config.get("timeout_s", items.ITEM_TIMEOUT_S)
    for entry in config["plan"]:
        name = f"{entry['source']}:{entry['key']}"
        audit("gpucourse.phase", "item", name)
        spec, obj = found.get(entry["source"], {}).get(entry["key"], (None, None))
        if obj is None:
            why = errors.get(entry["source"], "the item is missing from the test file the kernel loaded")
            payload = {"error": f"the kernel could not load this item ({why})"}
        elif entry["split"] and items.is_split(obj):
            payload = {"observed": items.observe_item(obj, ns, entry["cases"], timeout)}
        elif not entry["split"] and not items.is_split(obj):
            payload = {"result": items.run_item(spec, obj, ns, timeout).to_dict()}
        else:
            payload = {"error": "the kernel loaded a different kind of item than the grader"}
        # Plain data, copied and written by the guard itself (never through json, which the
        # submission may have patched for the length of one call).
        sent[name] = payload
        audit("gpucourse.observed", name, payload)
    audit("gpucourse.phase", "end", "")  # (the guard ends the standby first, if there is one)
    return sent


def run_sealed(sealed: bytes, user_ns: dict, audit=None) -> dict:
    """:func:`run` on the config the grader sealed with the guard's key: the guard unseals it, once."""
    import sys

    audit = audit or sys.audit
    holder = []
    audit("gpucourse.config", sealed, holder)
    if not holder:
        raise RuntimeError("the grader's guard did not unseal the checks' config")
    return run(holder[0].decode(), user_ns, audit)


def _worker(config: dict, audit):
    """``ns.worker`` for items that kill a process: the standby the grader's first cell forked (see
    :mod:`gpucourse.grading.kernel_standby`), which only the guard holds, given the submission's cells
    and the test file's text."""
    texts = {path: text for _, path, text in config["tests"]}

    def worker(entry, args, stop_at=None, timeout_s=60.0):
        path = entry.__code__.co_filename
        holder = []
        audit("gpucourse.worker", (config["cells"], path, texts[path], entry.__name__, args, stop_at, timeout_s),
              holder)
        if not holder or holder[0][1] is None:
            raise RuntimeError("the grader's standby process did not start")
        status, value = holder[0]
        if status != "ok":
            raise value
        return value

    return worker
