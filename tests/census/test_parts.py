"""The census's parts are registered once: the names the settings offer (the catalog's, read with
no torch) are the parts :mod:`headscope.census` runs, in the same order."""

from headscope import census
from headscope.apps.settings import CensusSettings
from headscope.catalog import CENSUS_PARTS


def test_the_settings_offer_exactly_the_registered_parts_in_order():
    assert tuple(census.PARTS) == CENSUS_PARTS == CensusSettings().parts
    assert all(callable(part) for part in census.PARTS.values())
