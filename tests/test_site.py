"""The course website (site/build.py, `make site`): built from stored outputs, offline, links that resolve.

* Unit tests of the staging step (call-outs, widget pictures, badges, the home page), no Sphinx.
* One build of the whole site into a temporary folder (~10 s), then checks on the HTML: every
  tutorial and lab has a page and no solution has one; launch buttons are gpucourse.colab's URLs; no
  page loads anything from another site; every internal link and anchor resolves; plots, code and
  call-outs are there; the search index knows the course's words.
* The browser test opens the home page and one tutorial from a loopback server, with every request
  that leaves loopback blocked and recorded, and uses the search page.
* The Chinese site (``zh-CN/`` inside the English one, same build): a page for every built edition and
  none for a topic without one (the English page is linked instead), a language switch on every page
  of both sites that resolves to the same page in the other language, Chinese words in its search
  index, and in a browser the switch and a Chinese search.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import html.parser
import http.server
import importlib.util
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from gpucourse import colab

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
TUTORIALS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
ZH_EDITIONS = sorted((ROOT / "notebooks" / "zh-CN").glob("[0-9][0-9]_*.ipynb")) + \
    sorted((ROOT / "labs" / "zh-CN").glob("[0-9][0-9]_*.ipynb"))


def _load_builder():
    spec = importlib.util.spec_from_file_location("course_site_build", ROOT / "site" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


site = _load_builder()


# --------------------------------------------------------------------------------- staging (no Sphinx)

def test_callouts_become_admonitions_and_other_quotes_stay():
    md = ("Intro.\n\n> **Snippets in circulation that are wrong.**\n> `a()` is gone.\n> Use `b()`.\n\n"
          "> **Leave headroom.** Keep 10% free.\n\n> a plain quote\n\n```\n> **not a call-out** in code\n```")
    out = site.convert_callouts(md)
    assert ":::{admonition} Snippets in circulation that are wrong\n:class: warning\n\n`a()` is gone.\nUse `b()`.\n:::" \
        in out
    assert ":::{admonition} Leave headroom\n:class: note\n\nKeep 10% free.\n:::" in out
    assert "> a plain quote" in out and "> **not a call-out** in code" in out


def test_inline_title_callout():
    out = site.convert_callouts("> **Outdated:** `t.cpu()` is deprecated;\n> use `tf.identity`.")
    assert out.startswith(":::{admonition} Outdated\n:class: warning\n\n`t.cpu()` is deprecated;\nuse `tf.identity`.")


def _explorer_state():
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    model = lambda name, **state: {"model_name": name, "state": state}  # noqa: E731
    return {
        "root": model("VBoxModel", _dom_classes=["gpucourse-explorer"],
                      children=["IPY_MODEL_status", "IPY_MODEL_row", "IPY_MODEL_out", "IPY_MODEL_gone"]),
        "status": model("HTMLModel", _dom_classes=["gpucourse-explorer-status"],
                        value="<b>Pipeline</b> (update 1): ratio 1.20x"),
        "row": model("VBoxModel", children=["IPY_MODEL_s", "IPY_MODEL_c", "IPY_MODEL_d", "IPY_MODEL_b"]),
        "s": model("IntSliderModel", description="batch", value=64, min=8, max=256),
        "c": model("CheckboxModel", description="prefetch", value=True),
        "d": model("DropdownModel", description="policy", _options_labels=["float32", "mixed_float16"], index=1),
        "b": model("ButtonModel", description="Run"),
        "out": model("OutputModel", outputs=[{"output_type": "stream", "name": "stdout", "text": "ratio <1.2x>\n"},
                                             {"output_type": "display_data", "data": {"image/png": png}}]),
    }


def test_widget_picture_shows_controls_status_and_output():
    page = site.render_widget(_explorer_state(), "root")
    assert 'class="gpucourse-static-widget gpucourse-explorer gpucourse-static-column"' in page
    assert "<b>Pipeline</b> (update 1): ratio 1.20x" in page
    assert "batch</span> <b>64</b> (range 8 to 256)" in page
    assert "☑ prefetch" in page and "<b>mixed_float16</b>" in page
    assert "<button type=\"button\" disabled>Run</button>" in page
    assert "<pre>ratio &lt;1.2x&gt;\n</pre>" in page and 'src="data:image/png;base64,' in page
    assert site.render_widget(_explorer_state(), "missing") == ""


def test_widget_outputs_become_static_and_the_state_is_dropped():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("explorer.show()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        site.WIDGET_VIEW: {"model_id": "root", "version_major": 2, "version_minor": 0},
        "text/plain": "VBox(children=(HTML(value='...'),))"})]
    orphan = nbformat.v4.new_code_cell("w")
    orphan.outputs = [nbformat.v4.new_output("display_data", data={
        site.WIDGET_VIEW: {"model_id": "lost"}, "text/plain": "IntSlider(value=3)"})]
    nb.cells = [cell, orphan]
    nb.metadata["widgets"] = {site.WIDGET_STATE: {"state": _explorer_state(), "version_major": 2}}
    assert site.render_widget_outputs(nb) == 2
    assert "widgets" not in nb.metadata
    first, second = (c.outputs[0]["data"] for c in nb.cells)
    assert site.WIDGET_VIEW not in first and "gpucourse-explorer" in first["text/html"]
    assert "IntSlider(value=3)" in second["text/html"], "without stored state the text repr is shown"
    assert all(site.NOTE in d["text/html"] for d in (first, second))


def test_home_page_keeps_notebook_links_and_points_files_at_the_repository():
    readme = ("# Course\n\nIntro [env](environment.yml) and [t](notebooks/01_device_detection.ipynb) "
              "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://x)\n\n"
              "## Start\n\nrun it\n\n## Repository layout\n\nnot for the site\n")
    page = site.home_page(readme, "owner/repo", "main")
    assert "[env](https://github.com/owner/repo/blob/main/environment.yml)" in page
    assert "[t](notebooks/01_device_detection.ipynb)" in page
    assert "](_badges/colab-badge.svg)" in page and "colab.research.google.com/assets" not in page
    assert "## Start" in page and "Repository layout" not in page
    assert ":caption: Tutorials" in page and ":caption: Labs" in page
    for nb in TUTORIALS:
        assert f"notebooks/{nb.stem}\n" in page or f"notebooks/{nb.stem}:::" in page
    assert "solutions/" not in page


def test_the_switch_links_the_same_page_in_the_other_language_or_its_home_page():
    pages = {"en": ["index", "search", "genindex", "notebooks/01_a", "notebooks/02_b", "labs/01_a"],
             "zh-CN": ["index", "search", "genindex", "notebooks/01_a", "labs/01_a"]}
    assert site.switch_links("notebooks/01_a", "en", pages) == [
        {"url": "../zh-CN/notebooks/01_a.html", "label": "简体中文", "hreflang": "zh-CN", "same_page": True}]
    assert site.switch_links("notebooks/02_b", "en", pages)[0]["url"] == "../zh-CN/index.html"
    assert site.switch_links("index", "en", pages)[0]["url"] == "zh-CN/index.html"
    assert site.switch_links("labs/01_a", "zh-CN", pages) == [
        {"url": "../../labs/01_a.html", "label": "English", "hreflang": "en", "same_page": True}]
    assert site.switch_links("search", "zh-CN", pages)[0]["url"] == "../search.html"


def test_an_edition_links_editions_on_its_site_and_english_notebooks_on_the_english_site():
    editions = {"notebooks/01_device_detection", "labs/01_device_detection"}
    md = ("See [06](../06_xla.ipynb#fusion), [01](01_device_detection.ipynb), the lab "
          "`labs/zh-CN/01_device_detection.ipynb`, its English `labs/01_device_detection.ipynb` and "
          "[site](https://example.org/x.ipynb).")
    out = site.link_edition(md, "zh-CN", "notebooks", editions)
    assert '<a href="../../notebooks/06_xla.html#fusion">06</a>' in out
    assert "[01](../notebooks/01_device_detection.ipynb)" in out
    assert "[`labs/zh-CN/01_device_detection.ipynb`](../labs/01_device_detection.ipynb)" in out
    assert '<a href="../../labs/01_device_detection.html"><code>labs/01_device_detection.ipynb</code></a>' in out
    assert "[site](https://example.org/x.ipynb)" in out
    home = site.link_edition("[t](notebooks/zh-CN/01_device_detection.ipynb) [e](notebooks/03_memory.ipynb)",
                             "zh-CN", "", editions)
    assert "[t](notebooks/01_device_detection.ipynb)" in home and '<a href="../notebooks/03_memory.html">e</a>' in home


def test_the_chinese_home_page_is_the_chinese_readme_with_its_editions_as_navigation():
    readme = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    page = site.home_page(readme, "owner/repo", "main", "zh-CN")
    assert ":caption: 教程" in page and ":caption: 实验" in page
    for nb in ZH_EDITIONS:
        assert f"{nb.parent.parent.name}/{nb.stem}\n" in page, f"{nb} is not in the Chinese navigation"
    assert '<a href="../index.html">English</a>' in page, "the link to README.md is not the English home page"
    with pytest.raises(ValueError, match="lang must be one of"):
        site.notebooks("fr")


def test_without_jieba_the_chinese_index_still_gets_two_character_words():
    spec = importlib.util.spec_from_file_location("course_site_conf", ROOT / "site" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    words = list(conf._cut_chinese_without_jieba("受显存带宽限制的算子 (memory-bound)"))
    assert "显存" in words and "算子" in words and "memory" not in words, words


# ------------------------------------------------------------------------------------ the built site

class _Page(html.parser.HTMLParser):
    """Links, loaded resources and element ids of one HTML page."""

    LOADS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "audio": "src", "video": "src",
             "embed": "src", "object": "data"}

    def __init__(self):
        super().__init__()
        self.links, self.loads, self.ids = [], [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower()
            (self.loads if any(r in rel for r in ("stylesheet", "icon", "preload", "modulepreload", "manifest"))
             else self.links).append(a["href"])
        if tag in self.LOADS and a.get(self.LOADS[tag]):
            self.loads.append(a[self.LOADS[tag]])


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def _pages(built: Path) -> list[Path]:
    """The site's HTML pages (the theme also copies Jinja macro files ending in .html into _static/)."""
    return sorted(p for p in built.rglob("*.html") if "_static" not in p.relative_to(built).parts)


