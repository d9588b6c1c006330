"""The graded kernel's agent (gpucourse.grading.kernel.agent), driven through the grader's real Link: each op, the
callbacks, the learner's exceptions (BaseException included) as answers, plain results, stop."""

import argparse
import time

import pytest

from gpucourse.grading.protocol import unpack_tuples

from .agent_harness import ThreeArgError, serve_in_process, serve_in_thread


def _soon(seconds=10.0):
    return time.monotonic() + seconds


def _call(link, name, *args, **kwargs):
    return link.call({"op": "call", "name": name, "args": link.pack(list(args)), "kwargs": link.pack(kwargs)},
                     _soon())


@pytest.fixture
def kernel():
    """``(link, ns, errors)``: an agent serving ``ns`` (fill it before the first call)."""
    ns: dict = {}
    with serve_in_thread(ns) as (link, thread, errors):
        yield link, ns, errors
    assert not thread.is_alive(), "the agent did not end after stop"
    assert errors == [], f"serve raised {errors!r}"


# ---------------------------------------------------------------------------------------------- ops


def test_kind_says_missing_function_or_the_type_name(kernel):
    link, ns, _ = kernel
    ns.update(f=lambda: 1, n=3, xs=[1], Cls=int)
    kinds = {name: link.call({"op": "kind", "name": name}, _soon())["ok"] for name in ("f", "n", "xs", "Cls", "nope")}
    assert kinds == {"f": "function", "n": "int", "xs": "list", "Cls": "function", "nope": "missing"}


def test_kind_hides_private_names_and_ipythons_own(kernel):
    link, ns, _ = kernel
    ns.update(_secret=1, In=[""], get_ipython=lambda: None)
    kinds = [link.call({"op": "kind", "name": name}, _soon())["ok"] for name in ("_secret", "In", "get_ipython")]
    assert kinds == ["missing", "missing", "missing"]


def test_value_returns_the_variable_as_plain_data_with_its_tuples(kernel):
    link, ns, _ = kernel
    ns["shape"] = {"dims": (2, 3), "name": "x"}
    answer = link.call({"op": "value", "name": "shape"}, _soon())
    assert unpack_tuples(answer["ok"]) == {"dims": (2, 3), "name": "x"}


def test_value_of_a_missing_name_is_answered_as_raised_key_error(kernel):
    link, _, _ = kernel
    answer = link.call({"op": "value", "name": "nope"}, _soon())
    assert answer["raised"]["type"] == "KeyError"


def test_call_passes_plain_arguments_and_returns_the_result(kernel):
    link, ns, _ = kernel
    ns["scale"] = lambda xs, factor=1: [x * factor for x in xs]
    assert _call(link, "scale", [1, 2], factor=3)["ok"] == [3, 6]


def test_call_result_holding_an_int_subclass_arrives_as_the_exact_int_and_its_methods_never_run(kernel):
    link, ns, _ = kernel
    ran = []

    class Sneaky(int):
        def __int__(self):
            ran.append("__int__")
            return 10

        def __index__(self):
            ran.append("__index__")
            return 10

        def __repr__(self):
            ran.append("__repr__")
            return "10"

        __str__ = __repr__

    ns["answer"] = lambda: {"n": Sneaky(7), "ns": [Sneaky(1)]}
    result = _call(link, "answer")["ok"]
    assert result == {"n": 7, "ns": [1]}
    assert type(result["n"]) is int
    assert ran == []


def test_call_result_that_is_not_plain_data_is_described_by_its_type(kernel):
    link, ns, _ = kernel
    thing = object()
    ns["make"] = lambda: thing
    assert _call(link, "make")["ok"] == {"__type__": "builtins.object", "repr": repr(thing)}


def test_call_result_with_a_lone_surrogate_is_answered(kernel):
    link, ns, _ = kernel
    ns["name"] = lambda: b"caf\xe9".decode("utf-8", "surrogateescape")
    assert _call(link, "name")["ok"] == "caf\udce9"


def test_call_result_that_cannot_be_sent_is_answered_as_raised_and_the_agent_keeps_serving(kernel):
    link, ns, _ = kernel
    ns.update(huge=lambda: 10 ** 5000, small=lambda: 1)  # more digits than int's text conversion allows
    answer = _call(link, "huge")
    assert answer["raised"]["type"] == "ValueError"
    assert _call(link, "small")["ok"] == 1


