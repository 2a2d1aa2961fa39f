"""The placement rule: which step reads a batch, on its planned records alone."""

from __future__ import annotations

import pytest
from cdclake.placement import MEASURED, Placement

LIMIT = MEASURED.driver_read_records
SMALL, BIG = LIMIT, LIMIT + 1
A, D, R = Placement.AUTO, Placement.DRIVER, Placement.RANGES


@pytest.mark.parametrize(
    "placement, records, step",
    [(A, SMALL, D), (A, BIG, R),  # the rule: small in the driver, big range by range
     (D, SMALL, D), (D, BIG, R),  # never a big batch in the driver
     (R, SMALL, R), (R, BIG, R)],
)  # fmt: skip
def test_one_step_reads_a_batch(placement, records, step):
    assert placement.step(records, LIMIT) is step


def test_a_placement_is_named_by_its_value():
    assert Placement("ranges") is Placement.RANGES
    with pytest.raises(ValueError):
        Placement("tasks")
