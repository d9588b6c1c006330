"""Run the notebooks' setup cell (gpucourse.colab.SETUP_CELL) as Colab runs it, in this Python.

`make test-colab` calls this with .venv-colab's interpreter, after Colab's pinned stack
(.ci/colab-stack.txt) is installed. It executes the very cell every notebook starts with, in an
IPython shell that believes it is on Colab (``google.colab`` is importable), so its ``%pip`` lines
really run: the course is installed --no-deps, the extra packages with whatever dependencies pip
picks, exactly as a learner's Colab session does. The one substitution: the cell installs the
course from GitHub, here it is built from this checkout.

Then it checks what a learner relies on: the cell raised nothing, TensorFlow, Keras and ipywidgets
are still Colab's pinned versions, and a TensorFlow op and the profiler still work.
Exit status 0 on success, 1 with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / ".ci" / "colab-stack.txt"
#: The setup cell's course requirement, "gpucourse @ git+https://github.com/...@branch" (quoted or not).
COURSE_FROM_GITHUB = re.compile(r"""(["']?)gpucourse @ git\+\S+?\1(?=\s|$)""")
#: What must survive the setup cell untouched (it promises not to replace the platform's stack).
PROTECTED = ("tensorflow-cpu", "keras", "ipywidgets", "tensorboard", "numpy", "protobuf")


def setup_cell() -> str:
    """SETUP_CELL from this checkout's utils/colab.py (the course is not installed yet)."""
    spec = importlib.util.spec_from_file_location("_gpucourse_colab", ROOT / "utils" / "colab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SETUP_CELL


def local_pip_args(line: str) -> list[str]:
    """The arguments of one ``%pip`` line, with the course taken from this checkout instead of GitHub."""
    line = COURSE_FROM_GITHUB.sub(shlex.quote(str(ROOT)), line)
    return shlex.split(line, comments=True)


def pins() -> dict[str, str]:
    out = {}
    for raw in PINS.read_text().splitlines():
        line = raw.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.strip().lower()] = version.strip()
    return out


def main() -> int:
    from IPython.core.interactiveshell import InteractiveShell

    try:
        import google  # noqa: F401 - the real namespace package (protobuf lives in it)
    except ImportError:
        sys.modules["google"] = types.ModuleType("google")
    sys.modules["google.colab"] = types.ModuleType("google.colab")  # what the cell tests for
    shell = InteractiveShell.instance()
    ran = []

    def pip(line: str) -> None:  # IPython has already expanded {variables} in the line
        args = local_pip_args(line)
        ran.append(args)
        print("%pip", " ".join(args), flush=True)
        subprocess.run([sys.executable, "-m", "pip", *args], check=True)

    shell.register_magic_function(pip, "line", "pip")
    before = {name: metadata.version(name) for name in PROTECTED if _installed(name)}
    result = shell.run_cell(setup_cell())
    problems = []
    if not result.success:
        problems.append(f"the setup cell raised {result.error_in_exec or result.error_before_exec!r}")
    if not ran:
        problems.append("the setup cell installed nothing although it believes it is on Colab")
    for name, version in before.items():
        now = metadata.version(name)
        if now != version:
            problems.append(f"the setup cell replaced Colab's {name} {version} with {now}")
    if not problems:
        problems += _smoke_test()
    for p in problems:
        print("make test-colab:", p, file=sys.stderr)
    if not problems:
        print(f"setup cell ran as on Colab ({len(ran)} %pip lines); "
              + ", ".join(f"{n} {v}" for n, v in before.items()) + " kept")
    return 1 if problems else 0


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


SMOKE = """
import tempfile, pathlib, tensorflow as tf
assert float(tf.reduce_sum(tf.ones((2, 2)))) == 4.0
with tempfile.TemporaryDirectory() as d:
    tf.profiler.experimental.start(d)
    tf.matmul(tf.ones((8, 8)), tf.ones((8, 8)))
    tf.profiler.experimental.stop()
    traces = list(pathlib.Path(d).glob("plugins/profile/*/*.xplane.pb"))
    assert traces, "no trace written"
    from xprof.convert import raw_to_tool_data
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(traces[0])], "trace_viewer", {})
    assert data, "the profiler plugin could not read the trace"
print("TensorFlow", tf.__version__, "runs ops and the profiler; the plugin reads its trace")
"""


def _smoke_test() -> list[str]:
    """A fresh process, as the next notebook cell would see it: TensorFlow imports, runs, profiles."""
    proc = subprocess.run([sys.executable, "-c", SMOKE], capture_output=True, text=True, timeout=300)
    print(proc.stdout.strip())
    if proc.returncode:
        return [f"after the setup cell TensorFlow or the profiler plugin is broken:\n{proc.stderr[-3000:]}"]
    return []


if __name__ == "__main__":
    sys.exit(main())
