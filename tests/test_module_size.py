"""No module of the course package is over 600 lines (the developers' guide: one job per module, ~600 lines).

Every ``.py`` file under ``utils/`` counts: the taught modules, the grader, the lab tests and the tools. A module
that grows past the limit is split by job (a re-export keeps a taught name where the notebooks import it).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 600


def module_sizes(folder: Path) -> dict[str, int]:
    """``{path relative to folder: lines}`` of every Python module under ``folder``, at any depth."""
    return {p.relative_to(folder).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts}


def test_no_module_is_over_600_lines():
    sizes = module_sizes(ROOT / "utils")
    assert len(sizes) > 50 and "grading/grader/judge.py" in sizes, f"found only {sorted(sizes)}"
    over = sorted(((n, p) for p, n in sizes.items() if n > LIMIT), reverse=True)
    assert not over, (f"{len(over)} module(s) over {LIMIT} lines; split each by job: "
                      + ", ".join(f"utils/{p} ({n} lines)" for n, p in over))


def test_the_count_reaches_nested_modules_and_counts_their_lines(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "short.py").write_text("y = 2\n" * 3)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "stale.py").write_text("z = 3\n" * 900)
    assert module_sizes(tmp_path) == {"short.py": 3, "sub/deeper/long.py": 601}
