"""The wire protocol between the grader and the graded kernel (gpucourse.grading.protocol): the canonical text a
MAC is computed over, checked frames, and plain data that never runs the learner's methods."""

import json
import math

import numpy as np
import pytest

from gpucourse.grading import protocol
from gpucourse.grading.protocol import Kind, ProtocolError, Reader, Role, canonical, encode, plain, unpack_tuples

KEY = b"k" * 32
OTHER_KEY = b"o" * 32


def _frames(key, kinds_bodies, start=0):
    return b"".join(encode(key, start + i, kind, body) for i, (kind, body) in enumerate(kinds_bodies))


def _hello(role="tripwire"):
    return ("hello", {"role": role, "token": "t"})


# ---------------------------------------------------------------------------------------------- canonical


@pytest.mark.parametrize("value", [
    {"b": [1, 2.5, None, True, False], "a": {"z": "x", "y": []}},
    ["quote \" backslash \\ slash / del \x7f"],
    {"é": "日本語 ✓ \U0001f600"},
    [1e300, 1e-300, 123456789012345678901234567890, -1, 0.1],
])
def test_canonical_is_pythons_compact_sorted_json(value):
    assert canonical(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_canonical_escapes_every_control_character_and_json_reads_it_back():
    value = "".join(chr(i) for i in range(32))
    text = canonical(value)
    assert text.isprintable()
    assert json.loads(text) == value
    assert canonical(json.loads(text)) == text


def test_canonical_round_trips_nan_infinities_and_negative_zero():
    value = [math.nan, math.inf, -math.inf, -0.0]
    back = json.loads(canonical(value))
    assert math.isnan(back[0])
    assert back[1:3] == [math.inf, -math.inf]
    assert math.copysign(1.0, back[3]) == -1.0
    assert canonical(back) == canonical(value) == "[NaN,Infinity,-Infinity,-0.0]"


def test_canonical_round_trips_a_lone_surrogate():
    """A learner's string may hold one (os.fsdecode of bytes): it must not break the frame."""
    value = {"path": "a\udcffb"}
    text = canonical(value)
    assert "\\udcff" in text
    text.encode()  # a frame is UTF-8: no lone surrogate may reach it
    assert json.loads(text) == value
    assert canonical(json.loads(text)) == text


@pytest.mark.parametrize("value", [(1, 2), {1: "a"}, b"x", {1.5}, np.float32(1)])
def test_canonical_refuses_what_is_not_plain_data(value):
    with pytest.raises(TypeError):
        canonical(value)


def test_canonical_refuses_a_str_subclass_instead_of_running_its_methods():
    calls = []

    class Loud(str):
        def translate(self, table):
            calls.append("translate")
            return "forged"

    with pytest.raises(TypeError):
        canonical(Loud("x"))
    assert calls == []


# ---------------------------------------------------------------------------------------------- frames


def test_a_frame_round_trips_through_a_reader():
    data = _frames(KEY, [_hello(), ("flag", {"category": "ctypes", "detail": "d", "where": "w"})])
    got = Reader({Role.TRIPWIRE: KEY}).feed(data)
    assert got == [("hello", {"role": "tripwire", "token": "t"}),
                   ("flag", {"category": "ctypes", "detail": "d", "where": "w"})]


def test_a_reader_returns_frames_as_they_complete_byte_by_byte():
    data = _frames(KEY, [_hello(), ("look", {"at": 1})])
    reader = Reader({Role.TRIPWIRE: KEY})
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i:i + 1])
    assert [kind for kind, _ in got] == ["hello", "look"]


def test_the_mac_is_hmac_sha256_of_the_canonical_seq_kind_body():
    import hashlib
    import hmac

    body = {"x": [1, "y"]}
    expected = hmac.new(KEY, b'[3,"look",{"x":[1,"y"]}]', hashlib.sha256).hexdigest()
    assert protocol.mac(KEY, 3, "look", body) == expected
    frame = json.loads(encode(KEY, 3, Kind.LOOK, body)[4:])
    assert frame == {"seq": 3, "kind": "look", "body": body, "mac": expected}


def _greeted_reader():
    reader = Reader({Role.TRIPWIRE: KEY})
    assert reader.feed(_frames(KEY, [_hello()])) == [_hello()]
    return reader


def test_a_frame_with_a_wrong_mac_is_refused():
    reader = _greeted_reader()
    with pytest.raises(ProtocolError, match="frame 1 .flag. has a wrong MAC"):
        reader.feed(encode(OTHER_KEY, 1, "flag", {"category": "x"}))
    assert "wrong MAC" in reader.broken


def test_a_frame_whose_body_was_changed_after_signing_is_refused():
    frame = json.loads(encode(KEY, 1, "flag", {"category": "ctypes"})[4:])
    frame["body"]["category"] = "threads"
    raw = json.dumps(frame).encode()
    reader = _greeted_reader()
    with pytest.raises(ProtocolError, match="frame 1 .flag. has a wrong MAC"):
        reader.feed(len(raw).to_bytes(4, "big") + raw)


