"""Graded items: how a lab's tests are written, found and run.

A lab's tests live in ``gpucourse/labtests/labNN.py`` (public) or in any
extra file an instructor passes to the grader (hidden tests). An item is a
class with three parts, so that the verdict never depends on code that runs
beside the learner's::

    from gpucourse.grading.items import Fail, item, outcome, expect_raised

    @item("q1", points=2, title="summarise_devices counts devices by type")
    class q1:
        def cases(rng):                   # trusted side: fresh inputs, JSON-able
            return [{"kinds": {"GPU": rng.randint(1, 8)}}, ...]

        def observe(ns, case):            # learner's kernel: call the code, return plain data
            fn = ns.function("summarise_devices")
            return {"got": fn(build_devices(case))}

        def judge(case, seen):            # trusted side: expected answer and verdict
            want = {...computed from case...}
            if seen["got"] != want:
                raise Fail(f"for ... expected {want}, got {seen['got']}")

* ``cases(rng)`` runs where the learner's code cannot reach it (the grader's
  own process) with a ``random.Random`` the grader seeds; it returns a list of
  JSON-able cases.
* ``observe(ns, case)`` runs on the trusted side too, in the grader's observer (or, for ``check()``, in the
  learner's own kernel). ``ns`` is a :class:`Namespace` over the learner's notebook variables:
  ``ns.function(name)(...)`` calls the learner's function with plain arguments and returns plain data
  (NumPy arrays and tensors are converted by :func:`plain` where they were made). A function of the
  check passed as an argument stays on the trusted side: the learner's code gets a stand-in that calls
  back, so the check counts and times those calls where the learner's code cannot reach. What must
  happen among live TensorFlow objects (a model, a dataset, a strategy) is a module-level function
  marked :func:`in_kernel`, run there with ``ns.kernel(fn, *args)``: it returns plain data, which the
  judge treats as the learner's word (it recomputes what it can). ``observe`` never decides pass or
  fail, except to raise :class:`Fail` when a name is missing or not a function. Use :func:`outcome` to
  record an exception the learner's code should raise.
* ``judge(case, seen)`` runs on the trusted side again, with the case and the
  observation after a JSON round trip; it raises :class:`Fail` with a message
  addressed to the learner, or returns.

Cases and observations always go through ``json.dumps``/``json.loads`` (also
for the in-notebook ``check()``), so a judge sees lists for tuples and string
keys for dicts in both places, and behaves identically in both.

``NotImplementedError`` from the learner's code means "not attempted yet";
any other exception is reported with where it happened. Points are all or
nothing per item.

An item may still be written as a single function ``fn(ns)`` that calls the
learner's code and judges in one go (an *inline* item, an instructor's older
hidden test). The grader runs it in its observer like ``observe``; the
course's own labs use split items only.

Every learner-facing text goes through :func:`tr`, a gettext-style lookup in the message
catalogue ``grading/locale/<lang>.po`` (msgid: the English text with ``{name}`` fields), in the
:func:`language` of the notebook: ``GPUCOURSE_LANG`` (``zh_CN``), else Chinese when the notebook is
in a ``zh-CN`` folder. Messages only: statuses and points never depend on the language.

This module uses the standard library only (and :mod:`.protocol`, which does too).
"""

from __future__ import annotations

import copy
import json
import signal
import sys
import threading
import traceback
import types
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

from .messages import language, tr
from .protocol import plain, unpack_tuples

__all__ = ["Fail", "ItemResult", "ItemTimeout", "ItemSpec", "KernelLost", "Namespace", "NotDefined", "Observed",
           "ProcessKilled",
           "RaisedInKernel", "expect_raised", "expect_raises", "in_kernel", "is_kernel_function", "is_split", "item",
           "items_in", "judge_item", "lab_ids", "lab_test_path", "load_test_file", "language", "load_test_source",
           "make_cases", "observe_item", "outcome", "plain", "round_trip", "run_item", "score_table", "tr"]

LABTESTS_DIR = Path(__file__).resolve().parent.parent / "labtests"
_MARK = "__gpucourse_item__"
_KERNEL_MARK = "__gpucourse_in_kernel__"
#: Seconds one item may run before it is stopped (an endless loop in the learner's code).
ITEM_TIMEOUT_S = 120


