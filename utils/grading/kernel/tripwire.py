"""Kernel side, before the submission's cells: report what a human should look at. Never a verdict.

The grader's first cell sends this file's text and :mod:`gpucourse.grading.protocol`'s, and calls
:func:`install`, which connects to the grader's socket and installs an audit hook (:pep:`578`; it
cannot be removed). The hook sends a ``flag`` record when the submission's own code

* reads frames or walks objects (``sys._getframe``, ``sys._current_frames``, frame attributes of
  tracebacks and generators, ``gc.get_objects``/``get_referrers``/``get_referents``), also through
  ``inspect``, ``traceback``, ``logging`` and TensorFlow's ``tf_inspect``/``tf_stack``, whose frames
  count as their caller's;
* runs dynamic code (``exec``, ``compile`` called by the submission itself);
* sets a profiler or a tracer (``sys.setprofile``, ``sys.settrace``), whoever calls it;
* calls ``ctypes``, starts or signals a process, opens ``/proc/<pid>/mem``, adds an audit hook;

and, at each ``gpucourse.look`` event (the agent raises one before and after every call), a ``look``
record: Python signal handlers, profiler and tracer, and threads that were not there when it was
installed (each as the function it runs, read from its frames). The grader turns these into review flags
(:mod:`gpucourse.grading.grader.flags`).

The hook never calls the submission's code: it reads only exact built-in types, frames and code objects.
It fails closed: an exception inside the hook becomes a ``tripwire-error`` flag (at the next event, if
there was no stack left to send it), and a missing ``look`` shows as ``silenced``; a ``KeyboardInterrupt``
(the observer's interrupt) passes through, as it would anywhere else. The submission shares this process
and can, with effort, silence the hook; that only hides a flag, since no mark depends on anything said
here. Standard library only.
"""

from __future__ import annotations

__all__ = ["CELL_TEMPLATE", "install"]

#: The grader's first cell: the protocol's and this file's texts, the socket, the run's token and the key.
CELL_TEMPLATE = """\
def _gpucourse_tripwire(protocol_src, tripwire_src, address, token, key, grader_code):
    protocol = {{"__name__": "gpucourse_protocol"}}
    exec(compile(protocol_src, "<gpucourse-protocol>", "exec"), protocol)
    tripwire = {{"__name__": "gpucourse_tripwire"}}
    exec(compile(tripwire_src, "<gpucourse-tripwire>", "exec"), tripwire)
    tripwire["install"](protocol, address, token, bytes.fromhex(key), grader_code)
_gpucourse_tripwire({protocol_src!r}, {tripwire_src!r}, {address!r}, {token!r}, {key!r}, {grader_code!r})
del _gpucourse_tripwire
"""

#: Modules whose frames count as their caller's for introspection (they hand frames on).
FRAME_WRAPPERS = ("/inspect.py", "/traceback.py", "/logging/__init__.py", "/tf_inspect.py", "/tf_stack.py")
#: The functions of those modules that hand frame objects to their caller (``logging.currentframe`` is a lambda).
#: A frame read inside any other of their functions (``logging.warning`` finding its caller, ``traceback.print_exc``
#: printing a traceback) stays inside the library: honest code that logs is not flagged.
FRAME_HANDOUTS = ("stack", "trace", "currentframe", "getouterframes", "getinnerframes", "walk_stack", "walk_tb",
                  "<lambda>", "_getframe")
#: Audit events and the category they are flagged under when the submission's code raises them.
EVENTS = {"sys._getframe": "introspection", "sys._current_frames": "introspection",
          "sys._current_exceptions": "introspection", "object.__getattr__": "introspection",
          "gc.get_objects": "introspection", "gc.get_referrers": "introspection", "gc.get_referents": "introspection",
          "exec": "dynamic-code", "compile": "dynamic-code",
          "os.system": "process", "subprocess.Popen": "process", "os.exec": "process", "os.fork": "process",
          "os.forkpty": "process", "os.posix_spawn": "process", "os.spawn": "process", "os.kill": "process",
          "os.killpg": "process", "pty.spawn": "process", "sys.addaudithook": "audit-hook"}
#: Events flagged whoever raises them.
ANYONE = {"sys.setprofile": "profiler", "sys.settrace": "profiler"}


