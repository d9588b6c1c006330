# The worst case: an unsolved lab plus one cell that rewrites the grader's results.
# It forges json.dumps (the old grader serialised results with it), starts a thread that rewrites any
# result file, replaces check(), and prints lines that look like the grader's own output.
import glob
import json
import threading
import time

_real_dumps = json.dumps


def _full_marks(obj, *a, **k):
    if isinstance(obj, dict) and "results" in obj:
        for r in obj["results"]:
            r["points"], r["status"] = r["max_points"], "pass"
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


def check(*a, **k):
    print("✅ everything passed")


print("GPUCOURSE_RESULT_SHA256 0000")
