"""Dead letters applied again (`cdclake dead-letters list|replay`): once the pipeline, the
lake table or the source is fixed, the records a pipeline set aside go through the same
load as any batch, in replay mode (a record older than the lake's row does not regress
it, and no table's offsets move), read from their raw bytes in the dead-letter table.
Each one that loads is marked replayed; one that is still bad is set aside again (its
reason and batch updated) and stays pending."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections import defaultdict
from functools import partial
from itertools import groupby
from typing import TYPE_CHECKING, Any

from cdclake.config import PipelineConfig
from cdclake.exceptions import ConfigError
from cdclake.iceberg.deadletters import mark_replayed
from cdclake.iceberg.tables import DEAD_LETTERS
from cdclake.job import run_batch
from cdclake.kafka.reader import RawSource
from cdclake.kafka.topics import discover
from cdclake.offsets import BatchPlan, OffsetRange, PlanMode

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame, Row, SparkSession

    from cdclake.config import KafkaConfig
    from cdclake.kafka.reader import RangeReader

log = logging.getLogger(__name__)
# what one replay takes at most (the records are held by the driver)
MAX_RECORDS = 100_000
LISTED = (
    "topic",
    "partition",
    "offset",
    "batch_id",
    "recorded_at",
    "error",
    "replayed_at",
    "replayed_in",
)


def dead_letters(
    spark: SparkSession,
    pipeline: PipelineConfig,
    table: str | None = None,
    since: dt.datetime | None = None,
    pending: bool = True,
) -> DataFrame | None:
    """The pipeline's dead letters (of `table`'s topic, recorded since `since`; pending
    only: not replayed yet), oldest first; None when it has none."""
    from pyspark.sql import functions as F

    name = f"{pipeline.catalog.name}.{pipeline.namespace}.{DEAD_LETTERS}"
    if not spark.catalog.tableExists(name):
        return None
    spark.catalog.refreshTable(name)  # a replay elsewhere may have marked some
    rows = spark.table(name).where(F.col("pipeline") == pipeline.name)
    if table is not None:
        rows = rows.where(F.col("topic") == _topic(pipeline, table))
    if since is not None:
        rows = rows.where(F.col("recorded_at") >= F.lit(since))
    if pending:
        rows = rows.where(F.col("replayed_at").isNull())
    return rows.orderBy("recorded_at", "topic", "partition", "offset")


def list_dead_letters(
    spark: SparkSession,
    pipeline: PipelineConfig,
    table: str | None = None,
    since: dt.datetime | None = None,
    pending: bool = True,
) -> list[dict[str, Any]]:
    rows = dead_letters(spark, pipeline, table, since, pending)
    return [] if rows is None else [r.asDict() for r in rows.select(*LISTED).collect()]


def describe(
    pipeline: str, rows: list[dict[str, Any]], pending: bool = True, shown: int = 20
) -> str:
    """A listing in words: how many dead letters, per topic, then the oldest `shown`, one
    line each (where it was read, when it was set aside, the first line of why)."""
    kind = "pending dead letter" if pending else "dead letter"
    if not rows:
        return f"0 {kind}s for {pipeline}"
    topics: defaultdict[str, int] = defaultdict(int)
    for r in rows:
        topics[r["topic"]] += 1
    per_topic = ", ".join(f"{t}: {n}" for t, n in sorted(topics.items()))
    lines = [f"{len(rows)} {kind}{'s' if len(rows) > 1 else ''} for {pipeline} ({per_topic})"]
    for r in rows[:shown]:
        when = r["recorded_at"]
        when = when.strftime("%Y-%m-%d %H:%M:%S") if isinstance(when, dt.datetime) else when
        why = str(r["error"] or "").splitlines()[0] if r["error"] else ""
        lines.append(f"  {r['topic']}[{r['partition']}] offset {r['offset']}, {when}: {why}")
    if len(rows) > shown:
        lines.append(f"  ... and {len(rows) - shown} more")
    return "\n".join(lines)


def replay(
    spark: SparkSession,
    pipeline: PipelineConfig,
    table: str | None = None,
    since: dt.datetime | None = None,
) -> dict[str, Any]:
    """Apply the pending dead letters again (at most `MAX_RECORDS`, oldest first)."""
    rows = dead_letters(spark, pipeline, table, since)
    found = [] if rows is None else rows.limit(MAX_RECORDS).collect()
    usable = [r for r in found if r.raw_key is not None or r.raw_value is not None]
    if len(usable) < len(found):
        log.warning(
            "%d dead letter(s) have no raw record (gone from Kafka before they were "
            "set aside) and cannot be replayed",
            len(found) - len(usable),
        )
    batch_id = f"dead-letters-{uuid.uuid4().hex[:12]}"
    report: dict[str, Any] = {
        "pipeline": pipeline.name,
        "batch_id": batch_id,
        "pending": len(found),
        "replayed": 0,
        "tables": [],
    }
    if not usable:
        return report
    spans: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in usable:
        spans[(r.topic, r.partition)].append(r.offset)
    ranges = tuple(OffsetRange(t, p, min(o), max(o) + 1) for (t, p), o in sorted(spans.items()))
    plan = BatchPlan(pipeline.name, batch_id, ranges, PlanMode.REPLAY)

    read = RawSource(partial(_reader, raw_rows(pipeline, usable)))
    results = run_batch(spark, pipeline, plan, read=read)  # only tables with ranges load
    loaded = [(r.topic, r.partition, r.offset) for r in usable]
    report["replayed"] = mark_replayed(
        spark, f"{pipeline.catalog.name}.{pipeline.namespace}", pipeline.name, batch_id, loaded
    )
    report["tables"] = [r.to_dict() for r in results]
    return report


def raw_rows(pipeline: PipelineConfig, records: list[Row]) -> pa.Table:
    """The reader's raw rows of dead letters (Spark rows with their raw record), split by
    the pipeline's format as the records were when they were read from Kafka."""
    import pyarrow as pa

    from cdclake.raw_rows import kept_headers, raw_arrow_schema

    kafka = pipeline.kafka
    batches = []
    records = sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
    for (topic, partition), group in groupby(records, key=lambda r: (r.topic, r.partition)):
        found = list(group)
        writer = kafka.format.raw_rows(topic, partition, kafka.schema_registry)
        writer.add_many(
            [r.offset for r in found],
            [0] * len(found),
            [r.raw_key for r in found],
            [r.raw_value for r in found],
            [kept_headers(r.headers) for r in found],
        )
        batches.append(writer.batch())
    return pa.Table.from_batches(batches, schema=raw_arrow_schema())


