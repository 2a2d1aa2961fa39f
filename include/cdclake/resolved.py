"""What a table's resolve hands its writer (`cdclake.iceberg.write`): the resolved rows and
what was found of them, the last truncate, and the names of the columns the MERGE reads
beside the table's own. Neither the fold's rules nor the storage: both sides import it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdclake.placement import Placement

if TYPE_CHECKING:
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

    @property
    def upserts(self) -> int:
        return self.counts.get(False, 0)

    @property
    def deletes(self) -> int:
        return self.counts.get(True, 0)

    def release(self) -> None:
        """Unpersist the rows (once written)."""
        (self.rows if self.cached is None else self.cached).unpersist()
