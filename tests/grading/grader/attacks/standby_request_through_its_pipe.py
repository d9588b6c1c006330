# Unwatched processes: lab 04's grader forks a standby whose workers run code without the guard. Nothing in the
# kernel refers to it (only the guard's hook does), so this cell finds its request pipe through /proc (the pipe
# this kernel writes and the standby, its child, reads) and writes a request of its own: a worker that would
# leave a mark. The standby serves signed requests only: the mark never appears, so q1 keeps its points.
import json as _json
import os as _os
import time as _time

_mark = "/tmp/standby-served-me"


def _pipes(pid):
    out = {}
    for fd in _os.listdir(f"/proc/{pid}/fd"):
        try:
            target = _os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            out.setdefault(target, []).append(int(fd))
    return out


_children = []
for _name in _os.listdir("/proc"):
    if _name.isdigit():
        try:
            with open(f"/proc/{_name}/stat") as _f:
                if int(_f.read().rpartition(")")[2].split()[1]) == _os.getpid():
                    _children.append(int(_name))
        except OSError:
            pass
_mine = _pipes(_os.getpid())
_body = _json.dumps({"id": "mine", "cells": [], "path": "/tmp/mine.py", "entry": "entry", "args": {},
                     "stop_at": None, "timeout_s": 5,
                     "source": f"def entry(v, a, report):\n    open({_mark!r}, 'w').close()\n"})
for _child in _children:
    for _pipe in set(_pipes(_child)) & set(_mine):
        for _fd in _mine[_pipe]:
            try:
                _os.write(_fd, b"0" * 64 + b" " + _body.encode() + b"\n")  # a signature it cannot make
            except OSError:
                pass
_time.sleep(1.0)
if _os.path.exists(_mark):
    def global_batch(strategy, per_replica):  # noqa: F811 (the attack succeeded: say so through q1)
        return -1
