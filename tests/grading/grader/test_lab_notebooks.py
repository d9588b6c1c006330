"""Labs, solutions and tests agree: every lab has all three, labs are generated and hide the solutions."""

import pytest

from gpucourse.tools import labgen
from gpucourse.grading.items import lab_ids, lab_test_path
from gpucourse.grading.grader.runner import lab_of


def test_every_lab_has_tests_and_notebooks(root):
    assert lab_ids(), "no lab tests found"
    for lab in lab_ids():
        assert lab_test_path(lab).is_file()
        assert list((root / "solutions").glob(f"{lab}_*.ipynb")), f"lab {lab} has tests but no solution"
        assert list((root / "labs").glob(f"{lab}_*.ipynb")), f"lab {lab} has tests but no lab notebook"
        assert list((root / "notebooks").glob(f"{lab}_*.ipynb")), f"lab {lab} has tests but no tutorial"


def test_strip_solution_rules():
    src = ("def f(x):\n    ### BEGIN SOLUTION\n    # STUB: return None\n    return x + 1\n    ### END SOLUTION\n"
           "def g():\n    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION\n# NBVAL_CHECK_OUTPUT\ncheck('q1')")
    out = labgen.strip_solution(src)
    assert out == ("def f(x):\n    return None\ndef g():\n    raise NotImplementedError(\"TODO\")\ncheck('q1')")
    assert labgen.strip_solution("a\n### BEGIN SOLUTION\nsecret\n### END SOLUTION\nb", markdown=True) == "a\nb"
    for bad in ("### BEGIN SOLUTION\nx", "### END SOLUTION", "### BEGIN SOLUTION\n### BEGIN SOLUTION"):
        with pytest.raises(ValueError):
            labgen.strip_solution(bad)


def test_labs_are_generated_from_solutions(root):
    """labs/ must equal what the generator makes from solutions/ (single source)."""
    assert labgen.main(["--check", "--root", str(root)]) == 0


def test_labs_hide_the_solutions(root):
    import nbformat

    for sol in sorted((root / "solutions").glob("*.ipynb")):
        lab = nbformat.read(labgen.lab_path_for(sol), as_version=4)
        text = "\n".join(c.source for c in lab.cells)
        assert "BEGIN SOLUTION" not in text and "SOLUTION ONLY" not in text
        assert "NotImplementedError" in text or "# STUB" not in text
        assert all(not c.get("outputs") for c in lab.cells if c.cell_type == "code")
        assert lab.metadata["gpucourse"]["kind"] == "lab"
        assert lab_of(lab, "x.ipynb") == sol.name[:2]


def test_labgen_only_one_lab(root, capsys):
    assert labgen.main(["--check", "--only", "1", "--root", str(root)]) == 0
    with pytest.raises(SystemExit):
        labgen.main(["--only", "42", "--root", str(root)])
    assert "no solution notebook matches" in capsys.readouterr().err
