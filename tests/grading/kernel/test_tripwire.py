"""The graded kernel's tripwire (gpucourse.grading.kernel.tripwire), each test in a fresh process: what the learner's
code does is flagged by category and place, what libraries and the grader do is not, looks report what changed,
and the hook neither runs the learner's code nor fails silently."""

import pytest

from .tripwire_harness import PROTOCOL_SRC, run, sha256


def _one_look(result, at):
    looks = [look for look in result.looks() if look["at"] == at]
    assert len(looks) == 1, result.records
    return looks[0]


# ---------------------------------------------------------------------------------------------- flagged


def test_it_says_hello_then_nothing_for_code_that_does_nothing_of_note():
    result = run("x = [i * i for i in range(10)]\nprint(sum(x))\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "285\n"
    assert [kind for kind, _ in result.records] == ["hello"]


@pytest.mark.parametrize("line,detail", [
    ("import sys; sys._getframe()", "sys._getframe"),
    ("import sys; sys._current_frames()", "sys._current_frames"),
    ("import inspect; inspect.stack()", "sys._getframe"),          # through the wrapper: the learner's line
    ("import inspect; inspect.currentframe()", "sys._getframe"),
    ("import traceback; next(traceback.walk_stack(None))", "sys._getframe"),
    ("import logging; logging.currentframe()", "sys._getframe"),
    ("import gc; gc.get_objects()", "gc.get_objects"),
    ("import gc; gc.get_referrers(gc)", "gc.get_referrers"),
])
def test_introspection_by_the_learner_is_flagged_at_the_learners_line(line, detail):
    result = run(f"x = 1\n{line}\n")
    assert ("introspection", detail, result.at(2)) in result.flags()


def test_a_tracebacks_frame_read_by_the_learner_is_flagged():
    result = run("""\
        try:
            1 / 0
        except ZeroDivisionError as exc:
            frame = exc.__traceback__.tb_frame
    """)
    assert result.flags() == [("introspection", "read .tb_frame", result.at(4))]


def test_a_generators_frame_read_by_the_learner_is_flagged():
    result = run("""\
        def gen():
            yield 1
        g = gen()
        frame = g.gi_frame
    """)
    assert result.flags() == [("introspection", "read .gi_frame", result.at(4))]


def test_introspection_in_a_learners_function_names_the_function():
    result = run("""\
        import sys
        def peek():
            return sys._getframe(1)
        peek()
    """)
    assert result.flags() == [("introspection", "sys._getframe", result.at(3, "peek"))]


def test_the_same_place_is_flagged_once():
    result = run("import sys\nfor _ in range(5):\n    sys._getframe()\n")
    assert result.flags() == [("introspection", "sys._getframe", result.at(3))]


def test_exec_of_a_string_is_flagged_as_dynamic_code():
    result = run("x = 1\nexec('y = 2')\n")
    assert result.flags() == [("dynamic-code", "compile", result.at(2)), ("dynamic-code", "exec", result.at(2))]


def test_compile_of_a_string_is_flagged_as_dynamic_code():
    result = run("code = compile('1 + 1', '<mine>', 'eval')\n")
    assert result.flags() == [("dynamic-code", "compile", result.at(1))]


def test_code_named_like_the_graders_but_not_its_text_is_flagged():
    result = run("exec(compile('x = 1', '<gpucourse-agent>', 'exec'))\n", grader_code=[sha256("y = 2")])
    assert result.flags() == [("dynamic-code", "compile", result.at(1)), ("dynamic-code", "exec", result.at(1))]


def test_a_profiler_installed_by_the_standard_librarys_profile_is_flagged():
    result = run("import profile\nprofile.Profile().runcall(sum, [1, 2])\n")
    assert ("profiler", "sys.setprofile", result.at(2)) in result.flags()


def test_a_profiler_installed_through_threading_is_flagged_when_a_thread_starts():
    result = run("""\
        import threading
        threading.setprofile(lambda *args: None)
        t = threading.Thread(target=sum, args=([1],))
        t.start()
        t.join()
    """)
    assert "profiler" in result.categories()


def test_a_tracer_is_flagged():
    result = run("import sys\nsys.settrace(lambda *args: None)\nsys.settrace(None)\n")
    assert ("profiler", "sys.settrace", result.at(2)) in result.flags()


def test_a_foreign_function_loaded_with_ctypes_is_flagged():
    result = run("import ctypes\npid = ctypes.CDLL(None).getpid()\n")
    assert ("ctypes", "ctypes.dlopen", result.at(2)) in result.flags()
    assert ("ctypes", "ctypes.dlsym", result.at(2)) in result.flags()


def test_reading_memory_by_address_with_ctypes_is_flagged():
    result = run("import ctypes\nraw = ctypes.string_at(id(1), 8)\n")
    assert result.flags() == [("ctypes", "ctypes.string_at", result.at(2))]


def test_opening_the_process_memory_is_flagged():
    result = run("fh = open('/proc/self/mem', 'rb')\nfh.close()\n")
    assert result.flags() == [("memory", "opened /proc/self/mem", result.at(1))]


def test_opening_the_process_memory_by_a_bytes_path_is_flagged():
    result = run("fh = open(b'/proc/self/mem', 'rb')\nfh.close()\n")
    assert result.flags() == [("memory", "opened /proc/self/mem", result.at(1))]


def test_signalling_a_process_is_flagged():
    result = run("import os\nos.kill(os.getpid(), 0)\n")
    assert result.flags() == [("process", "os.kill", result.at(2))]


@pytest.mark.parametrize("python", ["venv", "base"])
def test_starting_a_process_with_subprocess_is_flagged_at_the_learners_line(python):
    """Also in a Python without a virtual environment (a container's), where the prefix holds the stdlib."""
    result = run("import subprocess\nsubprocess.run(['true'])\n", python=python)
    assert ("process", "subprocess.Popen", result.at(2)) in result.flags()


def test_another_audit_hook_is_flagged():
    result = run("import sys\nsys.addaudithook(lambda event, args: None)\n")
    assert result.flags() == [("audit-hook", "sys.addaudithook", result.at(2))]


# ---------------------------------------------------------------------------------------------- not flagged


def test_importing_modules_is_not_dynamic_code(tmp_path):
    result = run("""\
        import pathlib, sys
        pathlib.Path('mine.py').write_text('VALUE = 3\\n')
        sys.path.insert(0, '.')
        import colorsys, json.tool, mine
        print(mine.VALUE)
    """)
    assert result.stdout == "3\n", result.stderr
    assert result.flags() == []


def test_a_module_that_reads_frames_while_it_is_imported_does_not_flag_its_importer():
    result = run("import logging\n")  # logging reads a function's __code__ when imported
    assert result.flags() == []


def test_importing_ctypes_is_not_a_ctypes_call():
    result = run("import ctypes\n")
    assert result.flags() == []


def test_a_warning_from_a_library_is_not_flagged():
    result = run("""\
        import locale, warnings
        warnings.simplefilter('always')
        locale.getdefaultlocale()  # the standard library warns that it is deprecated
    """)
    assert "DeprecationWarning" in result.stderr
    assert result.flags() == []


def test_code_a_library_generates_is_not_flagged():
    result = run("""\
        import collections, dataclasses
        Point = collections.namedtuple('Point', 'x y')
        @dataclasses.dataclass
        class Case:
            n: int = 1
        print(Point(1, 2).x + Case().n)
    """)
    assert result.stdout == "2\n"
    assert result.flags() == []


def test_the_graders_own_code_compiled_and_run_from_a_cell_is_not_flagged():
    text = "VALUE = 41 + 1\n"
    result = run(f"""\
        scope = {{}}
        exec(compile({text!r}, '<gpucourse-agent>', 'exec'), scope)
        print(scope['VALUE'])
    """, grader_code=[sha256(text)])
    assert result.stdout == "42\n"
    assert result.flags() == []


def test_the_graders_text_is_allowed_once_per_compile():
    text = "VALUE = 1\n"
    result = run(f"""\
        code = compile({text!r}, '<gpucourse-agent>', 'exec')
        exec(code, {{}})
        exec(code, {{}})
    """, grader_code=[sha256(text)])
    assert result.flags() == [("dynamic-code", "exec", result.at(3))]


def test_the_agent_cells_protocol_text_is_the_graders_code():
    """The agent's cell compiles the protocol's text under <gpucourse-protocol>: its digest is in grader_code."""
    result = run(f"scope = {{}}\nexec(compile({PROTOCOL_SRC!r}, '<gpucourse-protocol>', 'exec'), scope)\n",
                 grader_code=[sha256(PROTOCOL_SRC)])
    assert result.flags() == []


# ---------------------------------------------------------------------------------------------- looks


def test_a_look_before_anything_changed_reports_nothing():
    result = run("import sys\nsys.audit('gpucourse.look', 7)\n")
    assert result.looks() == [{"at": 7, "signals": [], "threads": [], "profiler": False, "tracer": False}]


def test_a_look_reports_a_python_signal_handler_set_after_install():
    result = run("""\
        import signal, sys
        signal.signal(signal.SIGUSR1, lambda *args: None)
        sys.audit('gpucourse.look', 1)
    """)
    import signal

    assert _one_look(result, 1)["signals"] == [str(int(signal.SIGUSR1))]


def test_a_look_reports_a_profiler_and_a_tracer():
    result = run("""\
        import sys
        sys.setprofile(lambda *args: None)
        sys.audit('gpucourse.look', 1)
        sys.setprofile(None)
        sys.settrace(lambda *args: None)
        sys.audit('gpucourse.look', 2)
        sys.settrace(None)
    """)
    assert (_one_look(result, 1)["profiler"], _one_look(result, 1)["tracer"]) == (True, False)
    assert (_one_look(result, 2)["profiler"], _one_look(result, 2)["tracer"]) == (False, True)


def test_a_look_reports_a_thread_started_after_install_by_what_it_runs():
    result = run("""\
        import sys, threading
        done = threading.Event()
        def worker():
            done.wait()
        threading.Thread(target=worker, name='gpucourse-agent-reader', daemon=True).start()
        sys.audit('gpucourse.look', 1)
        done.set()
    """)
    assert _one_look(result, 1)["threads"] == ["worker (learner.py)"]


def test_a_look_does_not_report_the_graders_own_threads():
    text = "def read():\n    done.wait()\n"
    result = run(f"""\
        import sys, threading
        done = threading.Event()
        grader = {{'done': done}}
        exec(compile({text!r}, '<gpucourse-agent>', 'exec'), grader)
        threading.Thread(target=grader['read'], daemon=True).start()
        sys.audit('gpucourse.look', 1)
        done.set()
    """, grader_code=[sha256(text)])
    assert _one_look(result, 1)["threads"] == []


def test_a_look_does_not_run_a_learners_thread_properties():
    result = run("""\
        import sys, threading
        ran = []
        class Sly(threading.Thread):
            @property
            def name(self):
                ran.append('name')
                return 'gpucourse-hidden'
            @name.setter
            def name(self, value):
                pass
            @property
            def ident(self):
                ran.append('ident')
                return super().ident
        done = threading.Event()
        def worker():
            done.wait()
        Sly(target=worker, daemon=True).start()
        ran.clear()
        sys.audit('gpucourse.look', 1)
        done.set()
        print(ran)
    """)
    assert result.stdout == "[]\n", result.stderr
    assert _one_look(result, 1)["threads"] == ["worker (learner.py)"]


# ---------------------------------------------------------------------------------------------- the hook's own safety


def test_code_whose_file_name_is_a_str_subclass_is_flagged_and_its_methods_never_run():
    result = run("""\
        import sys, types
        ran = []
        class Name(str):
            def startswith(self, *args):
                ran.append('startswith'); return False
            def endswith(self, *args):
                ran.append('endswith'); return False
            def __format__(self, spec):
                ran.append('__format__'); return 'x'
            def __str__(self):
                ran.append('__str__'); return 'x'
            def __eq__(self, other):
                ran.append('__eq__'); return False
            __hash__ = str.__hash__
        peek = lambda: sys._getframe()
        peek = types.FunctionType(peek.__code__.replace(co_filename=Name('hidden.py')), globals())
        peek()
        print(ran)
    """)
    assert result.stdout == "[]\n", result.stderr
    assert ("introspection", "sys._getframe", "code whose file name is not a str") in result.flags()


def test_code_whose_name_is_a_str_subclass_is_flagged_and_its_methods_never_run():
    result = run("""\
        import sys, types
        ran = []
        class Name(str):
            def __format__(self, spec):
                ran.append('__format__'); return 'x'
            def __str__(self):
                ran.append('__str__'); return 'x'
        peek = lambda: sys._getframe()
        peek = types.FunctionType(peek.__code__.replace(co_name=Name('peek')), globals())
        peek()
        print(ran)
    """)
    assert result.stdout == "[]\n", result.stderr
    assert ("introspection", "sys._getframe", "code whose name is not a str") in result.flags()


def test_an_exec_event_with_an_object_that_is_not_code_never_runs_its_attributes():
    result = run("""\
        import sys
        ran = []
        class Fake:
            @property
            def co_filename(self):
                ran.append('co_filename')
                return '<gpucourse-agent>'
        sys.audit('exec', Fake())
        print(ran)
    """)
    assert result.stdout == "[]\n", result.stderr
    assert result.flags() == [("dynamic-code", "exec", result.at(8))]


_FAILING_ENCODE = """\
    protocol = {{"__name__": "gpucourse_protocol"}}
    exec(compile({protocol_src}, "<gpucourse-protocol>", "exec"), protocol)
    encode, failed = protocol["encode"], []
    def encode_failing_once(key, seq, kind, body):
        if kind == "flag" and body.get("category") == "introspection" and not failed:
            failed.append(1)
            raise {error}("the socket is gone")
        return encode(key, seq, kind, body)
    protocol["encode"] = encode_failing_once
    tripwire = {{"__name__": "gpucourse_tripwire"}}
    exec(compile({tripwire_src}, "<gpucourse-tripwire>", "exec"), tripwire)
    tripwire["install"](protocol, {address}, {token}, {key}, ())
"""


def test_an_exception_inside_the_hook_is_flagged_as_a_tripwire_error():
    result = run("import sys\nsys._getframe()\n", install=_FAILING_ENCODE.replace("{error}", "BrokenPipeError"))
    assert result.returncode == 0, result.stderr
    assert result.flags() == [("tripwire-error", "BrokenPipeError in sys._getframe", "")]


def test_the_frame_a_failed_send_did_not_write_does_not_use_up_its_number():
    result = run("import sys\nsys._getframe()\nsys.audit('gpucourse.look', 1)\n",
                 install=_FAILING_ENCODE.replace("{error}", "BrokenPipeError"))
    assert result.broken == ""
    assert [kind for kind, _ in result.records] == ["hello", "flag", "look"]


def test_an_interrupt_inside_the_hook_interrupts_the_learners_code_and_is_not_a_tripwire_error():
    result = run("""\
        import sys
        try:
            sys._getframe()
        except KeyboardInterrupt:
            print('interrupted')
    """, install=_FAILING_ENCODE.replace("{error}", "KeyboardInterrupt"))
    assert result.stdout == "interrupted\n", result.stderr
    assert result.flags() == []


def test_an_error_the_hook_could_not_report_at_once_is_reported_at_the_next_event():
    """At the deepest recursion the learner can reach, the hook itself overflows, and so does sending the
    tripwire-error flag; the error must not be lost."""
    result = run("""\
        import sys
        def down():
            try:
                down()
            except RecursionError:
                sys._getframe()  # at the last frame that still works: the hook has no room left
        down()
        sys.audit('gpucourse.look', 1)
    """)
    assert result.returncode == 0, result.stderr
    assert ("tripwire-error", "RecursionError in sys._getframe", "") in result.flags()


def test_a_look_keeps_the_collector_out_of_the_thread_list_so_it_cannot_deadlock():
    """CPython 3.11 before 3.11.9 deadlocks when a collection inside ``sys._current_frames()`` frees a
    ``threading.local`` (gh-106883; TensorFlow's graphs hold such locals): the old grader's guard hung on it
    (issue 34). Here a collection is forced at every allocation while the tripwire looks: it must return."""
    result = run("""
        import gc, sys, threading

        class Holder:
            pass

        def make_garbage():  # a reference cycle holding a threading.local, as a TensorFlow graph does
            h = Holder(); h.me = h; h.loc = threading.local(); h.loc.x = 1

        def on_gc(phase, info):
            if phase == "stop" and armed:
                make_garbage()

        ev = threading.Event()
        for _ in range(4):
            threading.Thread(target=ev.wait, daemon=True).start()
        gc.callbacks.append(on_gc)
        armed = True
        gc.set_threshold(1)
        for at in range(20):
            make_garbage()
            sys.audit("gpucourse.look", at)
        gc.set_threshold(700)
        armed = False
        print("looked", 20, gc.isenabled())
        """, timeout=30)  # (a deadlock holds the GIL: only the timeout ends it)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "looked 20 True\n"
    assert len(result.looks()) == 20


def test_a_process_started_through_a_frozen_standard_module_is_flagged_at_the_learners_line():
    """``os`` is a frozen module in CPython 3.11 (its frames are ``<frozen os>``): ``os.popen`` is the standard
    library acting for its caller, as ``subprocess`` is, not the import system."""
    result = run("import os\nos.popen('true').read()\n")
    assert result.returncode == 0, result.stderr
    assert ("process", "subprocess.Popen", result.at(2)) in result.flags()


def test_a_forked_child_sends_nothing_on_the_parents_connection():
    """A child shares the parent's socket and its record numbers: its records would corrupt the stream (the
    grader would read every later record as forged). The fork itself is flagged; the child stays quiet."""
    result = run("""
        import os, sys
        pid = os.fork()
        if pid == 0:
            sys._getframe()
            os._exit(0)
        os.waitpid(pid, 0)
        sys._getframe()
        """)
    assert result.returncode == 0, result.stderr
    assert not result.broken, result.broken
    assert [(c, d) for c, d, _ in result.flags()] == [("process", "os.fork"), ("introspection", "sys._getframe")]


@pytest.mark.parametrize("line", [
    "import logging; logging.getLogger('x').warning('honest')",   # findCaller reads frames for the record
    "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()",
    "import traceback; traceback.extract_stack()",                  # summaries, no frame objects
])
def test_honest_logging_and_tracebacks_are_not_flagged(line):
    result = run(line)
    assert result.returncode == 0, result.stderr
    assert result.flags() == [], result.flags()
