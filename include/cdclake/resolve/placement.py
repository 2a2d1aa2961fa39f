"""Where a batch's changes are read and resolved: one rule for every load, or one place a
caller asks for (the tests run each place, the benchmark compares them)."""

from __future__ import annotations

from enum import Enum

from cdclake.kafka.reader import DRIVER_READ_RECORDS


class Placement(Enum):
    """Where the changes of a batch are read and resolved.

    `AUTO` is the rule every load follows:

    1. A batch of at most `DRIVER_READ_RECORDS` records from Kafka (and at most
       `DRIVER_READ_BYTES` of them) is read and resolved by the driver: no Spark job
       before the write.
    2. A bigger one is read and resolved range by range, in the Spark task that reads
       each Kafka partition's range.
    3. A topic whose ranges cannot be (a schema change inside a range, a re-sent
       change, more keys than `RANGE_KEYS` in one range, a record that cannot be applied)
       is read again by Spark tasks and resolved by the same code after a shuffle by
       Kafka key; a topic that cannot be grouped by its Kafka key (a configured key,
       several key schemas, a truncate) is resolved in one task.

    The other members ask for one step of the rule: `DRIVER` is step 1, from any source
    the driver can read (`RawSource`; a bigger batch: step 3); `RANGES` starts at step 2
    and `TASKS` at step 3.
    """

    AUTO = "auto"
    DRIVER = "driver"
    RANGES = "ranges"
    TASKS = "tasks"

    def driver_reads(self, records: int, from_kafka: bool, readable: bool = False) -> bool:
        """Step 1: the driver reads (and resolves) a batch of `records` records from
        Kafka, or with `DRIVER` from another source it can read (`readable`)."""
        if records > DRIVER_READ_RECORDS:
            return False
        if self is Placement.AUTO:
            return from_kafka
        return self is Placement.DRIVER and (from_kafka or readable)

    @property
    def by_range(self) -> bool:
        """Step 2: Spark tasks read and resolve a big batch range by range."""
        return self in (Placement.AUTO, Placement.RANGES)
