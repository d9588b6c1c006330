"""Driving a real browser for the tests: headless Chromium through Playwright, a JupyterLab server, and what
a learner does in JupyterLab (open a notebook from the file browser, type into a cell, run cells, save).

Used by ``tests/test_browser.py`` (every tutorial live, the Chinese edition) and ``tests/test_site.py``.
Chromium is Debian's (or Google Chrome), driven with ``executable_path``, so no browser is ever
downloaded; pages may reach 127.0.0.1 only (:func:`loopback_only`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

__all__ = ["BROWSERS", "CHROMIUM_ARGS", "CJK_FONT", "JupyterLab", "PROGRESS_JS", "can_run", "chromium",
           "current_tab", "drawn_in_cjk", "free_port", "goto_folder", "loopback_only", "open_document",
           "rendered_fonts", "run_all_cells", "start_cells", "stop", "sync_playwright", "type_into_cell", "wait_http",
           "wait_loaded"]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"]

def _need(what: str, why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI: {why}")
    pytest.skip(f"{what} not available: {why}")


#: Chromium-family browsers Playwright can drive through executable_path (no browser download):
#: Debian's chromium here, Google Chrome on GitHub's hosted Ubuntu runners. $CHROMIUM overrides.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
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


def can_run() -> bool:
    """Whether the browser tests will run rather than skip: a browser and Playwright are here, or CI=true
    (where their absence fails the tests)."""
    import importlib.util

    found = os.environ.get("CHROMIUM") or any(shutil.which(name) for name in BROWSERS)
    return os.environ.get("CI") == "true" or bool(found and importlib.util.find_spec("playwright"))


def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError:
        _need("playwright", "pip install playwright (the Python package; no browser download is needed)")
    return start()


def loopback_only(page, blocked: list) -> None:
    """Let ``page`` reach 127.0.0.1 only; every other request is aborted and appended to ``blocked``."""
    def route(r):
        url = r.request.url
        if url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "about:")):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()
    page.route("**/*", route)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s; log:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 serving ``root``, with its own settings and a random token."""

    SETTINGS = {
        # every cell in the DOM, so every output can be checked without scrolling
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        # no "get notified about Jupyter news?" toast, no update check (it would leave loopback)
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                            "checkForUpdates": False},
    }

    def __init__(self, root: Path, home: Path):
        self.port, self.token = free_port(), secrets.token_hex(16)
        for name, value in self.SETTINGS.items():
            path = home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
               "JUPYTER_CONFIG_DIR": str(home / "config")}
        # the kernels must behave as for a learner on Colab: inline plots, live widgets, and TensorFlow's
        # log level as the setup cell leaves it (1: warnings and errors show), not the test suite's 2
        for name in ("PYTEST_CURRENT_TEST", "MPLBACKEND", "GPUCOURSE_STATIC", "TF_CPP_MIN_LOG_LEVEL"):
            env.pop(name, None)
        self.log_path = home / "jupyterlab.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}", "--allow-root",
             "--ServerApp.disable_check_xsrf=True", "--LabApp.news_url=",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.port}/api/status?token={self.token}", self.proc, self.log_path, 90)

    def url(self, path: str, workspace: str) -> str:
        return f"http://127.0.0.1:{self.port}/lab/workspaces/{workspace}/tree/{path}?token={self.token}&reset"

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


PROGRESS_JS = """(root, [kept, total]) => {
  const cells = [...root.querySelectorAll('.jp-Notebook .jp-Cell')];
  if (cells.length !== total) return 'loading';
  const run = kept.map(i => cells[i]);
  if (run.some(c => c.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')))
    return 'error';
  // textContent, not innerText: polled often over ten notebooks, it must not force a layout each time
  const prompts = run.map(c => (c.querySelector('.jp-InputArea-prompt') || {textContent: ''}).textContent);
  if (prompts.every(p => /\\[\\d+\\]/.test(p))) return 'done';
  return prompts.some(p => p.includes('*')) ? 'running' : 'waiting';
}"""


def goto_folder(page, folder: str) -> None:
    """Show ``folder`` (relative to the server's root) in JupyterLab's file browser as a learner would: the
    home breadcrumb, then a double click on each folder on the way."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    here = "/".join(t.strip() for t in page.locator(".jp-FileBrowser .jp-BreadCrumbs-item").all_inner_texts()
                    if t.strip() and t.strip() != "/")
    if here == folder:
        return
    page.locator(".jp-FileBrowser .jp-BreadCrumbs-home").first.click()
    for part in [p for p in folder.split("/") if p]:
        item = page.locator(".jp-DirListing-item", has=page.locator(".jp-DirListing-itemName", has_text=part))
        crumb = page.locator(".jp-FileBrowser .jp-BreadCrumbs-item", has_text=part).first
        for attempt in range(4):  # a busy page re-renders its listing: the item may detach mid-click
            item.first.wait_for(timeout=60_000)
            try:
                item.first.dblclick(timeout=30_000)
            except PlaywrightTimeoutError:
                if attempt == 3:
                    raise
            try:
                crumb.wait_for(timeout=30_000 if attempt < 3 else 60_000)
                break
            except PlaywrightTimeoutError:
                if attempt == 3:
                    raise


def open_document(page, path: str, tabs: dict):
    """Open ``path`` (relative to the server's root) from the file browser, a double click as a learner does,
    unless it is open; bring its tab to the front and return the locator of its panel. ``tabs`` maps each
    opened path to its tab's id (two folders may hold files of the same name)."""
    if path not in tabs:
        folder, _, name = path.rpartition("/")
        goto_folder(page, folder)
        before = set(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").evaluate_all(
            "tabs => tabs.map(t => t.dataset.id)"))
        page.locator(".jp-DirListing-itemName", has_text=name).first.dblclick()
        page.wait_for_function(
            "before => [...document.querySelectorAll('.lm-DockPanel-tabBar .lm-TabBar-tab')]"
            ".some(t => !before.includes(t.dataset.id))", arg=sorted(before), timeout=120_000)
        tabs[path] = next(i for i in page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").evaluate_all(
            "tabs => tabs.map(t => t.dataset.id)") if i not in before)
    page.locator(f'.lm-DockPanel-tabBar .lm-TabBar-tab[data-id="{tabs[path]}"]').click()
    return page.locator(f'[id="{tabs[path]}"]')


