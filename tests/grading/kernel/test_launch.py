"""The graded kernel's launcher (gpucourse.grading.kernel.launch) for real: a fresh process locks itself down with
this machine's filter (gpucourse.grading.grader.seccomp), then tries what the filter refuses and what it allows; a
process it starts must inherit the filter."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucourse.grading.grader import seccomp
from gpucourse.grading.kernel import launch

LAUNCH_PY = Path(launch.__file__)

PROBE = r"""
import ctypes, json, os, socket, subprocess, sys
from gpucourse.grading.kernel.launch import lock_down

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def errno_of(fn):
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return 0

def c_errno(result):
    return ctypes.get_errno() if result == -1 else 0

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

lock_down(sys.argv[1])
out = {
    "inet": errno_of(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
    "inet6": errno_of(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()),
    "unix": errno_of(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()),
    "netlink": errno_of(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()),
    # PTRACE_PEEKDATA of a process this one does not trace: ESRCH unless the filter refuses ptrace first
    "ptrace": c_errno(libc.ptrace(2, os.getpid(), None, None)),
    # process_vm_readv(self) with no buffers: 0 unless the filter refuses it
    "process_vm_readv": c_errno(libc.process_vm_readv(os.getpid(), None, 0, None, 0, 0)),
    "io_uring_setup": c_errno(libc.syscall(int(sys.argv[2]), 1, ctypes.create_string_buffer(120))),
    "no_new_privs": status("NoNewPrivs"),
    "seccomp_mode": status("Seccomp"),
    "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
}
child = subprocess.run([sys.executable, "-c",
                        "import socket\ntry:\n    socket.socket(socket.AF_INET)\n    print(0)\n"
                        "except OSError as exc:\n    print(exc.errno)"], capture_output=True, text=True)
out["child_inet"] = int(child.stdout)
print(json.dumps(out))
"""


def _seccomp_available() -> bool:
    try:
        return "Seccomp:" in Path("/proc/self/status").read_text()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _seccomp_available(), reason="this kernel has no seccomp")


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    """What a process saw after lock_down with this machine's filter (one fresh process for the module)."""
    try:
        program = seccomp.program()
    except ValueError as exc:
        pytest.skip(str(exc))
    path = tmp_path_factory.mktemp("seccomp") / "filter.bpf"
    path.write_bytes(program)
    io_uring_setup = seccomp.ARCHES[os.uname().machine.lower()][1]["io_uring_setup"]
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path), str(io_uring_setup)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_network_socket_is_refused_with_eafnosupport(locked):
    assert (locked["inet"], locked["inet6"]) == (errno.EAFNOSUPPORT, errno.EAFNOSUPPORT)


def test_a_unix_socket_is_allowed(locked):
    assert locked["unix"] == 0


def test_a_netlink_socket_is_allowed(locked):
    assert locked["netlink"] == 0


def test_ptrace_is_refused_with_eperm(locked):
    assert locked["ptrace"] == errno.EPERM


def test_process_vm_readv_is_refused_with_eperm(locked):
    assert locked["process_vm_readv"] == errno.EPERM


def test_io_uring_is_refused_with_eperm(locked):
    assert locked["io_uring_setup"] == errno.EPERM


def test_no_new_privs_is_set(locked):
    assert locked["no_new_privs"] == 1


def test_the_filter_is_installed_in_filter_mode(locked):
    assert locked["seccomp_mode"] == 2


def test_the_process_is_not_dumpable(locked):
    assert locked["dumpable"] == 0


def test_a_child_process_inherits_the_filter(locked):
    assert locked["child_inet"] == errno.EAFNOSUPPORT


def test_without_the_filter_the_probes_succeed(tmp_path):
    """The control: an empty filter file sets no filter, and the same calls are allowed (so the refusals above are
    the filter's, not this machine's)."""
    path = tmp_path / "empty.bpf"
    path.write_bytes(b"")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path), "425"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert (seen["inet"], seen["ptrace"], seen["process_vm_readv"], seen["child_inet"], seen["seccomp_mode"]) == (
        0, errno.ESRCH, 0, 0, 0)


def test_a_launcher_that_cannot_lock_down_exits_3_and_says_why(tmp_path):
    path = tmp_path / "broken.bpf"
    path.write_bytes(b"\x06\x00\x00")  # not whole instructions: the kernel refuses it
    proc = subprocess.run([sys.executable, str(LAUNCH_PY), str(path), "-f", "/nonexistent.json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.startswith("gpucourse: the graded kernel could not be locked down:")


def test_a_launcher_without_its_filter_file_exits_3(tmp_path):
    proc = subprocess.run([sys.executable, str(LAUNCH_PY), str(tmp_path / "missing.bpf")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "missing.bpf" in proc.stderr
