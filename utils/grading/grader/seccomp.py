"""The graded kernel's seccomp filter: the system calls a submission has no use for, refused.

:func:`program` assembles a classic-BPF seccomp program for this machine's architecture (x86_64 or
aarch64). The kernel's launcher (:mod:`gpucourse.grading.kernel.launch`) installs it before anything
else runs, with ``no_new_privs`` set; no process can remove a seccomp filter, and every process the
kernel starts inherits it. It refuses, with ``EPERM``:

* ``ptrace``, ``process_vm_readv``/``process_vm_writev``, ``perf_event_open``, ``kcmp``, ``pidfd_getfd``:
  reading or changing another process's memory, or taking its open files;
* ``io_uring_setup``/``_enter``/``_register``: an io_uring runs socket, connect and open operations inside
  the kernel, where no seccomp filter sees them (it would undo the socket rule below);
* ``socket`` for any family but Unix sockets and netlink (``EAFNOSUPPORT``): no network, only the grader's
  socket (the kernel talks to the grader and to Jupyter over Unix sockets);
* every system call of another ABI (x86's 32-bit ``int 0x80`` and x32), which would pass the checks above.

Everything else is allowed. The filter is a second wall: in bubblewrap the kernel also has no network
namespace to reach and runs as a uid that owns nothing (:mod:`.sandbox`).
"""

from __future__ import annotations

import platform
import struct

__all__ = ["ARCHES", "BLOCKED", "SOCKET_FAMILIES", "program"]

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
EPERM, EAFNOSUPPORT = 1, 97
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low 32 bits on little-endian)

#: machine name -> (AUDIT_ARCH, {syscall: number}, lowest number of a foreign ABI to refuse or None)
ARCHES = {
    "x86_64": (0xC000003E, {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "perf_event_open": 298,
                            "kcmp": 312, "pidfd_getfd": 438, "io_uring_setup": 425, "io_uring_enter": 426,
                            "io_uring_register": 427, "socket": 41}, 0x40000000),
    "aarch64": (0xC00000B7, {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "perf_event_open": 241,
                             "kcmp": 272, "pidfd_getfd": 438, "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427, "socket": 198}, None),
}
ARCHES["arm64"] = ARCHES["aarch64"]
ARCHES["amd64"] = ARCHES["x86_64"]
#: System calls refused outright.
BLOCKED = ("ptrace", "process_vm_readv", "process_vm_writev", "perf_event_open", "kcmp", "pidfd_getfd",
           "io_uring_setup", "io_uring_enter", "io_uring_register")
#: Socket families allowed: AF_UNIX, AF_NETLINK.
SOCKET_FAMILIES = (1, 16)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one) as ``struct sock_filter`` records, ready for prctl.

    ValueError for an architecture this module does not know (the grader then runs without the filter and
    says so).
    """
    machine = (machine or platform.machine()).lower()
    if machine not in ARCHES:
        raise ValueError(f"no seccomp filter for the architecture {machine!r}; known: x86_64, aarch64")
    arch, numbers, foreign = ARCHES[machine]
    # Layout: checks first, then three return instructions at the end: [deny, no-family, allow].
    body = [("ld", _ARCH), ("jne_deny", arch), ("ld", _NR)]
    if foreign is not None:
        body.append(("jge_deny", foreign))
    body += [("jeq_deny", numbers[name]) for name in BLOCKED]
    body += [("jne_allow", numbers["socket"]), ("ld", _ARG0)]
    body += [("jeq_allow", family) for family in SOCKET_FAMILIES]
    body.append(("goto_nofamily", 0))
    n = len(body)
    deny, nofamily, allow = n, n + 1, n + 2
    out = []
    for i, (what, k) in enumerate(body):
        rel = lambda target: target - i - 1  # noqa: E731 (a jump's offset from the next instruction)
        if what == "ld":
            out.append(_op(_LD_W_ABS, k))
        elif what == "jne_deny":
            out.append(_op(_JEQ_K, k, 0, rel(deny)))
        elif what == "jge_deny":
            out.append(_op(_JGE_K, k, rel(deny), 0))
        elif what == "jeq_deny":
            out.append(_op(_JEQ_K, k, rel(deny), 0))
        elif what == "jne_allow":
            out.append(_op(_JEQ_K, k, 0, rel(allow)))
        elif what == "jeq_allow":
            out.append(_op(_JEQ_K, k, rel(allow), 0))
        else:  # goto_nofamily: an always-true test
            out.append(_op(_JGE_K, 0, rel(nofamily), rel(nofamily)))
    out += [_op(_RET_K, _ERRNO | EPERM), _op(_RET_K, _ERRNO | EAFNOSUPPORT), _op(_RET_K, _ALLOW)]
    if any(not 0 <= b[2] <= 255 or not 0 <= b[3] <= 255 for b in out):  # jt/jf are 8 bits
        raise AssertionError("a seccomp jump is out of range")
    return b"".join(out)
