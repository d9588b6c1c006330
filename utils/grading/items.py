"""Graded items: how a lab's tests are written, found and run.

A lab's tests are plain functions in ``gpucourse/labtests/labNN.py`` (public)
or in any extra file an instructor passes to the grader (hidden tests)::

    from gpucourse.grading.items import item, Fail

    @item("q1", points=2, title="summarise_devices counts devices by type")
    def q1(ns):
        fn = ns.function("summarise_devices")
        got = fn([...fresh input...])
        if got != expected:
            raise Fail(f"for ... expected {expected}, got {got}")

``ns`` is a :class:`Namespace` over the learner's notebook variables. A test
passes if it returns; it fails with the message of the :class:`Fail` (or
``AssertionError``) it raises. ``NotImplementedError`` from the learner's code
means "not attempted yet"; any other exception is reported with where it
happened. Points are all or nothing per item.

This module uses the standard library only, so the grader can load a fresh
copy of it by file path, out of reach of anything a submission patched.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
import types
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

__all__ = ["Fail", "ItemResult", "ItemTimeout", "ItemSpec", "Namespace", "expect_raises", "item", "items_in", "lab_ids", "lab_test_path",
           "load_test_file", "load_test_source", "run_item", "score_table"]

LABTESTS_DIR = Path(__file__).resolve().parent.parent / "labtests"
_MARK = "__gpucourse_item__"


#: Seconds one item may run before it is stopped (an endless loop in the learner's code).
ITEM_TIMEOUT_S = 120


class Fail(AssertionError):
    """Raise in a test with a message addressed to the learner."""


def expect_raises(call: Callable[[], object], what: str, why: str = "", exc_type: type = ValueError) -> None:
    """Fail unless ``call()`` raises ``exc_type`` (for bad-input cases of a learner's function).

    ``what`` names the call for the learner, e.g. ``"pick_device([])"``; ``why`` says why it must
    raise. ``NotImplementedError`` passes through, so an untouched stub still counts as not attempted.
    """
    reason = f" ({why})" if why else ""
    try:
        got = call()
    except exc_type:
        return
    except NotImplementedError:
        raise
    except Exception as exc:
        raise Fail(f"{what} should raise {exc_type.__name__}{reason}, it raised "
                   f"{type(exc).__name__}: {exc}") from None
    raise Fail(f"{what} should raise {exc_type.__name__}{reason}, but returned {got!r}")


class ItemTimeout(BaseException):
    """Raised inside a running item when its time is up (BaseException: ``except Exception`` won't catch it)."""


@dataclass(frozen=True)
class ItemSpec:
    key: str
    points: int
    title: str


def item(key: str, points: int = 1, title: str = ""):
    """Mark a function ``fn(ns)`` as the graded item ``key`` worth ``points``."""
    if not isinstance(key, str) or not key.isidentifier():
        raise ValueError(f"item key must be a short identifier like 'q1', got {key!r}")
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"points must be a whole number >= 1, got {points!r}")

    def mark(fn: Callable) -> Callable:
        doc = (fn.__doc__ or "").strip().splitlines()
        setattr(fn, _MARK, ItemSpec(key, points, title or (doc[0] if doc else key)))
        return fn

    return mark


class Namespace:
    """Read-only view of the learner's notebook variables, with learner-facing errors."""

    def __init__(self, mapping: Mapping[str, object]):
        self._ns = dict(mapping)

    def __contains__(self, name: str) -> bool:
        return name in self._ns

    def value(self, name: str):
        """The variable ``name``; fails with a hint if the learner has not defined it."""
        if name not in self._ns:
            raise Fail(f"`{name}` is not defined. Run the cell that defines it (and the cells above it) first.")
        return self._ns[name]

    def function(self, name: str) -> Callable:
        """The function ``name``; fails with a hint if missing or not callable."""
        obj = self.value(name)
        if not callable(obj):
            raise Fail(f"`{name}` should be a function, but it is a {type(obj).__name__}.")
        return obj


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
    what = f"{type(exc).__name__}: {exc}"
    f = _learner_frame(exc, test_file)
    if f is None:
        return (f"The check raised {what} while testing your answer: look at what your function returns "
                f"(type, shape, device). If it looks right, tell your instructor.")
    where = f" (in `{f.name}`, line: {f.line.strip()})" if f.line else f" (in `{f.name}`)"
    return f"Your code raised {what}{where}"


def _alarm_available() -> bool:
    """SIGALRM works only on Unix and only in the main thread (where notebook code runs)."""
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


def run_item(spec: ItemSpec, fn: Callable, ns: Namespace | Mapping,
             timeout_s: float | None = ITEM_TIMEOUT_S) -> ItemResult:
    """Run one item and classify the outcome. Never raises (except KeyboardInterrupt).

    With ``timeout_s`` (and SIGALRM available) an item that runs longer is
    stopped and reported as an error, so an endless loop cannot hang ``check()``.
    """
    if not isinstance(ns, Namespace):
        ns = Namespace(ns)
    test_file = getattr(getattr(fn, "__code__", None), "co_filename", None)

    def result(status, message=""):
        pts = spec.points if status == "pass" else 0
        return ItemResult(spec.key, spec.title, pts, spec.points, status, message)

    def on_alarm(signum, frame):
        raise ItemTimeout()

    timed = bool(timeout_s) and _alarm_available()
    if timed:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        fn(ns)
    except KeyboardInterrupt:
        raise
    except ItemTimeout:
        return result("error", f"Stopped after {timeout_s:g} s: your code did not finish. Look for an endless "
                               f"loop, or an iterator that never ends (e.g. a dataset with .repeat()).")
    except NotImplementedError:
        return result("todo", "Not attempted yet: your code still raises NotImplementedError. "
                              "Replace the `raise NotImplementedError` line under the TODO with your code.")
    except AssertionError as exc:  # Fail is an AssertionError
        msg = str(exc).strip()
        if not msg:
            tb = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == test_file]
            msg = f"check failed: {tb[-1].line.strip()}" if tb and tb[-1].line else "a check failed"
        return result("fail", msg)
    except BaseException as exc:  # learner code may raise anything, even SystemExit
        return result("error", _error_message(exc, test_file))
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return result("pass")


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
    lines.append(f"Score: {got}/{total}")
    return "\n".join(lines)
