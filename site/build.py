"""Build the course website from the notebooks' stored outputs (no notebook is executed).

    python site/build.py [OUT]          # default OUT: _build/site  (what `make site` runs)

Two sites, one per language: the English one at ``OUT`` and the Chinese one at ``OUT/zh-CN`` (from
``README.zh-CN.md`` and the built editions in ``notebooks/zh-CN``, ``labs/zh-CN``; a topic without an
edition is linked to its English page, never copied). Every page of both has a language switch: a link
to the same page in the other language, or to that site's home page where the page has no edition.

Two steps:

1. **Stage** the sources in ``_build/site-src``: the README becomes the home page, and every tutorial
   (``notebooks/``) and lab (``labs/``, never ``solutions/``) is copied with three changes that only
   concern the web page:

   * the Colab/Kaggle badge *images* are replaced by local copies (the links stay: they are the
     launch buttons), so a page loads nothing from another site;
   * a blockquote that opens with a bold title (``> **Snippets in circulation that ...**``, the
     notebooks' call-outs) becomes an admonition box;
   * a widget output (an explorer, a monitor) becomes a static HTML picture of its stored state: the
     controls with their values, the status line and the output area as they were when the
     notebook was last run. The live widget needs a kernel: the page says where to get one.

2. **Build** with Sphinx + MyST-NB (``site/conf.py``): execution off, the book theme, the syllabus as
   navigation, client-side search, math rendered to MathML at build time. Warnings are errors, so a
   broken internal link fails the build. The Chinese site is the same configuration with
   ``language = "zh_CN"``: the theme's labels in Chinese, and Sphinx's Chinese search, which splits
   the text into words with ``jieba`` (see ``conf.py`` for what happens without it).
"""

from __future__ import annotations

import base64
import html
import json
import posixpath
import re
import shutil
import sys
import warnings
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
DEFAULT_OUT = ROOT / "_build" / "site"
FOLDERS = ("notebooks", "labs")  # solutions are never published
REPO_URL = "https://github.com/{repo}/blob/{branch}/{path}"

BADGES = {
    "https://colab.research.google.com/assets/colab-badge.svg": "colab-badge.svg",
    "https://kaggle.com/static/images/open-in-kaggle.svg": "kaggle-badge.svg",
}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

#: README sections that are for the repository's developers, not for the site's readers.
README_SKIP = ("Repository layout", "For course authors")

#: Call-outs whose title starts with one of these words are warnings; every other call-out is a note.
WARNING_TITLES = ("snippet", "outdated", "wrong", "do not", "don't", "never", "trap", "beware", "careful",
                  "流传", "过时", "错误", "不要", "切勿", "陷阱", "小心", "当心")

#: The site in each language: Sphinx's language, its home page's source, its folder inside the English
#: site, the label of its switch link, its title and its navigation captions.
LANGUAGES = {
    "en": {"sphinx": "en", "readme": "README.md", "folder": "", "label": "English",
           "title": "TensorFlow GPU acceleration", "captions": ("Tutorials", "Labs")},
    "zh-CN": {"sphinx": "zh_CN", "readme": "README.zh-CN.md", "folder": "zh-CN", "label": "简体中文",
              "title": "TensorFlow GPU 加速", "captions": ("教程", "实验")},
}
#: Pages Sphinx makes in every site.
SPECIAL_PAGES = ("index", "search", "genindex")
#: Where the site's settings for conf.py are written in the staged sources.
SETTINGS_FILE = "_gpucourse_site.json"


# ----------------------------------------------------------------------------------------- call-outs

_CALLOUT = re.compile(r"^\*\*(?P<title>[^*]+?)\*\*(?P<rest>.*)$", re.S)


def _admonition(title: str, body: str) -> str:
    title = title.strip().rstrip(".:").strip()
    kind = "warning" if title.lower().startswith(WARNING_TITLES) else "note"
    body = body.strip()
    return f":::{{admonition}} {title}\n:class: {kind}\n\n{body}\n:::"


