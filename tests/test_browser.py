"""Real browser: JupyterLab on loopback, a lab notebook run top to bottom in headless Chromium.

Checks what a learner would see: no tracebacks, widgets rendered as widgets (not their text repr),
plots shown, and a widget that reacts when clicked. A screenshot is kept in test-artifacts/.

Needs Debian's chromium (installed by `make test` / `.ci/run` when missing) and Playwright for Python,
driven with `executable_path`, so no browser is ever downloaded. Without chromium the test skips,
except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
LAB = ROOT / "labs" / "08_profiling_capstone.ipynb"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"]
RUN_ALL_TIMEOUT_S = 240

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _need(what: str, why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI: {why}")
    pytest.skip(f"{what} not available: {why}")


#: Chromium-family browsers Playwright can drive through executable_path (no browser download):
#: Debian's chromium here, Google Chrome on GitHub's hosted Ubuntu runners. $CHROMIUM overrides.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    override = os.environ.get("CHROMIUM")
    if override:
        if not (shutil.which(override) or os.path.isfile(override)):
            pytest.fail(f"CHROMIUM={override!r} is not an executable")
        return shutil.which(override) or override
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    _need("chromium", "install Debian's package: apt-get install chromium (make test does this as root)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 serving ``root``, with its own settings and a random token."""

    def __init__(self, root: Path, home: Path):
        self.port, self.token = _free_port(), secrets.token_hex(16)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
               "JUPYTER_CONFIG_DIR": str(home / "config")}
        env.pop("PYTEST_CURRENT_TEST", None)
        env.pop("MPLBACKEND", None)  # the kernel must use the inline backend, as for a learner
        self.log = open(home / "jupyterlab.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}", "--allow-root",
             "--ServerApp.disable_check_xsrf=True"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}&reset"

    def _wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status?token={self.token}",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer on port {self.port} within {timeout:.0f} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_notebook_in_browser(notebook: Path, work: Path, screenshot: Path, done_text: str = "Score:"):
    """Open ``notebook`` (a copy) in JupyterLab, Run All, and return the live Playwright page objects.

    Yields ``page`` to the caller's checks through a generator so the server and browser are always closed.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright", "pip install playwright (the Python package; no browser download is needed)")
    chromium = _chromium()
    served = work / "served"
    served.mkdir()
    shutil.copy(notebook, served / notebook.name)  # autosave must never touch the repository
    lab = JupyterLab(served, work)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(lab.url(f"lab/tree/{notebook.name}"), timeout=90_000)
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
                page.wait_for_function("() => document.body.innerText.includes('| Idle')",
                                       timeout=90_000)  # status bar: the kernel is up
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                page.wait_for_function(
                    "text => [...document.querySelectorAll('.jp-OutputArea-output')]"
                    ".some(e => e.innerText.includes(text))", arg=done_text, timeout=RUN_ALL_TIMEOUT_S * 1000)
                page.wait_for_timeout(1500)  # late display updates (widgets, images)
                news = page.locator(".jp-Notification-Toast button", has_text="No")
                if news.count():
                    news.first.click()  # "get notified about Jupyter news?" toast: keep the screenshot clean
                yield page
            finally:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=False)
                browser.close()
    finally:
        lab.stop()


def test_lab_runs_in_jupyterlab(tmp_path):
    if not LAB.is_file():
        pytest.fail(f"{LAB.relative_to(ROOT)} is missing")
    shot = ARTIFACTS / "browser-lab08.png"
    for page in run_notebook_in_browser(LAB, tmp_path, shot):
        outputs = page.locator(".jp-OutputArea-output")
        texts = outputs.all_inner_texts()
        joined = "\n".join(texts)
        assert "Traceback (most recent call last)" not in joined, "a cell raised an exception:\n" + joined[-3000:]
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
        assert errors.count() == 0, errors.first.inner_text()[:2000]

        # Widgets render as widgets, not as their text repr.
        for repr_text in ("IntSlider(", "VBox(children", "Button(description", "HTML(value"):
            assert repr_text not in joined, f"a widget was shown as text ({repr_text}...): is the widget manager missing?"
        explorer = page.locator(".gpucourse-explorer")
        assert explorer.count() >= 1, "the utilisation explorer widget did not render"
        explorer = explorer.first
        explorer.scroll_into_view_if_needed()
        assert explorer.locator(".widget-slider, .widget-hslider").count() >= 1
        status = explorer.locator(".widget-html", has_text="utilisation:")
        assert status.count() == 1, "the explorer needs exactly one 'utilisation: ...' HTML widget"
        assert "not measured yet" in status.inner_text()

        # Plots appear as images.
        assert page.locator(".jp-OutputArea-output img").count() >= 1, "no plot was rendered"

        # Interacting with the widget changes its output.
        explorer.locator("button", has_text="Measure").click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.gpucourse-explorer .widget-html')]"
            ".some(e => /utilisation: \\d+(\\.\\d+)?%/.test(e.innerText))", timeout=60_000)
        assert "utilisation:" in status.inner_text() and "not measured" not in status.inner_text()
    assert shot.is_file() and shot.stat().st_size > 10_000
