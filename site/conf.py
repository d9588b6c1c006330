"""Sphinx configuration of the course website (built by `make site`, i.e. site/build.py).

Sources are staged by build.py; nothing here executes a notebook. Everything a page loads is
served from the site itself: no CDN at build time or in the browser.
"""

from __future__ import annotations

import importlib.util
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
}


# ----------------------------------------------------------------------------- launch buttons

def _source_path(app, pagename: str) -> str | None:
    """Repository path of a notebook page ('notebooks/01_x.ipynb'), or None for other pages."""
    folder = pagename.split("/")[0]
    if folder in ("notebooks", "labs") and str(app.env.doc2path(pagename)).endswith(".ipynb"):
        return f"{pagename}.ipynb"
    return None


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
