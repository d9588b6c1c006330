"""The one wire protocol between the grader and the code it ships into a graded kernel.

Both ends use this module: the grader imports it, and the kernel gets its text (it is standard library
only, and defines nothing the kernel could use to change a mark). See ``docs/grading-architecture.md``.

* **Frames.** A frame is a 4-byte big-endian length and a UTF-8 JSON object
  ``{"seq": n, "kind": "...", "body": ..., "mac": "<hex>"}``. ``seq`` counts the frames one side sent on
  one connection, from 0. ``mac`` is :func:`mac` of ``[seq, kind, body]`` under the connection's key.
* **Connections.** The kernel opens two to the grader's Unix socket: the tripwire's (before any submitted
  code runs) and the agent's (after the submission's cells). Each starts with a ``hello`` frame naming its
  :class:`Role` and the run's token, under the key the grader gave that role.
* **Kinds** (:class:`Kind`): the tripwire sends ``flag`` and ``look`` records; the observer sends ``call``
  and ``reply`` (to a callback) and ``stop``; the agent sends ``result`` and ``callback``.
* **Plain data** (:func:`plain`): everything that crosses is exact ``dict``/``list``/``str``/``int``/
  ``float``/``bool``/``None``, converted at once on the side that made it.

What the kernel sends is never trusted for a mark: the MAC and the numbering only make a tripwire record
that was forged or suppressed visible (:class:`Reader` reports it).
"""

from __future__ import annotations

import json
import struct
from _hashlib import hmac_digest as _hmac_digest
from _operator import _compare_digest
from enum import Enum

__all__ = ["Category", "Kind", "MAX_FRAME", "ProtocolError", "Reader", "Role", "canonical", "encode", "mac", "plain",
           "plain_key", "unpack_tuples"]

#: Largest frame accepted (an observation of a big tensor is one frame).
MAX_FRAME = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")


class Role(str, Enum):
    """Who opened a connection to the grader."""

    TRIPWIRE = "tripwire"
    AGENT = "agent"


class Kind(str, Enum):
    """What a frame carries."""

    HELLO = "hello"        # first frame of a connection: {"role", "token"}
    FLAG = "flag"          # tripwire -> grader: {"category", "detail", "where"}
    LOOK = "look"          # tripwire -> grader: {"at", "signals", "profiler", "tracer", "threads"}
    CALL = "call"          # observer -> agent: {"id", "op", ...} (see gpucourse.grading.kernel.agent)
    RESULT = "result"      # agent -> observer: {"id", "ok": value} or {"id", "raised": {...}}
    CALLBACK = "callback"  # agent -> observer: {"cb", "fn", "args", "kwargs"}
    REPLY = "reply"        # observer -> agent: {"cb", "ok": value} or {"cb", "raise": {"type", "message"}}
    STOP = "stop"          # observer -> agent: serve no more


class Category(str, Enum):
    """What a tripwire flag is about: each is for a human to review, never a verdict."""

    INTROSPECTION = "introspection"      # frames, tracebacks, gc walks
    DYNAMIC_CODE = "dynamic-code"        # exec/compile of code that is not a cell
    SIGNAL_HANDLER = "signal-handler"    # a Python signal handler set by the submission
    PROFILER = "profiler"                # sys.setprofile / sys.settrace / threading's
    CTYPES = "ctypes"                    # foreign calls, which can rewrite any memory
    MEMORY = "memory"                    # /proc/<pid>/mem
    PROCESS = "process"                  # a new process, or a signal to one
    AUDIT_HOOK = "audit-hook"            # another audit hook
    THREADS = "threads"                  # threads the submission left running
    SILENCED = "silenced"                # the tripwire stopped reporting, or a record was forged or lost
    TRIPWIRE_ERROR = "tripwire-error"    # an exception inside the tripwire itself (it fails closed)


class ProtocolError(ValueError):
    """A frame that is malformed, too long, out of order or carries a wrong MAC.

    ``frames``: the good frames the same :meth:`Reader.feed` read before the bad one (they came first, and
    are as trustworthy as any).
    """

    frames: list = []


