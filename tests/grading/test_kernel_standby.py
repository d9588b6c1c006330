"""The standby and its workers (gpucourse.grading.kernel_standby): killed for real, with everything they started.

The scenarios run in one fresh Python process (the standby forks, and a pytest worker is no place to
fork from), without TensorFlow: the entry functions are small test files given as text.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpucourse.grading.judge import load_tests, make_plan
from gpucourse.grading.runner import _cells

ROOT = Path(__file__).resolve().parents[2]

ENTRIES = '''
import os, subprocess, sys, time

def steps(variables, args, report):
    """Report steps 1..n; at block_at wait (as q5's on_step does) for the kill."""
    print("cells gave x =", variables.get("x"))
    if args.get("daemon"):  # a process in a new session, as a learner's code could leave behind
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        report(["daemon", daemon.pid])
    for k in range(1, args["n"] + 1):
        report(["step", k])
        if k == args.get("block_at"):
            time.sleep(300)
    if args.get("fail"):
        raise ValueError("the entry failed on purpose")
    report(["gpus", os.environ.get("CUDA_VISIBLE_DEVICES")])
'''

SCENARIOS = r'''
import hashlib, json, marshal, os, select, sys, time
from pathlib import Path
import gpucourse.grading as grading
import gpucourse.grading.kernel_standby as reference

# Loaded as the grader loads it: compiled from its text under its own file name.
ks = {"__name__": "gpucourse_standby"}
exec(compile(Path(reference.__file__).read_text(), "<gpucourse-standby>", "exec"), ks)
entries = sys.stdin.read()
standby, stop = ks["start"](preload=())
out = {"published": hasattr(grading, "standby") or hasattr(grading, "stop_standby")}
call = standby

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False

t0 = time.monotonic()
out["killed"] = call(["x = 41 + 1", "%time y = 2"], "/t/entries.py", entries, "steps",
                     {"n": 6, "block_at": 3, "daemon": True}, ["step", 3], 30)
out["killed_s"] = time.monotonic() - t0
daemon = [r[1] for r in out["killed"]["reports"] if r[0] == "daemon"]
out["daemon_alive"] = bool(daemon) and alive(daemon[0])
out["finished"] = call(["x = 1"], "/t/entries.py", entries, "steps", {"n": 2}, ["step", 9], 30)
out["failed"] = call([], "/t/entries.py", entries, "steps", {"n": 1, "fail": True}, None, 30)
out["timeout"] = call([], "/t/entries.py", entries, "steps", {"n": 2, "block_at": 1}, None, 1.5)
out["broken_cell"] = call(["1 / 0", "x = 7"], "/t/entries.py", entries, "steps", {"n": 1}, None, 30)
stop()
out["children_after_stop"] = [int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                              and open(f"/proc/{p}/stat").read().rpartition(")")[2].split()[1] == str(os.getpid())]

# The standby's own loop: only signed requests, each id once.
key = bytearray(os.urandom(32))
req_r, req_w = os.pipe()
resp_r, resp_w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.close(req_w); os.close(resp_r)
        ks["_serve"](req_r, resp_w, key)
    finally:
        os._exit(0)
os.close(req_r); os.close(resp_w)

def request(body, signing_key=bytes(key)):
    data = repr(body).encode()
    os.write(req_w, hashlib.sha256(signing_key + data).hexdigest().encode() + b" " + data + b"\n")

def answers(wait):
    got, end, out = b"", time.monotonic() + wait, []
    while time.monotonic() < end and select.select([resp_r], [], [], end - time.monotonic())[0]:
        chunk = os.read(resp_r, 65536)
        if not chunk:
            break
        got += chunk
        while len(got) >= 4 and len(got) >= 4 + int.from_bytes(got[:4], "big"):
            size = int.from_bytes(got[:4], "big")
            out.append(marshal.loads(got[4:4 + size]))
            got = got[4 + size:]
        if any("ended" in m for m in out):
            break
    return out

job = {"id": "a1", "cells": [], "path": "/t/entries.py", "source": entries, "entry": "steps", "args": {"n": 1},
       "stop_at": None, "timeout_s": 20}
request(job, os.urandom(32))
out["forged_key"] = answers(0.8)
request(job)
out["signed"] = [m.get("id") for m in answers(20)]
request(job)
out["replayed"] = answers(0.8)
request({"id": "q1", "quit": True})
out["quit_exit"] = os.waitpid(pid, 0)[0] == pid
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def outcome():
    run = subprocess.run([sys.executable, "-c", SCENARIOS], input=ENTRIES,
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_worker_is_killed_at_the_report_it_waits_for(outcome):
    killed = outcome["killed"]
    assert killed["ended"] == "killed"
    steps = [r[1] for r in killed["reports"] if r[0] == "step"]
    assert steps == [1, 2, 3]  # nothing after the kill: the worker waited in step 3 and died there
    assert outcome["killed_s"] < 20  # killed at once, not at the time limit


def test_what_the_worker_started_dies_with_it(outcome):
    assert any(r[0] == "daemon" for r in outcome["killed"]["reports"])
    assert outcome["daemon_alive"] is False  # in a new session, yet found through the subreaper


def test_the_worker_runs_the_cells_first_ipython_syntax_included(outcome):
    assert "cells gave x = 42" in outcome["killed"]["log"]
    assert "Wall time" in outcome["killed"]["log"]  # %time ran


def test_a_worker_that_returns_exits_cleanly_without_a_gpu(outcome):
    finished = outcome["finished"]
    assert finished["ended"] == "exit 0"
    assert finished["reports"][-1] == ["gpus", "-1"]


def test_an_error_in_the_entry_reaches_the_log(outcome):
    failed = outcome["failed"]
    assert failed["ended"] == "exit 1"
    assert "ValueError: the entry failed on purpose" in failed["log"]


def test_a_worker_past_its_time_is_killed(outcome):
    assert outcome["timeout"]["ended"] == "timeout"
    assert [r[1] for r in outcome["timeout"]["reports"] if r[0] == "step"] == [1]


def test_a_failing_cell_does_not_stop_the_next(outcome):
    broken = outcome["broken_cell"]
    assert "ZeroDivisionError" in broken["log"]
    assert "cells gave x = 7" in broken["log"]
    assert broken["ended"] == "exit 0"


def test_handed_to_the_guard_alone_and_stopped(outcome):
    assert outcome["published"] is False  # nothing a submission could find on a module
    assert outcome["children_after_stop"] == []


def test_the_standby_serves_signed_requests_once(outcome):
    assert outcome["forged_key"] == []
    assert outcome["signed"] and set(outcome["signed"]) == {"a1"}  # reports and the end, with the request's id
    assert outcome["replayed"] == []
    assert outcome["quit_exit"] is True


def _plan(lab: str):
    path = ROOT / "utils" / "labtests" / f"lab{lab}.py"
    tests = [("public", str(path), path.read_text())]
    plan, errors = make_plan(load_tests(tests))
    assert not errors
    return tests, plan


def test_the_grader_starts_a_standby_only_for_labs_that_kill_a_worker():
    code = [(3, "x = 1")]
    tests, plan = _plan("04")
    cells, config, _ = _cells(code, tests, plan, [], None)
    setup = cells[0].source
    assert setup.index('s["start"]()') < setup.index('g["install"](config, globals(), standby)')  # before the guard
    assert "def _serve(" in setup  # the standby's text, compiled there
    assert json.loads(config)["cells"] == ["x = 1"]
    assert "def run_sealed(" in cells[-1].source and '"cells": [' not in cells[-1].source  # the config comes later
    tests, plan = _plan("01")
    cells, config, _ = _cells(code, tests, plan, [], None)
    assert "def _serve(" not in cells[0].source
    assert "cells" not in json.loads(config)


def test_the_driver_cell_holds_its_config_sealed():
    from gpucourse.grading.kernel_guard import seal
    from gpucourse.grading.runner import seal_driver_cell

    tests, plan = _plan("04")
    cells, config, _ = _cells([(3, "x = 1")], tests, plan, [], None)
    key = bytes(range(32))
    seal_driver_cell(cells[-1], config, key)
    source = cells[-1].source
    assert '"y_restart"' not in source and "crash_at" not in source  # no case in the cell's text
    sealed = bytes.fromhex(source.rsplit(", '", 1)[1].split("'")[0])
    assert seal(key, sealed, hashlib.shake_256, int.from_bytes).decode() == config


def test_the_client_reads_no_global_or_builtin_name():
    """The client runs inside the guard's hook: it may use names captured before the submission ran only."""
    import dis
    import types

    from gpucourse.grading import kernel_standby

    def nested(code):
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield const
                yield from nested(const)

    found = {c.co_name: c for c in nested(kernel_standby.start.__code__)}
    found["_signer"] = kernel_standby._signer.__code__
    assert {"send", "receive", "standby", "stop_standby", "_signer"} <= set(found)
    for name, code in found.items():
        loads = [i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
        assert not loads, f"{name} looks up {loads} at run time, which a submission could rebind"