def convert_callouts(markdown: str) -> str:
    """Blockquotes that open with ``**Title.**`` (or ``**Title:**``) become MyST admonitions.

    Other blockquotes, and everything inside code fences, are left alone.
    """
    lines = markdown.split("\n")
    out: list[str] = []
    i, fence = 0, None
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        if fence is None and line.startswith(">"):
            block = []
            while i < len(lines) and lines[i].startswith(">"):
                block.append(re.sub(r"^> ?", "", lines[i]))
                i += 1
            text = "\n".join(block)
            m = _CALLOUT.match(text)
            out.append(_admonition(m["title"], m["rest"]) if m else "\n".join("> " + b for b in block))
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def localise_badges(markdown: str, depth: int) -> str:
    """Point the Colab/Kaggle badge images at local copies (the links around them are kept)."""
    prefix = "../" * depth + "_badges/"
    for url, local in BADGES.items():
        markdown = markdown.replace(f"]({url})", f"]({prefix}{local})")
    return markdown


# ------------------------------------------------------------------------------------------ widgets

def _ref(value) -> str | None:
    return value[len("IPY_MODEL_"):] if isinstance(value, str) and value.startswith("IPY_MODEL_") else None


def _render_outputs(outputs: list) -> str:
    parts = []
    for o in outputs or []:
        kind = o.get("output_type")
        if kind == "stream":
            text = o.get("text", "")
            parts.append(f"<pre>{html.escape(''.join(text) if isinstance(text, list) else text)}</pre>")
        elif kind in ("display_data", "execute_result"):
            data = o.get("data", {})
            if "image/png" in data:
                png = data["image/png"]
                png = "".join(png) if isinstance(png, list) else png
                base64.b64decode(png, validate=False)  # a corrupt image fails the build, not the page
                parts.append(f'<img alt="explorer output" src="data:image/png;base64,{png.strip()}">')
            elif "text/html" in data:
                value = data["text/html"]
                parts.append("".join(value) if isinstance(value, list) else value)
            elif "text/plain" in data:
                value = data["text/plain"]
                parts.append(f"<pre>{html.escape(''.join(value) if isinstance(value, list) else value)}</pre>")
        elif kind == "error":
            parts.append(f"<pre>{html.escape(o.get('ename', 'Error'))}: {html.escape(o.get('evalue', ''))}</pre>")
    return "".join(parts)


def render_widget(models: dict, model_id: str, _seen: frozenset = frozenset()) -> str:
    """Static HTML for the stored widget ``model_id`` and its children (unknown models are skipped)."""
    model = models.get(model_id)
    if model is None or model_id in _seen:
        return ""
    seen = _seen | {model_id}
    name = model.get("model_name", "")
    s = model.get("state", {})
    classes = " ".join(["gpucourse-static-widget"] + [html.escape(c) for c in s.get("_dom_classes", [])])
    desc = html.escape(str(s.get("description") or ""))
    label = f'<span class="gpucourse-static-label">{desc}</span> ' if desc else ""
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel"):
        inner = "".join(render_widget(models, r, seen) for r in map(_ref, s.get("children", [])) if r)
        direction = "row" if name == "HBoxModel" else "column"
        return f'<div class="{classes} gpucourse-static-{direction}">{inner}</div>'
    if name == "HTMLModel":
        return f'<div class="{classes}">{label}{s.get("value", "")}</div>'
    if name in ("LabelModel", "TextModel", "TextareaModel"):
        return f'<div class="{classes}">{label}{html.escape(str(s.get("value", "")))}</div>'
    if name in ("IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "IntRangeSliderModel",
                "FloatRangeSliderModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel",
                "BoundedFloatTextModel"):
        lo, hi, value = s.get("min"), s.get("max"), s.get("value")
        span = f" (range {lo} to {hi})" if lo is not None and hi is not None else ""
        return f'<div class="{classes}">{label}<b>{html.escape(str(value))}</b>{html.escape(span)}</div>'
    if name in ("FloatProgressModel", "IntProgressModel"):
        lo, hi, value = s.get("min", 0), s.get("max", 100), s.get("value", 0)
        return f'<div class="{classes}">{label}<progress max="{hi}" value="{value}"></progress></div>' \
            if isinstance(lo, (int, float)) and lo == 0 else f'<div class="{classes}">{label}<b>{value}</b></div>'
    if name in ("CheckboxModel", "ToggleButtonModel"):
        mark = "☑" if s.get("value") else "☐"
        return f'<div class="{classes}">{mark} {desc}</div>'
    if name in ("DropdownModel", "RadioButtonsModel", "SelectModel", "ToggleButtonsModel"):
        labels, index = s.get("_options_labels", []), s.get("index")
        value = labels[index] if isinstance(index, int) and 0 <= index < len(labels) else ""
        return f'<div class="{classes}">{label}<b>{html.escape(str(value))}</b></div>'
    if name == "ButtonModel":
        return f'<div class="{classes}"><button type="button" disabled>{desc or "button"}</button></div>'
    if name == "OutputModel":
        return f'<div class="{classes}">{_render_outputs(s.get("outputs", []))}</div>'
    if name == "ImageModel":
        return ""
    return ""


