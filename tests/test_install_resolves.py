"""The learner's install (what `make lab` installs) resolves on each platform the README promises, binary wheels only.

`uv pip compile --python-platform` evaluates pyproject's environment markers for the target (pip's ``--platform``
checks wheel tags but evaluates markers for the machine it runs on), and resolves without installing anything.
The test needs the package registry: without it, it skips with the reason, except under ``CI=true``, where it fails.
"""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "3.11"

#: platform (uv's target triple) -> the TensorFlow package the learner's install must get there
EXPECTED = {
    "aarch64-apple-darwin": "tensorflow",  # Apple Silicon: no tensorflow-cpu wheel; tensorflow has no CUDA there
    "x86_64-pc-windows-msvc": "tensorflow-cpu",
    "x86_64-unknown-linux-gnu": "tensorflow-cpu",
    "aarch64-unknown-linux-gnu": "tensorflow",  # Graviton, Docker on Apple Silicon: a manylinux_2_27 CPU build
}


def _lab_extras() -> list[str]:
    """The extras `make lab` installs, read from the Makefile (`-e ".[$(TF),lab]"` with TF's default)."""
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^\$\(LAB_STAMP\):.*?(?=^\S)", make, flags=re.M | re.S).group(0)
    extras = re.search(r'-e "\.\[([^\]]+)\]"', recipe).group(1).split(",")
    tf_default = re.search(r"^TF\s*\?=\s*(\S+)", make, re.M).group(1)
    return [tf_default if e == "$(TF)" else e for e in extras]


def _registry_reachable() -> str | None:
    """None when PyPI (or UV_INDEX_URL's host) answers on its port; otherwise why not."""
    url = urlparse(os.environ.get("UV_INDEX_URL") or os.environ.get("UV_DEFAULT_INDEX") or "https://pypi.org/simple")
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=10).close()
    except OSError as exc:
        return f"the package registry {url.hostname} cannot be reached ({exc})"
    return None


@pytest.fixture(scope="module")
def registry():
    missing = None
    try:
        subprocess.run([sys.executable, "-m", "uv", "--version"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        missing = f"uv is not installed ({exc}): it comes with the dev extra, pip install -e '.[dev]'"
    missing = missing or _registry_reachable()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, so this must run: {missing}")
        pytest.skip(missing)


def _compile(platform: str, extras: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", *[a for e in extras for a in ("--extra", e)],
           "--python-platform", platform, "--python-version", PYTHON, "--only-binary", ":all:",
           "--no-header", "--no-annotate", "--quiet"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _resolved(proc) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)$", proc.stdout, re.M))


def test_make_lab_installs_the_cpu_and_lab_extras():
    assert _lab_extras() == ["cpu", "lab"]


@pytest.mark.parametrize("platform", EXPECTED)
def test_the_learners_install_resolves_with_the_right_tensorflow(registry, platform):
    proc = _compile(platform, _lab_extras())
    assert proc.returncode == 0, f"{platform}: make lab's install does not resolve:\n{proc.stderr[-3000:]}"
    got = _resolved(proc)
    wanted = EXPECTED[platform]
    other = {"tensorflow", "tensorflow-cpu"} - {wanted}
    assert wanted in got and not other & set(got), f"{platform}: expected {wanted}, got {sorted(got)}"
    assert got[wanted].startswith("2.21."), got[wanted]
    assert {"jupyterlab", "keras", "tensorboard", "ipywidgets"} <= set(got), sorted(got)


def test_an_intel_mac_has_no_tensorflow_and_the_resolver_names_it(registry):
    """TensorFlow stopped building for macOS x86_64 after 2.16: the README sends Intel Macs to Colab or Kaggle."""
    proc = _compile("x86_64-apple-darwin", _lab_extras())
    said = " ".join(proc.stderr.split())  # uv wraps its message at the terminal's width
    assert proc.returncode != 0
    assert re.search(r"Because tensorflow\b.*==2\.21\.0 has no wheels with a matching platform tag", said), said
    assert "macosx_12_0_arm64" in said, "uv lists the platforms TensorFlow has wheels for"
