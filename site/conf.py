"""Sphinx configuration of the course website (built by `make site`, i.e. site/build.py).

Sources are staged by build.py; nothing here executes a notebook. Everything a page loads is
served from the site itself: no CDN at build time or in the browser.

One configuration for both languages: build.py passes ``-D language=zh_CN`` (and the title) for the
Chinese site and writes, beside the staged sources, the language switch of every page and the
repository folder of the notebooks (``_gpucourse_site.json``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _colab():
    """gpucourse.colab: the installed package if any, else the checkout's utils/colab.py."""
    try:
        from gpucourse import colab
    except ImportError:
        spec = importlib.util.spec_from_file_location("gpucourse_colab", ROOT / "utils" / "colab.py")
        colab = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(colab)
    return colab


colab = _colab()

project = "TensorFlow GPU acceleration"
author = "the course authors"
copyright = "the course authors, Apache-2.0"
html_title = "TensorFlow GPU acceleration"

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# ----------------------------------------------------------------------------- notebooks (MyST-NB)
nb_execution_mode = "off"          # stored outputs only: the site never runs a notebook
nb_ipywidgets_js = {}              # no widget JavaScript from a CDN: build.py made widget outputs static
nb_merge_streams = True
nb_output_stderr = "remove"        # TensorFlow's C++ log lines are not course content
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type"]

# ----------------------------------------------------------------------------- HTML
html_theme = "sphinx_book_theme"
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course-search.js"]   # search excerpts from the article, not the page's header buttons
html_context = {"default_mode": "auto"}  # the theme's light/dark mode (unset: "Got invalid theme mode")
html_math_renderer = "mathml"      # see setup(): MathML at build time, no MathJax download
html_copy_source = True
html_show_sphinx = False
html_theme_options = {
    "repository_url": f"https://github.com/{colab.REPO}",
    "repository_branch": colab.BRANCH,
    "use_repository_button": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
    # one search box (the sidebar's): the header would repeat it
    "navbar_persistent": [],
    # the language switch beside the header buttons, on every page (templates/language-switch.html)
    "article_header_end": ["language-switch.html", "article-header-buttons.html"],
}


# ----------------------------------------------------------------------------- launch buttons

def _site_settings(app) -> dict:
    """What build.py wrote for this site (the language switch, the notebooks' repository folder)."""
    path = Path(app.srcdir) / "_gpucourse_site.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _source_path(app, pagename: str) -> str | None:
    """Repository path of a notebook page ('notebooks/01_x.ipynb', 'notebooks/zh-CN/01_x.ipynb' on the
    Chinese site), or None for other pages."""
    folder, _, name = pagename.partition("/")
    if folder in ("notebooks", "labs") and str(app.env.doc2path(pagename)).endswith(".ipynb"):
        sub = _site_settings(app).get("repo_folder", "")
        return f"{folder}/{sub}/{name}.ipynb" if sub else f"{pagename}.ipynb"
    return None


def add_language_switch(app, pagename, templatename, context, doctree):
    """The links of templates/language-switch.html: this page in the other language (build.py's list)."""
    context["gpucourse_switch"] = _site_settings(app).get("switch", {}).get(pagename, [])


def _cut_chinese_without_jieba(sentence: str, HMM: bool = True):
    """Sphinx's Chinese search splits text into words with jieba; without it, Sphinx 9 indexes no Chinese
    at all. This stand-in indexes every two-character run (most Chinese words are two characters), so a
    search for a two-character word such as 显存 still finds its pages; longer words need jieba."""
    for run in re.findall(r"[\u3400-\u9fff]+", sentence):
        yield from (run[i:i + 2] for i in range(len(run) - 1))


def _fix_chinese_stemmer_name():
    """Sphinx 9.0 writes ``window.Stemmer = ChineseStemmer;`` into the Chinese site's language_data.js,
    but the Chinese search uses the English stemmer, whose class is ``EnglishStemmer``: every search
    stops with "ChineseStemmer is not defined" (sphinx-doc/sphinx#14229, fixed upstream by deriving the
    name from the stemmer file, PR #14416). Name the class that is there, only while Sphinx has the bug."""
    import inspect

    import sphinx.search
    import sphinx.search.zh

    chinese = sphinx.search.zh.SearchChinese
    buggy = "language_name}Stemmer" in inspect.getsource(sphinx.search.IndexBuilder.get_js_stemmer_code)
    if buggy and chinese.js_stemmer_rawcode == "english-stemmer.js" and chinese.language_name != "English":
        chinese.language_name = "English"


def use_chinese_search(app, config):
    """jieba for the Chinese site's search index if it is installed (the site extra), else the stand-in;
    and the working stemmer name (:func:`_fix_chinese_stemmer_name`)."""
    if not str(config.language or "").startswith("zh"):
        return
    _fix_chinese_stemmer_name()
    try:
        import jieba  # noqa: F401
    except ImportError:
        import sphinx.search.zh

        sphinx.search.zh.cut_for_search = _cut_chinese_without_jieba


def add_launch_buttons(app, pagename, templatename, context, doctree):
    """A rocket menu in the page header with 'Colab' and 'Kaggle', from gpucourse.colab's URLs."""
    path = _source_path(app, pagename)
    if path is None or "header_buttons" not in context:
        return
    context["launch_colab"], context["launch_kaggle"] = colab.colab_url(path), colab.kaggle_url(path)
    context["header_buttons"].append({
        "type": "group", "tooltip": "Run this notebook", "icon": "fas fa-rocket", "label": "launch-buttons",
        "buttons": [
            {"type": "link", "text": "Colab", "tooltip": "Open in Colab", "url": colab.colab_url(path),
             "icon": "_static/images/logo_colab.png", "label": "launch-colab"},
            {"type": "link", "text": "Kaggle", "tooltip": "Open in Kaggle", "url": colab.kaggle_url(path),
             "icon": "fab fa-kaggle", "label": "launch-kaggle"},
        ],
    })


# ----------------------------------------------------------------------------- math as MathML

def _mathml(latex: str, display: str) -> str:
    from latex2mathml.converter import convert

    return convert(latex, display=display)


def _visit_inline(self, node):
    self.body.append(f'<span class="math">{_mathml(node.astext(), "inline")}</span>')
    from docutils import nodes

    raise nodes.SkipNode


def _visit_block(self, node):
    from docutils import nodes

    self.body.append(f'<div class="math">{_mathml(node.astext(), "block")}</div>')
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (_visit_inline, None), (_visit_block, None))
    # after the book theme (priority 500) has created header_buttons
    app.connect("html-page-context", add_launch_buttons, priority=900)
    app.connect("html-page-context", add_language_switch)
    app.connect("config-inited", use_chinese_search)
