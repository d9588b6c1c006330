"""``python -m gpucourse.benchmark``: the command of :mod:`gpucourse.tools.benchmark` (the maintainers' tools live in ``tools/``)."""

from .tools.benchmark import *  # noqa: F401,F403 (the tool's public names, for scripts that import them from here)
from .tools.benchmark import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