def test_a_hello_signed_with_another_roles_key_is_refused():
    data = encode(OTHER_KEY, 0, "hello", {"role": "tripwire", "token": "t"})
    with pytest.raises(ProtocolError, match="wrong MAC"):
        Reader({Role.TRIPWIRE: KEY, Role.AGENT: OTHER_KEY}).feed(data)


def test_a_replayed_frame_is_refused():
    first = encode(KEY, 1, "look", {"at": 1})
    reader = _greeted_reader()
    assert reader.feed(first) == [("look", {"at": 1})]
    with pytest.raises(ProtocolError, match="frame 1 came where frame 2 was due"):
        reader.feed(first)


def test_a_skipped_frame_is_refused():
    reader = _greeted_reader()
    with pytest.raises(ProtocolError, match="frame 2 came where frame 1 was due"):
        reader.feed(encode(KEY, 2, "look", {"at": 1}))


def test_a_bool_seq_is_refused():
    frame = json.loads(encode(KEY, 1, "look", {})[4:])
    frame["seq"] = True
    raw = json.dumps(frame).encode()
    with pytest.raises(ProtocolError, match="was due"):
        Reader({Role.TRIPWIRE: KEY}).feed(_frames(KEY, [_hello()]) + len(raw).to_bytes(4, "big") + raw)


def test_a_first_frame_that_is_not_hello_is_refused():
    with pytest.raises(ProtocolError, match="did not start with a hello"):
        Reader({Role.TRIPWIRE: KEY}).feed(encode(KEY, 0, "flag", {"role": "tripwire"}))


def test_a_hello_from_an_unknown_role_is_refused():
    with pytest.raises(ProtocolError, match="did not start with a hello"):
        Reader({Role.TRIPWIRE: KEY}).feed(encode(KEY, 0, "hello", {"role": "agent", "token": "t"}))


@pytest.mark.parametrize("frame", [
    {"seq": 0, "kind": "hello", "body": {"role": ["tripwire"]}, "mac": "0"},   # an unhashable role
    {"seq": 0, "kind": ["hello"], "body": {"role": "tripwire"}, "mac": "0"},   # an unhashable kind
    {"seq": 0, "kind": "hello", "body": {"role": "tripwire"}, "mac": 0},       # a MAC that is not text
    [0, "hello", {}, "0"],                                                      # not an object
    {"seq": 0, "kind": "hello", "body": {}},                                    # a field missing
])
def test_a_malformed_frame_is_a_protocol_error_not_a_crash(frame):
    raw = json.dumps(frame).encode()
    with pytest.raises(ProtocolError):
        Reader({Role.TRIPWIRE: KEY}).feed(len(raw).to_bytes(4, "big") + raw)


def test_a_deeply_nested_frame_is_a_protocol_error_not_a_recursion_error():
    raw = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ProtocolError):
        Reader({Role.TRIPWIRE: KEY}).feed(len(raw).to_bytes(4, "big") + raw)


def test_a_frame_that_is_not_json_is_refused():
    raw = b"\xff\xfe not json"
    with pytest.raises(ProtocolError, match="not JSON"):
        Reader({Role.TRIPWIRE: KEY}).feed(len(raw).to_bytes(4, "big") + raw)


def test_a_length_over_the_limit_is_refused_before_reading_the_frame():
    with pytest.raises(ProtocolError, match="over the limit"):
        Reader({Role.TRIPWIRE: KEY}).feed((protocol.MAX_FRAME + 1).to_bytes(4, "big"))


def test_the_good_frames_before_a_bad_one_come_with_the_error():
    data = _frames(KEY, [_hello(), ("flag", {"category": "ctypes"})]) + encode(OTHER_KEY, 2, "look", {})
    with pytest.raises(ProtocolError) as refused:
        Reader({Role.TRIPWIRE: KEY}).feed(data)
    assert refused.value.frames == [_hello(), ("flag", {"category": "ctypes"})]


def test_a_broken_reader_reads_nothing_more():
    reader = Reader({Role.TRIPWIRE: KEY})
    with pytest.raises(ProtocolError):
        reader.feed(encode(KEY, 0, "look", {}))
    assert reader.feed(_frames(KEY, [_hello()])) == []


def test_a_reader_with_a_role_reads_the_observers_frames_without_a_hello():
    reader = Reader({Role.AGENT: KEY}, role="agent")
    assert reader.feed(_frames(KEY, [("call", {"id": 1, "op": "kind", "name": "f"}), ("stop", {})])) == [
        ("call", {"id": 1, "op": "kind", "name": "f"}), ("stop", {})]


def test_encode_refuses_an_unknown_kind():
    with pytest.raises(ValueError):
        encode(KEY, 0, "shout", {})


# ---------------------------------------------------------------------------------------------- plain


class _Recorder:
    def __init__(self):
        self.calls = []

    def record(self, name):
        self.calls.append(name)


