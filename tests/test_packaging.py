"""The set-up promised by the README: dependencies agree, the two commands exist, CI calls them."""

import re
import tomllib

import yaml


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject(root):
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["cpu"] + project["optional-dependencies"]["dev"]
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


def test_package_imports_under_its_own_name():
    import gpucourse

    assert gpucourse.__file__.replace("\\", "/").endswith("utils/__init__.py")
    assert "devices" in dir(gpucourse)


def test_readme_commands_exist_and_ci_uses_them(root):
    readme = (root / "README.md").read_text()
    make = (root / "Makefile").read_text()
    assert "make lab" in readme and "make test" in readme
    assert re.search(r"^lab:", make, re.M) and re.search(r"^test:", make, re.M)
    ci = (root / ".ci" / "run").read_text()
    assert "make test" in ci
    assert "-n $(JOBS) --dist loadfile" in make
    assert "--allow-root" in make, "make lab must work as root (containers) too"
    addopts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    for opt in ("--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with", "tests.nbval_hooks"):
        assert opt in addopts
