"""The other half of the attack notebooks (see test_attacks.py: two files, so both xdist workers grade them)."""

import pytest

from .test_attacks import SECOND_HALF, check_outcome, graded  # noqa: F401 (graded: the module's own fixture)


@pytest.mark.parametrize("path", SECOND_HALF, ids=lambda p: p.stem)
def test_attack_gets_its_golden_outcome(path, graded, request):  # noqa: F811
    check_outcome(path, graded.result(request))