def install(protocol: dict, address: str, token: str, key: bytes, grader_code=()) -> None:
    """Connect to the grader, send ``hello``, install the hook. Raises if the grader cannot be reached.

    ``grader_code``: SHA-256 digests of the texts the grader's own later cell compiles (the protocol's and
    the agent's): compiling and running exactly those is not dynamic code of the submission.
    """
    import builtins as b

    # Every name the hook uses is bound here, before any submitted code runs: a builtin or a module global the
    # submission replaces later (``builtins.len``, ``builtins.type``) must never run inside the hook.
    (type, str, int, len, iter, next, bytes, BaseException, KeyboardInterrupt) = (
        b.type, b.str, b.int, b.len, b.iter, b.next, b.bytes, b.BaseException, b.KeyboardInterrupt)
    events, anyone, frame_wrappers, handouts = dict(EVENTS), dict(ANYONE), tuple(FRAME_WRAPPERS), frozenset(FRAME_HANDOUTS)
    import os
    from _hashlib import openssl_sha256
    import signal
    import socket
    import sys
    import threading
    from _thread import get_ident
    from types import CodeType

    encode = protocol["encode"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    sendall, getframe, getsignal, get_profile, get_trace = (sock.sendall, sys._getframe, signal.getsignal,
                                                             sys.getprofile, sys.gettrace)
    current_frames, lock = sys._current_frames, threading.Lock()
    import gc

    gc_disable, gc_enable, gc_isenabled = gc.disable, gc.enable, gc.isenabled

    def frames_now() -> dict:
        """``sys._current_frames()`` with the collector off: in CPython 3.11 before 3.11.9 a collection inside it
        can free a ``threading.local`` and deadlock on the runtime's thread lock (gh-106883; TensorFlow's graphs
        hold such locals). That deadlock hung the old grader's guard (issue 34)."""
        was = gc_isenabled()
        gc_disable()
        try:
            return current_frames()
        finally:
            if was:
                gc_enable()

    type_name = type.__dict__["__name__"].__get__  # not a metaclass's __name__
    import sysconfig

    library = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    paths = sysconfig.get_paths()
    stdlib = os.path.realpath(paths["stdlib"]) + os.sep
    # Third-party packages (site-packages, which may lie inside stdlib's folder). Not "data" or "scripts": without
    # a virtual environment they are the prefix itself, and every stdlib file would count as a package's.
    site = tuple({os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib")})
    try:
        import gpucourse

        library += (os.path.dirname(os.path.realpath(gpucourse.__file__)) + os.sep,)
    except Exception:  # noqa: BLE001 (a course without its package: its frames count as the learner's)
        pass
    signals = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)]
    baseline_signals = {int(s): getsignal(s) for s in signals}
    baseline_threads = set(frames_now())
    seq, busy, said = [0], set(), set()
    unsent: dict = {}  # tripwire-error flags that could not be sent when they happened (no stack left)
    grader_code, compiled = frozenset(grader_code), []  # file names of grader code compiled, not yet run

    pid = os.getpid()
    getpid = os.getpid

    def send(kind: str, body) -> None:
        if getpid() != pid:  # a forked child shares the socket: its records would corrupt the parent's stream
            return
        with lock:
            frame = encode(key, seq[0], kind, body)
            seq[0] += 1  # before writing: sendall reports an interrupt that came after it wrote the whole frame
            sendall(frame)

    def where(frame, skip: str):
        """(whose, 'file:line function') of the first frame that acts: the learner's, the grader's or a library's.

        ``skip``: "wrappers" passes over the frames of modules that hand frames on (:data:`FRAME_WRAPPERS`),
        "stdlib" over the standard library's (``subprocess`` starting a process, ``ctypes.CDLL`` loading a library
        for its caller), "library" over every library frame (to say where the learner's code was), "none" over
        none. Only "library" passes over the import system: what a module does while it is imported (ctypes
        loading libc, logging reading a code object) is not its importer's act. With "wrappers", a frame read is
        the learner's only when the learner called one of :data:`FRAME_HANDOUTS` (it gets the frames).
        """
        called = None  # the last wrapper function passed: the one its caller called
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if type(name) is not str:  # a str subclass would run its own methods here
                return "learner", "code whose file name is not a str"
            if type(code.co_name) is not str:  # ... and in the f-string below
                return "learner", "code whose name is not a str"
            if name.startswith("<gpucourse-"):
                return "grader", name
            if name.startswith("<frozen importlib"):  # the import system: it compiles and runs what it imports
                if skip != "library":  # what a module does while imported is the import's (ctypes, logging)
                    return "library", name
                frame = frame.f_back
                continue
            if name.startswith("<frozen"):  # a frozen standard module (os, codecs): stdlib code, as on disk
                if skip == "none":
                    return "library", name
                frame = frame.f_back
                continue
            if skip != "none" and name.endswith(frame_wrappers):
                called = code.co_name
                frame = frame.f_back
                continue
            if name.startswith(library):
                if skip == "library" or (skip == "stdlib" and name.startswith(stdlib) and not name.startswith(site)):
                    frame = frame.f_back
                    continue
                return "library", f"{name}:{frame.f_lineno} {code.co_name}"
            if skip == "wrappers" and called is not None and called not in handouts:
                return "library", f"{name}:{frame.f_lineno} {code.co_name}"  # the library kept the frames
            return "learner", f"{name}:{frame.f_lineno} {code.co_name}"
        return "library", ""

    def flag(category: str, detail: str, at: str) -> None:
        item = (category, detail, at)
        if item not in said:  # each place once
            send("flag", {"category": category, "detail": detail, "where": at})
            said.add(item)  # only once sent: an interrupted send is tried again the next time

    def entry(frame):
        """What a thread runs, ``function (file)``, from its frames only (a Thread object's name, ident and
        class are the learner's code); None for the grader's own threads."""
        found = "a thread"
        while frame is not None:
            code = frame.f_code
            name, function = code.co_filename, code.co_name
            if type(name) is not str or type(function) is not str:
                return "code whose names are not str"
            if name.startswith("<gpucourse-"):
                return None
            if not name.endswith(os.sep + "threading.py"):  # the outermost frame that is not threading's own
                found = f"{function} ({name.rpartition(os.sep)[2]})"
            frame = frame.f_back
        return found

    def look(at) -> None:
        changed = [f"{int(s)}" for s in signals if getsignal(s) is not baseline_signals[int(s)]]
        threads = []
        for ident, frame in frames_now().items():  # an exact dict, made now: no thread can hide from it
            if ident not in baseline_threads:
                what = entry(frame)
                if what is not None:
                    threads.append(what)
        send("look", {"at": at if type(at) is int else -1, "signals": changed, "threads": threads,
                      "profiler": get_profile() is not None, "tracer": get_trace() is not None})

    def hook(event, args):
        me = get_ident()
        if me in busy:
            return
        busy.add(me)
        try:
            while unsent:  # errors that happened where not even their flag could be sent
                detail = next(iter(unsent))
                send("flag", unsent[detail])
                del unsent[detail]
            if event == "gpucourse.look":
                look(args[0] if args else -1)
            elif event in anyone:
                flag(anyone[event], event, where(getframe(1), "library")[1])
            elif event.startswith("ctypes."):  # ctypes' own Python wrappers (CDLL, string_at) act for their caller
                whose, at = where(getframe(1), "stdlib")
                if whose == "learner":
                    flag("ctypes", event, at)
            elif event == "open" and args and type(args[0]) in (str, bytes) and args[0].startswith(
                    "/proc/" if type(args[0]) is str else b"/proc/") and args[0].endswith(
                    "/mem" if type(args[0]) is str else b"/mem"):
                path = args[0] if type(args[0]) is str else bytes.decode(args[0], "utf-8", "replace")
                flag("memory", "opened " + path, where(getframe(1), "library")[1])  # whoever opens it
            elif event == "compile" and args and type(args[0]) in (str, bytes) and type(args[1]) is str \
                    and args[1].startswith("<gpucourse-") and openssl_sha256(
                        args[0] if type(args[0]) is bytes else args[0].encode()).hexdigest() in grader_code:
                compiled.append(args[1])  # the grader's own text, compiled by its agent cell
            elif event == "exec" and args and type(args[0]) is CodeType and type(args[0].co_filename) is str \
                    and args[0].co_filename in compiled:
                compiled.remove(args[0].co_filename)
            elif event in events:
                category = events[event]
                whose, at = where(getframe(1), {"introspection": "wrappers", "process": "stdlib"}.get(category, "none"))
                if whose == "learner":
                    attr = args[1] if event == "object.__getattr__" and len(args) > 1 else None
                    flag(category, "read ." + attr if type(attr) is str else event, at)
        except KeyboardInterrupt:  # the observer's interrupt: it stops the learner's code, as anywhere else
            raise
        except BaseException as exc:  # noqa: BLE001 (fails closed: the error itself is reported)
            body = {"category": "tripwire-error", "detail": f"{str.__str__(type_name(type(exc)))} in {event}", "where": ""}
            try:
                send("flag", body)
            except BaseException:  # noqa: BLE001 (no stack left, or the socket is gone: sent at the next event)
                unsent[body["detail"]] = body
        finally:
            busy.discard(me)

    send("hello", {"role": "tripwire", "token": token})
    sys.addaudithook(hook)
