"""The placement rule: which steps each member takes, and which step reads a batch."""

from __future__ import annotations

import pytest
from cdclake.kafka.reader import KAFKA, RawSource
from cdclake.ranged import step_for
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


A, D, R, T = Placement.AUTO, Placement.DRIVER, Placement.RANGES, Placement.TASKS
RECORDED = RawSource(lambda kafka: None)  # records Spark tasks read range by range


def handed_in(spark, kafka, ranges):  # a raw records DataFrame made another way
    raise AssertionError("not called")


@pytest.mark.parametrize(
    "placement, records, read, step",
    [(A, SMALL, None, D), (A, BIG, None, R),  # the rule: small in the driver, big by range
     (A, SMALL, RECORDED, R), (A, BIG, RECORDED, R),  # the driver reads only Kafka
     (A, SMALL, handed_in, T), (A, BIG, handed_in, T),  # no ranges to read
     (D, SMALL, None, D), (D, BIG, None, T),  # never a big batch in the driver
     (D, SMALL, RECORDED, D), (D, BIG, RECORDED, T),  # any source it can read
     (D, SMALL, handed_in, T),
     (R, SMALL, None, R), (R, BIG, None, R), (R, SMALL, RECORDED, R), (R, BIG, RECORDED, R),
     (R, SMALL, handed_in, T),  # no ranges to read
     (T, SMALL, None, T), (T, BIG, RECORDED, T), (T, SMALL, handed_in, T)],
)  # fmt: skip
def test_one_step_reads_a_batch(placement, records, read, step):
    """The read by range and the driver's read both ask `step_for`: a batch goes to
    exactly one of them, or to Spark tasks."""
    assert step_for(placement, records, MEASURED, read) is step
    readable = isinstance(KAFKA if read is None else read, RawSource)
    assert placement.first_step(records, LIMIT, read is None, readable) is step
