"""Run wrong-answer fixtures against a lab's items: one kernel per lab, golden verdicts beside each fixture.

A fixture is ``tests/labtests/fixtures/labNN/<item>_<what>.py``: Python source
that is executed on top of the lab's *solution* (its functions already
defined), usually redefining one function with a classic mistake. Beside it,
``<same name>.expected.json`` holds the golden verdict::

    {"item": "q3", "status": "fail", "message": ["compute_average_loss", "global batch"]}

``status`` is what the targeted item must report (``fail``, ``error`` or
``todo``) and every string in ``message`` must appear in its message. Every
*other* item whose answer the fixture touches must still pass: a fixture
loses exactly the item it targets.

How it runs: one fresh kernel per lab executes the solution's code cells,
then runs each item once on the solution while recording which notebook names
it reads. For each fixture it snapshots the kernel's globals, executes the
fixture, runs the targeted item plus every item that read a name the fixture
changed, and restores the globals.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

_HARNESS = r'''
def _fx_main(lab, fixtures):
    import json
    from gpucourse.grading.items import Namespace, items_in, lab_test_path, load_test_file, run_item

    class Recording(Namespace):
        def __init__(self, mapping, seen):
            super().__init__(mapping)
            self._seen = seen

        def lookup(self, name):
            self._seen.add(name)
            return super().lookup(name)

    g = globals()
    public = lambda: {k: v for k, v in g.items() if not k.startswith("_")}  # noqa: E731
    items = {spec.key: (spec, obj) for spec, obj in items_in(load_test_file(lab_test_path(lab)))}
    reads, baseline = {}, {}
    for key, (spec, obj) in items.items():
        seen = set()
        res = run_item(spec, obj, Recording(public(), seen))
        reads[key], baseline[key] = sorted(seen), res.to_dict()
    out = {"baseline": baseline, "reads": reads, "fixtures": {}}
    for name, target, source in fixtures:
        before = dict(g)
        try:
            exec(compile(source, name, "exec"), g)
        except BaseException as exc:
            out["fixtures"][name] = {"setup_error": f"{type(exc).__name__}: {exc}"}
            continue
        changed = {k for k, v in g.items() if not k.startswith("_") and (k not in before or before[k] is not v)}
        run = [k for k in items if k == target or changed & set(reads[k])]
        results = {k: run_item(items[k][0], items[k][1], Namespace(public())).to_dict() for k in run}
        out["fixtures"][name] = {"changed": sorted(changed), "results": results}
        for k in list(g):
            if k not in before:
                del g[k]
        g.update(before)
    print("GPUCOURSE_FIXTURES " + json.dumps(out))

_fx_main(%(lab)r, %(fixtures)r)
'''


def fixture_files(lab: str | None = None) -> list[Path]:
    """Every fixture (``.py`` with a golden ``.expected.json`` beside it), optionally of one lab."""
    pattern = f"lab{lab}/*.py" if lab else "lab*/*.py"
    return sorted(p for p in FIXTURES.glob(pattern) if p.with_suffix(".expected.json").is_file())


def expected(path: Path) -> dict:
    return json.loads(path.with_suffix(".expected.json").read_text())


def solution_path(lab: str) -> Path:
    found = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
    assert len(found) == 1, f"no single solution notebook for lab {lab}: {found}"
    return found[0]


def run_lab(lab: str) -> dict:
    """Execute the solution of ``lab`` and all its fixtures in one fresh kernel; the harness's JSON (the tests
    call it once per lab, through tests/ahead.py)."""
    import nbformat
    from nbclient import NotebookClient

    from gpucourse.grading.grader.session import kernel_env

    sol = nbformat.read(solution_path(lab), as_version=4)
    cells = [nbformat.v4.new_code_cell(c.source) for c in sol.cells
             if c.cell_type == "code" and "check(" not in c.source and "check.summary" not in c.source]
    fixtures = [(p.name, expected(p)["item"], p.read_text()) for p in fixture_files(lab)]
    cells.append(nbformat.v4.new_code_cell(_HARNESS % {"lab": lab, "fixtures": fixtures}))
    nb = nbformat.v4.new_notebook(cells=cells)
    env = kernel_env()  # the graded kernel's environment (explorers idle, no user site, Agg plots)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(solution_path(lab).parent)}})
    with client.setup_kernel(env=env):
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    line = [ln for ln in text.splitlines() if ln.startswith("GPUCOURSE_FIXTURES ")]
    assert line, f"the fixture harness printed nothing for lab {lab}:\n{text[-2000:]}"
    return json.loads(line[-1].split(" ", 1)[1])
