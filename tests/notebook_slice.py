"""Slice a notebook down to the code its widgets need: the browser test runs only that (nbval runs the rest).

``slice_cells`` is a def-use analysis over a notebook's code cells: a cell is kept when it is the
setup cell, shows a widget, builds an explorer, or defines (or mutates) a name that a kept cell
reads; the closure is transitive. ``sliced_copy`` returns the notebook with every cell and every
stored output in place, except that the kept cells have no outputs yet: running those cells, in
order, reproduces every widget and explorer, and the other cells still show what nbval verified.

Conservative by design: a cell that does not parse (after blanking IPython magics) is kept, a
name read inside a function counts as read when the function is defined, and ``x.method(...)``,
``x[...] = ...`` and ``x.attr = ...`` count as changing ``x``.
"""

from __future__ import annotations

import ast
import copy
import re
import symtable

__all__ = ["WIDGET_VIEW", "cell_names", "slice_cells", "target_cells", "sliced_copy"]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
EXPLORER = re.compile(r"explorer", re.I)


def strip_magics(src: str) -> str:
    """IPython magics and shell escapes become ``pass`` (indentation kept), so the source parses."""
    return "\n".join(ln[:len(ln) - len(ln.lstrip())] + "pass" if ln.lstrip().startswith(("%", "!")) else ln
                     for ln in src.splitlines())


def _nested_globals(table: symtable.SymbolTable) -> tuple[set, set]:
    """(read, assigned) module-level names of the functions, lambdas, classes, comprehensions in ``table``."""
    read, assigned = set(), set()
    for child in table.get_children():
        for sym in child.get_symbols():
            if sym.is_global() or (child.get_type() == "class" and not sym.is_local()):
                if sym.is_referenced():
                    read.add(sym.get_name())
                if sym.is_declared_global() and sym.is_assigned():
                    assigned.add(sym.get_name())
        r, a = _nested_globals(child)
        read |= r
        assigned |= a
    return read, assigned


def _base(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _changed(stmt, imported: set) -> set:
    """Names a statement changes in place: ``x[k] = v``, ``x.a = v``, ``x.method(...)`` (not modules)."""
    out = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # a body runs when called; its module-level effects are its declared globals
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(_base(node))
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute):
        out.add(_base(stmt.value.func))
    return {n for n in out if n and n not in imported}


def cell_names(src: str, modules=frozenset()) -> tuple[set, set] | None:
    """(defines, reads) of one code cell: module-level names it binds or changes, and names it needs
    from earlier cells (those it reads before binding them itself). None when it does not parse.

    Calling a method of one of ``modules`` (names imported anywhere in the notebook) changes nothing.
    """
    try:
        tree = ast.parse(strip_magics(src))
    except SyntaxError:
        return None
    defines, reads, imported = set(), set(), set()
    for stmt in tree.body:
        table = symtable.symtable(ast.unparse(stmt) or "pass", "<cell>", "exec")
        read, assigned = _nested_globals(table)
        for sym in table.get_symbols():
            if sym.is_referenced():
                read.add(sym.get_name())
            if sym.is_assigned() or sym.is_imported():
                assigned.add(sym.get_name())
            if sym.is_imported():
                imported.add(sym.get_name())
        changed = _changed(stmt, imported | set(modules))
        reads |= read - defines
        defines |= assigned | changed
    return defines, reads


def slice_cells(sources: list[str], targets) -> set[int]:
    """Indices (into ``sources``) of the cells the ``targets`` need, the targets and cell 0 included.

    A read of ``x`` needs the last earlier cell that defines or changes ``x``; if that cell reads
    ``x`` too (``x += 1``, ``x.append(...)``), the one before it is needed as well, and so on.
    """
    modules = set()
    for src in sources:
        try:
            modules |= {(a.asname or a.name).split(".")[0] for node in ast.walk(ast.parse(strip_magics(src)))
                        if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
        except SyntaxError:
            pass
    names = [cell_names(s, modules) for s in sources]
    keep: set[int] = set()
    todo = [0, *targets] if sources else []
    while todo:
        i = todo.pop()
        if i in keep:
            continue
        keep.add(i)
        if names[i] is None:  # unparseable: keep every earlier cell that does not parse either
            todo += [j for j in range(i) if names[j] is None]
            continue
        for name in names[i][1]:
            for j in range(i - 1, -1, -1):
                if names[j] is None or name in names[j][0]:
                    todo.append(j)
                    if names[j] is not None:
                        break
    return keep


def target_cells(cells) -> list[int]:
    """Indices (into ``cells``, code cells only) of cells that show a widget or build an explorer."""
    out = []
    for i, cell in enumerate(cells):
        widget = any(WIDGET_VIEW in o.get("data", {}) for o in cell.get("outputs", []))
        try:
            ids = {getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "name", None)
                   for n in ast.walk(ast.parse(strip_magics(cell.source)))}
        except SyntaxError:
            ids = set()
        if widget or any(isinstance(n, str) and EXPLORER.search(n) for n in ids):
            out.append(i)
    return out


def sliced_copy(nb) -> tuple[object, list[int]]:
    """(notebook, kept): a copy of ``nb`` whose kept code cells have no outputs, and their indices in ``nb.cells``.

    Every other cell keeps its source and stored outputs; the widget state is dropped, so no widget
    on the page can come from an earlier run.
    """
    nb = copy.deepcopy(nb)
    where = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    code = [nb.cells[i] for i in where]
    kept = sorted(where[i] for i in slice_cells([c.source for c in code], target_cells(code)))
    for i in kept:
        nb.cells[i].outputs, nb.cells[i].execution_count = [], None
    nb.metadata.pop("widgets", None)
    return nb, kept