_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})
_ESCAPES.update({i: f"\\u{i:04x}" for i in range(0xD800, 0xE000)})  # a lone surrogate cannot be UTF-8
_FLOATS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def canonical(value, _type=type, _str=str, _repr=float.__repr__, _int=int.__repr__, _sorted=sorted,
              _escapes=_ESCAPES, _floats=_FLOATS) -> str:
    """``value`` (plain data) as compact JSON with sorted keys, the one text a MAC is computed over.

    Pure Python over exact built-in types, with what it uses bound when this module was loaded (the
    kernel's tripwire loads it before any submitted code runs). NaN and infinities are written as Python's
    ``json`` writes them; control characters and lone surrogates (a learner's ``os.fsdecode`` of bytes) as
    ``\\uXXXX``, so that every text can be sent as UTF-8 and reads back the same. TypeError for anything that
    is not plain data.
    """
    kind = _type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return _int(value)
    if kind is float:
        text = _repr(value)
        return _floats.get(text, text)
    if kind is str:
        return '"' + _str.translate(value, _escapes) + '"'
    if kind is list:
        return "[" + ",".join([canonical(v) for v in value]) + "]"
    if kind is dict:
        keys = _sorted(value)
        if any(_type(k) is not str for k in keys):
            raise TypeError("a dict key that is not a str is not plain data")
        return "{" + ",".join([canonical(k) + ":" + canonical(value[k]) for k in keys]) + "}"
    raise TypeError(f"{kind.__name__} is not plain data")


def mac(key: bytes, seq: int, kind: str, body, _body_text: str | None = None, _digest=_hmac_digest,
        _canonical=canonical) -> str:
    """HMAC-SHA256 of ``canonical([seq, kind, body])`` under ``key``, as hex."""
    text = "[" + _canonical(seq) + "," + _canonical(kind) + "," + (_body_text or _canonical(body)) + "]"
    return _digest(key, text.encode(), "sha256").hex()


#: The kinds' values, for :func:`encode` (which must not call ``Kind(...)``: the tripwire sends from inside its
#: audit hook, and an enum's metaclass is a class the submission could patch).
_KIND_VALUES = frozenset(k.value for k in Kind)


def encode(key: bytes, seq: int, kind, body, _kinds=_KIND_VALUES, _len=len, _isinstance=isinstance, _str=str,
           _canonical=canonical, _mac=mac, _pack=_LENGTH.pack, _limit=MAX_FRAME) -> bytes:
    """One frame, ready to write (TypeError if ``body`` is not plain data, ValueError for an unknown kind).

    What it uses is bound when this module is loaded (the tripwire loads it before any submitted code runs).
    """
    kind = _str.__str__(kind) if _isinstance(kind, _str) else kind  # a Kind member is a str: its value
    if kind not in _kinds:
        raise ValueError(f"{kind!r} is not a kind of frame")
    body_text = _canonical(body)
    tag = _mac(key, seq, kind, body, body_text)
    data = ('{"body":' + body_text + ',"kind":' + _canonical(kind) + ',"mac":"' + tag + '","seq":'
            + _canonical(seq) + "}").encode()
    if _len(data) > _limit:
        raise ProtocolError(f"a frame of {_len(data)} bytes is over the limit of {_limit}")
    return _pack(_len(data)) + data


