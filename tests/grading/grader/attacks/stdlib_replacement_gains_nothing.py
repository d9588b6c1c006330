# Stdlib replacement (made moot by grading v2): the worst case and every other route tried, in one cell.
# An unsolved lab plus one cell that forges json.dumps (the old grader serialised results with it), starts a
# thread that rewrites any result file, replaces hashlib.sha256 and os.replace through importlib, swaps the
# notebook's own __builtins__ for a dict whose compile rewrites the grader's later cells, replaces check(),
# prints lines that look like the grader's own output, and answers q4 wrongly. The observer judges q4 on the
# plain data it received: none of this reaches it.
import builtins
import glob
import importlib
import json
import threading
import time

_real_dumps = json.dumps


def _full_marks(obj, *a, **k):
    if isinstance(obj, dict):
        for r in obj.get("results", []) if isinstance(obj.get("results"), list) else []:
            r["points"], r["status"] = r["max_points"], "pass"
        if "raised" in obj and "id" in obj:  # an answer on its way to the grader
            obj.pop("raised")
            obj["ok"] = 4
    return _real_dumps(obj, *a, **k)


json.dumps = _full_marks


def _forge():
    while True:
        for p in glob.glob("result-*.json") + glob.glob("/tmp/**/result-*.json", recursive=True):
            try:
                d = json.load(open(p))
                for r in d.get("results", []):
                    r["points"], r["status"] = r["max_points"], "pass"
                json.dump(d, open(p, "w"))
            except Exception:
                pass
        time.sleep(0.01)


threading.Thread(target=_forge, daemon=True).start()

hashlib = importlib.import_module("hashlib")
_real_sha = hashlib.sha256
hashlib.sha256 = lambda data=b"", **k: _real_sha(b"forged")
importlib.import_module("os").replace = lambda src, dst: None

_real_compile = builtins.compile


def _compile(source, filename, *args, **kwargs):
    if isinstance(source, str) and "gpucourse" in str(filename):
        source = source.replace('"raised": _describe(exc, plain)', '"ok": 4') + "\n"
    return _real_compile(source, filename, *args, **kwargs)


__builtins__ = dict(vars(builtins), compile=_compile)


def check(*a, **k):
    print("✅ everything passed")


def visible_gpu_count(value, physical):
    raise ValueError("not written yet, but the forged serialisers say 4")


print("GPUCOURSE_RESULT_SHA256 0000")
