"""``python -m gpucourse.labgen``: the command of :mod:`gpucourse.tools.labgen` (the maintainers' tools live in ``tools/``)."""

from .tools.labgen import *  # noqa: F401,F403 (the tool's public names, for scripts that import them from here)
from .tools.labgen import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
