"""The placement rule: which steps each member takes."""

from __future__ import annotations

import pytest
from cdclake.placement import Placement
from cdclake.reader import DRIVER_READ_RECORDS

SMALL, BIG = DRIVER_READ_RECORDS, DRIVER_READ_RECORDS + 1


@pytest.mark.parametrize(
    "placement, small_in_driver, by_range, in_tasks",
    [(Placement.AUTO, True, True, True), (Placement.DRIVER, True, False, False),
     (Placement.RANGES, False, True, True), (Placement.TASKS, False, False, True),
     (Placement.SPARK, False, False, False)],
)  # fmt: skip
def test_each_placement_takes_its_steps_of_the_rule(placement, small_in_driver, by_range,
                                                    in_tasks):  # fmt: skip
    assert placement.driver_reads(SMALL, from_kafka=True) is small_in_driver
    assert placement.driver_reads(BIG, from_kafka=True) is False  # never a big batch
    assert placement.driver_reads(SMALL, from_kafka=False) is False  # another source
    assert (placement.by_range, placement.in_tasks) == (by_range, in_tasks)


def test_a_placement_is_named_by_its_value():
    assert Placement("ranges") is Placement.RANGES
    with pytest.raises(ValueError):
        Placement("everywhere")
