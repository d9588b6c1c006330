"""Kernel side, after the submission's cells: answer the observer's calls on the learner's variables.

The grader sends this file's text and the text of :mod:`gpucourse.grading.protocol` in its last cell;
:func:`serve` then connects to the grader's socket and answers, until told to stop, one kind of request
at a time (``op`` of a ``call`` frame):

* ``kind``: what the learner's name is (``"missing"``, ``"function"`` or the type's name);
* ``value``: the learner's variable ``name`` as plain data;
* ``call``: call the learner's function ``name`` with plain arguments;
* ``load``: build a test file's kernel part (the functions its items mark ``@in_kernel``) from text;
* ``fixture``: call such a function with a view of the learner's variables and plain arguments.

Arguments are plain data, except ``{"__callback__": n}``, which becomes a function that calls back into
the observer (a ``callback`` frame) and returns its reply: the observer counts and times those calls
itself. Every result is converted to plain data at once (:func:`~gpucourse.grading.protocol.plain`),
before the next request is read. An exception of the learner's code, ``KeyboardInterrupt`` and
``SystemExit`` included, is an answer like any other (``raised``).

Nothing here is trusted: the submission ran before this file and can change whatever this file uses. The
observer therefore judges only what it can check itself (see ``docs/grading-architecture.md``).
Standard library only.
"""

from __future__ import annotations

__all__ = ["CELL_TEMPLATE", "serve"]

#: The grader's last cell: the agent's and the protocol's texts, the socket, the run's token and the key.
CELL_TEMPLATE = """\
def _gpucourse_agent(protocol_src, agent_src, address, token, key):
    protocol = {{"__name__": "gpucourse_protocol"}}
    exec(compile(protocol_src, "<gpucourse-protocol>", "exec"), protocol)
    agent = {{"__name__": "gpucourse_agent"}}
    exec(compile(agent_src, "<gpucourse-agent>", "exec"), agent)
    agent["serve"](protocol, address, token, bytes.fromhex(key), globals())
_gpucourse_agent({protocol_src!r}, {agent_src!r}, {address!r}, {token!r}, {key!r})
"""

#: Notebook variables that are IPython's, not the learner's.
HIDDEN_NAMES = ("In", "Out", "get_ipython", "exit", "quit")


