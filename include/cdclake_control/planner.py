"""Plan: committed offsets (from the Iceberg tables) + Kafka end offsets -> a bounded batch.

For flattened formats the plan also reads each topic's latest records and warns of what
the CDC rules lack in them (`json_flat.lost`): the transform's settings decide it, and
nothing in a batch's result would show it."""

from __future__ import annotations

import logging
import uuid

from cdclake.config import PipelineConfig
from cdclake.iceberg.catalog import load_catalog, table_state
from cdclake.kafka.topics import discover, fetch_watermarks
from cdclake.offsets import BatchPlan, OffsetRange, Watermarks, plan_batch

log = logging.getLogger(__name__)
PEEK_RECORDS = 20  # the latest records of a flattened topic read to see what they carry


def plan_pipeline(pipeline: PipelineConfig, batch_id: str | None = None) -> BatchPlan:
    pipeline = discover(pipeline)
    cat = load_catalog(pipeline.catalog)
    committed: dict[tuple[str, int], int | None] = {}
    for table in pipeline.tables:
        committed.update(table_state(cat, pipeline, table).offsets)
    topics = [pipeline.topic_for(t) for t in pipeline.tables]
    marks = fetch_watermarks(pipeline.kafka, topics)
    missing = sorted({t for t in topics} - {tp[0] for tp in marks})
    if missing:
        log.info("topics not in Kafka yet (nothing captured): %s", ", ".join(missing))
    if pipeline.kafka.format.flat:
        for topic, lacks in flattened_lacks(pipeline, marks).items():
            for why in lacks:
                log.warning("topic %s: %s", topic, why)
    ranges = plan_batch(committed, marks, pipeline.max_records_per_batch)
    plan = BatchPlan(pipeline.name, batch_id or uuid.uuid4().hex, ranges)
    log.info("planned %d records over %d partitions", plan.total, len(plan.ranges))
    return plan


def flattened_lacks(pipeline: PipelineConfig,
                    marks: dict[tuple[str, int], Watermarks]) -> dict[str, list[str]]:  # fmt: skip
    """What the CDC rules lack in each flattened topic (`json_flat.lost`), read from the
    latest records of its fullest partition that carry a row."""
    from cdclake.debezium.json_flat import lost
    from cdclake.kafka.reader import read_local

    fullest: dict[str, tuple[int, Watermarks]] = {}
    for (topic, partition), m in marks.items():
        if m.high > m.low and m.high > fullest.get(topic, (0, Watermarks(0, 0)))[1].high:
            fullest[topic] = (partition, m)
    ranges = [OffsetRange(topic, p, max(m.low, m.high - PEEK_RECORDS), m.high)
              for topic, (p, m) in sorted(fullest.items())]  # fmt: skip
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
