"""The dead-letter table: records set aside with their reason and the record as Kafka held
it (read again from Kafka when it is set aside)."""

from __future__ import annotations

import logging

from cdclake.config import PipelineConfig
from cdclake.iceberg.leases import Leases
from cdclake.iceberg.tables import (
    DEAD_LETTER_RAW,
    DEAD_LETTERS,
    ensure_namespace,
    write_dead_letters,
)
from cdclake.kafka.topics import raw_records
from cdclake.offsets import BatchPlan

log = logging.getLogger(__name__)


def set_aside(spark, pipeline: PipelineConfig, plan: BatchPlan, rows, count: int,
              leases: Leases) -> int:  # fmt: skip
    """Write `count` records set aside (`rows`: topic, partition, offset, key and value
    payload text, error) to the pipeline's dead-letter table, once each."""
    from pyspark.sql import functions as F

    stamped = _with_raw(spark, pipeline, rows).select(
        F.lit(pipeline.name).alias("pipeline"),
        F.lit(plan.batch_id).alias("batch_id"),
        "topic", "partition", "offset", "key", "value", "error",
        F.current_timestamp().alias("recorded_at"), "raw_key", "raw_value", "headers",
        F.lit(None).cast("timestamp").alias("replayed_at"),
        F.lit(None).cast("string").alias("replayed_in"),
    )  # fmt: skip
    namespace = f"{pipeline.catalog.name}.{pipeline.namespace}"
    ensure_namespace(spark, namespace)
    dead = f"{namespace}.{DEAD_LETTERS}"
    # leased once it exists (its first write creates it: a kill then leaves files to
    # maintenance's orphan removal)
    leased = spark.catalog.tableExists(dead)
    if leased:
        leases.take(dead)
    write_dead_letters(spark, namespace, stamped)
    if leased:
        leases.done(dead)
    log.warning("%d record(s) went to %s.%s", count, pipeline.namespace, DEAD_LETTERS)
    return count


def _with_raw(spark, pipeline: PipelineConfig, rows):
    """Dead-letter rows with their records' key, value and headers as Kafka holds them
    (read again: the rows kept only what could be parsed of them)."""
    coordinates = [tuple(r) for r in rows.select("topic", "partition", "offset").collect()]
    found = [(*at, *record) for at, record in raw_records(pipeline.kafka, coordinates).items()]
    frame = spark.createDataFrame(found, f"topic string, partition int, offset bigint, "
                                         f"{DEAD_LETTER_RAW}")  # fmt: skip
    return rows.join(frame, ["topic", "partition", "offset"], "left")
