"""The grader's end of the guard's channel: MACs, sequence numbers, one connection, the alarm."""

import hashlib
import hmac
import os
import socket

from gpucourse.grading.channel import Channel
from gpucourse.grading.kernel_guard import PROTOCOL


def _fake_guard(address, lines):
    key = os.urandom(32)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(address)
        s.sendall(f"{PROTOCOL} {key.hex()}\n".encode())
        for seq, kind, detail, good in lines:
            body = repr((seq, kind, detail)).encode()
            mac = hmac.new(key if good else b"x" * 32, body, hashlib.sha256).hexdigest().encode()
            s.sendall(mac + b" " + body + b"\n")


def test_channel_rejects_forged_and_missing_records():
    channel = Channel().start()
    try:
        _fake_guard(channel.address, [(1, "ready", (1, 1, 1), True), (2, "event", ("x",), False),
                                      (4, "phase", ("begin", ""), True), (5, "end", (0.1,), True),
                                      (6, "observed", ("late", "x"), True)])
        assert channel.wait_end(5)
    finally:
        channel.close()
    assert [r.kind for r in channel.records] == ["ready", "phase", "end"]  # nothing after end
    assert channel.tampered.is_set()
    assert any("did not write" in p for p in channel.problems)
    assert any("never arrived" in p for p in channel.problems)


def test_channel_reports_a_closed_channel_and_accepts_one_connection():
    channel = Channel().start()
    try:
        _fake_guard(channel.address, [(1, "ready", (1, 1, 1), True)])
        assert not channel.wait_end(5)
        assert not os.path.exists(channel.address)  # no second connection possible
    finally:
        channel.close()
    assert channel.closed_early and channel.problems == []


def test_channel_raises_the_alarm_on_tampering_records_only():
    for detail, kind, alarm in [((("replaced", "json.dumps"),), "changed", True),
                                ((("import-system", "sys.meta_path was changed"),), "changed", False)]:
        channel = Channel().start()
        try:
            _fake_guard(channel.address, [(1, "ready", (1, 1, 1), True), (2, kind, ("submission", detail), True),
                                          (3, "event", ("item:public:q1", "ctypes" if alarm else "process", "x", "f:1"),
                                           True), (4, "end", (0.1,), True)])
            assert channel.wait_end(5)
        finally:
            channel.close()
        assert channel.tampered.is_set() is alarm and channel.problems == []
        assert channel.records[1].detail == ("submission", detail)
