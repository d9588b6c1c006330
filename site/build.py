"""Build the course website from the notebooks' stored outputs (no notebook is executed).

    python site/build.py [OUT]          # default OUT: _build/site  (what `make site` runs)

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
   broken internal link fails the build.
"""

from __future__ import annotations

import base64
import html
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
WARNING_TITLES = ("snippet", "outdated", "wrong", "do not", "don't", "never", "trap", "beware", "careful")


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


def stage_notebook(src: Path, dst: Path) -> int:
    """Copy one notebook for the site (see the module docstring); returns the number of widgets made static.

    Also drops the test-suite markers (``# NBVAL_CHECK_OUTPUT`` ...) from the first line of code cells:
    they tell nbval what to compare and mean nothing to a reader; gives every plot an alt text that
    says what it shows (:func:`figure_alt`), and links every notebook named in code font.
    """
    nb = nbformat.read(src, as_version=4)
    depth, heading = 1, ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = link_notebook_paths(convert_callouts(localise_badges(cell.source, depth)), depth)
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


def home_page(readme: str, repo: str, branch: str) -> str:
    """The home page: the README for learners, links into the site, the syllabus as navigation."""
    text = "".join(body for title, body in readme_sections(readme) if title not in README_SKIP)
    text = localise_badges(text, 0)

    def link(m: re.Match) -> str:
        label, target = m[1], m[2]
        if re.match(r"^[a-z]+://|^#|^mailto:", target) or target.startswith("_badges/"):
            return m[0]
        path = target.split("#")[0]
        if path.endswith(".ipynb") and path.split("/")[0] in FOLDERS:
            return m[0]  # a page of this site
        return f"[{label}]({REPO_URL.format(repo=repo, branch=branch, path=target)})"

    text = re.sub(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)", link, text)
    nav = []
    for caption, folder in (("Tutorials", "notebooks"), ("Labs", "labs")):
        pages = sorted(p.stem for p in (ROOT / folder).glob("[0-9][0-9]_*.ipynb"))
        nav.append(f":::{{toctree}}\n:caption: {caption}\n:hidden:\n:maxdepth: 1\n\n"
                   + "\n".join(f"{folder}/{p}" for p in pages) + "\n:::\n")
    return text.rstrip() + "\n\n" + "\n".join(nav)


def stage(dst: Path) -> dict:
    """Write the site's sources into ``dst`` (emptied first). Returns {'pages': [...], 'widgets': n}."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    (dst / "_badges").mkdir()
    for local in BADGES.values():
        shutil.copy(SITE / "badges" / local, dst / "_badges" / local)
    repo, branch = _repo_and_branch()
    (dst / "index.md").write_text(home_page((ROOT / "README.md").read_text(encoding="utf-8"), repo, branch),
                                  encoding="utf-8")
    pages, widgets = ["index"], 0
    for folder in FOLDERS:
        for nb in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
            widgets += stage_notebook(nb, dst / folder / nb.name)
            pages.append(f"{folder}/{nb.stem}")
    return {"pages": pages, "widgets": widgets}


def build(out: Path = DEFAULT_OUT, quiet: bool = True) -> Path:
    """Stage and build the site into ``out``; returns the path of the home page. Raises on any warning."""
    from sphinx.cmd.build import build_main

    out = Path(out).resolve()
    src = out.parent / (out.name + "-src")
    stage(src)
    if out.exists():
        shutil.rmtree(out)
    args = ["-b", "html", "-c", str(SITE), "-W", "--keep-going", "-E", "-d", str(out.parent / (out.name + "-doctrees")),
            str(src), str(out)]
    if quiet:
        args.insert(0, "-q")
    with warnings.catch_warnings():  # the theme and MyST use APIs Sphinx 11 will remove: not ours to fix
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        code = build_main(args)
    if code:
        raise SystemExit(f"the site build failed (exit {code}); see the warnings above")
    for folder in FOLDERS:  # the download button gives the notebook itself, not the staged copy
        for nb in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
            shutil.copy(nb, out / "_sources" / folder / nb.name)
    return out / "index.html"


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    index = build(target, quiet=False)
    print(f"site built: {index}  (open it in a browser, or: python -m http.server -d {index.parent})")
