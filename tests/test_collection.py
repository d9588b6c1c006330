"""What pytest collects: fixture notebooks are data for the tests that read them, never run by nbval."""

import subprocess
import sys

from tests.conftest import ROOT


def test_no_fixture_notebook_is_collected():
    """A fixture notebook collected by nbval starts a kernel and checks nothing (the similarity fixtures were
    run this way for a while after they moved under tests/grading/grader/: ~26 s of every run)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    notebooks = sorted({line.split("::")[0] for line in proc.stdout.splitlines() if ".ipynb::" in line})
    assert notebooks == [], f"fixture notebooks collected as tests (add their folder to collect_ignore_glob " \
                            f"in tests/conftest.py): {notebooks}"
