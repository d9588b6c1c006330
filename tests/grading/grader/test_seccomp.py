"""The graded kernel's seccomp filter (gpucourse.grading.grader.seccomp) as a program: well-formed classic BPF for
each architecture, and what it returns for each system call, run by a small BPF interpreter. The filter installed
for real is tested in tests/grading/kernel/test_launch.py."""

import re
import struct
from pathlib import Path

import pytest

from gpucourse.grading.grader import seccomp

ALLOW, ERRNO, DATA = 0x7FFF0000, 0x00050000, 0xFFFF
EPERM, EAFNOSUPPORT = 1, 97
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 1, 2, 10, 16, 17
BPF_MAXINSNS = 4096
OTHER_ARCH = {"x86_64": 0x40000003, "aarch64": 0x40000028}  # AUDIT_ARCH_I386, AUDIT_ARCH_ARM: 32-bit ABIs
READ = {"x86_64": 0, "aarch64": 63}


def _decode(program: bytes):
    assert len(program) % 8 == 0
    return [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]


def _run(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """What the kernel's BPF interpreter would return for ``struct seccomp_data`` {nr, arch, ip=0, args}."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns, pc, acc = _decode(program), 0, 0
    for _ in range(len(insns)):
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
    raise AssertionError("the program ran off its end")


@pytest.fixture(params=["x86_64", "aarch64"])
def machine(request):
    return request.param


def _arch(machine):
    return seccomp.ARCHES[machine][0]


def _nr(machine, name):
    return seccomp.ARCHES[machine][1][name]


#: The kernel's own numbering, where its headers are installed (aarch64 uses the generic table).
HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}


def test_the_system_call_numbers_are_the_kernels(machine):
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", header.read_text())}
    for name, number in seccomp.ARCHES[machine][1].items():
        assert numbers[name] == number, name


def test_the_program_is_whole_instructions_under_the_kernels_limit(machine):
    program = seccomp.program(machine)
    assert len(program) % 8 == 0
    assert 0 < len(program) // 8 <= BPF_MAXINSNS


def test_every_jump_lands_inside_the_program_and_every_path_ends_in_a_return(machine):
    insns = _decode(seccomp.program(machine))
    for pc, (code, jt, jf, _) in enumerate(insns):
        if code in (0x15, 0x35):
            assert pc + 1 + jt < len(insns) and pc + 1 + jf < len(insns), f"a jump out of the program at {pc}"
    assert insns[-1][0] == 0x06


def test_the_program_loads_only_fields_of_seccomp_data(machine):
    for code, _, _, k in _decode(seccomp.program(machine)):
        if code == 0x20:
            assert k in (0, 4, 16), k  # nr, arch, args[0]'s low word


@pytest.mark.parametrize("name", seccomp.BLOCKED)
def test_each_blocked_call_is_refused_with_eperm(machine, name):
    assert _run(seccomp.program(machine), _arch(machine), _nr(machine, name)) == ERRNO | EPERM


@pytest.mark.parametrize("family", [AF_INET, AF_INET6, AF_PACKET])
def test_a_network_socket_is_refused_with_eafnosupport(machine, family):
    result = _run(seccomp.program(machine), _arch(machine), _nr(machine, "socket"), family)
    assert result == ERRNO | EAFNOSUPPORT


@pytest.mark.parametrize("family", [AF_UNIX, AF_NETLINK])
def test_a_unix_or_netlink_socket_is_allowed(machine, family):
    assert _run(seccomp.program(machine), _arch(machine), _nr(machine, "socket"), family) == ALLOW


def test_an_ordinary_call_is_allowed(machine):
    assert _run(seccomp.program(machine), _arch(machine), READ[machine]) == ALLOW


def test_a_call_of_another_abi_is_refused(machine):
    assert _run(seccomp.program(machine), OTHER_ARCH[machine], READ[machine]) == ERRNO | EPERM


def test_an_x32_call_is_refused_on_x86_64():
    assert _run(seccomp.program("x86_64"), _arch("x86_64"), 0x40000000 | 41, AF_UNIX) == ERRNO | EPERM


def test_the_machine_names_are_case_blind_and_have_their_aliases():
    assert seccomp.program("AMD64") == seccomp.program("x86_64")
    assert seccomp.program("arm64") == seccomp.program("aarch64")


def test_an_unknown_architecture_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="'riscv64'"):
        seccomp.program("riscv64")
