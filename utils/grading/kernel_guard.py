"""Kernel side, first cell of a graded run: record what the grader relies on, then watch the submission.

This file runs inside the submission's kernel *before any of the submission's code*. The grader
reads it as text and executes it in a private namespace (see :mod:`gpucourse.grading.execute`); it
is never imported there and uses the standard library only. It is a real module so that it can be
linted and unit-tested (``tests/grading/test_kernel_guard.py``).

:func:`install` does, in order:

1. imports the libraries the observations use (TensorFlow, Keras, NumPy, the course package) and
   records, for every watched module and every class defined in one, which object each function,
   class and descriptor name refers to, which class each module is, and which ``sys.modules`` entry
   each module is;
2. wraps the lab's answer-bearing course helpers (e.g. ``gpucourse.xla.padding_cost``) and
   ``atexit.register`` so that calls to them are reported;
3. connects to the grader's socket and sends it a fresh random key;
4. installs an audit hook (:pep:`578`; Python offers no way to remove it) that

   * reports, as they happen, the primitives a submission needs to cheat, when the submission's own
     code calls them: frame introspection (``sys._getframe``, ``sys._current_frames``, ``tb_frame``,
     ``gi_frame``, ``sys.settrace``/``setprofile``), ``gc`` object walks, ``ctypes``, dynamic code
     (``exec``, ``compile``, ``function.__new__``), new processes, writes into the Python
     installation, and calls of the answer-bearing helpers; it refuses new audit hooks, and reports
     replacing the code of a watched function or the class of a watched module or class;
   * on the observation driver's phase events, compares every watched name with the record and
     reports what was replaced; at the end, also the threads the submission left running and the
     ``atexit`` hooks it registered;

5. starts a watchdog thread that looks at the standard library's functions every 0.25 s, so a
   patch that breaks the kernel itself (``json``, ``builtins``) is reported before the run dies.

Every report is one line ``<hmac> <repr((seq, kind, detail))>`` written with ``os.write`` to the
socket. The hook and its helpers refer only to names captured when they were built (closure cells),
never to globals or builtins (a unit test checks the bytecode), and never call code the submission
could have defined, so replacing ``json``, ``hashlib``, ``os`` or ``builtins`` after this cell
changes neither what the hook compares nor what it sends. A record the submission writes itself has
no valid HMAC and a record it suppresses leaves a gap in the sequence numbers: the grader withholds
the marks for both.
"""

from __future__ import annotations

__all__ = ["GUARD_FILENAME", "PROTOCOL", "install", "seal"]

#: First line of the channel: ``PROTOCOL <hex key>``.
PROTOCOL = "gpucourse-channel-1"

#: Seconds between two looks of the watchdog thread at the standard library.
WATCH_INTERVAL_S = 0.25

#: File name the guard's code is compiled under (so frames of the guard are recognised).
GUARD_FILENAME = "<gpucourse-guard>"

#: Top-level packages, besides the standard library, whose modules and classes are watched.
WATCHED_PACKAGES = ("tensorflow", "keras", "numpy", "gpucourse", "ml_dtypes")

#: Libraries imported before the snapshot (so they are recorded before the submission can touch them).
PRELOAD = ("json", "hashlib", "hmac", "importlib", "importlib.util", "inspect", "random", "math", "time",
           "threading", "traceback", "types", "uuid", "dataclasses", "copy", "functools", "operator",
           "numpy", "tensorflow", "keras")

#: Standard-library modules the kernel machinery itself rebinds while it runs (not the submission).
SKIP_MODULES = ("asyncio", "concurrent", "logging", "warnings", "encodings", "sqlite3", "pydoc",
                "__main__", "_pydevd", "site", "readline", "rlcompleter", "getpass", "pdb", "bdb",
                "tkinter", "curses", "idlelib", "turtledemo", "tty", "pty", "selectors", "socketserver",
                "xmlrpc", "http", "email", "urllib", "multiprocessing", "ctypes", "distutils", "lib2to3",
                "unittest", "doctest", "test", "zipimport", "code", "codeop")

#: (module, attribute) pairs the kernel rebinds on every request (ipykernel redirects input()).
KERNEL_SWAPPED = (("builtins", "input"), ("builtins", "raw_input"), ("builtins", "getpass"),
                  ("builtins", "display"), ("builtins", "get_ipython"), ("builtins", "exit"),
                  ("builtins", "quit"), ("builtins", "help"), ("sys", "displayhook"), ("sys", "excepthook"),
                  ("sys", "breakpointhook"), ("sys", "unraisablehook"))

FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "gi_yieldfrom", "cr_await")
PATCH_ATTRS = ("__code__", "__defaults__", "__kwdefaults__", "__class__", "__bases__", "__dict__")
PROCESS_EVENTS = ("os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.kill",
                  "os.killpg", "subprocess.Popen", "pty.spawn", "signal.pthread_kill")
INTROSPECTION_EVENTS = ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                        "gc.get_objects", "gc.get_referrers", "gc.get_referents")
DYNAMIC_EVENTS = ("exec", "compile", "function.__new__", "code.__new__", "code.replace", "marshal.loads")
CTYPES_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.addressof", "ctypes.call_function",
                 "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.create_string_buffer", "ctypes.create_unicode_buffer",
                 "ctypes.get_errno", "ctypes.set_errno", "ctypes.string_at", "ctypes.wstring_at",
                 "ctypes.PyObj_FromPtr", "ctypes.get_last_error", "ctypes.set_last_error")


def _is_watched_name(name: str, stdlib: frozenset) -> bool:
    top = name.partition(".")[0]
    return top not in SKIP_MODULES and (top in stdlib or top in WATCHED_PACKAGES)


def _preload(extra=(), defaults: bool = True, course=()) -> None:
    """Import the libraries to watch: PRELOAD and ``course`` (the grader lists the course's helper
    modules, so this file needs nothing but the standard library), then ``extra``."""
    import importlib

    names = tuple(PRELOAD) + tuple(course) if defaults else ()
    for name in names + tuple(extra):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 (a library that is not installed is simply not watched)
            continue


def seal(key: bytes, data: bytes, shake, from_bytes) -> bytes:
    """``data`` XOR a SHAKE-256 keystream of ``key`` (the same call unseals).

    The grader seals the observation driver's config (the items' cases) with the channel key this
    guard sent before any submitted code ran; only the guard unseals it, once, for the driver (audit
    event ``gpucourse.config``). So the cases are never in a cell's source, which the submission can
    read (``In``, ``linecache``, IPython's events). Uses only its arguments (see the hook's rule).
    """
    n = data.__len__()
    stream = shake(key + b"gpucourse-config").digest(n)
    return (from_bytes(data, "big") ^ from_bytes(stream, "big")).to_bytes(n, "big")


