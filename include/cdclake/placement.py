"""Where a batch's changes are read and resolved: one rule for every load, or one place a
caller asks for (the tests run each place, the benchmark compares them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Placement(StrEnum):
    """Where the changes of a batch are read and resolved.

    `AUTO` is the rule every load follows, on the batch's planned records alone (before
    any is read):

    1. A batch of at most `Tuning.driver_read_records` records is read and resolved by
       the driver: no Spark job or Python worker before the write. Should its records
       pass `DRIVER_READ_BYTES` as they are read, the driver stops and step 2 reads
       them (a memory bound, not a way of its own: the same rules resolve them).
    2. A bigger one is read and resolved range by range, in the Spark task that reads
       each Kafka partition's range (`cdclake.ranged`).

    The other members ask for one step: `DRIVER` (a bigger batch: step 2), `RANGES`.
    """

    AUTO = "auto"
    DRIVER = "driver"
    RANGES = "ranges"

    def step(self, records: int, limit: int) -> Placement:
        """The step that reads a batch of `records` records (`limit`:
        `Tuning.driver_read_records`): `DRIVER` or `RANGES`."""
        if self is Placement.RANGES or records > limit:
            return Placement.RANGES
        return Placement.DRIVER


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
    # new key) goes on by key hash on local disk (`cdclake.resolve.spill`), folding a
    # bucket of about this many keys at a time: a task's memory stays bounded (a fold
    # holds a few decoded changes of each key).
    range_keys: int = 100_000
    # A range's fold decodes and folds its read batches this many records at a time
    # (`cdclake.resolve.ranges`): each step is a DuckDB query (~75 ms to plan) and a pass
    # over what the fold holds.
    fold_records: int = 50_000


MEASURED = Tuning()  # the defaults every load runs with
