"""Every notebook: Colab badge, identical setup cell, guide structure; the syllabus is complete; README links work."""

import re
import sys
import types
from pathlib import Path

import nbformat
import pytest

from gpucourse import colab

ROOT = Path(__file__).resolve().parent.parent
TOPICS = {
    "01": "device_detection", "02": "placement_logging", "03": "memory", "04": "distribution",
    "05": "mixed_precision", "06": "xla", "07": "tf_data", "08": "profiling_capstone", "09": "roofline_mfu",
}
MODULES = {"01": "devices", "02": "placement", "03": "memory", "04": "distribute", "05": "precision",
           "06": "xla", "07": "pipeline", "08": "profiling", "09": "roofline"}
NOTEBOOKS = sorted(p for d in ("notebooks", "labs", "solutions") for p in (ROOT / d).glob("*.ipynb"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("nn", sorted(TOPICS))
def test_every_topic_is_complete(nn):
    name = TOPICS[nn]
    for folder in ("notebooks", "labs", "solutions"):
        assert (ROOT / folder / f"{nn}_{name}.ipynb").is_file(), f"missing {folder}/{nn}_{name}.ipynb"
    assert (ROOT / "utils" / "labtests" / f"lab{nn}.py").is_file()
    assert (ROOT / "utils" / f"{MODULES[nn]}.py").is_file()
    assert (ROOT / "tests" / f"test_{MODULES[nn]}.py").is_file(), f"the {MODULES[nn]} helpers need unit tests"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_rel)
def test_badge_and_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert colab.colab_url(_rel(path)) in first.source, "the Colab badge must open this very notebook"
    assert colab.kaggle_url(_rel(path)) in first.source, "the Kaggle badge must open this very notebook"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and code[0].source == colab.SETUP_CELL, "the first code cell must be gpucourse.colab.SETUP_CELL"


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=_rel)
def test_tutorial_reads_like_a_guide(path):
    nb = nbformat.read(path, as_version=4)
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for heading in ("**Objective", "## Summary", "## Exercises"):
        assert heading in md, f"{path.name} lacks {heading}"
    checked = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# NBVAL_CHECK_OUTPUT")]
    assert len(checked) >= 2, "each tutorial needs deterministic cells checked by nbval"
    assert all(c.outputs for c in checked), "checked cells need stored outputs"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if "labs" not in p.parts], ids=_rel)
def test_stored_outputs_have_no_errors(path):
    nb = nbformat.read(path, as_version=4)
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            errs = [o for o in c.outputs if o.output_type == "error"]
            assert not errs, f"cell {i} of {path.name} stored an error: {errs[0].get('ename')}"


def test_readme_links_every_notebook_and_links_resolve():
    readme = (ROOT / "README.md").read_text()
    for p in NOTEBOOKS:
        if "solutions" not in p.parts:
            assert f"]({_rel(p)})" in readme, f"README does not link {_rel(p)}"
            assert colab.colab_url(_rel(p)) in readme, f"README lacks the Colab badge of {_rel(p)}"
            assert colab.kaggle_url(_rel(p)) in readme, f"README lacks the Kaggle badge of {_rel(p)}"
    for target in re.findall(r"\]\(((?!https?://)[^)#]+)\)", readme):
        assert (ROOT / target).exists(), f"README links to missing {target}"


def test_the_instructors_guide_is_linked_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/instructors.md)" in readme, "the learners' README must link the instructors' guide"
    guide = ROOT / "docs" / "instructors.md"
    text = guide.read_text()
    for heading in ("## Grading submissions", "## What a submission that cheats gets", "## Hidden tests",
                    "## Gradescope", "## LMS gradebook", "## Writing and changing the course"):
        assert heading in text, f"docs/instructors.md lacks {heading!r}"
    for target in re.findall(r"\]\(((?!https?://)[^)#]+)\)", text):
        assert (guide.parent / target).resolve().exists(), f"docs/instructors.md links to missing {target}"


def _run_setup_cell(monkeypatch, in_colab: bool, in_kaggle: bool = False):
    """Execute SETUP_CELL as IPython would, recording %pip calls instead of running them."""
    from IPython.core.inputtransformer2 import TransformerManager

    calls = []

    class FakeShell:
        def run_line_magic(self, name, line):
            calls.append((name, line))

    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if in_kaggle:
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    else:
        monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    monkeypatch.delenv(colab.SET_BY_COURSE, raising=False)
    code = TransformerManager().transform_cell(colab.SETUP_CELL)
    exec(compile(code, "setup-cell", "exec"), {"get_ipython": lambda: FakeShell()})
    return calls