class Reader:
    """Frames out of a byte stream, checked: ``feed(data)`` returns the ``(kind, body)`` pairs now complete.

    The first frame must be ``hello``; its role picks the key from ``keys`` (``{role: key}``), unless
    ``role`` says whose frames these are (the agent reading the observer's). Every frame must carry the next
    ``seq`` and a valid MAC; the first one that does not raises :class:`ProtocolError` and the reader reads
    nothing more; the exception's ``frames`` are the good frames of that call, before the bad one.
    """

    def __init__(self, keys: dict, role: str | None = None):
        self.keys = {Role(r).value: k for r, k in keys.items()}
        self.role: str | None = None if role is None else Role(role).value
        self.seq = 0
        self._buf = b""
        self.broken: str = ""

    def feed(self, data: bytes) -> list[tuple[str, object]]:
        if self.broken:
            return []
        self._buf += data
        out = []
        try:
            while len(self._buf) >= _LENGTH.size:
                (n,) = _LENGTH.unpack_from(self._buf)
                if n > MAX_FRAME:
                    raise ProtocolError(f"a frame of {n} bytes is over the limit of {MAX_FRAME}")
                if len(self._buf) < _LENGTH.size + n:
                    break
                raw, self._buf = self._buf[_LENGTH.size:_LENGTH.size + n], self._buf[_LENGTH.size + n:]
                out.append(self._check(raw))
        except ProtocolError as exc:
            self.broken = str(exc)
            exc.frames = out
            raise
        return out

    def _check(self, raw: bytes) -> tuple[str, object]:
        try:
            return self._check_frame(raw)
        except RecursionError:  # nested deeper than json or canonical() can go: no frame of ours is
            raise ProtocolError(f"frame {self.seq} is nested too deeply") from None

    def _check_frame(self, raw: bytes) -> tuple[str, object]:
        try:
            frame = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"frame {self.seq} is not JSON ({exc})") from None
        if not isinstance(frame, dict) or set(frame) != {"seq", "kind", "body", "mac"}:
            raise ProtocolError(f"frame {self.seq} does not have the fields seq, kind, body, mac")
        seq, kind, body, tag = frame["seq"], frame["kind"], frame["body"], frame["mac"]
        if seq != self.seq or type(seq) is not int:
            raise ProtocolError(f"frame {seq!r} came where frame {self.seq} was due (one was forged or lost)")
        if type(kind) is not str or kind not in {k.value for k in Kind}:
            raise ProtocolError(f"frame {seq} has an unknown kind {kind!r}")
        if self.role is None:
            if kind != Kind.HELLO.value or not isinstance(body, dict) or type(body.get("role")) is not str \
                    or body["role"] not in self.keys:
                raise ProtocolError("the connection did not start with a hello from a known role")
            self.role = body["role"]
        if not isinstance(tag, str) or not _compare_digest(tag, mac(self.keys[self.role], seq, kind, body)):
            raise ProtocolError(f"frame {seq} ({kind}) has a wrong MAC: it was not written by the {self.role}")
        self.seq += 1
        return kind, body


def plain(value, _depth: int = 0, tuples: bool = False):
    """``value`` as exact built-in data: ``dict`` (str keys), ``list``, ``str``, ``int``, ``float``, ``bool``, None.

    Subclasses are copied to their exact base type through the base type's own methods (an ``int``
    subclass's ``__int__`` or a ``list`` subclass's ``__iter__`` never runs). NumPy values and arrays become
    lists (``tolist``), TensorFlow tensors too (``numpy``), tuples become lists (``tuples=True``: they
    become ``{"__tuple__": [...]}``, which :func:`unpack_tuples` turns back). Anything else becomes
    ``{"__type__": "module.Class", "repr": "..."}``, so that a judge can say what came instead.
    """
    if _depth > 50:
        return {"__type__": "deeply nested", "repr": "..."}
    if value is None or value is True or value is False:
        return value
    kind = type(value)  # not isinstance(), which would ask the object's own __class__
    if issubclass(kind, int):
        return int.__index__(value)
    if issubclass(kind, float):
        return float.__float__(value)
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, list):
        return [plain(v, _depth + 1, tuples) for v in list.__iter__(value)]
    if issubclass(kind, tuple):
        out = [plain(v, _depth + 1, tuples) for v in tuple.__iter__(value)]
        return {"__tuple__": out} if tuples else out
    if issubclass(kind, dict):
        return {plain_key(k): plain(v, _depth + 1, tuples) for k, v in dict.items(value)}
    mod = getattr(kind, "__module__", "") or ""
    if mod.startswith(("numpy", "ml_dtypes")) and hasattr(value, "tolist"):
        return plain(value.tolist(), _depth + 1, tuples)
    if mod.startswith(("tensorflow", "keras")) and hasattr(value, "numpy"):
        try:
            return plain(value.numpy(), _depth + 1, tuples)
        except Exception:  # noqa: BLE001 (a symbolic tensor, a variable on a lost device...)
            pass
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = "<unprintable>"
    return {"__type__": f"{mod}.{getattr(kind, '__qualname__', kind.__name__)}".lstrip("."),
            "repr": str.__str__(text)[:300] if isinstance(text, str) else "<unprintable>"}


def unpack_tuples(value):
    """Undo ``plain(..., tuples=True)``: ``{"__tuple__": [...]}`` becomes a tuple again."""
    if isinstance(value, list):
        return [unpack_tuples(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("__tuple__"), list):
            return tuple(unpack_tuples(v) for v in value["__tuple__"])
        return {k: unpack_tuples(v) for k, v in value.items()}
    return value


def plain_key(key) -> str:
    """A dict key as the exact ``str`` JSON will carry (``1`` -> ``"1"``)."""
    key = plain(key)
    return key if type(key) is str else str(key)
