"""The module map in gpucourse/__init__.py matches the modules that exist.

Every public module pkgutil finds in the package is a row of the docstring's
table and an entry of ``_SUBMODULES`` (so ``gpucourse.<name>`` works), and
vice versa. Private modules (``_x``) are plumbing; the command-line tools (every module of ``tools/``, each
with a ``gpucourse.<name>`` shim, and ``train_multiworker``) are listed separately, in the paragraph after
the table.
"""

import importlib
import pkgutil
import re
from pathlib import Path

import gpucourse

#: The maintainers' tools, derived from the folder (the one list), and the cluster job's script.
MAINTAINERS = {p.stem for p in (Path(gpucourse.__file__).parent / "tools").glob("*.py") if p.stem != "__init__"}
TOOLS = MAINTAINERS | {"train_multiworker"}


def _found() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(gpucourse.__path__) if not m.name.startswith("_")}


def _table_rows() -> list[str]:
    doc = gpucourse.__doc__
    rules = [m.start() for m in re.finditer(r"^=+ +=+$", doc, flags=re.M)]
    assert len(rules) == 2, "the module map must be one table between two ===== rules"
    body = doc[rules[0]:rules[1]].splitlines()[1:]
    rows = [re.match(r"``(\w+)``\s+\S", line) for line in body if line.strip()]
    assert all(rows), f"every table line is ``name`` + description: {body}"
    return [r.group(1) for r in rows]


def test_every_public_module_is_in_the_table_and_importable_by_attribute_and_vice_versa():
    found = _found()
    public = found - TOOLS
    rows = _table_rows()
    assert len(rows) == len(set(rows)), f"duplicate rows: {sorted(r for r in rows if rows.count(r) > 1)}"
    assert set(rows) == public, (f"missing from the module map: {sorted(public - set(rows))}; "
                                 f"in the map but no such module: {sorted(set(rows) - public)}")
    assert set(gpucourse._SUBMODULES) == public, (
        f"missing from _SUBMODULES: {sorted(public - set(gpucourse._SUBMODULES))}; "
        f"in _SUBMODULES but no such module: {sorted(set(gpucourse._SUBMODULES) - public)}")
    assert set(gpucourse.__all__) == public | {"__version__"}


def test_tools_exist_run_as_main_and_are_named_after_the_table():
    found = _found()
    assert TOOLS <= found, f"tools not found: {sorted(TOOLS - found)}"
    after = gpucourse.__doc__.split("Command-line tools", 1)
    assert len(after) == 2, "the docstring names the command-line tools after the table"
    for tool in TOOLS:
        assert f"``{tool}``" in after[1], f"{tool} is not named among the command-line tools"
        spec = importlib.util.find_spec(f"gpucourse.{tool}")
        assert "__main__" in open(spec.origin, encoding="utf-8").read(), f"{tool} has no __main__ entry"
        assert tool not in gpucourse._SUBMODULES


def test_each_maintainers_tool_has_its_shim_and_nothing_else_does():
    folder = Path(gpucourse.__file__).parent
    shims = {m.name for m in pkgutil.iter_modules(gpucourse.__path__) if not m.ispkg
             and "from .tools." in (folder / f"{m.name}.py").read_text(encoding="utf-8")}
    assert shims == MAINTAINERS, f"shims {sorted(shims)} but tools {sorted(MAINTAINERS)}"
    for tool in MAINTAINERS:
        shim = importlib.import_module(f"gpucourse.{tool}")
        assert shim.main is importlib.import_module(f"gpucourse.tools.{tool}").main


def test_private_modules_are_named_in_the_docstring_but_not_exported():
    private = {m.name for m in pkgutil.iter_modules(gpucourse.__path__) if m.name.startswith("_")}
    assert private, "pkgutil found no private modules: is gpucourse installed from utils/?"
    for name in private:
        assert f"``{name}``" in gpucourse.__doc__, f"{name} is not described in the module map"
        assert name not in gpucourse._SUBMODULES and name not in gpucourse.__all__
