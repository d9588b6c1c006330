"""``python -m gpucourse.i18n``: the command of :mod:`gpucourse.tools.i18n` (the maintainers' tools live in ``tools/``)."""

from .tools.i18n import *  # noqa: F401,F403 (the tool's public names, for scripts that import them from here)
from .tools.i18n import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
