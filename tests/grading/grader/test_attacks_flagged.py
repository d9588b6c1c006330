"""The other half of the attack notebooks (see test_attacks.py: two files, so both xdist workers grade them)."""

import pytest

from .test_attacks import FLAGGED, check_attack


@pytest.mark.parametrize("path", FLAGGED, ids=lambda p: p.stem)
def test_attack_gets_its_golden_outcome(path, tmp_path):
    check_attack(path, tmp_path)