def test_notebooks_named_in_code_font_become_links():
    text = "Revisit `notebooks/03_memory.ipynb` for the background; [`labs/03_memory.ipynb`](x) stays."
    out = site.link_notebook_paths(text, 1)
    assert "[`notebooks/03_memory.ipynb`](../notebooks/03_memory.ipynb)" in out
    assert out.count("](") == 2, out  # the existing link is not linked twice


def test_plots_get_alt_text_that_says_what_they_show():
    code = 'ax.set_title(f"Peak memory of one step on {DEVICE}")\nplt.show()'
    assert site.figure_alt(code, "6. The peak memory of a `training` step") == \
        "Plot: Peak memory of one step on … (section “6. The peak memory of a training step”)"
    assert site.figure_alt("plt.plot(x)", "3. Prefetch") == "Plot (section “3. Prefetch”)"


def _external(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url.strip(), re.I))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "html"
    index = site.build(out)
    assert index.is_file()
    return out


def test_every_tutorial_and_lab_has_a_page_and_no_solution_does(built):
    for nb in TUTORIALS + LABS:
        assert (built / nb.parent.name / f"{nb.stem}.html").is_file(), f"no page for {nb.parent.name}/{nb.name}"
    assert not (built / "solutions").exists() and not list(built.rglob("*solution*.html"))


