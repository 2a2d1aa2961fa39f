"""The load job: read the planned offset ranges, resolve, MERGE, commit offsets with data.

Shared by `cdclake run` (in-process Spark) and `jobs/load.py` (spark-submit).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from cdclake.changes import DELETED, decode_changes, topic_schema
from cdclake.config import OnError, PipelineConfig, TableConfig
from cdclake.exceptions import CommitConflictError, ConfigError, DecodeError
from cdclake.merge import (
    build_merge_sql,
    commit_empty,
    commit_properties,
    current_snapshot,
    ensure_table,
)
from cdclake.offsets import (
    SUMMARY_BATCH,
    SUMMARY_DELETES,
    SUMMARY_OFFSETS,
    SUMMARY_RECORDS,
    SUMMARY_SOURCE_TS,
    SUMMARY_UPSERTS,
    BatchPlan,
    OffsetRange,
    TopicPartition,
    decode_offsets,
    encode_offsets,
)
from cdclake.reader import read_ranges
from cdclake.resolve import find_invalid, resolve_latest

log = logging.getLogger(__name__)


@dataclass
class TableResult:
    table: str
    topic: str
    status: str  # committed | already_committed | skipped
    records: int = 0
    upserts: int = 0
    deletes: int = 0
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    snapshot_id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def run_batch(spark, pipeline: PipelineConfig, plan: BatchPlan) -> list[TableResult]:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if pipeline.on_error is OnError.DEAD_LETTER:
        raise ConfigError(f"{pipeline.path}: on_error: dead_letter is not available yet")
    if not plan.ranges:
        return []
    raw = read_ranges(spark, pipeline.kafka, plan.ranges).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        bad = (
            raw.where(F.col("error").isNotNull())
            .select("topic", "partition", "offset", "error")
            .orderBy("topic", "partition", "offset")
            .limit(1)
            .collect()
        )
        if bad:
            b = bad[0]
            raise DecodeError(f"{b.topic} partition {b.partition} offset {b.offset}: {b.error}")
        schemas = _collect_schemas(raw)
        results = []
        for table in pipeline.tables:
            topic = pipeline.topic_for(table)
            ranges = [r for r in plan.ranges if r.topic == topic]
            if not ranges:
                continue
            results.append(
                _load_table(
                    spark,
                    pipeline,
                    plan,
                    table,
                    ranges,
                    raw.where(F.col("topic") == topic),
                    schemas.get(topic, {}),
                )  # fmt: skip
            )
        return results
    finally:
        raw.unpersist()


def _collect_schemas(raw) -> dict[str, dict[str, list[tuple[int, str]]]]:
    """Per topic, key and value schemas (id, text), oldest first by their last offset."""
    from pyspark.sql import functions as F

    out: dict[str, dict[str, list[tuple[int, str]]]] = {}
    for side in ("key", "value"):
        rows = (
            raw.where(F.col(f"{side}_schema_id").isNotNull())
            .groupBy("topic", f"{side}_schema_id")
            .agg(
                F.max(F.struct("partition", "offset")).alias("last"),
                F.first(f"{side}_schema", ignorenulls=True).alias("schema"),
            )
            .collect()
        )
        for r in sorted(rows, key=lambda r: (r["topic"], r["last"]["offset"])):
            out.setdefault(r["topic"], {}).setdefault(side, []).append(
                (r[f"{side}_schema_id"], r["schema"])
            )
    return out


def _committed_offsets(spark, table: str) -> dict[TopicPartition, int]:
    jvm = spark.sparkContext._jvm
    ice = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    ice.refresh()
    snap = ice.currentSnapshot()
    while snap is not None:
        summary = snap.summary()
        if summary.containsKey(SUMMARY_OFFSETS):
            return decode_offsets(summary.get(SUMMARY_OFFSETS))
        parent = snap.parentId()
        snap = ice.snapshot(parent) if parent is not None else None
    return {}


def _load_table(
    spark,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    table: TableConfig,
    ranges: list[OffsetRange],
    raw,
    schemas: dict[str, list[tuple[int, str]]],
) -> TableResult:
    from pyspark.sql import functions as F

    qualified = pipeline.qualified_target(table)
    topic = pipeline.topic_for(table)
    records = sum(r.size for r in ranges)
    result = TableResult(table=qualified, topic=topic, status="skipped", records=records)
    exists = spark.catalog.tableExists(qualified)
    committed = _committed_offsets(spark, qualified) if exists else {}
    ends = {(r.topic, r.partition): r.end for r in ranges}
    starts = {(r.topic, r.partition): r.start for r in ranges}
    if all(committed.get(tp) == end for tp, end in ends.items()):
        log.info("%s: batch %s was already committed", qualified, plan.batch_id)
        result.status = "already_committed"
        return result
    moved = {tp: c for tp in starts if (c := committed.get(tp)) is not None and c != starts[tp]}
    if moved:
        raise CommitConflictError(
            f"{qualified}: committed offsets {moved} differ from the plan's start "
            f"{ {tp: starts[tp] for tp in moved} }; another run loaded this table meanwhile. "
            "Nothing was written; plan again."
        )
    if not schemas.get("value") and not exists:
        log.info("%s: only tombstones for a table that does not exist yet; skipped", qualified)
        return result

    where = f"{topic}"
    key_texts = [s for _, s in schemas.get("key", [])]
    value_texts = [s for _, s in schemas.get("value", [])]
    schema = topic_schema(key_texts, value_texts, table.key, where)
    changes = decode_changes(raw, schema, dict(schemas.get("key", [])),
                             dict(schemas.get("value", [])))  # fmt: skip
    find_invalid(changes, schema, topic)
    resolved = resolve_latest(changes, schema).persist()
    try:
        counts = {r[DELETED]: r["count"] for r in resolved.groupBy(DELETED).count().collect()}
        result.upserts = counts.get(False, 0)
        result.deletes = counts.get(True, 0)
        max_ts = resolved.agg(F.max("_cdc_source_ts")).collect()[0][0]
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {pipeline.catalog.name}.{pipeline.namespace}")
        ensure_table(spark, qualified, schema, {})
        new_offsets = {**committed, **ends}
        props = {
            SUMMARY_OFFSETS: encode_offsets(new_offsets),
            SUMMARY_BATCH: plan.batch_id,
            SUMMARY_RECORDS: str(records),
            SUMMARY_UPSERTS: str(result.upserts),
            SUMMARY_DELETES: str(result.deletes),
        }
        if max_ts is not None:
            props[SUMMARY_SOURCE_TS] = str(int(max_ts.timestamp() * 1000))
        before_id, _ = current_snapshot(spark, qualified)
        view = f"cdclake_changes_{table.target}"
        resolved.createOrReplaceTempView(view)
        with commit_properties(spark, props):
            spark.sql(build_merge_sql(qualified, view, schema))
        after_id, summary = current_snapshot(spark, qualified)
        if after_id == before_id:
            commit_empty(spark, qualified, props)  # nothing changed, offsets still move
            after_id, summary = current_snapshot(spark, qualified)
        if summary.get(SUMMARY_OFFSETS) != props[SUMMARY_OFFSETS]:
            raise CommitConflictError(
                f"{qualified}: snapshot {after_id} does not carry this batch's offsets"
            )
        spark.catalog.dropTempView(view)
    finally:
        resolved.unpersist()
    result.status = "committed"
    result.snapshot_id = after_id
    result.offsets = {t: {} for t, _ in new_offsets}
    for (t, p), o in sorted(new_offsets.items()):
        result.offsets[t][str(p)] = o
    log.info("%s: committed %d records (%d upserts, %d deletes) in snapshot %s",
             qualified, records, result.upserts, result.deletes, after_id)  # fmt: skip
    return result