def current_tab(page) -> str:
    """The id of the main area's current tab."""
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").first.get_attribute("data-id")


def wait_loaded(page, root, total: int) -> None:
    """Wait until the notebook ``root`` shows its ``total`` cells and its own kernel is idle."""
    root.wait_for(timeout=120_000)
    page.wait_for_function("([el, n]) => el.querySelectorAll('.jp-Notebook .jp-Cell').length === n",
                           arg=[root.element_handle(), total], timeout=180_000)
    # its own kernel up (the status bar may still show the previous notebook's)
    root.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(timeout=180_000)


def type_into_cell(page, root, index: int, code: str) -> None:
    """Replace the source of cell ``index`` of ``root`` with ``code``, typed into its editor as a learner would
    (the text is inserted as typed, without the editor's auto-indent)."""
    editor = root.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content").first
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(code)
    page.keyboard.press("Escape")  # back to command mode


def run_all_cells(page, root, total: int) -> None:
    """Run every cell of the notebook ``root`` (brought to the front) as a learner does: the Run menu, then
    Run All Cells. One command: clicking into each cell costs the page a layout of the whole notebook per cell
    (about 0.3 s of Chromium's CPU each, 10 s for notebook 06), and the last notebooks start late."""
    wait_loaded(page, root, total)
    root.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})  # this notebook is the current widget
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-content .lm-Menu-item:visible").filter(
        has=page.get_by_text("Run All Cells", exact=True)).first.click()
    page.keyboard.press("Escape")  # the menu closed; command mode


def start_cells(page, root, kept: list[int], total: int) -> None:
    """Queue the cells ``kept`` (indices in nb.cells) of the current notebook ``root``, in order:
    select each one, then Ctrl+Enter."""
    wait_loaded(page, root, total)
    cells = root.locator(".jp-Notebook .jp-Cell")
    for i in kept:
        cell = cells.nth(i)
        cell.locator(".jp-InputPrompt").first.click()  # selects the cell, in command mode
        page.wait_for_function("el => el.classList.contains('jp-mod-active')", arg=cell.element_handle(),
                               timeout=30_000)
        page.keyboard.press("Control+Enter")  # run the selected cell, stay on it
        page.wait_for_function("el => /\\[(\\*|\\d+)\\]/.test(el.querySelector('.jp-InputPrompt').innerText)",
                               arg=cell.element_handle(), timeout=30_000)  # queued or done


#: Font families that hold Chinese glyphs (Debian's fonts-noto-cjk gives "Noto Sans CJK SC"; the others are
#: what other systems fall back to). Text drawn in none of them shows as boxes or in a font without them.
CJK_FONT = re.compile(r"CJK|Source Han|WenQuanYi|Droid Sans Fallback|AR PL|Noto Sans SC|Noto Serif SC|PingFang|"
                      r"Microsoft YaHei|SimSun|SimHei|Hiragino|Heiti", re.I)


def rendered_fonts(page, element) -> dict[str, int]:
    """{font family: glyphs drawn} for the text directly inside ``element`` (a Playwright locator), as
    Chromium itself reports it (DevTools' ``CSS.getPlatformFontsForNode``): the fonts really used, after
    fallback, not the CSS ``font-family`` asked for."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        mark = secrets.token_hex(4)
        element.evaluate("(e, mark) => e.setAttribute('data-font-probe', mark)", mark)
        doc = cdp.send("DOM.getDocument", {"depth": 0})
        node = cdp.send("DOM.querySelector", {"nodeId": doc["root"]["nodeId"],
                                              "selector": f'[data-font-probe="{mark}"]'})
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node["nodeId"]})["fonts"]
        return {f["familyName"]: f["glyphCount"] for f in fonts}
    finally:
        cdp.detach()


def drawn_in_cjk(fonts: dict[str, int]) -> bool:
    """Whether :func:`rendered_fonts`' report has glyphs drawn in a CJK font (:data:`CJK_FONT`)."""
    return any(CJK_FONT.search(family) and glyphs for family, glyphs in fonts.items())
