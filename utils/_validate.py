"""Argument validation for every helper: one policy, one wording.

The policy: a value of the wrong *type* raises ``TypeError``; a value of the
right type that is out of range raises ``ValueError``. Every message names the
argument, shows the value it got and says what would be accepted, e.g.::

    ValueError: repeats must be >= 1, got 0 (a whole number of timed runs)

``bool`` is never accepted where a number is expected (``True`` is an ``int``
in Python, but ``repeats=True`` is always a mistake).
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Mapping

__all__ = ["whole", "real", "seconds", "text", "one_of", "env_vars", "callable_", "mapping", "sequence"]


def _hint(what: str) -> str:
    return f" ({what})" if what else ""


def whole(name: str, value, minimum: int | None = 1, maximum: int | None = None, what: str = "") -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``; NumPy integers are accepted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number (int), got {value!r} of type "
                        f"{type(value).__name__}{_hint(what)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}{_hint(what)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}{_hint(what)}")
    return value


def real(name: str, value, minimum: float | None = None, maximum: float | None = None, *,
         strict_min: bool = False, finite: bool = True, what: str = "") -> float:
    """``value`` as a finite ``float`` within the bounds (``strict_min``: must be > minimum)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}{_hint(what)}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number, got {value}{_hint(what)}")
    if minimum is not None and (value < minimum or (strict_min and value == minimum)):
        raise ValueError(f"{name} must be {'>' if strict_min else '>='} {minimum:g}, got {value:g}{_hint(what)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum:g}, got {value:g}{_hint(what)}")
    return value


def seconds(name: str, value, allow_zero: bool = True) -> float:
    """A duration in seconds: finite, ``>= 0`` (or ``> 0`` without ``allow_zero``)."""
    return real(name, value, 0.0, strict_min=not allow_zero, what="a duration in seconds")


def text(name: str, value, what: str = "") -> str:
    """A non-empty string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {value!r} of type {type(value).__name__}{_hint(what)}")
    if not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}{_hint(what)}")
    return value


def one_of(name: str, value, options: Iterable):
    """``value`` if it is one of ``options`` (compared with ``==``), else ValueError listing them."""
    options = list(options)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}; got {value!r}")
    return value


def mapping(name: str, value, what: str = "") -> Mapping:
    """A non-empty mapping (``dict``): TypeError for anything else, ValueError when empty.

    ``what`` describes the expected shape, e.g. ``"{label: seconds}"``.
    """
    shape = what or "{key: value}"
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict like {shape}, got {_short(value)} of type {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty dict like {shape}, got {{}}: give at least one entry")
    return value


def sequence(name: str, value, what: str = "") -> list:
    """A non-empty ordered collection (list, tuple, range, NumPy array...) as a ``list``.

    A string, a dict or a set is a TypeError (one is a single value, the others
    have no meaningful order); an empty collection is a ValueError.
    """
    shape = what or "items"
    if isinstance(value, (str, bytes, Mapping, set, frozenset)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of {shape}, got {_short(value)} of type {type(value).__name__}")
    items = list(value)
    if not items:
        raise ValueError(f"{name} must be a non-empty list of {shape}, got an empty {type(value).__name__}")
    return items


def _short(value, limit: int = 80) -> str:
    text_ = repr(value)
    return text_ if len(text_) <= limit else text_[: limit - 3] + "..."


def env_vars(name: str, value: Mapping | None) -> dict[str, str]:
    """A mapping of environment variables, str -> str (``None`` means none)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TypeError(f"{name} must be a dict of str -> str, e.g. {{'CUDA_VISIBLE_DEVICES': '-1'}}; got {value!r}")
    return dict(value)


def callable_(name: str, value):
    """A callable (function, tf.function, Keras model...)."""
    if not callable(value):
        raise TypeError(f"{name} must be callable (a function), got {type(value).__name__}")
    return value
