# A kernel that breaks its own messages: isinstance says True for anything (through vars() of builtins, no
# visible assignment) and json in sys.modules is a fake. Under the old grader this forged what its driver
# serialised; now the kernel can no longer answer Jupyter at all: its cell never reports that it ended, and the
# run stops at the cells' time limit with nothing graded (an error, never a mark).
import sys
import types

vars(__import__("builtins"))["isinstance"] = lambda obj, cls: True
fake = types.ModuleType("json")
fake.dumps = lambda *a, **k: "{}"
fake.loads = lambda *a, **k: {}
sys.modules["json"] = fake