class Fail(AssertionError):
    """Raise in a test with a message addressed to the learner."""


def expect_raises(call: Callable[[], object], what: str, why: str = "", exc_type: type = ValueError) -> None:
    """Fail unless ``call()`` raises ``exc_type`` (for bad-input cases of a learner's function).

    ``what`` names the call for the learner, e.g. ``"pick_device([])"``; ``why`` says why it must
    raise. ``NotImplementedError`` passes through, so an untouched stub still counts as not attempted.
    """
    reason = tr(" ({why})", why=tr(why)) if why else ""
    try:
        got = call()
    except exc_type:
        return
    except NotImplementedError:
        raise
    except Exception as exc:
        raise Fail(tr("{what} should raise {expected}{reason}, it raised {raised}: {message}", what=what,
                      expected=exc_type.__name__, reason=reason, raised=type(exc).__name__, message=exc)) from None
    raise Fail(tr("{what} should raise {expected}{reason}, but returned {got}", what=what,
                  expected=exc_type.__name__, reason=reason, got=repr(got)))


class ItemTimeout(BaseException):
    """Raised inside a running item when its time is up (BaseException: ``except Exception`` won't catch it).

    An ``observe`` that knows how far the learner's code got may catch it and raise ``ItemTimeout(text)``
    again: ``text`` (addressed to the learner) then replaces the generic "endless loop?" advice.
    """


class KernelLost(BaseException):
    """The grader lost the graded kernel while an item ran (it died, or did not stop when interrupted).

    Not the learner's exception: it passes through ``observe`` to the grader, which starts the kernel again.
    """


class ProcessKilled(KernelLost):
    """A check killed the process it was running, on purpose (``ns.fresh_process().kill()``)."""


@dataclass(frozen=True)
class ItemSpec:
    key: str
    points: int
    title: str


def item(key: str, points: int = 1, title: str = ""):
    """Mark ``key`` worth ``points``: a class with ``cases``/``observe``/``judge``, or an inline ``fn(ns)``."""
    if not isinstance(key, str) or not key.isidentifier():
        raise ValueError(f"item key must be a short identifier like 'q1', got {key!r}")
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"points must be a whole number >= 1, got {points!r}")

    def mark(obj: Callable) -> Callable:
        if isinstance(obj, type):
            missing = [part for part in ("cases", "observe", "judge") if not callable(vars(obj).get(part))]
            if missing:
                raise TypeError(f"item {key!r}: the class {obj.__name__} needs the functions cases(rng), "
                                f"observe(ns, case) and judge(case, seen); it lacks {', '.join(missing)}")
        doc = (obj.__doc__ or "").strip().splitlines()
        setattr(obj, _MARK, ItemSpec(key, points, title or (doc[0] if doc else key)))
        return obj

    return mark


def is_split(obj) -> bool:
    """True for an item written as cases/observe/judge (judged outside the learner's kernel)."""
    return isinstance(obj, type)


def in_kernel(fn: Callable) -> Callable:
    """Mark a module-level function of a test file as one that runs in the learner's kernel.

    ``ns.kernel(fn, *args)`` calls ``fn(learner_ns, *args)`` there (in ``check()``: here) and returns what it
    returns, as plain data. Only such functions, and what they use, are sent to the graded kernel; what
    they report is the learner's word, which a judge checks against what it computes itself.
    """
    if not callable(fn) or getattr(fn, "__qualname__", "").count(".") or fn.__name__ == "<lambda>":
        raise TypeError(f"in_kernel marks a module-level function of a test file, got {fn!r}")
    setattr(fn, _KERNEL_MARK, True)
    return fn


def is_kernel_function(fn) -> bool:
    """True for a function marked :func:`in_kernel`."""
    return bool(getattr(fn, _KERNEL_MARK, False))


class RaisedInKernel(Exception):
    """What the learner's code raised in the graded kernel, as the agent described it (plain data)."""

    def __init__(self, spec: dict):
        self.spec = spec if isinstance(spec, dict) else {}
        self.type_name = str(self.spec.get("type", "Exception"))
        self.mro = [str(c) for c in self.spec.get("mro") or [self.type_name]]
        self.where = self.spec.get("where") if isinstance(self.spec.get("where"), dict) else None
        super().__init__(str(self.spec.get("message", "")))


