"""The kernel-side guard, unit-tested in a fresh interpreter (its audit hook cannot be removed) and its channel."""

import dis
import hashlib
import os
import subprocess
import sys
import textwrap
import types

from gpucourse.grading import kernel_guard
from gpucourse.grading.channel import Channel
from gpucourse.grading.kernel_guard import GUARD_FILENAME, seal

#: Functions the hook runs after the submission's code: they may use closure variables only.
RUNTIME = {"plain", "caller", "origin", "where", "emit", "_mac", "_sha256_hex", "compare", "watchdog", "threads_left", "report",
           "on_phase", "on_grader_event", "handle", "hook", "helper", "one", "keeper", "register", "frozen",
           "protected_path"}


def _nested(code):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested(const)


def test_the_hook_reads_no_global_or_builtin_name():
    found = {c.co_name: c for c in _nested(kernel_guard.install.__code__)}
    assert RUNTIME <= set(found), f"missing functions: {RUNTIME - set(found)}"
    for name in RUNTIME:
        loads = [i.argval for i in dis.get_instructions(found[name]) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
        assert not loads, f"{name} looks up {loads} at run time, which a submission could rebind"


SCRIPT = r'''
import hashlib, sys
src, address = sys.argv[1], sys.argv[2]
DRIVER = """
import sys
holder = []
sys.audit("gpucourse.config", b"abc", holder)  # unsealed once
sys.audit("gpucourse.config", b"abc", holder)  # and never again
sys.audit("gpucourse.phase", "begin", "")
sys.audit("gpucourse.phase", "item", "public:q1")
sys.audit("gpucourse.observed", "public:q1", holder[0].hex())
class Sub(str):
    pass
asked = []
sys.audit("gpucourse.worker", ([Sub("a str subclass")],), asked)  # never handed to the standby
print("WORKER", *asked[0])
sys.audit("gpucourse.phase", "end", "")
"""
DRIVER_SHA256 = hashlib.sha256(DRIVER.encode()).hexdigest()
g = {"__name__": "gpucourse_guard"}
exec(compile(open(src).read(), GUARD_FILENAME, "exec"), g)
PROTECTED = sys.argv[3]
g["install"]({"address": address, "preload_defaults": False, "preload": ["json", "hashlib", "gpucourse.distribute",
                                                                          "gpucourse.multiworker"],
              "answer_helpers": ["gpucourse.multiworker.visible_gpu_ids"], "driver_files": ["<driver>"],
              "driver_sha256": [DRIVER_SHA256],
              "grader_files": ["<grader>"], "protected_files": [PROTECTED]})
exec(compile("open(PROTECTED).read()", "<grader>", "exec"), {"PROTECTED": PROTECTED})  # the grader's own read
LEARNER = """
import builtins, gc, importlib, json, sys, threading, time, types
import collections, dataclasses
collections.namedtuple("P", "x y")                    # library code that uses sys._getframe: not reported
dataclasses.make_dataclass("D", ["a"])                 # library code that uses exec: not reported
setattr(__import__("json"), "dumps", lambda *a, **k: "{}")
importlib.import_module("hashlib").sha256 = None
from gpucourse import distribute
distribute.CrossDeviceChoice.__repr__ = lambda self: "x"
distribute.strategy_devices.__code__ = (lambda n=None, device_type=None: []).__code__
class Fake(types.ModuleType):
    pass
sys.modules["json"].__class__ = Fake
def peek():
    return getattr(sys, "_get" + "frame")(1)
peek()
importlib.import_module("inspect").currentframe()
try:
    1 / 0
except ZeroDivisionError as exc:
    exc.__traceback__.tb_frame
import io, traceback
try:
    1 / 0
except ZeroDivisionError:
    traceback.print_exc(file=io.StringIO())              # printing a traceback is not introspection
gc.get_referrers(peek)
from gpucourse import multiworker
multiworker.visible_gpu_ids("0,1", 4)
import atexit
atexit.register(print)
threading.Thread(target=lambda: time.sleep(60), daemon=True).start()
try:
    sys.addaudithook(lambda *a: None)
except Exception:
    pass
exec("1 + 1")
import pathlib
pathlib.Path(PROTECTED).read_text()                    # reading the tests, through a library
compile("x = 1", "<driver>", "exec")                  # other code under the driver's name
sys.audit("gpucourse.observed", "public:q1", "forged")
compile(DRIVER, "<driver>", "exec")                  # the driver's own text first: the grader's compile is reported
(lambda: 0).__code__.replace(co_filename="<driver>")  # code made under the driver's name
open("/proc/self/mem", "rb").close()                  # a process's memory
open(b"/proc/self/mem", "rb").close()                 # also by a bytes path
import ctypes
ctypes.CDLL(None).getpid()                            # ctypes through its own Python wrappers
CALLS = []
class Sneaky(str):                                    # would run in the hook if the guard compared it there
    def __eq__(self, other):
        CALLS.append("eq")
        return str.__eq__(self, other)
    def __hash__(self):
        CALLS.append("hash")
        return str.__hash__(self)
code = compile("y = 1", "<plain>", "exec").replace(co_filename=Sneaky("<driver>"))
CALLS.clear()
exec(code, {})                                        # a code object whose file name is not a str
print("SNEAKY CALLS", CALLS)
sys.audit("gpucourse.config", b"abc", [])            # only the driver's frames may ask
vars(builtins)["isinstance"] = lambda o, c: True      # the hook must not care about these
builtins.len = lambda x: 0
builtins.repr = lambda x: "forged"
"""
exec(compile(LEARNER, "/tmp/ipykernel_0/cell.py", "exec"), {"__name__": "__main__", "PROTECTED": PROTECTED,
                                                            "DRIVER": DRIVER})
exec(compile(DRIVER, "<driver>", "exec"), {})
'''


def test_guard_reports_each_attack_through_an_authenticated_channel(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(f"GUARD_FILENAME = {GUARD_FILENAME!r}\n" + SCRIPT)
    tests = tmp_path / "lab99.py"
    tests.write_text("SECRET = 1\n")
    channel = Channel().start()
    try:
        proc = subprocess.run([sys.executable, str(script), kernel_guard.__file__, channel.address, str(tests)],
                              text=True, capture_output=True, timeout=120,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert channel.wait_end(10), (channel.records, channel.problems)
    finally:
        channel.close()
    assert channel.problems == []
    kinds = [r.kind for r in channel.records]
    assert kinds[0] == "ready" and kinds[-1] == "end"
    events = [r.detail for r in channel.records if r.kind == "event"]
    text = "\n".join(map(str, events))
    assert "'introspection', 'sys._getframe', 'peek:" in text           # through getattr
    assert text.count("'introspection', 'sys._getframe'") == 2          # and through importlib + inspect
    assert text.count("reads .tb_frame") == 1 and "gc.get_referrers" in text
    assert "'helper', 'gpucourse.multiworker.visible_gpu_ids'" in text
    assert "'atexit', 'atexit.register'" in text
    assert "sys.addaudithook (refused)" in text
    assert "'dynamic-code', 'exec'" in text and "'dynamic-code', 'compile'" in text
    assert "'forged', 'gpucourse.observed'" in text
    assert "'forged', 'gpucourse.config'" in text                       # from the submission's frame
    assert "'forged', \"asked for the grader's config again\"" in text
    assert "'forged', \"compiled code under the name of the grader's driver (other code, or a second time)\"" in text
    assert "'forged', \"ran code under the name of the grader's driver\"" in text  # its compile was refused
    assert "'forged', \"made code under the name of the grader's driver\"" in text
    assert text.count("'memory', '/proc/self/mem', '<module>:") == 2
    assert "'ctypes', 'ctypes.dlsym', '<module>:" in text
    assert "'forged', 'ran code whose file name is not a str', '<module>:" in text
    assert "SNEAKY CALLS []" in proc.stdout  # its __eq__/__hash__ never ran in the hook
    assert "WORKER error the check's request for a worker was not plain data" in proc.stdout
    assert "guard-error" not in kinds
    observed = [r.detail for r in channel.records if r.kind == "observed"]
    assert tuple(observed[-1]) == ("public:q1", seal(channel.key, b"abc", hashlib.shake_256, int.from_bytes).hex())
    assert text.count("'reads-tests'") == 1 and "lab99.py', '<module>:" in text  # the learner's read only
    assert "namedtuple" not in text and "make_dataclass" not in text and "_process_class" not in text
    changed = [c for r in channel.records if r.kind == "changed" for c in r.detail[1]]
    names = {name for _, name in changed}
    assert {"json.dumps", "hashlib.sha256", "builtins.isinstance", "builtins.len", "builtins.repr",
            "the class of module json"} <= names, names
    assert "gpucourse.distribute.CrossDeviceChoice.__repr__" in names  # a dataclass: replaced, not added
    assert any("__code__ of gpucourse.distribute.strategy_devices" in n for n in names), names
    phases = [tuple(r.detail) for r in channel.records if r.kind == "phase"]
    assert phases == [("begin", ""), ("item", "public:q1")]
    assert len([r for r in channel.records if r.kind == "observed"]) == 1
    threads = [r.detail for r in channel.records if r.kind == "threads"]
    assert threads and "<lambda>" in threads[0][0]


def test_guard_source_uses_the_standard_library_only():
    tree_src = textwrap.dedent(open(kernel_guard.__file__).read())
    imports = {line.split()[1].split(".")[0] for line in tree_src.splitlines()
               if line.strip().startswith(("import ", "from ")) and not line.strip().startswith("from __future__")}
    assert imports <= set(sys.stdlib_module_names), imports - set(sys.stdlib_module_names)
