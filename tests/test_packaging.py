"""The set-up promised by the README: dependencies agree, the two commands exist, CI calls them.

Every module of the package imports (in a fresh interpreter, without TensorFlow), and pyproject installs every
package of it.

Also Colab's stack (`make test-colab`): its pins agree with gpucourse.colab.TESTED, the target installs
the course the way the setup cell does, and, when run inside that environment
(GPUCOURSE_COLAB_STACK=1, set by the Makefile), the installed versions are the pinned ones.
"""

import importlib.util
import os
import re
import tomllib
from pathlib import Path
from importlib import metadata

import pytest
import yaml

from gpucourse import colab

ROOT = Path(__file__).resolve().parent.parent


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject(root):
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + extras["cpu"] + extras["dev"] + extras["site"]
    env = yaml.safe_load((root / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = [p for p in pip if not p.startswith("-e")]
    assert sorted(map(_norm, listed)) == sorted(map(_norm, wanted)), "environment.yml and pyproject.toml disagree"
    assert "-e ." in pip, "environment.yml must install the helper package itself"


def test_pins_fit_the_course(root):
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    deps = " ".join(project["dependencies"] + sum(project["optional-dependencies"].values(), []))
    assert "tensorflow-cpu>=2.21,<2.22" in deps and "tensorflow[and-cuda]>=2.21,<2.22" in deps
    assert "ipywidgets>=7.7,<9" in deps, "ipywidgets must accept Colab's 7.7 so Colab is never force-upgraded"
    for name in ("jupyterlab", "nbval", "pytest-xdist", "wurlitzer", "tensorboard", "nvidia-ml-py", "matplotlib"):
        assert name in deps, f"{name} is missing from pyproject.toml"


#: Imports every module of the package in a fresh interpreter; prints what failed (module -> error), the
#: modules of the map that the package's attribute does not give, and whether TensorFlow got imported.
IMPORT_ALL = """
import importlib, json, pkgutil, sys, traceback
import gpucourse
failed = {}
def broken(name):
    failed[name] = traceback.format_exc(limit=-1).strip().splitlines()[-1]
names = [m.name for m in pkgutil.walk_packages(gpucourse.__path__, "gpucourse.", onerror=broken)]
for name in list(gpucourse._SUBMODULES) + names:
    name = name if name.startswith("gpucourse.") else "gpucourse." + name
    try:
        importlib.import_module(name)
    except BaseException:
        broken(name)
wrong = [n for n in gpucourse._SUBMODULES if "gpucourse." + n not in failed
         and getattr(gpucourse, n) is not sys.modules["gpucourse." + n]]
print(json.dumps({"modules": sorted(set(names)), "failed": failed, "wrong": wrong,
                  "tensorflow": "tensorflow" in sys.modules}))
"""


def test_package_imports_under_its_own_name():
    import gpucourse

    assert gpucourse.__file__.replace("\\", "/").endswith("utils/__init__.py")
    assert gpucourse.devices.__name__ == "gpucourse.devices"  # an attribute of the map is its module, imported


def test_every_module_of_the_package_imports(fresh_python):
    """Every module of the module map (``gpucourse.<name>``), and every module of its packages (the grader, the
    kernel's code, the lab tests, the tools), imports in a fresh interpreter without TensorFlow. (``dir()``
    cannot tell: ``__all__`` lists a module that does not import.)"""
    import json

    import gpucourse

    out = json.loads(fresh_python(IMPORT_ALL).splitlines()[-1])
    failed = out["failed"]
    assert failed == {}, "modules that do not import: " + "; ".join(f"{k}: {v}" for k, v in failed.items())
    assert out["wrong"] == [], f"gpucourse.<name> is not the module for {out['wrong']}"
    assert not out["tensorflow"], "importing the package's modules imported TensorFlow: keep its imports lazy"
    modules = set(out["modules"])
    assert {f"gpucourse.{n}" for n in gpucourse._SUBMODULES} <= modules
    for needed in ("gpucourse.grading.grader.runner", "gpucourse.grading.kernel.agent", "gpucourse.grading.protocol",
                   "gpucourse.labtests.lab01", "gpucourse.tools.labgen"):
        assert needed in modules, f"{needed} was not found, so not imported"


def test_pyproject_installs_every_package(root):
    """A non-editable install (a wheel, Gradescope's setup.sh) installs only the packages pyproject lists."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    utils = root / setuptools["package-dir"]["gpucourse"]
    found = {".".join(("gpucourse",) + p.parent.relative_to(utils).parts) for p in utils.rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert set(setuptools["packages"]) == found, (f"not installed: {sorted(found - set(setuptools['packages']))}; "
                                                  f"no such package: {sorted(set(setuptools['packages']) - found)}")


def test_readme_commands_exist_and_ci_uses_them(root):
    readme = (root / "README.md").read_text()
    make = (root / "Makefile").read_text()
    assert "make lab" in readme and "make test" in readme and "make site" in readme
    for target in ("lab", "test", "site", "test-colab"):
        assert re.search(rf"^{target}:", make, re.M), f"the Makefile has no {target} target"
    ci = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines() if line.strip().startswith("make")]
    assert ci == ["make test", "make test-cpu-paths", "make test-colab"], \
        f".ci/run must run make test, then make test-cpu-paths, then make test-colab: {ci}"
    assert "-n $(JOBS) --dist loadfile" in make
    assert "--allow-root" in make, "make lab must work as root (containers) too"
    addopts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    for opt in ("--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with", "tests.nbval_hooks"):
        assert opt in addopts


def test_system_deps_waits_for_the_apt_lock_and_names_what_it_installs(root):
    """`make system-deps` with missing stand-in packages: apt (here `echo`) gets the lock timeout, and the message
    separates the words ("Debian's fake-pkg", not "Debian'sfake-pkg")."""
    import subprocess

    make = (root / "Makefile").read_text()
    assert re.search(r"^APT_GET := apt-get -o DPkg::Lock::Timeout=\$\(APT_LOCK_WAIT\)$", make, re.M)
    assert "$(APT_GET) update" in make and "$(APT_GET) install" in make
    deps = re.search(r"^SYSTEM_DEPS := (.*?)\n(?=\S)", make, re.M | re.S).group(1)
    assert {"chromium", "fonts-noto-cjk", "bubblewrap", "slurmctld", "slurmd", "slurm-client", "munge"} \
        <= set(re.findall(r"^\s*([a-z0-9.+-]+):'", deps, re.M))
    proc = subprocess.run(["make", "-s", "--no-print-directory", "system-deps",
                           "SYSTEM_DEPS=fake-pkg:'false' other-fake:'exit 1' present:'true'", "APT_GET=echo APT"],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    if os.geteuid() == 0:
        assert "installing Debian's fake-pkg other-fake for the tests" in proc.stdout, proc.stdout
        assert "APT update -qq" in proc.stdout
    else:
        assert "note: missing fake-pkg other-fake and cannot apt-get install it" in proc.stdout, proc.stdout
    assert "present" not in proc.stdout
    quiet = subprocess.run(["make", "-s", "--no-print-directory", "system-deps", "SYSTEM_DEPS=present:'true'",
                            "APT_GET=false"], cwd=root, capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stdout


def test_make_lab_installs_the_runtime_only_and_opens_notebook_01_without_the_news_prompt(root, tmp_path):
    """What a learner gets: `.[cpu,lab]` (no test or website tools), notebook 01 at the printed URL, no news."""
    import json
    import signal
    import socket
    import subprocess
    import time

    make = (root / "Makefile").read_text()
    lab_install = re.search(r"^\$\(LAB_STAMP\):.*?(?=^\S)", make, flags=re.M | re.S).group(0)
    assert '-e ".[$(TF),lab]"' in lab_install and "dev" not in lab_install and "site" not in lab_install
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["lab"]] == ["jupyterlab"]
    overrides = json.loads((root / ".venv" / "share" / "jupyter" / "lab" / "settings" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false", "checkForUpdates": False}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "BROWSER": "true", "JUPYTER_RUNTIME_DIR": str(tmp_path)}  # `true`: open no browser
    proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"PORT={port}"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, seen = time.monotonic() + 60, ""
        while time.monotonic() < deadline and "?token=" not in seen:
            seen += proc.stdout.readline()
        url = re.search(r"http://\S+\?token=\S+", seen)
        assert url, f"make lab printed no URL within 60 s:\n{seen[-2000:]}"
        assert f":{port}/lab/tree/notebooks/01_device_detection.ipynb?token=" in url.group(0)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


# ------------------------------------------------------------------------------------ Colab's stack

def _colab_pins(root) -> dict[str, str]:
    pins = {}
    for line in (root / ".ci" / "colab-stack.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_colab_pins_are_the_oldest_tested_versions(root):
    pins = _colab_pins(root)
    for package, pinned in (("tensorflow", pins.get("tensorflow-cpu")), ("keras", pins.get("keras")),
                            ("ipywidgets", pins.get("ipywidgets"))):
        assert pinned, f".ci/colab-stack.txt does not pin {package}"
        oldest = colab.TESTED[package][0]
        assert _major_minor(pinned) == oldest, \
            f"{package}: make test-colab pins {pinned}, but gpucourse.colab.TESTED says the oldest tested is {oldest}"
    assert _major_minor(pins["tensorboard"]) == _major_minor(pins["tensorflow-cpu"]), "TensorBoard must match TensorFlow"


def test_local_stack_is_the_newest_tested_version(root):
    deps = " ".join(tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"])
    newest = colab.TESTED["tensorflow"][1]
    assert f"tensorflow-cpu>={newest[0]}.{newest[1]}," in deps, f"pyproject's TensorFlow is not TESTED's newest {newest}"


def _colab_setup():
    spec = importlib.util.spec_from_file_location("colab_setup", ROOT / ".ci" / "colab_setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_test_colab_runs_the_real_setup_cell_with_the_course_from_this_checkout(root):
    emulator = _colab_setup()
    assert emulator.setup_cell() == colab.SETUP_CELL
    lines = [ln.strip()[len("%pip"):] for ln in colab.SETUP_CELL.splitlines() if ln.strip().startswith("%pip")]
    assert lines, "the setup cell installs nothing on Colab?"
    course = [emulator.local_pip_args(ln) for ln in lines if "gpucourse @ git+" in ln]
    assert course, "the setup cell no longer installs gpucourse from GitHub: update .ci/colab_setup.py"
    for args in map(emulator.local_pip_args, lines):
        assert not any("github.com" in a for a in args), args
    assert str(root) in course[0] and "--no-deps" in course[0], course[0]
    make = (root / "Makefile").read_text()
    assert "$(COLAB_PY) .ci/colab_setup.py" in make and "-r .ci/colab-stack.txt" in make


@pytest.mark.skipif(os.environ.get("GPUCOURSE_COLAB_STACK") != "1", reason="only inside make test-colab")
def test_this_is_colabs_stack(root):
    for name, pinned in _colab_pins(root).items():
        assert metadata.version(name) == pinned, f"{name} {metadata.version(name)} installed, {pinned} pinned"
    import tensorflow as tf

    assert tf.__version__ == _colab_pins(root)["tensorflow-cpu"]
    assert colab.version_problems() == [], colab.version_problems()
