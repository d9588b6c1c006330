"""Hidden test in the older inline form (judged inside the learner's kernel), used by the attack tests."""

import random

from gpucourse.grading.items import Fail, item


@item("h1", points=5, title="hidden inline: secret_sum adds three numbers")
def h1(ns):
    rng = random.Random()
    a, b, c = (rng.randint(1, 10**6) for _ in range(3))
    want = a + b + c
    got = ns.function("secret_sum")(a, b, c)
    if got != want:
        raise Fail(f"secret_sum({a}, {b}, {c}) should be {want}, got {got}")