def test_launch_buttons_open_the_notebook_in_colab_and_kaggle(built):
    for nb in TUTORIALS + LABS:
        rel = f"{nb.parent.name}/{nb.name}"
        text = (built / nb.parent.name / f"{nb.stem}.html").read_text(encoding="utf-8")
        for url in (colab.colab_url(rel), colab.kaggle_url(rel)):
            assert f'href="{url}"' in text, f"{rel}: no launch link {url}"
        assert "launch-buttons" in text, f"{rel}: no launch menu in the header"


def test_download_button_gives_the_notebook_itself(built):
    for nb in TUTORIALS + LABS:
        rel = f"{nb.parent.name}/{nb.name}"
        page = (built / nb.parent.name / f"{nb.stem}.html").read_text(encoding="utf-8")
        assert f'href="../_sources/{rel}"' in page, f"{rel}: no download link"
        assert (built / "_sources" / rel).read_bytes() == nb.read_bytes(), f"{rel}: the download is not the notebook"


def test_pages_load_nothing_from_another_site(built):
    pages = _pages(built)
    assert len(pages) >= len(TUTORIALS) + len(LABS) + 1
    for page in pages:
        remote = [u for u in _parse(page).loads if _external(u)]
        assert not remote, f"{page.relative_to(built)} loads {remote}"
    for css in built.rglob("*.css"):
        urls = re.findall(r"url\(\s*['\"]?([^'\")]+)|@import\s+['\"]([^'\"]+)", css.read_text(errors="replace"))
        remote = [u for pair in urls for u in pair if u and _external(u)]
        assert not remote, f"{css.relative_to(built)} loads {remote}"
    for js in built.rglob("*.js"):
        text = js.read_text(errors="replace")
        assert "cdn.jsdelivr.net" not in text and "unpkg.com" not in text and "cdnjs.cloudflare.com" not in text, \
            f"{js.relative_to(built)} refers to a CDN"