class RaisedNotImplementedInKernel(RaisedInKernel, NotImplementedError):
    """The learner's code raised NotImplementedError in the graded kernel: not attempted yet."""


# ------------------------------------------------------------------ transport


def round_trip(value):
    """``plain(value)`` through ``json.dumps``/``json.loads``: exactly what the other side receives."""
    return json.loads(json.dumps(plain(value), allow_nan=True))


def outcome(call: Callable[[], object]) -> dict:
    """Run ``call()`` inside ``observe``: ``{"value": ...}`` or ``{"raised": "ValueError", "message": ...}``.

    ``NotImplementedError`` passes through, so an untouched stub still counts as not attempted.
    """
    try:
        return {"value": plain(call())}
    except NotImplementedError:
        raise
    except RaisedInKernel as exc:
        if "Exception" not in exc.mro:  # KeyboardInterrupt, SystemExit...: not an answer, an error of the item
            raise
        return {"raised": exc.type_name, "message": str(exc)[:300], "raised_mro": exc.mro}
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300],
                "raised_mro": [c.__name__ for c in type(exc).__mro__]}


def expect_raised(seen: dict, what: str, why: str = "", exc_name: str = "ValueError") -> None:
    """In ``judge``: fail unless the :func:`outcome` ``seen`` raised ``exc_name`` (or a subclass of it)."""
    reason = tr(" ({why})", why=tr(why)) if why else ""
    if "raised" in seen:
        if exc_name in seen.get("raised_mro", [seen["raised"]]):
            return
        raise Fail(tr("{what} should raise {expected}{reason}, it raised {raised}: {message}", what=what,
                      expected=exc_name, reason=reason, raised=seen["raised"], message=seen.get("message", "")))
    raise Fail(tr("{what} should raise {expected}{reason}, but returned {got}", what=what, expected=exc_name,
                  reason=reason, got=_short(seen.get("value"))))


def _short(value, limit: int = 200) -> str:
    """``value`` for a message. An object :func:`plain` could not convert (``{"__type__": ..., "repr": ...}``)
    reads as the learner would see it: ``a Sequential (<Sequential name=sequential, built=True>)``."""
    if isinstance(value, dict) and set(value) == {"__type__", "repr"} and isinstance(value["__type__"], str):
        kind = value["__type__"].rsplit(".", 1)[-1]
        text = str(value["repr"])
        return tr("a {kind} ({repr})", kind=kind, repr=text if len(text) <= limit else text[:limit] + "...")
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class NotDefined(NotImplementedError):
    """The learner has not run (or written) the cell that defines a name yet: the item is not attempted."""


class Namespace:
    """Read-only view of the learner's notebook variables, with learner-facing errors (in the learner's kernel).

    The grader's observer uses a stand-in with the same methods over the graded kernel
    (:class:`gpucourse.grading.grader.observer.RemoteNamespace`).
    """

    #: ``fresh_process()`` (grader only, else None): a context manager with a namespace over a new process that
    #: ran the submission's cells again, which the check may kill (``.kill()``), as a real failure would.
    fresh_process = None

    def __init__(self, mapping: Mapping[str, object], raw: bool = False):
        self._ns = dict(mapping)
        #: ``raw``: the view an ``@in_kernel`` function gets (the learner's functions return live objects);
        #: otherwise, as in the grader's observer, what a learner's function returns is plain data at once.
        self.raw = raw

    def __contains__(self, name: str) -> bool:
        return name in self._ns

    def lookup(self, name: str):
        """The learner's object ``name`` itself; fails with a hint if the learner has not defined it."""
        if name not in self._ns:
            raise NotDefined(tr("Not attempted: `{name}` is not defined yet. Run the cell above first (the one that "
                                "defines `{name}`, and the cells before it).", name=name))
        return self._ns[name]

    def value(self, name: str):
        """The variable ``name`` (plain data, or a function as :meth:`function` gives it); fails with a hint if the
        learner has not defined it."""
        obj = self.lookup(name)
        if self.raw:
            return obj
        return self.function(name) if callable(obj) else unpack_tuples(plain(obj, tuples=True))

    def function(self, name: str) -> Callable:
        """The function ``name``; fails with a hint if missing or not callable."""
        obj = self.lookup(name)
        if not callable(obj):
            raise Fail(tr("`{name}` should be a function, but it is a {kind}.", name=name, kind=type(obj).__name__))
        if self.raw:
            return obj

        def call(*args, **kwargs):
            return unpack_tuples(plain(obj(*args, **kwargs), tuples=True))

        call.__name__ = name
        return call

    def kernel(self, fn: Callable, *args, **kwargs):
        """``fn(raw namespace, *args, **kwargs)`` for a function marked :func:`in_kernel`, as plain data."""
        if not is_kernel_function(fn):
            raise TypeError(f"ns.kernel runs a function marked @in_kernel, got {fn!r}")
        view = copy.copy(self)
        view.raw = True
        return unpack_tuples(plain(fn(view, *args, **kwargs), tuples=True))