def test_load_builds_a_module_whose_fixture_gets_the_learners_namespace(kernel):
    link, ns, _ = kernel
    ns.update(weights=[1, 2, 3], _hidden=1)
    text = "def total(ns, extra):\n    return sum(ns.value('weights')) + extra, '_hidden' in ns\n"
    loaded = link.call({"op": "load", "module": "lab01", "text": text, "path": "/labtests/lab01_kernel.py"}, _soon())
    assert loaded == {"id": loaded["id"], "ok": None}
    answer = link.call({"op": "fixture", "module": "lab01", "name": "total", "args": [10], "kwargs": {}}, _soon())
    assert unpack_tuples(answer["ok"]) == (16, False)


def test_a_loaded_fixture_that_raises_says_the_checks_file_is_not_the_learners(kernel):
    link, _, _ = kernel
    text = "def boom(ns):\n    raise ValueError('bad case')\n"
    link.call({"op": "load", "module": "m", "text": text, "path": "<gpucourse-tests-m>"}, _soon())
    raised = link.call({"op": "fixture", "module": "m", "name": "boom", "args": [], "kwargs": {}}, _soon())["raised"]
    assert (raised["type"], raised["message"], raised["learner"]) == ("ValueError", "bad case", False)


def test_an_unknown_op_is_answered_as_raised_value_error(kernel):
    link, _, _ = kernel
    raised = link.call({"op": "shell", "name": "x"}, _soon())["raised"]
    assert raised["type"] == "ValueError"
    assert "shell" in raised["message"]


# ---------------------------------------------------------------------------------------------- the learner's exceptions


def test_a_learner_exception_is_answered_with_its_type_classes_message_and_place(kernel):
    link, ns, _ = kernel

    def divide(a, b):
        return a / b

    ns["divide"] = divide
    raised = _call(link, "divide", 1, 0)["raised"]
    assert raised["type"] == "ZeroDivisionError"
    assert raised["mro"] == ["ZeroDivisionError", "ArithmeticError", "Exception", "BaseException", "object"]
    assert raised["message"] == "division by zero"
    assert raised["where"] == {"function": "divide", "line": "return a / b"}
    assert raised["learner"] is True


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_learner_base_exception_is_answered_as_raised_and_the_agent_keeps_serving(kernel, exc_type):
    link, ns, _ = kernel

    def stop():
        raise exc_type("from the learner")

    ns.update(stop=stop, ok=lambda: "still here")
    raised = _call(link, "stop")["raised"]
    assert (raised["type"], raised["message"]) == (exc_type.__name__, "from the learner")
    assert _call(link, "ok")["ok"] == "still here"


def test_a_learner_exception_whose_str_raises_system_exit_is_answered_with_its_place(kernel):
    link, ns, _ = kernel

    class Rude(Exception):
        def __str__(self):
            raise SystemExit("not from here")

    def fail():
        raise Rude()

    ns.update(fail=fail, ok=lambda: 1)
    raised = _call(link, "fail")["raised"]
    assert (raised["type"], raised["message"], raised["where"]["function"]) == ("Rude", "<unprintable>", "fail")
    assert _call(link, "ok")["ok"] == 1


def test_a_learner_exception_whose_class_name_raises_is_answered_with_the_types_own_name(kernel):
    link, ns, _ = kernel

    class Meta(type):
        __name__ = property(lambda cls: (_ for _ in ()).throw(SystemExit("no name")))

    class Nameless(Exception, metaclass=Meta):
        pass

    def fail():
        raise Nameless("x")

    ns.update(fail=fail, ok=lambda: 1)
    raised = _call(link, "fail")["raised"]
    assert (raised["type"], raised["mro"][1]) == ("Nameless", "Exception")
    assert _call(link, "ok")["ok"] == 1


# ---------------------------------------------------------------------------------------------- callbacks


def test_a_callback_runs_in_the_observer_and_its_result_comes_back(kernel):
    link, ns, _ = kernel
    seen = []

    def on_step(step, loss):
        seen.append((step, loss))
        return f"ok {step}"

    ns["train"] = lambda cb, steps: [cb(i, 0.5 * i) for i in range(steps)]
    assert _call(link, "train", on_step, 3)["ok"] == ["ok 0", "ok 1", "ok 2"]
    assert seen == [(0, 0.0), (1, 0.5), (2, 1.0)]


