"""Every wrong-answer fixture loses exactly the item it targets, with the golden message (see item_fixtures).

Labs 01-04 here, 05-08 in test_item_fixtures_05_08.py: two files, so that pytest-xdist (--dist loadfile)
runs the two halves, one kernel per lab, on both cores.
"""

import pytest

from tests.ahead import Ahead

from .item_fixtures import expected, fixture_files, run_lab

FILES = [p for lab in ("01", "02", "03", "04") for p in fixture_files(lab)]


def lab_of(path) -> str:
    return path.parent.name[3:]


@pytest.fixture(scope="module")
def kernels():
    """One kernel per lab (run_lab), the next lab's already running while this lab's fixtures are checked
    (tests/ahead.py: a lab's kernel waits on its fresh processes and simulated stages)."""
    ahead = Ahead(run_lab, "path", key=lab_of)
    yield ahead
    ahead.close()


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"lab{lab_of(p)}/{p.stem}")
def test_fixture_loses_exactly_its_item(path, kernels, request):
    check_fixture(path, kernels.result(request))


def check_fixture(path, out: dict) -> None:
    """``out``: run_lab's JSON for the fixture's lab."""
    lab = lab_of(path)
    want = expected(path)
    assert all(r["status"] == "pass" for r in out["baseline"].values()), \
        f"the solution of lab {lab} does not pass every item: {out['baseline']}"
    got = out["fixtures"][path.name]
    assert "setup_error" not in got, f"the fixture itself raised: {got.get('setup_error')}"
    target = got["results"][want["item"]]
    assert target["status"] == want["status"], f"{want['item']}: expected {want['status']}, got {target}"
    for fragment in want.get("message", []):
        assert fragment in target["message"], f"{want['item']}'s message lacks {fragment!r}: {target['message']}"
    others = {k: r for k, r in got["results"].items() if k != want["item"] and r["status"] != "pass"}
    assert not others, f"the fixture should lose only {want['item']}, but also: {others}"
