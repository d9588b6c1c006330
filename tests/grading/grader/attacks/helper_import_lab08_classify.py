# Helper import beyond lab 01: lab 08's q5 handed to gpucourse.bottleneck.classify (same rules, same answer).
from gpucourse import bottleneck


def step_verdicts(table):
    ids = [col["id"] for col in table["cols"]]
    rows = [dict(zip(ids, (cell["v"] for cell in row["c"]))) for row in table["rows"]]
    if not rows:
        raise ValueError("the step table has no steps")
    return {"steps": {r["stepnum"]: bottleneck.classify(r).kind for r in rows},
            "overall": bottleneck.classify(rows).kind}