NOTE = ('<p class="gpucourse-static-note">Interactive widget, shown as it was when the notebook was last run. '
        'Open the notebook in Colab, Kaggle or JupyterLab (the launch buttons above) to use it.</p>')


def render_widget_outputs(nb) -> int:
    """Replace every widget output of ``nb`` with its static picture; drop the widget state. Returns the count."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    count = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            model_id = data[WIDGET_VIEW].get("model_id", "")
            body = render_widget(state, model_id)
            if not body:  # no stored state: keep the text representation, say what it is
                text = data.get("text/plain", "")
                text = "".join(text) if isinstance(text, list) else text
                body = f"<pre>{html.escape(text)}</pre>"
            data.pop(WIDGET_VIEW)
            data["text/html"] = f'<div class="gpucourse-static">{body}{NOTE}</div>'
            count += 1
    nb.metadata.pop("widgets", None)
    return count


# ------------------------------------------------------------------------------------------- staging

def _repo_and_branch() -> tuple[str, str]:
    sys.path.insert(0, str(ROOT))  # an installed gpucourse is preferred; the checkout works too
    try:
        from gpucourse import colab
    except ImportError:  # pragma: no cover - `make site` installs the package
        import importlib.util

        spec = importlib.util.spec_from_file_location("gpucourse_colab", ROOT / "utils" / "colab.py")
        colab = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(colab)
    finally:
        sys.path.pop(0)
    return colab.REPO, colab.BRANCH


_TEST_MARKER = re.compile(r"\A# NBVAL_[A-Z_]+[^\n]*\n?")
_NOTEBOOK_PATH = re.compile(r"(?<!\[)`((?:notebooks|labs)/\d\d_[A-Za-z0-9_]+\.ipynb)`(?!\])")
_HEADING = re.compile(r"^#{1,6}\s+(.+)$", re.M)
_PLOT_TITLE = re.compile(r"""(?:title|set_title|suptitle)\s*[=(]\s*(?:f?)(["'])(.+?)\1""")


def link_notebook_paths(text: str, depth: int) -> str:
    """A notebook named in code font (`` `notebooks/03_memory.ipynb` ``) becomes a link to its page."""
    up = "../" * depth
    return _NOTEBOOK_PATH.sub(lambda m: f"[`{m[1]}`]({up}{m[1]})", text)


def figure_alt(code: str, heading: str) -> str:
    """Alt text of a plot: its title when the code sets one, and the section it illustrates."""
    title = _PLOT_TITLE.search(code)
    section = re.sub(r"[`*_]", "", heading).strip()
    what = f"Plot: {re.sub(r'{[^}]*}', '…', title[2])}" if title else "Plot"
    return f"{what} (section “{section}”)" if section else what


def notebooks(lang: str = "en") -> list[tuple[str, Path]]:
    """(folder, path) of every notebook the site in ``lang`` publishes: the English tutorials and labs, or
    the editions built in ``notebooks/<lang>`` and ``labs/<lang>``."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {sorted(LANGUAGES)}, got {lang!r}")
    sub = LANGUAGES[lang]["folder"]
    return [(folder, nb) for folder in FOLDERS for nb in sorted((ROOT / folder / sub).glob("[0-9][0-9]_*.ipynb"))]


def page_names(lang: str = "en") -> list[str]:
    """The pages of the site in ``lang`` ('index', 'notebooks/01_device_detection', ...)."""
    return list(SPECIAL_PAGES) + [f"{folder}/{nb.stem}" for folder, nb in notebooks(lang)]


def switch_links(pagename: str, lang: str, pages: dict) -> list[dict]:
    """The language switch of one page: for every other language, the URL (relative to the page) of the
    same page in that language, or of that site's home page where the page has no edition.

    ``pages`` maps each language to its page names (:func:`page_names`).
    """
    up = "../" * (pagename.count("/") + (1 if LANGUAGES[lang]["folder"] else 0))
    links = []
    for other, spec in LANGUAGES.items():
        if other == lang:
            continue
        target = pagename if pagename in pages.get(other, ()) else "index"
        prefix = f"{spec['folder']}/" if spec["folder"] else ""
        links.append({"url": f"{up}{prefix}{target}.html", "label": spec["label"], "hreflang": other,
                      "same_page": target == pagename})
    return links


_MD_LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")


def _raw_link(label: str, url: str) -> str:
    """An HTML link (MyST passes it through): for pages outside this site, which MyST cannot resolve."""
    text = html.escape(label)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return f'<a href="{html.escape(url)}">{text}</a>'


def link_edition(text: str, lang: str, folder: str, editions: set[str]) -> str:
    """Links of a translated notebook (or home page) for the site in ``lang``.

    A link is read where its source lies (``notebooks/zh-CN/`` for an edition, the repository root for
    the README). A link to an edition (``notebooks/zh-CN/01_x.ipynb``, or ``09_x.ipynb`` beside it)
    becomes a link to this site's page; a link to an English notebook (the build of an edition points
    at ``../06_xla.ipynb`` while 06 has no edition) becomes a link to the English site's page, never a
    copy. A notebook path in code font becomes a link the same way. ``folder`` is the page's folder
    ('' for the home page); ``editions`` the notebook pages of this site ('notebooks/01_x', ...).
    """
    sub = LANGUAGES[lang]["folder"]
    here = f"{folder}/{sub}" if folder else ""
    up = "../" if folder else ""

    def target_of(path: str) -> str | None:
        """This site's relative link, or the English page's, for a repository path; None if neither."""
        parts = path.split("/")
        if len(parts) == 3 and parts[0] in FOLDERS and parts[1] == sub and f"{parts[0]}/{parts[2][:-6]}" in editions:
            return f"{up}{parts[0]}/{parts[2]}"
        if len(parts) == 2 and parts[0] in FOLDERS and (ROOT / path).is_file():
            return "../" * (bool(folder) + 1) + f"{parts[0]}/{parts[1][:-6]}.html"
        return None

    def link(m: re.Match) -> str:
        label, target = m[1], m[2]
        path, _, fragment = target.partition("#")
        if re.match(r"^[a-z]+:|^#", target) or not path.endswith(".ipynb"):
            return m[0]
        url = target_of(posixpath.normpath(posixpath.join(here, path)))
        if url is None:
            return m[0]
        url += f"#{fragment}" if fragment else ""
        return _raw_link(label, url) if url.endswith(".html") or ".html#" in url else f"[{label}]({url})"

    def code_link(m: re.Match) -> str:
        url = target_of(m[1])
        if url is None:
            return m[0]
        return _raw_link(f"`{m[1]}`", url) if url.endswith(".html") else f"[`{m[1]}`]({url})"

    text = _MD_LINK.sub(link, text)
    return re.sub(r"(?<!\[)`((?:notebooks|labs)/(?:[A-Za-z-]+/)?\d\d_[A-Za-z0-9_]+\.ipynb)`(?!\])", code_link, text)


def stage_notebook(src: Path, dst: Path, lang: str = "en", editions: set[str] | None = None) -> int:
    """Copy one notebook for the site (see the module docstring); returns the number of widgets made static.

    Also drops the test-suite markers (``# NBVAL_CHECK_OUTPUT`` ...) from the first line of code cells:
    they tell nbval what to compare and mean nothing to a reader; gives every plot an alt text that
    says what it shows (:func:`figure_alt`), and links every notebook named in code font.
    """
    nb = nbformat.read(src, as_version=4)
    depth, heading = 1, ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text = convert_callouts(localise_badges(cell.source, depth))
            cell.source = (link_notebook_paths(text, depth) if lang == "en"
                           else link_edition(text, lang, dst.parent.name, editions or set()))
            headings = _HEADING.findall(cell.source)
            heading = headings[-1] if headings else heading
        elif cell.cell_type == "code":
            cell.source = _TEST_MARKER.sub("", cell.source)
            if any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
                cell.metadata.setdefault("mystnb", {})["image"] = {"alt": figure_alt(cell.source, heading)}
    widgets = render_widget_outputs(nb)
    dst.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)
    return widgets


def readme_sections(readme: str) -> list[tuple[str, str]]:
    """The README cut at its ``## `` headings: [(title, text)], the part before the first heading first."""
    parts = re.split(r"^## (.+)$", readme, flags=re.M)
    sections = [("", parts[0])]
    sections += [(parts[i].strip(), f"## {parts[i]}{parts[i + 1]}") for i in range(1, len(parts), 2)]
    return sections


def home_page(readme: str, repo: str, branch: str, lang: str = "en") -> str:
    """The home page: the README for learners, links into the site, the syllabus as navigation.

    In another language: the README of that language; its links to editions are pages of that site, its
    links to English notebooks go to the English pages, and the link to another language's README goes
    to that language's home page.
    """
    text = "".join(body for title, body in readme_sections(readme) if title not in README_SKIP)
    text = localise_badges(text, 0)
    sub = LANGUAGES[lang]["folder"]
    readmes = {spec["readme"]: spec["folder"] for other, spec in LANGUAGES.items() if other != lang}

    def link(m: re.Match) -> str:
        label, target = m[1], m[2]
        if re.match(r"^[a-z]+://|^#|^mailto:", target) or target.startswith("_badges/"):
            return m[0]
        path = target.split("#")[0]
        if path in readmes and path == target:  # the README in another language: that site's home page
            home = (f"{readmes[path]}/" if readmes[path] else "") + "index.html"
            return _raw_link(label, ("../" if sub else "") + home)
        if path.endswith(".ipynb") and path.split("/")[0] in FOLDERS:
            return m[0]  # a page of this site (another language's site: link_edition below)
        return f"[{label}]({REPO_URL.format(repo=repo, branch=branch, path=target)})"

    text = re.sub(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)", link, text)
    if lang != "en":
        text = link_edition(text, lang, "", {p for p in page_names(lang) if "/" in p})
    nav = []
    for caption, folder in zip(LANGUAGES[lang]["captions"], FOLDERS):
        pages = sorted(p.stem for p in (ROOT / folder / sub).glob("[0-9][0-9]_*.ipynb"))
        nav.append(f":::{{toctree}}\n:caption: {caption}\n:hidden:\n:maxdepth: 1\n\n"
                   + "\n".join(f"{folder}/{p}" for p in pages) + "\n:::\n")
    return text.rstrip() + "\n\n" + "\n".join(nav)


def stage(dst: Path, lang: str = "en") -> dict:
    """Write the sources of the site in ``lang`` into ``dst`` (emptied first).

    Returns {'pages': [...], 'widgets': n}. Also writes :data:`SETTINGS_FILE` for conf.py: the language,
    the repository folder of the notebooks (for the launch buttons) and every page's switch links.
    """
    notebooks(lang)  # a language without a site: ValueError naming the ones there are
    spec = LANGUAGES[lang]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    (dst / "_badges").mkdir()
    for local in BADGES.values():
        shutil.copy(SITE / "badges" / local, dst / "_badges" / local)
    repo, branch = _repo_and_branch()
    readme = (ROOT / spec["readme"]).read_text(encoding="utf-8")
    (dst / "index.md").write_text(home_page(readme, repo, branch, lang), encoding="utf-8")
    editions = {p for p in page_names(lang) if "/" in p}
    pages, widgets = ["index"], 0
    for folder, nb in notebooks(lang):
        widgets += stage_notebook(nb, dst / folder / nb.name, lang, editions)
        pages.append(f"{folder}/{nb.stem}")
    every = {other: page_names(other) for other in LANGUAGES}
    settings = {"language": lang, "repo_folder": spec["folder"],
                "switch": {page: switch_links(page, lang, every) for page in every[lang]}}
    (dst / SETTINGS_FILE).write_text(json.dumps(settings, ensure_ascii=False, indent=1), encoding="utf-8")
    return {"pages": pages, "widgets": widgets}


def build_one(out: Path, lang: str = "en", quiet: bool = True) -> Path:
    """Stage and build the site in ``lang`` into ``out`` (emptied first); returns its home page."""
    from sphinx.cmd.build import build_main

    out = Path(out).resolve()
    # beside the English site's folder (a language's site lies inside it): _build/site-src, _build/site-src-zh-CN
    base = out if lang == "en" else out.parent
    src = base.parent / f"{base.name}-src{'' if lang == 'en' else '-' + lang}"
    doctrees = base.parent / f"{base.name}-doctrees{'' if lang == 'en' else '-' + lang}"
    stage(src, lang)
    if out.exists():
        shutil.rmtree(out)
    spec = LANGUAGES[lang]
    args = ["-b", "html", "-c", str(SITE), "-W", "--keep-going", "-E", "-d", str(doctrees),
            "-D", f"language={spec['sphinx']}", "-D", f"html_title={spec['title']}", "-D", f"project={spec['title']}",
            str(src), str(out)]
    if quiet:
        args.insert(0, "-q")
    with warnings.catch_warnings():  # the theme and MyST use APIs Sphinx 11 will remove: not ours to fix
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        code = build_main(args)
    if code:
        raise SystemExit(f"the {lang} site build failed (exit {code}); see the warnings above")
    for folder, nb in notebooks(lang):  # the download button gives the notebook itself, not the staged copy
        shutil.copy(nb, out / "_sources" / folder / nb.name)
    return out / "index.html"


def build(out: Path = DEFAULT_OUT, quiet: bool = True, languages=tuple(LANGUAGES)) -> Path:
    """Build the English site into ``out`` and every other language's into ``out/<folder>``; returns the
    English home page. Raises on any warning."""
    out = Path(out).resolve()
    index = out / "index.html"
    for lang in ("en",) + tuple(lang for lang in languages if lang != "en"):
        folder = LANGUAGES[lang]["folder"]
        home = build_one(out / folder if folder else out, lang, quiet)
        index = home if lang == "en" else index
    return index


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    index = build(target, quiet=False)
    zh = index.parent / LANGUAGES["zh-CN"]["folder"] / "index.html"
    print(f"site built: {index} and {zh}  (open it in a browser, or: python -m http.server -d {index.parent})")