def test_a_callback_is_a_proxy_in_the_kernel_not_the_observers_function(kernel):
    link, ns, _ = kernel

    def secret():
        return 1

    ns["inspect_it"] = lambda cb: [cb.__name__, getattr(cb, "__wrapped__", None) is None, cb.__closure__ is not None]
    name, unwrapped, has_closure = _call(link, "inspect_it", secret)["ok"]
    assert name.startswith("grader_callback_")
    assert (unwrapped, has_closure) == (True, True)  # its closure is the agent's, with the id only


def _raises_in_the_kernel(link, ns, callback):
    def learner(cb):
        try:
            cb()
        except BaseException as exc:  # noqa: BLE001
            return [type(exc).__module__, type(exc).__qualname__, str(exc)]
        return None

    ns["learner"] = learner
    return _call(link, "learner", callback)["ok"]


@pytest.mark.parametrize("exc", [ValueError("bad value"), TimeoutError("too slow"), KeyboardInterrupt("stop")])
def test_a_callbacks_builtin_exception_is_raised_in_the_learners_code(kernel, exc):
    link, ns, _ = kernel

    def callback():
        raise exc

    assert _raises_in_the_kernel(link, ns, callback) == ["builtins", type(exc).__name__, str(exc)]


def test_a_callbacks_exception_of_a_dotted_class_is_raised_as_that_class(kernel):
    link, ns, _ = kernel

    def callback():
        raise argparse.ArgumentTypeError("not a size")

    assert _raises_in_the_kernel(link, ns, callback) == ["argparse", "ArgumentTypeError", "not a size"]


def test_a_callbacks_exception_built_like_tensorflows_op_error_is_raised_as_that_class(kernel):
    link, ns, _ = kernel

    def callback():
        raise ThreeArgError(None, None, "OOM when allocating")

    assert _raises_in_the_kernel(link, ns, callback) == [ThreeArgError.__module__, "ThreeArgError",
                                                         "OOM when allocating"]


def test_a_callbacks_exception_of_a_class_the_kernel_cannot_import_becomes_runtime_error(kernel):
    link, ns, _ = kernel

    class Local(Exception):
        pass

    def callback():
        raise Local("made in a test")

    module, name, message = _raises_in_the_kernel(link, ns, callback)
    assert (module, name) == ("builtins", "RuntimeError")
    assert message.endswith("Local: made in a test")


def test_a_learner_that_lets_a_callbacks_exception_through_is_answered_as_raised(kernel):
    link, ns, _ = kernel

    def callback():
        raise ValueError("the check says no")

    ns["learner"] = lambda cb: cb()
    raised = _call(link, "learner", callback)["raised"]
    assert (raised["type"], raised["message"]) == ("ValueError", "the check says no")


# ---------------------------------------------------------------------------------------------- serving


def test_stop_ends_serve():
    ns = {"f": lambda: 1}
    with serve_in_thread(ns) as (link, thread, errors):
        assert _call(link, "f")["ok"] == 1
        link.stop()
        thread.join(5)
        assert not thread.is_alive()
        assert errors == []


def test_the_agent_raises_a_look_event_before_and_after_every_call():
    with serve_in_process() as (link, _):
        counts = [link.call({"op": "call", "name": "looks", "args": [], "kwargs": {}}, _soon())["ok"]
                  for _ in range(3)]
    assert counts == [1, 3, 5]  # each call sees its own "before" look and every earlier call's two


def test_an_interrupt_reported_after_a_whole_frame_was_written_does_not_break_the_numbering():
    """``sendall`` runs the signal handlers after its last write: a KeyboardInterrupt can come out of it although
    the frame went out whole. The next frame must carry the next number, or the observer drops the agent."""
    prelude = """
        import socket
        _armed = [False]
        _sendall = socket.socket.sendall
        def _sendall_then_interrupted(self, data, *args):
            _sendall(self, data, *args)
            if _armed[0]:
                _armed[0] = False
                raise KeyboardInterrupt
        socket.socket.sendall = _sendall_then_interrupted
        def arm():
            _armed[0] = True
            return "armed"
    """
    with serve_in_process(prelude) as (link, _):
        first = link.call({"op": "call", "name": "arm", "args": [], "kwargs": {}}, _soon())
        assert first["ok"] == "armed"
        assert link.call({"op": "call", "name": "answer", "args": [], "kwargs": {}}, _soon())["ok"] == 42
