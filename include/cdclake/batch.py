"""What the tables of one batch share, and what each table's load gives back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from cdclake.config import PipelineConfig, TableConfig
from cdclake.iceberg.deadletters import set_aside
from cdclake.iceberg.write import WrittenBy
from cdclake.kafka.reader import KAFKA, RawSource
from cdclake.kafka.scan import RawScan
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.placement import Placement, Tuning
from cdclake.spark import COMPILE_TARGET_ROWS, restore_settings

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from cdclake.ranged import FailedTopic, RangedTopic

log = logging.getLogger(__name__)


class LoadStatus(StrEnum):
    """What a table's load did with the batch; its JSON and printed forms are the value."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"  # its offsets show the batch committed before
    SKIPPED = "skipped"  # nothing to write: only tombstones for a table not created yet


@dataclass(frozen=True)
class TableResult:
    """What a table's load did with the batch, built once when it is done."""

    table: str
    topic: str
    status: LoadStatus
    records: int = 0
    upserts: int = 0
    deletes: int = 0
    dead_letters: int = 0
    truncated: bool = False
    offsets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # where the changes were decoded and resolved; None when the table had nothing to load
    resolved_by: Placement | None = None
    # how the rows were written; None when nothing was
    written_by: WrittenBy | None = None
    snapshot_id: int | None = None
    # where the time went, in seconds: `read` (the batch's read and raw scan, shared by
    # its tables), then this table's `state` (table state and schema check), `resolve`
    # (decode, check, resolve) and `write` (table DDL, deleted-keys ledger, MERGE or append,
    # commit)
    seconds: Mapping[str, float] = field(default_factory=dict)
    # a retention gap being healed, or healed by this batch (`cdclake_control.gaps`)
    heal: str | None = None
    # the source transaction every table of the batch ends at (`consistency: transaction`)
    consistent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Batch:
    """What the tables of one batch share: the session, the raw records and their scan,
    and a lock for the dead-letter table every table writes to."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: PipelineConfig,
        plan: BatchPlan,
        raw: DataFrame | None,
        scan: RawScan,
        read_seconds: float,
        rows: pa.Table | None,
        ranged: dict[str, RangedTopic | FailedTopic],
        before: Mapping[str, str | None],
        tuning: Tuning,
        set_aside: Mapping[str, int] | None = None,
        read: RawSource = KAFKA,
    ) -> None:
        self.spark, self.pipeline, self.plan, self.raw, self.scan = spark, pipeline, plan, raw, scan
        self.tuning = tuning
        self.read = read  # where the records are read from (Kafka, or recorded files)
        self.rows = rows  # the raw records as an Arrow table, when the driver read them
        self.ranged = ranged  # topics read and resolved range by range (not in `raw`)
        self.read_seconds = read_seconds  # reading the raw records and their scan
        # per topic, its records set aside before the tables load (not envelopes)
        self.set_aside = dict(set_aside or {})
        self.dead_letter_lock = threading.Lock()
        # the session settings a small batch changed (`SMALL_BATCH_CONF`), with their values
        # before it: put back by `compile_for`
        self.interpreted = dict(before)
        self.settings_lock = threading.Lock()

    def compile_for(self, table: str, target_rows: int) -> None:
        """Compile the batch's expressions from now on (the settings before the batch
        back) when `table`, a MERGE target of `target_rows` rows, is big enough that
        its scan costs more interpreted than compiling does (`COMPILE_TARGET_ROWS`).
        One way only, so the tables loading meanwhile never switch back; what a query
        computes is the same either way."""
        if target_rows <= COMPILE_TARGET_ROWS or not self.interpreted:
            return
        with self.settings_lock:
            if not self.interpreted:
                return
            restore_settings(self.spark, self.interpreted)
            self.interpreted = {}
        log.info(
            "%s: a MERGE target of %d rows; the batch's expressions are compiled from now on",
            table,
            target_rows,
        )

    def ranges_of(self, table: TableConfig) -> list[OffsetRange]:
        topic = self.pipeline.topic_for(table)
        return [r for r in self.plan.ranges if r.topic == topic]

    def dead_letters(self, rows: DataFrame, count: int) -> int:
        with self.dead_letter_lock:  # concurrent commits to the one table would conflict
            return set_aside(self.spark, self.pipeline, self.plan, rows, count)