def install(config: dict, user_ns: dict | None = None, standby=None) -> dict:
    """Record, connect, install the hook. Returns a summary (sizes, seconds) for the grader's log.

    ``standby``: ``(request, stop)`` from :func:`gpucourse.grading.kernel_standby.start`, forked before
    this guard. It is kept in the hook's closure only: the driver reaches it through the audit event
    ``gpucourse.worker``, and the guard stops it at the end phase.

    ``config`` keys: ``address`` (the grader's Unix socket; ``None`` keeps the records in memory,
    for tests: they are returned under ``"records"`` with the hook), ``answer_helpers`` (dotted
    names of course functions whose use answers an item), ``grader_files`` (file names of grader
    code that later runs in the kernel: the tests), ``driver_files`` (the observation driver's file
    name: only code compiled under it may send phase and observation events), ``driver_sha256``
    (digests of the driver's source: compiling exactly that is not reported), ``protected_files``
    (the test files: opening one is reported), ``preload`` (extra
    modules to import and watch), ``course_modules`` (every helper module of the course, listed by the
    grader) and ``preload_defaults`` (False: import only ``preload``; for tests).
    ``user_ns`` is the notebook's namespace: its ``__builtins__`` must stay the real builtins.
    """
    import _thread
    import atexit
    import inspect
    import logging
    import operator
    import os
    import signal
    import sys
    import time
    import traceback
    import types

    t0 = time.perf_counter()
    _preload(config.get("preload", ()), config.get("preload_defaults", True), config.get("course_modules", ()))

    # ---------------------------------------------------------------- captured primitives
    # Every name the hook and its helpers use is one of these closure variables: never a global or
    # a builtin, which the submission could rebind (tests/grading/test_kernel_guard.py checks it).
    _type, _id, _len, _callable, _repr, _tuple, _set, _list = type, id, len, callable, repr, tuple, set, list
    _any, _map, _zip, _str, _issubclass, _memoryview = any, map, zip, str, issubclass, memoryview
    _bytes, _int, guard_file = bytes, int, GUARD_FILENAME
    _dict, _float, _bool, _inf = dict, float, bool, float("inf")
    _BaseException, _KeyError, _ValueError, _RuntimeError = BaseException, KeyError, ValueError, RuntimeError
    _is_not, _itemgetter = operator.is_not, operator.itemgetter
    _write, _perf, _sleep, interval = os.write, time.perf_counter, time.sleep, WATCH_INTERVAL_S
    _getframe, _current_frames, _get_ident = sys._getframe, sys._current_frames, _thread.get_ident
    _audit, _ncallbacks, _allocate_lock = sys.audit, atexit._ncallbacks, _thread.allocate_lock
    _join, _next = "".join, next
    _CodeType = types.CodeType
    from hashlib import sha256 as _sha256_new
    from hashlib import shake_256 as _shake

    _seal, _from_bytes = seal, int.from_bytes

    def _sha256_hex(data):
        return _sha256_new(data).hexdigest()
    _descriptor_types = frozenset((types.MemberDescriptorType, types.GetSetDescriptorType, property, classmethod,
                                    staticmethod))
    _sigmask = getattr(signal, "pthread_sigmask", None)
    _block = {signal.SIGALRM} if hasattr(signal, "SIGALRM") else set()
    _SIG_BLOCK, _SIG_SETMASK = getattr(signal, "SIG_BLOCK", 0), getattr(signal, "SIG_SETMASK", 2)
    sys_modules, sys_dict = sys.modules, sys.__dict__
    _modules_get, _sys_get = sys_modules.get, sys_dict.get
    meta_path = sys.meta_path
    HEAPTYPE = 1 << 9

    # ---------------------------------------------------------------- the record
    stdlib = frozenset(getattr(sys, "stdlib_module_names", ())) | {"builtins", "sys"}
    skip = set(KERNEL_SWAPPED)
    constants = (int, float, str, bytes, bool, type(None), tuple, frozenset)
    mod_entries, classes, labels = [], [], {}
    for name, mod in sorted(list(sys_modules.items()), key=lambda kv: str(kv[0])):
        if not isinstance(name, str) or not isinstance(mod, types.ModuleType) or not _is_watched_name(name, stdlib):
            continue
        d = mod.__dict__
        course = name.partition(".")[0] == "gpucourse"
        keys = []
        for k, v in list(d.items()):
            if type(k) is not str or (name, k) in skip or k in ("__builtins__", "__loader__", "__spec__"):
                continue
            if callable(v) or (course and k.isupper() and isinstance(v, constants)):  # STEP_S, not _counter
                keys.append(k)
                labels.setdefault(id(v), f"{name}.{k}")
            if (isinstance(v, type) and v.__flags__ & HEAPTYPE and id(v) not in labels.get("classes", ())
                    and _is_watched_name(str(getattr(v, "__module__", "") or ""), stdlib)):
                labels.setdefault("classes", set()).add(id(v))
                classes.append(v)
        mod_entries.append([name, mod, type(mod), d, tuple(keys)])
        labels[id(mod)] = name
    labels.pop("classes", None)
    class_snap = []
    for cls in classes:
        proxy = cls.__dict__
        qual = f"{cls.__module__}.{cls.__qualname__}"
        keys = []
        for k, v in list(proxy.items()):
            if type(k) is not str or k in ("__dict__", "__weakref__", "__doc__", "_abc_impl"):
                continue
            if callable(v) or type(v) in _descriptor_types:
                keys.append(k)
                labels.setdefault(id(v), f"{qual}.{k}")
                for part in ("__func__", "fget", "fset", "fdel"):
                    inner = getattr(v, part, None) if not callable(v) else None
                    if inner is not None:
                        labels.setdefault(id(inner), f"{qual}.{k}")
        keys = tuple(keys)
        class_snap.append((qual, cls, type(cls), proxy, keys, tuple(proxy[k] for k in keys),
                           operator.itemgetter(*keys) if len(keys) > 1 else None, len(proxy), frozenset(proxy)))
        labels[id(cls)] = qual
    class_snap = tuple(class_snap)

    # ---------------------------------------------------------------- who is calling
    import ctypes  # loaded now, so that its frames count as the caller's (below); prctl at the end

    # Frames counted as their caller's: a ctypes call the submission makes through ctypes' own Python
    # wrappers (CDLL.__getattr__, cast, string_at...) is the submission's, like one it makes directly.
    # The same for TensorFlow's own wrappers that hand out frames (tf_inspect.currentframe/stack, tf_stack).
    ctypes_files = tuple(getattr(sys.modules.get(m), "__file__", None)
                         for m in ("ctypes", "ctypes._endian", "tensorflow.python.util.tf_inspect",
                                   "tensorflow.python.util.tf_stack"))
    mediators = frozenset(f for f in (getattr(inspect, "__file__", None), getattr(traceback, "__file__", None),
                                      getattr(logging, "__file__", None), GUARD_FILENAME) + ctypes_files if f)
    roots = {os.path.dirname(os.__file__), sys.prefix, sys.base_prefix, sys.exec_prefix}
    for mod_name in ("numpy", "tensorflow", "IPython", "ipykernel", "gpucourse"):
        file = getattr(sys_modules.get(mod_name), "__file__", None)
        if file:  # the folder holding the package (site-packages, or the course's own utils/ folder)
            up = 1 if mod_name == "gpucourse" else 2
            roots.add(os.path.abspath(os.path.join(file, *[".."] * up)))
    roots |= {p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
    install_roots = tuple(sorted(r for r in roots if len(r) > 1))
    library_roots = install_roots + ("<frozen ",)
    grader_files = frozenset(config.get("grader_files", ()))
    driver_files = frozenset(config.get("driver_files", ()))
    driver_digests = set(config.get("driver_sha256", ()))  # each accepted once: the grader's own compile
    _realpath, _listdir, _readlink = os.path.realpath, os.listdir, os.readlink
    protected = frozenset(_realpath(p) for p in config.get("protected_files", ()))
    protected_names = frozenset(os.path.basename(p) for p in protected)
    # the grader's output folder, hidden tests, grading key: writing there is tampering (the sandbox
    # stops the write itself; without one, this still sees it)
    output_roots = tuple(_realpath(p).rstrip("/") + "/" for p in config.get("output_roots", ()))

    def protected_path(path, dir_fd=None):
        """The protected test file ``path`` names, or None. A relative path given with ``dir_fd``
        (``os.open(name, flags, dir_fd=fd)``: the audit event does not carry the fd) is resolved against
        every directory this process holds open."""
        if _type(path) is not _str or path.rpartition("/")[2] not in protected_names:
            return None
        full = _realpath(path)
        if full in protected:
            return full
        if path.startswith("/"):
            return None
        fds = [dir_fd] if _type(dir_fd) is _int else []
        try:
            fds += _listdir("/proc/self/fd")
        except _BaseException:  # noqa: S110 (no /proc: only the given fd)
            pass
        for fd in fds:
            try:
                base = _readlink("/proc/self/fd/" + _str(fd))
            except _BaseException:  # noqa: S112 (closed meanwhile, not a link)
                continue
            full = _realpath(base + "/" + path)
            if full in protected:
                return full
        return None

    def plain(s, limit=200):
        """An exact ``str`` copy of ``s`` (a str subclass cannot run code here), else '?'."""
        if _type(s) is _str:
            return s[:limit]
        if _issubclass(_type(s), _str):
            return _join((s,))[:limit]
        return "?"

    def frozen(x, depth=0):
        """An exact copy of plain data (dict with str keys, list, tuple, str, int, float, bool, None), made
        with nothing the submission can replace (no ``json``); a non-finite float becomes
        ``{"__float__": "nan"}``. Anything else (a subclass, another object) raises ValueError."""
        t = _type(x)
        if x is None or t is _str or t is _int or t is _bool:
            return x
        if t is _float:
            return x if x == x and x != _inf and x != -_inf else {"__float__": _repr(x)}
        if depth > 60:
            raise _ValueError("nested too deep")
        if t is _list or t is _tuple:
            return [frozen(v, depth + 1) for v in _list(x)]
        if t is _dict:
            out = {}
            for k, v in _list(x.items()):
                if _type(k) is not _str:
                    raise _ValueError("a key is not a str")
                out[k] = frozen(v, depth + 1)
            return out
        raise _ValueError("not plain data")

    def caller(depth=3, mediated=True):
        """The frame of the submission's code behind the current event, or None when a library raised it.

        Depth 3 from here: 0 this function, 1 ``handle``, 2 the hook, 3 the code that raised the event.
        With ``mediated``, frames of ``inspect``, ``traceback``, ``logging`` and the guard's own wrappers
        are skipped, so ``inspect.stack()`` counts as the caller's.
        """
        try:
            f = _getframe(depth)
        except _ValueError:
            return None
        while f is not None:
            name = f.f_code.co_filename
            if _type(name) is not _str:
                return f
            if name in mediators and (mediated or name == guard_file):
                f = f.f_back
                continue
            if name in grader_files or name.startswith(library_roots):
                return None
            return f
        return None

    def origin(depth=3):
        """Like :func:`caller`, but looks through library frames too: the first frame of the grader's own
        code (None) or of the submission's (that frame) behind the event."""
        try:
            f = _getframe(depth)
        except _ValueError:
            return None
        while f is not None:
            name = f.f_code.co_filename
            if _type(name) is not _str:
                return f
            if name in grader_files:
                return None
            if name in mediators or name.startswith(library_roots):
                f = f.f_back
                continue
            return f
        return None

    def where(f):
        if f is None:
            return "?"
        return plain(f.f_code.co_name, 80) + ":" + _repr(f.f_lineno)

    # ---------------------------------------------------------------- the channel
    key = os.urandom(32)
    _inner = bytes(b ^ 0x36 for b in key.ljust(64, b"\0"))
    _outer = bytes(b ^ 0x5C for b in key.ljust(64, b"\0"))

    def _mac(key, body):  # HMAC-SHA256 (RFC 2104) over captured hashlib.sha256
        return _sha256_new(_outer + _sha256_new(_inner + body).digest()).hexdigest()
    lock = _allocate_lock()
    seq = [0]
    memory = [] if config.get("address") is None else None
    fd = None
    if memory is None:
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(config["address"])
        fd = sock.detach()  # a bare descriptor: no socket object for the submission to find or close
        os.write(fd, f"{PROTOCOL} {key.hex()}\n".encode())

    def emit(kind, detail):
        with lock:
            seq[0] += 1
            body = _repr((seq[0], kind, detail)).encode()
            if memory is not None:
                memory.append((seq[0], kind, detail))
                return
            view = _memoryview(_mac(key, body).encode() + b" " + body + b"\n")
            old = _sigmask(_SIG_BLOCK, _block) if _sigmask is not None and _block else None
            try:  # an item's time limit (SIGALRM) must not cut a record in half
                while _len(view):
                    view = view[_write(fd, view):]
            finally:
                if old is not None:
                    _sigmask(_SIG_SETMASK, old)

    # ---------------------------------------------------------------- wrappers: answer helpers, atexit
    helpers, helper_files = [], {}
    for dotted in config.get("answer_helpers", ()):
        mod_name, _, attr = dotted.rpartition(".")
        mod = sys_modules.get(mod_name)
        orig = getattr(mod, attr, None) if mod is not None else None
        if not isinstance(orig, types.FunctionType):
            continue

        def make(fn, index):
            # The original lives only in generator frames (reading gi_frame is reported), never in the
            # wrapper's closure: helper.__closure__ leads to no unwrapped copy. Each call runs in its own
            # generator, so recursion and threads work.
            def one(fn, args, kwargs):
                _audit("gpucourse.helper", index)
                yield fn(*args, **kwargs)

            def keeper(fn):
                request = yield None
                while True:
                    request = yield one(fn, *request)

            keep = keeper(fn)
            _next(keep)
            send, lock = keep.send, _allocate_lock()

            def helper(*args, **kwargs):
                with lock:
                    call = send((args, kwargs))
                return _next(call)
            return helper

        wrapper = make(orig, len(helpers))
        for name in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(wrapper, name, getattr(orig, name))
        try:
            wrapper.__signature__ = inspect.signature(orig)
        except (TypeError, ValueError):
            pass
        setattr(mod, attr, wrapper)
        labels[id(wrapper)] = dotted
        helpers.append(dotted)
        for file in (getattr(mod, "__file__", None), orig.__code__.co_filename):
            if isinstance(file, str):  # running this file's code again makes a fresh, unwrapped copy
                for variant in {file, os.path.realpath(file)}:
                    known = helper_files.get(variant, "")
                    if dotted not in known.split():
                        helper_files[variant] = (known + " " + dotted).strip()
    helpers = tuple(helpers)
    _register = atexit.register

    def register(func, *args, **kwargs):
        _audit("gpucourse.atexit", 0)
        return _register(func, *args, **kwargs)

    register.__name__ = register.__qualname__ = "register"
    register.__doc__, register.__module__ = _register.__doc__, "atexit"
    atexit.register = register
    labels[id(register)] = "atexit.register"

    # Values are read after the wrappers went in: the wrappers are what must stay in place.
    mod_snap = tuple((n, m, t, d, k, tuple(d[x] for x in k), operator.itemgetter(*k) if len(k) > 1 else None)
                     for n, m, t, d, k in mod_entries)
    watched_ids = frozenset(labels) | frozenset(id(v) for e in mod_snap for v in e[5])
    # Scopes of a comparison: "core" (the watchdog: the standard library), "item" (before each item:
    # also the course package), "full" (at the start and the end of the checks: everything).
    core_snap = tuple(e for e in mod_snap if e[0].partition(".")[0] in stdlib)
    scopes = {"core": (core_snap, ()),
              "item": (core_snap + tuple(e for e in mod_snap if e[0].partition(".")[0] == "gpucourse"),
                       tuple(e for e in class_snap if e[0].startswith("gpucourse."))),
              "full": (mod_snap, class_snap)}
    meta_before = tuple(meta_path)
    counts = {"start": _ncallbacks(), "library": 0, "learner": 0}
    reported = set()
    compare_lock = _allocate_lock()
    user_get = user_ns.get if isinstance(user_ns, dict) else None
    user_builtins = user_ns.get("__builtins__") if user_get is not None else None

    # ---------------------------------------------------------------- comparing with the record
    def compare(scope="full"):
        """What was replaced or added since the record (in ``scope``), each (what, name) reported once."""
        modules, classes = scopes[scope]
        found = []
        if _sys_get("modules") is not sys_modules:
            found.append(("replaced", "sys.modules"))
        if user_get is not None and user_get("__builtins__", user_builtins) is not user_builtins:
            found.append(("replaced", "the notebook's __builtins__"))
        if _sys_get("meta_path") is not meta_path or _len(meta_path) != _len(meta_before) or _any(
                _map(_is_not, meta_path, meta_before)):
            found.append(("import-system", "sys.meta_path was changed"))
        for name, mod, mtype, d, keys, values, getter in modules:
            if _modules_get(name) is not mod:
                found.append(("replaced", "sys.modules[" + _repr(name) + "]"))
            if _type(mod) is not mtype:
                found.append(("replaced", "the class of module " + name))
            if not keys:
                continue
            try:
                now = getter(d) if getter is not None else (d[keys[0]],)
            except _KeyError:
                now = None
            if now is None or _any(_map(_is_not, now, values)):
                for k, v in _zip(keys, values):
                    if d.get(k, found) is not v:
                        found.append(("replaced", name + "." + k))
        for qual, cls, ctype, proxy, keys, values, getter, n, known in classes:
            if _type(cls) is not ctype:
                found.append(("replaced", "the metaclass of " + qual))
            if keys:
                try:
                    now = getter(proxy) if getter is not None else (proxy[keys[0]],)
                except _KeyError:
                    now = None
                if now is None or _any(_map(_is_not, now, values)):
                    for k, v in _zip(keys, values):
                        if proxy.get(k, found) is not v:
                            found.append(("replaced", qual + "." + k))
            if _len(proxy) != n:
                for k in _list(proxy):
                    if _type(k) is _str and k not in known:
                        v = proxy.get(k)
                        if _callable(v) or _type(v) in _descriptor_types:
                            found.append(("added", qual + "." + k))
        out = []
        with compare_lock:
            for item in found:
                if item not in reported:
                    reported.add(item)
                    out.append(item)
        return _tuple(out)

    def watchdog():
        """Every 0.25 s, a quick look at the standard library: a patch that breaks the kernel itself
        (json, builtins...) is reported even if the checks never get to run."""
        while state["phase"] != "end":
            _sleep(interval)
            try:
                changes = compare("core")
                if changes and state["phase"] != "end":
                    emit("changed", (state["phase"], changes))
            except _BaseException:  # noqa: S112 (a torn-down interpreter at exit)
                return

    def threads_left():
        """Where the submission's code is still running in other threads: ('function:line', ...)."""
        me = _get_ident()
        out = []
        for tid, f in _current_frames().items():
            while f is not None and tid != me:
                name = f.f_code.co_filename
                if _type(name) is not _str or not (name in grader_files or name in mediators
                                                   or name.startswith(library_roots)):
                    out.append(where(f))
                    break
                f = f.f_back
        return _tuple(out)

    # ---------------------------------------------------------------- the hook
    busy = _set()
    state = {"phase": "submission", "armed": 0, "config": 0}
    intros, dynamic = frozenset(INTROSPECTION_EVENTS), frozenset(DYNAMIC_EVENTS)
    processes, ctypes_events = frozenset(PROCESS_EVENTS), frozenset(CTYPES_EVENTS)
    frame_attrs, patch_attrs = frozenset(FRAME_ATTRS), frozenset(PATCH_ATTRS)
    grader_events = frozenset(("gpucourse.phase", "gpucourse.observed", "gpucourse.helper", "gpucourse.atexit",
                               "gpucourse.config", "gpucourse.worker"))
    link_events = frozenset(("os.link", "os.rename"))
    interesting = (intros | dynamic | processes | ctypes_events | grader_events
                   | {"object.__getattr__", "object.__setattr__", "object.__delattr__", "sys.addaudithook", "open"}
                   | link_events)
    REFUSE = object()

    def report(category, detail, f):
        emit("event", (state["phase"], category, detail, where(f)))

    def on_phase(args):
        what = plain(args[0]) if _len(args) > 0 else "?"
        item = plain(args[1]) if _len(args) > 1 else ""
        changes = compare("item" if what == "item" else "full")
        if changes:
            emit("changed", (state["phase"], changes))
        if what != "end":
            state["phase"] = what + (":" + item if item and what != "begin" else "")
            emit("phase", (what, item))
            return
        if standby is not None:  # the grader's own process, ended before the end record
            try:
                standby[1]()
            except _BaseException:  # noqa: S110 (the grader's sweep kills it anyway)
                pass
        threads = threads_left()
        if threads:
            emit("threads", threads)
        extra = _ncallbacks() - counts["start"] - counts["library"] - counts["learner"]
        if extra > 0:
            emit("atexit", ("unexplained", extra))
        state["phase"] = "end"
        emit("end", (_perf() - t0,))

    def on_grader_event(event, args):
        try:
            f = _getframe(3)  # 0 here, 1 handle, 2 hook, 3 who raised it
        except _ValueError:
            f = None
        name = f.f_code.co_filename if f is not None else None
        if _type(name) is not _str:  # a file name the submission shaped (a str subclass): never compared in here
            return report("forged", event, f)
        if event == "gpucourse.helper" or event == "gpucourse.atexit":
            if name != guard_file:
                return report("forged", event, f)
            learner = caller(4)
            if event == "gpucourse.atexit":
                counts["learner" if learner is not None else "library"] += 1
                if learner is not None:
                    report("atexit", "atexit.register", learner)
            elif learner is not None and _len(args) and _type(args[0]) is _int and 0 <= args[0] < _len(helpers):
                report("helper", helpers[args[0]], learner)
            return None
        if name not in driver_files:
            return report("forged", event, f)
        if event == "gpucourse.phase":
            on_phase(args)
        elif event == "gpucourse.config":  # the driver's sealed config: unsealed once, into its list
            state["config"] += 1
            if state["config"] > 1:
                return report("forged", "asked for the grader's config again", f)
            if _len(args) >= 2 and _type(args[0]) is _bytes and _type(args[1]) is _list:
                args[1].append(_seal(key, args[0], _shake, _from_bytes))
        elif event == "gpucourse.worker":  # a check's worker process, through the standby only this hook holds
            if _len(args) >= 2 and _type(args[0]) is _tuple and _type(args[1]) is _list:
                try:  # an exact plain copy: no object of the submission's (a str subclass...) runs code in here
                    request = frozen(args[0])
                    args[1].append(("ok", standby[0](*request)) if standby is not None else ("ok", None))
                except _ValueError:
                    args[1].append(("error", _RuntimeError("the check's request for a worker was not plain data")))
                except _BaseException as exc:  # an item's time limit, a dead standby: the driver re-raises it
                    args[1].append(("error", exc))
        elif _len(args) >= 2:
            # The observation arrives as data and is copied and written here, with the guard's own
            # primitives: a patch of json (or of anything else) made during the item cannot change it.
            try:
                payload = frozen(args[1])
            except _BaseException:
                payload = {"error": "the observation held something that is not plain data"}
            emit("observed", (plain(args[0]), payload))
        return None

    def handle(event, args):
        if event == "object.__getattr__":
            if _len(args) >= 2 and _type(args[1]) is _str and args[1] in frame_attrs:
                f = caller(3, False)  # traceback.print_exc() reading tb_frame is not the learner's doing
                if f is not None:
                    report("introspection", "reads ." + args[1], f)
            return None
        if event == "object.__setattr__" or event == "object.__delattr__":
            if _len(args) >= 2 and _id(args[0]) in watched_ids:
                attr = plain(args[1])
                if attr in patch_attrs:
                    what = attr + " of " + labels.get(_id(args[0]), "?")
                    emit("changed", (state["phase"], (("replaced", what),)))
            return None
        if event in link_events:  # a hard link or a move gives the tests another name: read by that name
            if _len(args) >= 1 and protected_path(args[0], args[2] if _len(args) > 2 else None) is not None:
                f = origin()
                if f is not None:
                    report("reads-tests", event + " " + plain(args[0]), f)
            return None
        if event == "open":
            if _len(args) >= 1 and _type(args[0]) is not _str:  # read a bytes or str-subclass path as the str it is
                path = args[0]
                if _type(path) is _bytes:
                    path = path.decode("utf-8", "surrogateescape")
                elif _issubclass(_type(path), _str):
                    path = _join((path,))
                if _type(path) is _str:
                    args = (path,) + _tuple(args[1:])
            if _len(args) >= 1 and protected_path(args[0]) is not None:
                # The grader sends the tests as text: only its own traceback formatting opens them. Any
                # other reader, directly or through a library (importlib, linecache), is the submission.
                f = origin()
                if f is not None:
                    report("reads-tests", args[0][-200:], f)
                return None
            if (_type(args[0]) is _str and args[0].rpartition("/")[2] == "mem"
                    and (not args[0].startswith("/") or _realpath(args[0]).startswith("/proc/"))):
                f = origin()  # a process's memory: read or rewrite anything (the guard included), like ctypes
                if f is not None:
                    report("memory", args[0][-200:], f)
                return None
            if _len(args) >= 2 and _type(args[0]) is _str:
                mode, flags = args[1], args[2] if _len(args) > 2 else 0
                if not ((_type(mode) is _str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
                        or (_type(flags) is _int and flags & 3 != 0)):
                    return None
                if args[0].startswith(install_roots):
                    f = caller()
                    if f is not None:
                        report("install-write", args[0][:200], f)
                elif output_roots and (_realpath(args[0]) + "/").startswith(output_roots):
                    f = origin()  # also through a library (json.dump, shutil), and through /proc/<pid>/cwd
                    if f is not None:
                        report("output-write", args[0][-200:], f)
            return None
        if event in grader_events:
            return on_grader_event(event, args)
        if event == "compile" and _len(args) >= 2 and _type(args[1]) is _str and args[1] in driver_files:
            source = args[0].encode() if _type(args[0]) is _str else args[0] if _type(args[0]) is _bytes else b""
            digest = _sha256_hex(source)
            if digest in driver_digests:  # the grader's observation cell loading the driver, once
                driver_digests.discard(digest)
                state["armed"] += 1
                return None
            state["armed"] = 0  # and what runs under its name from now on is not the grader's either
            report("forged", "compiled code under the name of the grader's driver (other code, or a second time)",
                   caller() or _getframe(2))
            return None
        code_file = (args[0].co_filename if (event == "exec" or event == "function.__new__") and _len(args) >= 1
                     and _type(args[0]) is _CodeType else None)
        if code_file is not None and _type(code_file) is not _str:
            # A str subclass as a code object's file name would run the submission's code in here (its __eq__,
            # __hash__) the moment the guard compared it; it also claims to be what it is not.
            return report("forged", "ran code whose file name is not a str", caller() or _getframe(2))
        if event == "exec" and code_file in driver_files:
            if state["armed"] > 0:  # running the driver compiled just above
                state["armed"] -= 1
                return None
            return report("forged", "ran code under the name of the grader's driver", caller() or _getframe(2))
        if ((event == "code.__new__" and _len(args) >= 2 and _type(args[1]) is _str and args[1] in driver_files)
                or (event == "function.__new__" and code_file in driver_files)):
            return report("forged", "made code under the name of the grader's driver", caller() or _getframe(2))
        if (event == "exec" or event == "compile") and _len(args) >= 1 and helper_files:
            # Every course module was imported before the submission ran, so running the code of one that
            # holds an answer-bearing helper again (runpy.run_module, importlib's exec_module, reload,
            # compile of its file) makes a fresh copy of the helper that the wrappers never see.
            name = (args[0].co_filename if _type(args[0]) is _CodeType
                    else args[1] if event == "compile" and _len(args) >= 2 else None)
            fresh = helper_files.get(name) if _type(name) is _str else None
            if fresh is not None:
                f = origin()
                if f is not None:
                    report("helper-copy", fresh, f)
                    return None
        if event == "sys.addaudithook":
            report("audit-hook", "sys.addaudithook (refused)", caller())
            return REFUSE
        f = caller()
        if f is not None:
            category = ("introspection" if event in intros else "ctypes" if event in ctypes_events
                        else "dynamic-code" if event in dynamic else "process")
            report(category, event, f)
        return None

    def hook(event, args):
        if event not in interesting:
            return
        tid = _get_ident()
        if tid in busy:
            return
        busy.add(tid)
        try:
            verdict = handle(event, args)
        except _BaseException:  # never break the kernel; tell the grader the guard failed here
            verdict = None
            try:
                emit("guard-error", (event,))
            except _BaseException:  # noqa: S110 (the channel itself is gone: the grader sees no end record)
                pass
        finally:
            busy.discard(tid)
        if verdict is REFUSE:
            raise _RuntimeError("the grader does not allow other audit hooks")

    summary = {"modules": len(mod_snap), "classes": len(class_snap), "names": len(watched_ids),
               "helpers": list(helpers), "seconds": round(time.perf_counter() - t0, 3)}
    emit("ready", (summary["modules"], summary["classes"], summary["names"]))
    # Not dumpable: another process of the same user (a subprocess, lab 04's unwatched worker) can then
    # neither ptrace this kernel nor open its /proc/<pid>/mem, where the channel key lives.
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0 (ctypes was imported above)
    except Exception:  # noqa: BLE001, S110 (not Linux: nothing to do)
        pass
    sys.addaudithook(hook)
    if config.get("watchdog", True):
        _thread.start_new_thread(watchdog, ())
    if memory is not None:
        summary.update(records=memory, hook=hook, compare=compare)
    return summary