@dataclass
class ItemResult:
    key: str
    title: str
    points: int
    max_points: int
    status: str  # "pass", "fail", "todo" (not attempted) or "error"
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One learner-facing line (plus the message, indented)."""
        icon = {"pass": "✅", "fail": "❌", "todo": "📝", "error": "💥"}[self.status]
        text = f"{icon} {self.key} ({self.points}/{self.max_points}) {self.title}"
        if self.message:
            text += "\n   " + self.message.replace("\n", "\n   ")
        return text


#: Code that is not the learner's: this package, the Python installation and its libraries.
_NOT_LEARNER = tuple(str(p) for p in {Path(__file__).resolve().parent.parent, Path(sys.prefix).resolve(),
                                      Path(sys.base_prefix).resolve()}) + ("<frozen",)


def _learner_frame(exc: BaseException, test_file: str | None):
    """The innermost traceback frame in the learner's own code, or None if none is on the stack."""
    mine = [f for f in traceback.extract_tb(exc.__traceback__)
            if f.filename != test_file and not f.filename.startswith(_NOT_LEARNER)]
    return mine[-1] if mine else None


def _error_message(exc: BaseException, test_file: str | None) -> str:
    """'Your code raised ...' when the learner's code raised; a neutral message when the check did."""
    if isinstance(exc, RaisedInKernel):
        what, where = f"{exc.type_name}: {exc}", exc.where or {}
        if exc.spec.get("learner") is False:  # raised in the check's own code in the kernel, not in the learner's
            return tr("The check raised {what} while testing your answer: look at what your function returns "
                      "(type, shape, device). If it looks right, tell your instructor.", what=what)
        if not where.get("function"):
            return tr("Your code raised {what}{where}", what=what, where="")
        where = (tr(" (in `{function}`, line: {line})", function=where["function"], line=where["line"])
                 if where.get("line") else tr(" (in `{function}`)", function=where["function"]))
        return tr("Your code raised {what}{where}", what=what, where=where)
    what = f"{type(exc).__name__}: {exc}"
    f = _learner_frame(exc, test_file)
    if f is None:
        return tr("The check raised {what} while testing your answer: look at what your function returns "
                  "(type, shape, device). If it looks right, tell your instructor.", what=what)
    where = (tr(" (in `{function}`, line: {line})", function=f.name, line=f.line.strip()) if f.line
             else tr(" (in `{function}`)", function=f.name))
    return tr("Your code raised {what}{where}", what=what, where=where)


def _alarm_available() -> bool:
    """SIGALRM works only on Unix and only in the main thread (where notebook code runs)."""
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


class _Alarm:
    """Stop the code inside after ``timeout_s`` (SIGALRM; a no-op where it is unavailable)."""

    def __init__(self, timeout_s):
        self.timeout_s = timeout_s
        self.on = bool(timeout_s) and _alarm_available()

    def __enter__(self):
        if self.on:
            def on_alarm(signum, frame):
                raise ItemTimeout()
            self.previous = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        return self

    def __exit__(self, *exc):
        if self.on:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