def test_internal_links_and_anchors_resolve(built):
    parsed = {p: _parse(p) for p in _pages(built)}
    broken = []
    for page, info in parsed.items():
        for href in info.links + info.loads:
            if _external(href) or href.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urlsplit(href)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if parts.path and not target.exists():
                broken.append(f"{page.relative_to(built)} -> {href}")
            elif parts.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page.relative_to(built)} -> {href} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:30])


def _callouts(markdown: str) -> int:
    """Blockquotes that open with a bold title."""
    lines = [""] + markdown.split("\n")
    return sum(1 for prev, line in zip(lines, lines[1:]) if line.startswith("> **") and not prev.startswith(">"))


def test_plots_code_callouts_and_widgets_render(built):
    for nb in TUTORIALS:
        text = (built / "notebooks" / f"{nb.stem}.html").read_text(encoding="utf-8")
        stored = nbformat.read(nb, as_version=4)
        plots = sum("image/png" in o.get("data", {}) for c in stored.cells for o in c.get("outputs", []))
        widgets = sum(site.WIDGET_VIEW in o.get("data", {}) for c in stored.cells for o in c.get("outputs", []))
        callouts = sum(_callouts(c.source) for c in stored.cells if c.cell_type == "markdown")
        code = sum(1 for c in stored.cells if c.cell_type == "code")
        shown = len(re.findall(r'<img[^>]+src="\.\./_images/[0-9a-f]+\.png"', text))
        assert shown >= plots, f"{nb.name}: {plots} stored plots, {shown} on the page"
        assert text.count('class="cell docutils container"') >= code, f"{nb.name}: code cells are missing"
        assert text.count('class="admonition') >= callouts, f"{nb.name}: {callouts} call-outs, fewer admonitions"
        assert text.count("gpucourse-static\"") >= widgets, f"{nb.name}: widget outputs were not made static"
        assert "widget-view+json" not in text and not re.search(r"(VBox|HBox)\(children=", text), nb.name
        assert "NBVAL_" not in text, f"{nb.name}: test markers leak into the page"
        assert "Traceback (most recent call last)" not in text, nb.name


def test_search_index_knows_the_course(built):
    index = (built / "searchindex.js").read_text(encoding="utf-8").lower()
    for word in ("mirroredstrategi", "xla", "prefetch", "profil"):
        assert word in index, f"search would not find {word!r}"


