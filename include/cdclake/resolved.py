"""What a table's resolve hands its writer (`cdclake.iceberg.write`): the resolved rows and
what was found of them, the last truncate, and the names of the columns the MERGE reads
beside the table's own. Neither the fold's rules nor the storage: both sides import it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdclake.placement import Placement

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# a keyed table's resolved row, per TOAST column: the column's value is a placeholder left
# to the table (the MERGE keeps the table's value)
TOAST_PREFIX = "_cdc_toast_"
# the LSN a resolved row is checked with against the table's row and the deleted-keys
# ledger: a re-sent change of a key an earlier batch loaded or deleted is not applied
STALE_CHECK_LSN = "_cdc_check_lsn"
# a keyed table's resolved row carries values of the batch: false only for a deleted key
# whose batch holds no row after of it (its columns are then NULL, and a soft delete keeps
# the values the table has)
HAS_VALUES = "_cdc_has_values"


@dataclass(frozen=True)
class Truncate:
    """The last truncate of a batch: where it is in Kafka and in the WAL."""

    partition: int
    offset: int
    lsn: int | None


@dataclass(frozen=True)
class Resolved:
    """A table's resolved rows (persisted: the load unpersists them) and what the resolve
    found: the last truncate, the rows per deleted flag, the latest source time (epoch
    ms), whether rows may hold TOAST placeholders, where they were resolved
    (`TableResult.resolved_by`) and how many records it set aside."""

    rows: DataFrame
    truncate: Truncate | None
    counts: Mapping[bool, int]
    max_ms: int | None
    toast: bool
    by: Placement
    dead_letters: int = 0
    cached: DataFrame | None = None  # the persisted frame the rows come from, when not the rows
    # the decoded changes the rows were resolved from, kept for a history (the driver's)
    changes: pa.Table | None = None

    @property
    def upserts(self) -> int:
        return self.counts.get(False, 0)

    @property
    def deletes(self) -> int:
        return self.counts.get(True, 0)

    def release(self) -> None:
        """Unpersist the rows (once written)."""
        (self.rows if self.cached is None else self.cached).unpersist()


# ---- a keyed table's history (SCD type 2, `cdclake.resolve.history`) ----------------

Key = tuple[Any, ...]
VALID_FROM, VALID_TO, CURRENT = "_valid_from", "_valid_to", "_is_current"  # its columns


@dataclass
class Version:
    """One version of a row: its columns, from when (source time, ms) and the change that
    opened it; `end`: when it was closed (None: open), `end_lsn` by the change of which
    LSN."""

    key: Key
    values: dict[str, Any]
    start: int
    lsn: int | None
    partition: int
    offset: int
    op: str
    end: int | None = None
    end_lsn: int | None = None  # the LSN of the change that closed it
    # the LSN of the last change of columns outside `history_columns`, taken in place
    updated_lsn: int | None = None


@dataclass(frozen=True)
class Before:
    """What the history held before the batch: each of the batch's keys' latest version
    (open or closed), the values of an old key before a change moved it (old key, the
    change's LSN), the LSN of the last truncate it applied, and each key's highest LSN
    (of a change that opened, changed or closed a version)."""

    latest: Mapping[Key, Version] = field(default_factory=dict)
    as_of: Mapping[tuple[Key, int], dict[str, Any]] = field(default_factory=dict)
    truncated: int | None = None
    high: Mapping[Key, int] = field(default_factory=dict)


@dataclass
class Changed:
    """What a batch does to the history: its new versions (`end` set for those it closed
    too), the versions from before it that it changed (closed, or their untracked columns
    taken in place), and the batch's truncates not re-sent (LSN, source time): the first
    closes every other open version."""

    versions: list[Version] = field(default_factory=list)
    earlier: list[Version] = field(default_factory=list)
    truncates: list[tuple[int | None, int]] = field(default_factory=list)  # (LSN, ms)
