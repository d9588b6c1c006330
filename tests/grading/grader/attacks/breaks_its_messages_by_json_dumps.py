# A kernel that breaks its own messages: json.dumps, replaced through setattr(__import__(...)), forges every
# object serialised afterwards. The old grader serialised its results with it; now it is what the kernel's own
# Jupyter messages are written with, so the grader receives messages without a header. A grader must end such
# a run with an error (never a mark), not raise.
setattr(__import__("json"), "dumps", lambda *a, **k: '{"status": "pass", "points": 10}')