def _switch(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return re.findall(r'<a class="btn btn-sm gpucourse-language-switch" href="([^"]+)"', text)


def test_the_chinese_site_has_every_edition_and_links_english_pages_for_the_rest(built):
    zh = built / "zh-CN"
    assert (zh / "index.html").is_file() and (zh / "search.html").is_file()
    for nb in ZH_EDITIONS:
        folder = nb.parent.parent.name
        page = zh / folder / f"{nb.stem}.html"
        assert page.is_file(), f"no zh page for {folder}/zh-CN/{nb.name}"
        text = page.read_text(encoding="utf-8")
        rel = f"{folder}/zh-CN/{nb.name}"
        assert f'href="{colab.colab_url(rel)}"' in text, f"{rel}: the launch button does not open the edition"
        assert (zh / "_sources" / folder / nb.name).read_bytes() == nb.read_bytes(), f"{rel}: download"
    editions = {(nb.parent.parent.name, nb.stem) for nb in ZH_EDITIONS}
    home = (zh / "index.html").read_text(encoding="utf-8")
    assert '<html lang="zh-CN"' in home
    for nb in TUTORIALS + LABS:
        if (nb.parent.name, nb.stem) not in editions:
            assert not (zh / nb.parent.name / f"{nb.stem}.html").exists(), f"{nb.name} was copied into the zh site"
            assert f'href="../{nb.parent.name}/{nb.stem}.html"' in home, f"the zh home page does not link {nb.name}"


def test_every_page_of_both_sites_has_a_language_switch_that_resolves(built):
    zh = built / "zh-CN"
    zh_pages = {p.relative_to(zh) for p in _pages(zh)}
    for page in _pages(built):
        links = _switch(page)
        assert len(links) == 1, f"{page.relative_to(built)}: {len(links)} language switches"
        target = (page.parent / links[0]).resolve()
        assert target.is_file(), f"{page.relative_to(built)}: the switch {links[0]} leads nowhere"
        in_zh = zh in page.parents
        assert (zh in target.parents) != in_zh, f"{page.relative_to(built)}: the switch stays in its language"
        rel = page.relative_to(zh if in_zh else built)
        same = (built / rel) if in_zh else (zh / rel)
        if in_zh or rel in zh_pages:
            assert target == same.resolve(), f"{page.relative_to(built)}: the switch leads to {links[0]}, not {rel}"
        else:
            assert target == (zh / "index.html").resolve(), f"{rel} has no edition: the switch goes to the zh home"


def test_the_chinese_search_index_has_chinese_words(built):
    import json

    text = (built / "zh-CN" / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    words = ["设备", "显存", "算子"]
    if (ROOT / "notebooks" / "zh-CN" / "09_roofline_mfu.ipynb").exists():
        words += ["屋顶", "算术", "强度"]
    missing = [w for w in words if w not in index["terms"]]
    assert not missing, f"the zh search would not find {missing}"
    english = (built / "searchindex.js").read_text(encoding="utf-8")
    assert "\\u663e\\u5b58" not in english and "显存" not in english, "Chinese pages leaked into the English index"


# ----------------------------------------------------------------------------------------- browser

@pytest.fixture(scope="module")
def served(built):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(built)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _check_layout_at_1400_px(page, served):
    """What a reader sees at 1400 px: no code or output block cut off, centred formulas, meaningful alt texts,
    one search box, and lab pages that link their tutorial."""
    page.set_viewport_size({"width": 1400, "height": 900})
    for rel in ["index.html"] + [f"{nb.parent.name}/{nb.stem}.html" for nb in TUTORIALS + LABS]:
        page.goto(f"{served}/{rel}")
        facts = page.evaluate("""() => ({
            cut: [...document.querySelectorAll('article pre')].filter(e => e.scrollWidth > e.clientWidth + 1)
                   .map(e => e.textContent.slice(0, 60)),
            alts: [...document.querySelectorAll('article img')].map(i => i.getAttribute('alt') || ''),
            formulas: [...document.querySelectorAll('div.math')].map(d => {
                const box = d.getBoundingClientRect(), f = d.firstElementChild.getBoundingClientRect();
                return [f.left - box.left, box.right - f.right]; }),
            searches: [...document.querySelectorAll('.search-button-field, .search-button')]
                   .filter(e => e.offsetParent !== null).length })""")
        assert not facts["cut"], f"{rel}: {len(facts['cut'])} blocks cut off at 1400 px, e.g. {facts['cut'][:2]}"
        bad = [a for a in facts["alts"] if not a or re.search(r"\.(png|svg|jpe?g)$|_images/|^[0-9a-f]{16,}", a)]
        assert not bad, f"{rel}: images whose alt text is a file path or empty: {bad}"
        for left, right in facts["formulas"]:
            assert abs(left - right) < 4, f"{rel}: a display formula is not centred ({left:.0f} px vs {right:.0f} px)"
        assert facts["searches"] == 1, f"{rel}: {facts['searches']} search boxes"
        if rel.startswith("labs/"):
            tutorial = f"notebooks/{Path(rel).stem}.html"
            assert page.locator(f"article a[href$='{tutorial}']").count() >= 1, f"{rel} does not link {tutorial}"
    assert (ROOT / "notebooks" / "07_tf_data.ipynb").exists()


@contextlib.contextmanager
def site_page():
    """A headless Chromium page for the site (it may reach 127.0.0.1 only), and what it saw: ``page``, the
    requests it ``blocked``, its JavaScript ``errors`` and its ``console`` messages."""
    from types import SimpleNamespace

    from tests.browser_tools import CHROMIUM_ARGS, chromium, loopback_only, sync_playwright

    browser_path = chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            seen = SimpleNamespace(page=page, blocked=[], errors=[], console=[])
            loopback_only(page, seen.blocked)
            page.on("pageerror", lambda e: seen.errors.append(str(e)))
            page.on("console", lambda m: seen.console.append(f"{m.type}: {m.text}"))
            yield seen
        finally:
            browser.close()


@pytest.mark.browser
def test_home_page_and_a_tutorial_in_a_browser(served):
    tutorial = next((nb for nb in TUTORIALS if "profiling" in nb.stem), TUTORIALS[-1])
    with site_page() as seen:
        page, console, blocked, errors = seen.page, seen.console, seen.blocked, seen.errors

        page.goto(f"{served}/index.html")
        nav = page.locator("nav.bd-links a.reference.internal")
        titles = nav.all_inner_texts()
        for nb in TUTORIALS:
            assert any(t.strip().startswith(nb.stem[:2]) for t in titles), f"{nb.stem} is not in the navigation"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "site-home.png"))

        page.locator("nav.bd-links a", has_text=tutorial.stem[:2]).first.click()  # the syllabus navigation
        page.wait_for_url(f"**/notebooks/{tutorial.stem}.html")
        images = page.evaluate("() => [...document.querySelectorAll('article img')]"
                               ".map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])")
        plots = [ok for src, ok in images if "_images/" in src and src.endswith(".png")]
        assert plots and all(plots), f"plots missing or not loaded: {images}"
        assert page.locator("article div.highlight pre").first.is_visible(), "code is not shown"
        admonition = page.locator("article .admonition").first
        assert admonition.is_visible() and admonition.locator(".admonition-title").inner_text().strip()
        launch = page.locator(".dropdown-launch-buttons a, a[href^='https://colab.research.google.com/github/']")
        assert launch.count() >= 1
        page.locator(".gpucourse-static, .admonition").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "site-tutorial.png"))
        _check_layout_at_1400_px(page, served)

        page.goto(f"{served}/search.html?q=MirroredStrategy")
        page.wait_for_selector("#search-results ul li p.context", timeout=30_000)
        hits = page.locator("#search-results ul li a").all_inner_texts()
        assert any("Distribution" in h or "04" in h for h in hits), f"search results: {hits}"
        excerpt = page.locator("#search-results ul li p.context").first.inner_text()
        assert "mirroredstrategy" in excerpt.lower() and "Light" not in excerpt and ".ipynb" not in excerpt[:12], \
            f"the excerpt is not the article's text: {excerpt[:120]!r}"
        assert not [m for m in console if "invalid theme mode" in m], console
        assert not blocked, f"a page tried to load from another site: {blocked}"
        assert not errors, f"JavaScript errors: {errors}"


