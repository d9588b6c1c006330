"""Shared fixtures for the course's own tests (the notebooks are tested by nbval)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def run_python(code: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a fresh TensorFlow runtime) and return the finished process."""
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full)


@pytest.fixture
def fresh_python():
    """Run code in a fresh Python process; asserts it exits 0 and returns its stdout."""
    def run(code: str, env: dict | None = None, timeout: float = 180) -> str:
        proc = run_python(code, env, timeout)
        assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-3000:]}"
        return proc.stdout
    return run