def _timeout_message(timeout_s, progress: str = "") -> str:
    """What a learner reads when an item ran out of time; ``progress`` is what the item saw the code do (an
    :class:`ItemTimeout` raised again by ``observe`` with it), so a slow machine is not mistaken for a loop."""
    if progress:
        return tr("Stopped after {seconds} s: the check's time is up. {progress}", seconds=f"{timeout_s:g}",
                  progress=progress)
    return tr("Stopped after {seconds} s: your code did not finish. Look for an endless loop, or an iterator "
              "that never ends (e.g. a dataset with .repeat()). If there is none, the machine may just be busy: "
              "run the check again.", seconds=f"{timeout_s:g}")


def _todo_message() -> str:
    return tr("Not attempted yet: your code still raises NotImplementedError. "
              "Replace the `raise NotImplementedError` line under the TODO with your code.")


def _fail_message(exc: AssertionError, test_file: str | None) -> str:
    msg = str(exc).strip()
    if not msg:
        tb = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == test_file]
        msg = tr("check failed: {line}", line=tb[-1].line.strip()) if tb and tb[-1].line else tr("a check failed")
    return msg


def _classify(call: Callable[[], object], test_file: str | None, timeout_s,
              raw_errors: bool = False, alarm: bool = True) -> tuple[str, object]:
    """Run ``call``; return ("ok", value) or (status, learner-facing message). Never raises but for interrupts.

    ``raw_errors``: an exception other than a Fail is given as ``"Type: message"`` only (a judge's own bug).
    """
    try:
        with _Alarm(timeout_s if alarm else None):
            return "ok", call()
    except (KeyboardInterrupt, KernelLost):
        raise
    except ItemTimeout as exc:
        return "error", _timeout_message(timeout_s, str(exc.args[0]) if exc.args else "")
    except NotDefined as exc:
        return "todo", str(exc)
    except NotImplementedError:
        return "todo", _todo_message()
    except AssertionError as exc:  # Fail is an AssertionError
        return "fail", _fail_message(exc, test_file)
    except BaseException as exc:  # learner code may raise anything, even SystemExit
        return "error", f"{type(exc).__name__}: {exc}" if raw_errors else _error_message(exc, test_file)


def _result(spec: ItemSpec, status: str, message: str = "") -> ItemResult:
    pts = spec.points if status == "pass" else 0
    return ItemResult(spec.key, tr(spec.title), pts, spec.points, status, message)


def make_cases(obj, seed: int | None = None) -> list:
    """The item's fresh cases for ``seed`` (trusted side), exactly as ``observe`` will receive them."""
    import random

    cases = obj.cases(random.Random(seed))
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"{obj.__name__}.cases(rng) must return a non-empty list, got {type(cases).__name__}")
    return round_trip(cases)


#: What :func:`observe_item` returns: ``{"status": "ok", "seen": [...]}``, or ``{"status": "todo" |
#: "fail" | "error", "message": ..., "case": index}`` when the learner's code stopped the observation.
Observed = dict


def observe_item(obj, ns: "Namespace | Mapping", cases: list, timeout_s: float | None = ITEM_TIMEOUT_S,
                 alarm: bool = True) -> Observed:
    """Run ``observe`` on every case; return plain, JSON-able observations.

    The whole item shares one time limit of ``timeout_s``, kept by SIGALRM here (``check()``) or, with
    ``alarm=False``, by the caller (the grader's observer raises :class:`ItemTimeout` itself). Stops at the
    first case the learner's code cannot get through.
    """
    if not hasattr(ns, "function"):  # a plain mapping (the grader passes its RemoteNamespace)
        ns = Namespace(ns)
    test_file = getattr(getattr(obj.observe, "__code__", None), "co_filename", None)
    seen: list = []

    def run_all():
        for case in cases:
            seen.append(plain(obj.observe(ns, case)))

    status, value = _classify(run_all, test_file, timeout_s, alarm=alarm)
    if status == "ok":
        return {"status": "ok", "seen": seen}
    return {"status": status, "message": value, "case": len(seen)}