@pytest.mark.browser
def test_the_language_switch_and_a_chinese_search_in_a_browser(served):
    from tests.browser_tools import drawn_in_cjk, rendered_fonts

    edition = next(nb for nb in ZH_EDITIONS if nb.parent.parent.name == "notebooks")
    with site_page() as seen:
        page, blocked, errors = seen.page, seen.blocked, seen.errors
        page.goto(f"{served}/notebooks/{edition.stem}.html")
        switch = page.locator("a.gpucourse-language-switch")
        assert switch.is_visible() and "简体中文" in switch.inner_text()
        switch.click()
        page.wait_for_url(f"**/zh-CN/notebooks/{edition.stem}.html")
        assert page.evaluate("document.documentElement.lang") == "zh-CN"
        title = page.locator("article h1").first
        assert re.search(r"[\u4e00-\u9fff]", title.inner_text())
        fonts = rendered_fonts(page, title)
        assert drawn_in_cjk(fonts), \
            f"the zh page's Chinese title was not drawn with a CJK font (install fonts-noto-cjk): {fonts}"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "site-zh-tutorial.png"))
        page.locator("a.gpucourse-language-switch").click()
        page.wait_for_url(f"**/notebooks/{edition.stem}.html")
        assert "/zh-CN/" not in page.url

        page.goto(f"{served}/zh-CN/search.html?q=显存")
        page.wait_for_selector("#search-results ul li p.context", timeout=30_000)
        hits = page.locator("#search-results ul li a").all_inner_texts()
        assert hits, "the zh search found nothing for 显存"
        assert "显存" in page.locator("#search-results").inner_text()
        assert not blocked, f"a page tried to load from another site: {blocked}"
        assert not errors, f"JavaScript errors: {errors}"
