"""The dead-letter table: records set aside with their reason and the record as Kafka held
it (read again from Kafka when it is set aside)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from cdclake.config import PipelineConfig
from cdclake.iceberg.tables import DEAD_LETTERS, ensure_namespace, table_columns
from cdclake.kafka.topics import raw_records
from cdclake.offsets import BatchPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

log = logging.getLogger(__name__)


def set_aside(
    spark: SparkSession, pipeline: PipelineConfig, plan: BatchPlan, rows: DataFrame, count: int
) -> int:
    """Write `count` records set aside (`rows`: topic, partition, offset, key and value
    payload text, error) to the pipeline's dead-letter table, once each."""
    from pyspark.sql import functions as F

    stamped = _with_raw(spark, pipeline, rows).select(
        F.lit(pipeline.name).alias("pipeline"),
        F.lit(plan.batch_id).alias("batch_id"),
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "error",
        F.current_timestamp().alias("recorded_at"),
        "raw_key",
        "raw_value",
        "headers",
        F.lit(None).cast("timestamp").alias("replayed_at"),
        F.lit(None).cast("string").alias("replayed_in"),
    )
    namespace = f"{pipeline.catalog.name}.{pipeline.namespace}"
    ensure_namespace(spark, namespace)
    write_dead_letters(spark, namespace, stamped)
    log.warning("%d record(s) went to %s.%s", count, pipeline.namespace, DEAD_LETTERS)
    return count


def _with_raw(spark: SparkSession, pipeline: PipelineConfig, rows: DataFrame) -> DataFrame:
    """Dead-letter rows with their records' key, value and headers as Kafka holds them
    (read again: the rows kept only what could be parsed of them)."""
    coordinates = [tuple(r) for r in rows.select("topic", "partition", "offset").collect()]
    found = [(*at, *record) for at, record in raw_records(pipeline.kafka, coordinates).items()]
    frame = spark.createDataFrame(
        found, f"topic string, partition int, offset bigint, {DEAD_LETTER_RAW}"
    )
    return rows.join(frame, ["topic", "partition", "offset"], "left")


# each dead letter's record as Kafka held it, to inspect it or produce it again
DEAD_LETTER_RAW = "raw_key binary, raw_value binary, headers array<struct<key:string,value:binary>>"
# when a dead letter was replayed, and by which batch (NULL: pending)
DEAD_LETTER_REPLAY = "replayed_at timestamp, replayed_in string"


def write_dead_letters(spark: SparkSession, namespace: str, rows: DataFrame) -> None:
    """Idempotently record undecodable records (one row per topic, partition, offset).

    Not safe to call from two threads at once (one temp view name, and two commits to
    the one table would conflict): the load job holds a lock around it."""
    table = f"{namespace}.{DEAD_LETTERS}"
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {table} (pipeline string, batch_id string, topic string, "
        "`partition` int, `offset` bigint, key string, value string, error string, "
        f"recorded_at timestamp, {DEAD_LETTER_RAW}, {DEAD_LETTER_REPLAY}) USING iceberg "
        "TBLPROPERTIES ('format-version'='2')"
    )
    columns = table_columns(spark, table)
    for name, kinds in (("raw_value", DEAD_LETTER_RAW), ("replayed_at", DEAD_LETTER_REPLAY)):
        if name not in columns:  # a table of an older version
            spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({kinds})")
    # a record set aside again (by a replay) is pending again, with its new reason
    _merge_by_record(
        spark,
        table,
        rows,
        "cdclake_dead_letters_new",
        "WHEN MATCHED AND t.batch_id <> s.batch_id THEN UPDATE SET batch_id = s.batch_id, "
        "error = s.error, recorded_at = s.recorded_at, replayed_at = NULL, replayed_in = NULL "
        "WHEN NOT MATCHED THEN INSERT *",
    )


def mark_replayed(
    spark: SparkSession,
    namespace: str,
    pipeline: str,
    batch_id: str,
    records: list[tuple[str, int, int]],
) -> int:
    """Mark the pipeline's pending dead letters at `records` (topic, partition, offset)
    replayed by `batch_id`, but those it set aside again; returns how many were."""
    table = f"{namespace}.{DEAD_LETTERS}"
    frame = spark.createDataFrame(records, "topic string, `partition` int, `offset` bigint")
    # the pipeline's name is an identifier, the batch id cdclake's own: plain literals
    _merge_by_record(
        spark,
        table,
        frame,
        "cdclake_dead_letters_replayed",
        f"WHEN MATCHED AND t.pipeline = '{pipeline}' AND t.replayed_at IS NULL AND t.batch_id "
        f"<> '{batch_id}' THEN UPDATE SET replayed_at = current_timestamp(), "
        f"replayed_in = '{batch_id}'",
    )
    counted = spark.sql(f"SELECT count(*) FROM {table} WHERE replayed_in = '{batch_id}'")
    return cast(int, cast("Row", counted.first())[0])  # an aggregate's one row: a count


def _merge_by_record(
    spark: SparkSession, table: str, rows: DataFrame, view: str, clauses: str
) -> None:
    """MERGE `rows` into the dead-letter table by record (topic, partition, offset)."""
    rows.createOrReplaceTempView(view)
    try:
        spark.sql(
            f"MERGE INTO {table} t USING {view} s "
            "ON t.topic = s.topic AND t.`partition` = s.`partition` AND t.`offset` = s.`offset` "
            + clauses
        )
    finally:
        spark.catalog.dropTempView(view)