@pytest.mark.parametrize("where", ["Colab", "Kaggle"])
def test_setup_cell_installs_only_on_platforms_and_keeps_their_packages(monkeypatch, capsys, where):
    assert _run_setup_cell(monkeypatch, in_colab=False) == []
    calls = _run_setup_cell(monkeypatch, in_colab=where == "Colab", in_kaggle=where == "Kaggle")
    assert calls and all(name == "pip" for name, _ in calls)
    course = [line for _, line in calls if "gpucourse @" in line]
    assert len(course) == 1 and "--no-deps" in course[0] and f"github.com/{colab.REPO}" in course[0]
    for _, line in calls:
        words = line.split("#")[0].split()
        assert not any(w.startswith(("tensorflow", "keras", "ipywidgets")) for w in words), line
        assert "--upgrade" not in words and "-U" not in words, line
        if "--no-deps" not in words:
            assert [w for w in words if not w.startswith("-") and w != "install"] == \
                list(colab.COLAB_WITH_DEPS) + ['"protobuf=={_protobuf}"'], "protobuf must stay the platform's"
    out = capsys.readouterr().out
    assert f"gpucourse ready ({where};" in out and "tested with TensorFlow 2.19-2.21" in out


def test_setup_turns_on_memory_growth_once_and_probes_drop_it(monkeypatch):
    from gpucourse import _probe

    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    monkeypatch.delenv(colab.SET_BY_COURSE, raising=False)
    assert colab.allow_gpu_memory_growth() is True
    assert colab.allow_gpu_memory_growth() is False  # idempotent
    import os
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    env = _probe.base_env()
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in env, "a fresh-process probe must start without the course's setting"
    assert _probe.base_env({"TF_FORCE_GPU_ALLOW_GROWTH": "true"})["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")  # the learner's own choice is kept
    monkeypatch.delenv(colab.SET_BY_COURSE)
    assert colab.allow_gpu_memory_growth() is False and os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert _probe.base_env()["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"


@pytest.mark.parametrize("package", colab.COLAB_WITH_DEPS)
def test_packages_installed_with_deps_never_pull_tensorflow(package):
    """Walk the installed dependency tree: nothing may require TensorFlow, Keras or ipywidgets."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    seen, todo = set(), [package]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        assert not key.startswith(("tensorflow", "keras", "tf-keras", "ipywidgets")), f"{package} pulls in {name}"
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for r in reqs:
            if "extra ==" not in r:
                todo.append(re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0])


@pytest.mark.parametrize("version, warns", [("7.7.1", False), ("8.1.5", False), ("7.6.5", True), ("9.0.0", True)])
def test_version_warnings(monkeypatch, version, warns):
    fake = types.ModuleType("ipywidgets")
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, "ipywidgets", fake)
    problems = colab.version_problems()
    assert any("ipywidgets" in p for p in problems) == warns
    if warns:
        with pytest.warns(UserWarning, match="ipywidgets"):
            colab.check_versions()


def test_the_setup_cell_imports_tensorflow_without_its_start_up_noise():
    """The red lines TensorFlow prints while it is imported (absl's notice, oneDNN's INFO line) are dropped;
    TF_CPP_MIN_LOG_LEVEL cannot hide them, since they come before TensorFlow's logging is set up."""
    code = "from gpucourse import colab; colab.quiet_import(); import tensorflow as tf; print(tf.__version__)"
    from tests.conftest import run_python

    proc = run_python(code, env={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLE_ONEDNN_OPTS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    noise = [n for n in colab.IMPORT_NOISE if n in proc.stderr]
    assert not noise, f"still printed: {noise}\n{proc.stderr[-2000:]}"
    kept = colab.drop_import_noise("WARNING: All log messages before absl::InitializeLog() is called are written "
                                   "to STDERR\nI0000 port.cc:153] oneDNN custom operations are on.\n\n"
                                   "E0000 something else\n")
    assert kept == "E0000 something else", "a line that is not known noise must stay visible"
