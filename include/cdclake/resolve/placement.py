"""Where a batch's changes are read and resolved: one rule for every load, or one place a
caller asks for (the tests run each place, the benchmark compares them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Placement(Enum):
    """Where the changes of a batch are read and resolved.

    `AUTO` is the rule every load follows:

    1. A batch of at most `Tuning.driver_read_records` records from Kafka (and at most
       `DRIVER_READ_BYTES` of them) is read and resolved by the driver: no Spark job
       before the write.
    2. A bigger one is read and resolved range by range, in the Spark task that reads
       each Kafka partition's range.
    3. A topic whose ranges cannot be (a schema change inside a range, more keys than
       `Tuning.range_keys` in one range, a key in two ranges) is read again by Spark
       tasks and resolved by the same code after a shuffle by Kafka key; a topic that
       cannot be grouped by its Kafka key (a configured key, several key schemas, a
       truncate) is resolved in one task.

    The other members ask for one step of the rule: `DRIVER` is step 1, from any source
    the driver can read (`RawSource`; a bigger batch: step 3); `RANGES` starts at step 2
    and `TASKS` at step 3.
    """

    AUTO = "auto"
    DRIVER = "driver"
    RANGES = "ranges"
    TASKS = "tasks"

    def driver_reads(self, records: int, limit: int, from_kafka: bool,
                     readable: bool = False) -> bool:  # fmt: skip
        """Step 1: the driver reads (and resolves) a batch of `records` records, at most
        `limit`, from Kafka, or with `DRIVER` from another source it can read
        (`readable`)."""
        if records > limit:
            return False
        if self is Placement.AUTO:
            return from_kafka
        return self is Placement.DRIVER and (from_kafka or readable)

    @property
    def by_range(self) -> bool:
        """Step 2: Spark tasks read and resolve a big batch range by range."""
        return self in (Placement.AUTO, Placement.RANGES)

    def first_step(self, records: int, limit: int, from_kafka: bool,
                   readable: bool) -> Placement:  # fmt: skip
        """The step that reads a batch of `records` records: `DRIVER` (step 1, as
        `driver_reads` says), else `RANGES` (step 2) when this placement takes it and the
        source is one Spark tasks read range by range (`readable`), else `TASKS`."""
        if self.driver_reads(records, limit, from_kafka, readable):
            return Placement.DRIVER
        return Placement.RANGES if self.by_range and readable else Placement.TASKS


@dataclass(frozen=True)
class Tuning:
    """The thresholds and text searches a load works with, a parameter of `run_batch`
    beside its placement: the defaults are measured (docs/performance.md); tests change
    them to reach each way a batch can take."""

    # A batch of at most this many records is read and resolved by the driver: no Spark
    # job or Python worker before the tables' work, and one process's CPU. Up to here
    # it was faster than range by range, cold (docs/performance.md, "Small batches").
    driver_read_records: int = 50_000
    # A keyed table that holds no row is written by an append that checks no other
    # commit added rows (`append_to_empty`), instead of a MERGE.
    first_load_append: bool = True
    # A MERGE into a table of at least `key_filter_rows` rows, of at most
    # `key_filter_keys` changes, names the values of its key columns in the join
    # condition (`build_merge_sql`), when they are integers or text: 10,000 changes into a
    # 10M-row table took 9.2 s without it. A smaller table is cheaper to join whole than
    # the extra job that collects the keys. Text keys whose literals would pass
    # `key_filter_chars` characters go without. A MERGE of more changes gives each integer
    # key column the range of its values instead (100,000 changes to the newest 5% of a
    # 10M-row table: 2.4-3.1 s with it, 7.0-12.0 s without).
    key_filter_rows: int = 1_000_000
    key_filter_keys: int = 20_000
    key_filter_chars: int = 1_000_000
    # A range whose fold holds more keys than this (an initial snapshot: every record a
    # new key) stops and its topic takes the general path, whose tasks hold ~50,000
    # records each: a task's memory stays bounded (a fold holds a few decoded changes of
    # each key).
    range_keys: int = 100_000
    # A range's fold decodes and folds its read batches this many records at a time
    # (`cdclake.resolve.ranges`): each step is a DuckDB query (~75 ms to plan) and a pass
    # over what the fold holds.
    fold_records: int = 50_000
    # a truncate event's payload has this in its text; a row's own "op" column can match
    # too, which only costs the extra check job
    truncate_text: str = r'"op"\s*:\s*"t"'


MEASURED = Tuning()  # the defaults every load runs with
