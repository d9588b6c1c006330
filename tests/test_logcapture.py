"""gpucourse.logcapture: C-level output is captured, which plain redirect_stdout cannot do."""

import ctypes
import os

import pytest

from gpucourse.logcapture import capture_output


def test_captures_fd_level_and_python_output():
    libc = ctypes.CDLL(None)
    with capture_output() as out:
        os.write(1, b"from fd 1\n")
        os.write(2, b"from fd 2\n")
        libc.printf(b"from C printf\n")
        print("from python")
    assert {"from fd 1", "from fd 2", "from C printf", "from python"} <= set(out.lines)
    assert out.grep(r"^from fd") == ["from fd 1", "from fd 2"]
    assert "file descriptors" in out.method


def test_echo(capsys):
    with capture_output(echo=True) as out:
        print("hello")
    assert out.text == "hello\n"
    assert "hello" in capsys.readouterr().out


def test_grep_bad_pattern():
    with capture_output() as out:
        pass
    with pytest.raises(TypeError):
        out.grep(42)


def test_captures_tensorflow_placement_log(fresh_python):
    out = fresh_python(
        "import tensorflow as tf\nfrom gpucourse.logcapture import capture_output\n"
        "tf.debugging.set_log_device_placement(True)\n"
        "with capture_output() as cap:\n"
        "    tf.matmul(tf.ones((2, 2)), tf.ones((2, 2)))\n"
        "print('LINES', len(cap.grep('MatMul')) > 0)\n", env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert "LINES True" in out
