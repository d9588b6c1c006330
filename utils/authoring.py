"""``python -m gpucourse.authoring``: the command of :mod:`gpucourse.tools.authoring` (the maintainers' tools live in ``tools/``)."""

from .tools.authoring import *  # noqa: F401,F403 (the tool's public names, for scripts that import them from here)
from .tools.authoring import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
