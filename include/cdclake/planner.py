"""Plan: committed offsets (from the Iceberg tables) + Kafka end offsets -> a bounded batch."""

from __future__ import annotations

import logging
import uuid

from cdclake.config import PipelineConfig
from cdclake.iceberg.catalog import load_catalog, table_state
from cdclake.kafka.topics import discover, fetch_watermarks
from cdclake.offsets import BatchPlan, plan_batch

log = logging.getLogger(__name__)


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
    ranges = plan_batch(committed, marks, pipeline.max_records_per_batch)
    plan = BatchPlan(pipeline.name, batch_id or uuid.uuid4().hex, ranges)
    log.info("planned %d records over %d partitions", plan.total, len(plan.ranges))
    return plan
