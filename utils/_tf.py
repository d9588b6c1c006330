"""The one lazy TensorFlow import: ``import gpucourse`` never imports TensorFlow by itself.

Helpers call :func:`tf` (or :func:`keras`) inside functions, so importing a
course module stays cheap and, above all, never initialises TensorFlow's
runtime before a notebook has configured its devices.
"""

from __future__ import annotations

__all__ = ["tf", "keras"]


def tf():
    """The ``tensorflow`` module (imported on first use)."""
    import tensorflow

    return tensorflow


def keras():
    """The ``keras`` module (Keras 3; imported on first use)."""
    import keras as _keras

    return _keras
