# Stdlib replacement without a visible assignment: builtins through vars(), json through sys.modules.
import sys
import types

vars(__import__("builtins"))["isinstance"] = lambda obj, cls: True
fake = types.ModuleType("json")
fake.dumps = lambda *a, **k: "{}"
fake.loads = lambda *a, **k: {}
sys.modules["json"] = fake
