"""``python -m gpucourse.gpureport``: the command of :mod:`gpucourse.tools.gpureport` (the maintainers' tools live in ``tools/``)."""

from .tools.gpureport import *  # noqa: F401,F403 (the tool's public names, for scripts that import them from here)
from .tools.gpureport import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
