"""The placement rule: which steps each member takes."""

from __future__ import annotations

import pytest
from cdclake.resolve.placement import MEASURED, Placement

LIMIT = MEASURED.driver_read_records
SMALL, BIG = LIMIT, LIMIT + 1


@pytest.mark.parametrize(
    "placement, small_in_driver, by_range",
    [(Placement.AUTO, True, True), (Placement.DRIVER, True, False),
     (Placement.RANGES, False, True), (Placement.TASKS, False, False)],
)  # fmt: skip
def test_each_placement_takes_its_steps_of_the_rule(placement, small_in_driver, by_range):
    assert placement.driver_reads(SMALL, LIMIT, from_kafka=True) is small_in_driver
    assert placement.driver_reads(BIG, LIMIT, from_kafka=True, readable=True) is False  # never big
    # another source the driver can read: only when the driver is asked for
    asked = placement is Placement.DRIVER
    assert placement.driver_reads(SMALL, LIMIT, False, readable=True) is asked
    assert placement.driver_reads(SMALL, LIMIT, from_kafka=False) is False  # a DataFrame handed in
    assert placement.by_range is by_range


def test_a_placement_is_named_by_its_value():
    assert Placement("ranges") is Placement.RANGES
    with pytest.raises(ValueError):
        Placement("everywhere")
