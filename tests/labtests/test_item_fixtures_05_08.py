"""Wrong-answer fixtures of labs 05-09 (the same test as test_item_fixtures.py, on the other xdist worker)."""

import pytest

from .item_fixtures import fixture_files
from .test_item_fixtures import check_fixture, kernels, lab_of  # noqa: F401 (kernels: the module's own fixture)

FILES = [p for lab in ("05", "06", "07", "08", "09") for p in fixture_files(lab)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"lab{lab_of(p)}/{p.stem}")
def test_fixture_loses_exactly_its_item(path, kernels, request):  # noqa: F811
    check_fixture(path, kernels.result(request))


def test_the_two_files_cover_every_fixture():
    from .test_item_fixtures import FILES as FIRST

    assert sorted(FIRST + FILES) == fixture_files()