def _loud(base, recorder, value, methods):
    """An instance of a ``base`` subclass whose ``methods`` record their call and return something else."""
    def make(name):
        def method(self, *args, **kwargs):
            recorder.record(name)
            return {"__int__": 99, "__index__": 99, "__float__": 99.0, "__str__": "forged", "__repr__": "forged",
                    "__iter__": iter(["forged"]), "__eq__": True, "__hash__": 0, "items": iter([("forged", 1)]),
                    "keys": iter(["forged"]), "__getitem__": "forged", "tolist": ["forged"],
                    "__len__": 0, "__format__": "forged", "__bool__": False}[name]
        return method

    cls = type(f"Loud{base.__name__}", (base,), {m: make(m) for m in methods})
    return cls(value)


@pytest.mark.parametrize("base,value,methods", [
    (int, 3, ["__int__", "__index__", "__str__", "__repr__", "__eq__", "__hash__", "__format__", "__bool__"]),
    (float, 2.5, ["__float__", "__str__", "__repr__", "__eq__", "__hash__", "__format__", "__bool__"]),
    (str, "abc", ["__str__", "__repr__", "__iter__", "__eq__", "__hash__", "__getitem__", "__len__", "__format__"]),
    (list, [1, 2], ["__iter__", "__eq__", "__getitem__", "__len__", "__repr__"]),
    (tuple, (1, 2), ["__iter__", "__eq__", "__getitem__", "__len__", "__repr__"]),
    (dict, {"a": 1}, ["__iter__", "__eq__", "__getitem__", "__len__", "items", "keys", "__repr__"]),
])
def test_plain_copies_a_subclass_to_its_exact_base_without_running_its_methods(base, value, methods):
    recorder = _Recorder()
    loud = _loud(base, recorder, value, methods)
    out = plain(loud)
    assert recorder.calls == []
    expected = list(value) if base is tuple else value
    assert type(out) is type(expected)
    assert out == expected


def test_plain_copies_a_subclass_key_without_running_its_methods():
    recorder = _Recorder()
    key = _loud(str, recorder, "k", ["__str__", "__repr__", "__eq__", "__hash__", "__format__"])
    value = {key: 1}
    recorder.calls.clear()  # making the dict hashed the key
    out = plain(value)
    assert recorder.calls == []
    assert [type(k) for k in out] == [str]
    assert out == {"k": 1}


def test_plain_does_not_ask_an_object_its_class():
    calls = []

    class Impostor:
        @property
        def __class__(self):
            calls.append("__class__")
            return int

        def __repr__(self):
            return "impostor"

    out = plain(Impostor())
    assert calls == []
    assert out["repr"] == "impostor"


def test_plain_turns_a_subclass_bool_result_into_an_exact_int():
    class Flag(int):
        pass

    assert type(plain(Flag(1))) is int


@pytest.mark.parametrize("value,expected", [
    (np.float32(1.5), 1.5), (np.int64(7), 7), (np.bool_(True), True), (np.float64(0.25), 0.25),
    (np.arange(4, dtype=np.int32).reshape(2, 2), [[0, 1], [2, 3]]),
    (np.array([0.5, -0.0], dtype=np.float16), [0.5, -0.0]),
    (np.array(["a", "b"]), ["a", "b"]),
])
def test_plain_converts_numpy_scalars_and_arrays_to_exact_builtins(value, expected):
    out = plain(value)
    assert out == expected

    def types(v):
        return [types(x) for x in v] if isinstance(v, list) else type(v)

    def expected_types(v):
        return [expected_types(x) for x in v] if isinstance(v, list) else type(v)

    assert types(out) == expected_types(expected)


def test_plain_keeps_tuples_when_asked_and_unpack_tuples_restores_them():
    value = {"pair": (1, (2, [3, (4,)])), "list": [(5, 6)]}
    packed = plain(value, tuples=True)
    assert packed == {"pair": {"__tuple__": [1, {"__tuple__": [2, [3, {"__tuple__": [4]}]]}]},
                      "list": [{"__tuple__": [5, 6]}]}
    assert json.loads(canonical(packed)) == packed
    assert unpack_tuples(json.loads(canonical(packed))) == value


def test_plain_turns_tuples_into_lists_by_default():
    assert plain((1, (2, 3))) == [1, [2, 3]]


def test_plain_describes_an_unknown_object_by_its_type_and_repr():
    class Thing:
        def __repr__(self):
            return "<a thing>"

    out = plain(Thing())
    assert out == {"__type__": f"{__name__}.test_plain_describes_an_unknown_object_by_its_type_and_repr.<locals>.Thing",
                   "repr": "<a thing>"}


def test_plain_describes_an_object_whose_repr_raises():
    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert plain(Broken())["repr"] == "<unprintable>"


def test_plain_stops_at_a_depth_limit_instead_of_recursing_forever():
    value: list = []
    value.append(value)  # a list that holds itself
    out = plain(value)
    depth = 0
    while isinstance(out, list):
        out, depth = out[0], depth + 1
    assert out == {"__type__": "deeply nested", "repr": "..."}
    assert depth == 51


def test_plain_key_turns_an_int_key_into_its_text():
    assert protocol.plain_key(1) == "1"
    assert type(protocol.plain_key(np.int64(2))) is str