def serve(protocol: dict, address: str, token: str, key: bytes, user_ns: dict) -> None:
    """Connect to ``address``, say hello with ``token``, answer calls until ``stop`` or the socket closes."""
    import queue
    import socket
    import sys
    import threading

    encode, reader = protocol["encode"], protocol["Reader"]({"agent": key}, role="agent")
    plain = protocol["plain"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    lock, seq = threading.Lock(), [0]

    def send(kind: str, body) -> None:
        with lock:
            frame = encode(key, seq[0], kind, body)
            seq[0] += 1  # before writing: sendall reports an interrupt that came after it wrote the whole frame
            sock.sendall(frame)

    inbox: queue.Queue = queue.Queue()
    waiting: dict = {}  # callback id -> [event, reply]

    def read() -> None:
        try:
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                for kind, body in reader.feed(data):
                    if kind == "reply":
                        slot = waiting.get(body.get("cb"))
                        if slot is not None:
                            slot[1] = body
                            slot[0].set()
                    else:
                        inbox.put((kind, body))
        except Exception as exc:  # noqa: BLE001 (a broken frame or socket ends the service)
            inbox.put(("broken", f"{type(exc).__name__}: {exc}"))
        finally:
            inbox.put(("stop", None))
            for slot in list(waiting.values()):
                slot[1] = {"raise": {"type": "RuntimeError", "message": "the grader's observer went away"}}
                slot[0].set()

    send("hello", {"role": "agent", "token": token})
    threading.Thread(target=read, name="gpucourse-agent-reader", daemon=True).start()
    counter = iter(range(1, 1 << 62))
    modules: dict = {}
    learner = _Learner(user_ns)

    def proxy(fn_id):
        def call(*args, **kwargs):
            cb = next(counter)
            slot = waiting[cb] = [threading.Event(), None]
            send("callback", {"cb": cb, "fn": fn_id, "args": plain(list(args)), "kwargs": plain(kwargs)})
            slot[0].wait()
            reply = waiting.pop(cb)[1]
            if "ok" in reply:
                return reply["ok"]
            raise _exception(reply.get("raise") or {})
        call.__name__ = call.__qualname__ = f"grader_callback_{fn_id}"
        return call

    def unpack(value):
        if isinstance(value, list):
            return [unpack(v) for v in value]
        if isinstance(value, dict):
            if len(value) == 1 and "__callback__" in value:
                return proxy(value["__callback__"])
            return {k: unpack(v) for k, v in value.items()}
        return value

    def answer(body: dict):
        op = body.get("op")
        if op == "kind":
            return learner.kind(body["name"])
        if op == "value":
            return learner.function(body["name"])
        if op == "load":
            modules[body["module"]] = _load(body["text"], body["path"])
            return None
        args, kwargs = unpack(body.get("args", [])), unpack(body.get("kwargs", {}))
        if op == "call":
            return learner.function(body["name"])(*args, **kwargs)
        if op == "fixture":
            return getattr(modules[body["module"]], body["name"])(learner.namespace(), *args, **kwargs)
        raise ValueError(f"unknown request {op!r}")

    audit = sys.audit
    try:
        while True:
            try:
                kind, body = inbox.get()
            except KeyboardInterrupt:  # the observer's interrupt came late: nothing is running
                continue
            if kind != "call":
                break
            call_id, sent = body.get("id"), False
            try:
                audit("gpucourse.look", call_id)
                try:
                    value = answer(body)
                    out = {"id": call_id, "ok": plain(value, tuples=True)}
                except BaseException as exc:  # noqa: BLE001 (the learner's code may raise anything)
                    out = {"id": call_id, "raised": _describe(exc, plain)}
                audit("gpucourse.look", call_id)
                try:
                    send("result", out)
                except OSError:
                    raise
                except Exception as exc:  # noqa: BLE001 (an answer too big, an int of too many digits...)
                    raised = _describe(exc, plain)
                    raised["message"] = "the answer could not be sent to the grader: " + raised["message"]
                    send("result", {"id": call_id, "raised": raised})
                sent = True
            except KeyboardInterrupt:
                if not sent:
                    send("result", {"id": call_id, "raised": {"type": "KeyboardInterrupt",
                                                              "mro": ["KeyboardInterrupt", "BaseException"],
                                                              "message": "interrupted", "where": None}})
    finally:  # however serve ends, the observer must see the connection close (not wait for its deadline)
        try:
            sock.shutdown(socket.SHUT_RDWR)  # close() alone leaves it open while the reader thread is in recv()
        except OSError:
            pass
        sock.close()


class _Learner:
    """The learner's public notebook variables (no leading underscore, none of IPython's)."""

    def __init__(self, user_ns: dict):
        self.user_ns = user_ns

    def _public(self) -> dict:
        return {k: v for k, v in self.user_ns.items() if not k.startswith("_") and k not in HIDDEN_NAMES}

    def kind(self, name: str) -> str:
        found = self._public()
        if name not in found:
            return "missing"
        return "function" if callable(found[name]) else type(found[name]).__name__

    def function(self, name: str):
        return self._public()[name]

    def namespace(self):
        from gpucourse.grading.items import Namespace

        return Namespace(self._public(), raw=True)


def _load(text: str, path: str):
    """A test file's kernel part as a module that is in no registry (its source is given to linecache)."""
    import linecache
    import sys
    import types

    linecache.cache[path] = (len(text), None, text.splitlines(True), path)
    module = types.ModuleType(f"gpucourse_kernel_tests_{abs(hash(path))}")
    sys.modules[module.__name__] = module  # dataclasses look their module up while a class is made
    try:
        exec(compile(text, path, "exec"), module.__dict__)  # noqa: S102 (the grader's text)
    finally:
        sys.modules.pop(module.__name__, None)
    return module


def _library_roots() -> tuple:
    """Where library code lives: a frame outside these (and outside the grader's shipped files) is the learner's."""
    import os
    import sys

    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    try:
        import gpucourse

        roots.add(os.path.realpath(os.path.dirname(gpucourse.__file__)))
    except Exception:  # noqa: BLE001
        pass
    return tuple(roots) + ("<frozen", "<gpucourse-")


def _describe(exc: BaseException, plain) -> dict:
    """An exception as plain data: its type, the names of its classes, its message, where in the learner's code.

    The learner's exception runs its own code here (``__str__``, a metaclass's ``__name__``); whatever that
    raises, ``SystemExit`` included, the answer is still a description, from the type's own slots.
    """
    try:
        return _describe_fully(exc, plain)
    except BaseException:  # noqa: BLE001
        name_of, mro_of = type.__dict__["__name__"].__get__, type.__dict__["__mro__"].__get__
        mro = [str.__str__(name_of(c)) for c in mro_of(type(exc))]
        return {"type": mro[0], "mro": mro, "message": "<unprintable>", "where": None, "learner": False}


def _describe_fully(exc: BaseException, plain) -> dict:
    import traceback

    mro = [c.__name__ for c in type(exc).__mro__]
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001
        message = "<unprintable>"
    where = None
    try:
        roots = _library_roots()
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_learners(f.filename, roots)]
        if frames:
            f = frames[-1]
            where = {"function": f.name, "line": (f.line or "").strip()}
    except Exception:  # noqa: BLE001
        where = None
    return plain({"type": type(exc).__name__, "mro": mro, "message": message[:1000], "where": where,
                  "learner": where is not None})


def _is_learners(filename: str, roots: tuple) -> bool:
    import os

    if filename.startswith(("<gpucourse-", "<frozen")):
        return False
    if filename.startswith("<"):  # <ipython-input-...>, <string>: the learner's cells
        return True
    return not os.path.realpath(filename).startswith(roots)


def _exception(spec: dict) -> BaseException:
    """The exception a callback's reply asks for: a built-in one, or a class named by its dotted path."""
    import builtins
    import importlib

    name, message = str(spec.get("type", "RuntimeError")), str(spec.get("message", ""))
    cls = None
    if "." not in name:
        cls = getattr(builtins, name, None)
    else:
        module, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr, None)
        except ImportError:
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return RuntimeError(f"{name}: {message}")
    for args in ((message,), (None, None, message)):  # TensorFlow's OpError takes (node_def, op, message)
        try:
            return cls(*args)
        except TypeError:
            continue
    return RuntimeError(f"{name}: {message}")