def judge_item(spec: ItemSpec, obj, cases: list, observed: Observed) -> ItemResult:
    """Trusted side: the verdict on ``observed`` for ``cases``. Never raises."""
    if not isinstance(observed, dict) or observed.get("status") not in ("ok", "todo", "fail", "error"):
        return _result(spec, "error", tr("the grader received no readable observation for this item"))
    if observed["status"] != "ok":
        return _result(spec, observed["status"], str(observed.get("message", "")))
    seen = observed.get("seen")
    if not isinstance(seen, list) or len(seen) != len(cases):
        return _result(spec, "error", tr("the grader received observations that do not match its cases"))
    test_file = getattr(getattr(obj.judge, "__code__", None), "co_filename", None)
    for case, obs in zip(cases, seen):
        status, value = _classify(lambda: obj.judge(case, obs), test_file, None, raw_errors=True)
        if status == "todo":
            return _result(spec, "todo", _todo_message())
        if status == "error":  # a judge never runs learner code: this is a bug in the test itself
            return _result(spec, "error", tr("The check failed while judging your answer ({what}): look at what "
                                             "your function returns (type, shape, nesting). If it looks right, "
                                             "tell your instructor.", what=value))
        if status != "ok":
            return _result(spec, status, value)
    return _result(spec, "pass")


def run_item(spec: ItemSpec, fn: Callable, ns: Namespace | Mapping,
             timeout_s: float | None = ITEM_TIMEOUT_S, seed: int | None = None, alarm: bool = True) -> ItemResult:
    """Run one item start to end in this process (``check()`` in a notebook). Never raises (but interrupts).

    A split item makes its cases, observes and judges here, with the same JSON round trips as
    the grader. With ``timeout_s`` (and SIGALRM available) learner code that runs longer is
    stopped and reported as an error, so an endless loop cannot hang ``check()``.
    """
    if not hasattr(ns, "function"):  # a plain mapping (the grader passes its RemoteNamespace)
        ns = Namespace(ns)
    if is_split(fn):
        try:
            cases = make_cases(fn, seed)
        except Exception as exc:
            return _result(spec, "error", tr("The check could not build its test cases ({what}). Tell your "
                                             "instructor.", what=f"{type(exc).__name__}: {exc}"))
        return judge_item(spec, fn, cases, observe_item(fn, ns, cases, timeout_s, alarm))
    test_file = getattr(getattr(fn, "__code__", None), "co_filename", None)
    status, value = _classify(lambda: fn(ns), test_file, timeout_s, alarm=alarm)
    return _result(spec, "pass") if status == "ok" else _result(spec, status, value)


def items_in(module) -> list[tuple[ItemSpec, Callable]]:
    """The graded items defined in ``module``, in definition order."""
    found = [(getattr(obj, _MARK), obj) for obj in vars(module).values() if hasattr(obj, _MARK)]
    keys = [s.key for s, _ in found]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"{getattr(module, '__file__', module)} defines item(s) {dupes} more than once")
    return found


def load_test_file(path: str | Path):
    """Import a test file by path as a fresh module (never reusing ``sys.modules``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"test file not found: {path}")
    return load_test_source(path.read_text(), str(path))


def load_test_source(source: str, filename: str):
    """Build a fresh module from test source text (``filename`` is used in tracebacks)."""
    name = f"_gpucourse_tests_{Path(filename).stem}_{uuid.uuid4().hex[:8]}"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses and pickling need it registered
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except Exception:
        sys.modules.pop(name, None)
        raise
    return module


def lab_ids() -> list[str]:
    """The labs that have public tests, e.g. ``['01', '02']``."""
    return sorted(p.stem[3:] for p in LABTESTS_DIR.glob("lab[0-9][0-9].py"))


def lab_test_path(lab: str) -> Path:
    """Path of the public tests for ``lab`` ('01' .. '08')."""
    lab = str(lab).zfill(2)
    path = LABTESTS_DIR / f"lab{lab}.py"
    if not path.is_file():
        raise ValueError(f"there is no lab {lab!r}; labs with tests: {', '.join(lab_ids()) or 'none'}")
    return path


def score_table(results: list[ItemResult], title: str = "") -> str:
    """Learner-facing table: one block per item, then the total."""
    got = sum(r.points for r in results)
    total = sum(r.max_points for r in results)
    lines = [title] if title else []
    lines += [r.line() for r in results]
    lines.append(tr("Score: {got}/{total}", got=got, total=total))
    return "\n".join(lines)
