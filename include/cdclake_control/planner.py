"""Plan: committed offsets (from the Iceberg tables) + Kafka end offsets -> a bounded batch.

For flattened formats the plan also reads each topic's latest records and warns of what
the CDC rules lack in them (`json_flat.lost`): the transform's settings decide it, and
nothing in a batch's result would show it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from cdclake.config import Consistency, PipelineConfig
from cdclake.exceptions import DataLossError
from cdclake.iceberg.catalog import load_catalog
from cdclake.kafka.topics import discover
from cdclake.offsets import BatchPlan, OffsetRange, TopicPartition, Watermarks

from cdclake_control.catalog import table_state
from cdclake_control.consistency import consistent_ranges
from cdclake_control.gaps import heal_gaps, pending_heals, with_heals
from cdclake_control.watermarks import fetch_watermarks

log = logging.getLogger(__name__)
PEEK_RECORDS = 20  # the latest records of a flattened topic read to see what they carry


def plan_pipeline(
    pipeline: PipelineConfig, batch_id: str | None = None, dsn: str | None = None
) -> BatchPlan:
    """The next batch. `dsn`: the source database, which healing a retention gap signals
    (`on_gap: resnapshot`, `cdclake_control.gaps`)."""
    pipeline = discover(pipeline)
    cat = load_catalog(pipeline.catalog)
    states = {t.source: table_state(cat, pipeline, t) for t in pipeline.tables}
    pending = pending_heals(pipeline, states)  # before the end offsets: see there
    topics = [pipeline.topic_for(t) for t in pipeline.tables]
    marks = fetch_watermarks(pipeline.kafka, topics)
    committed, heals = heal_gaps(pipeline, states, marks, pending, dsn)
    missing = sorted({t for t in topics} - {tp[0] for tp in marks})
    if missing:
        log.info("topics not in Kafka yet (nothing captured): %s", ", ".join(missing))
    if pipeline.kafka.format.flat:
        for topic, lacks in flattened_lacks(pipeline, marks).items():
            for why in lacks:
                log.warning("topic %s: %s", topic, why)
    ranges = plan_batch(committed, marks, pipeline.max_records_per_batch)
    cut = None
    if pipeline.consistency is Consistency.TRANSACTION:
        ranges, cut = consistent_ranges(pipeline, states, committed, ranges, marks)
    heals, ranges = with_heals(pipeline, heals, pending, ranges, marks, committed)
    plan = BatchPlan(pipeline.name, batch_id or uuid.uuid4().hex, ranges, heal=heals, cut=cut)
    log.info("planned %d records over %d partitions", plan.total, len(plan.ranges))
    return plan


def flattened_lacks(
    pipeline: PipelineConfig, marks: dict[tuple[str, int], Watermarks]
) -> dict[str, list[str]]:
    """What the CDC rules lack in each flattened topic (`json_flat.lost`), read from the
    latest records of its fullest partition that carry a row."""
    from cdclake.debezium.json_flat import lost
    from cdclake.kafka.reader import read_local

    fullest: dict[str, tuple[int, Watermarks]] = {}
    for (topic, partition), m in marks.items():
        if m.high > m.low and m.high > fullest.get(topic, (0, Watermarks(0, 0)))[1].high:
            fullest[topic] = (partition, m)
    ranges = [
        OffsetRange(topic, p, max(m.low, m.high - PEEK_RECORDS), m.high)
        for topic, (p, m) in sorted(fullest.items())
    ]
    kafka = pipeline.kafka
    rows = read_local(kafka, ranges, timeout_s=kafka.timeouts.request_s)
    found: dict[str, list[str]] = {}
    schemas: dict[int, str] = {}
    for row in [] if rows is None else rows.to_pylist():
        if row["value_schema"] is not None:
            schemas[row["value_schema_id"]] = row["value_schema"]
        if row["value_schema_id"] in schemas:  # the latest row of the topic wins
            found[row["topic"]] = lost(schemas[row["value_schema_id"]], row["headers"])
    return found


def plan_batch(
    committed: Mapping[TopicPartition, int | None],
    watermarks: Mapping[TopicPartition, Watermarks],
    max_records: int,
) -> tuple[OffsetRange, ...]:
    """Cut the next batch: per partition from the committed offset towards the end.

    A partition with nothing committed starts at its earliest offset. The cap is shared
    fairly: small backlogs are taken whole and the rest is split evenly, so one busy table
    cannot starve the others. Partitions with nothing to read are left out.
    """
    starts: dict[TopicPartition, int] = {}
    for tp, marks in watermarks.items():
        start = committed.get(tp)
        if start is None:
            start = marks.low
        elif start < marks.low:
            raise DataLossError(
                f"{tp[0]} partition {tp[1]}: the last committed offset is {start} but the "
                f"earliest offset still in Kafka is {marks.low}; records {start}..{marks.low - 1} "
                "were deleted by retention before they were loaded. Set `on_gap: resnapshot` "
                "to heal it by an incremental snapshot of the table, or recover by hand: an "
                "incremental snapshot of that table (cdclake_snapshot DAG or `cdclake snapshot`) "
                "and then a rebuild backfill."
            )
        elif start > marks.high:
            raise DataLossError(
                f"{tp[0]} partition {tp[1]}: the last committed offset {start} is beyond the "
                f"end of the partition ({marks.high}); the topic was probably deleted and "
                "recreated. Rebuild the table with a backfill in rebuild mode."
            )
        starts[tp] = start

    return cut_batch(starts, {tp: m.high for tp, m in watermarks.items()}, max_records)


def cut_batch(
    starts: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int], max_records: int
) -> tuple[OffsetRange, ...]:
    """One batch from `starts` towards `ends`, at most `max_records` shared fairly."""
    backlog = {tp: ends[tp] - s for tp, s in starts.items() if ends[tp] > s}
    take = share_cap(backlog, max_records)
    return tuple(
        sorted(OffsetRange(tp[0], tp[1], starts[tp], starts[tp] + n) for tp, n in take.items() if n)
    )


def share_cap(backlog: Mapping[TopicPartition, int], cap: int) -> dict[TopicPartition, int]:
    """Split `cap` records over partitions: smallest backlogs whole, the rest evenly."""
    if cap <= 0:
        raise ValueError("cap must be positive")
    out: dict[TopicPartition, int] = {}
    remaining = cap
    ordered = sorted(backlog.items(), key=lambda kv: (kv[1], kv[0]))
    for i, (tp, n) in enumerate(ordered):
        share = remaining // (len(ordered) - i)
        out[tp] = min(n, share)
        remaining -= out[tp]
    return out