def parse_since(text: str) -> dt.datetime:
    """An ISO 8601 date or time (UTC when it names no offset), or epoch milliseconds."""
    text = text.strip()
    try:
        if text.isdigit():
            return dt.datetime.fromtimestamp(int(text) / 1000, dt.UTC)
        found = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"since: {text!r} is not an ISO date or time, nor epoch ms") from None
    return found if found.tzinfo else found.replace(tzinfo=dt.UTC)


def _topic(pipeline: PipelineConfig, table: str) -> str:
    """The topic of the pipeline's table named `table` (its target, or its source)."""
    for t in discover(pipeline).tables:
        if table in (t.target, t.source, pipeline.qualified_target(t)):
            return pipeline.topic_for(t)
    raise ConfigError(f"pipeline {pipeline.name} has no table {table!r}")


def _reader(rows: pa.Table, kafka: KafkaConfig) -> RangeReader:
    """The `RangeReader` of the dead letters' raw rows (`rows`), read as Kafka's are."""
    return partial(_range_rows, rows)


def _range_rows(rows: pa.Table, r: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """The raw rows of one range ({"topic", "partition", "start", "end"})."""
    import pyarrow.compute as pc

    offsets = rows["offset"]
    mine = pc.and_(
        pc.and_(pc.equal(rows["topic"], r["topic"]), pc.equal(rows["partition"], r["partition"])),
        pc.and_(pc.greater_equal(offsets, r["start"]), pc.less(offsets, r["end"])),
    )
    yield from rows.filter(mine).to_batches()
