"""The load job: read the planned offset ranges, resolve, MERGE, commit offsets with data.

Shared by `cdclake run` (in-process Spark) and `jobs/load.py` (spark-submit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from cdclake.changes import (
    DELETED,
    SOURCE_TS,
    TopicSchema,
    column_types,
    decode_changes,
    misfit,
    topic_schema,
    value_row_fields,
)
from cdclake.config import DeleteMode, OnError, PipelineConfig, TableConfig
from cdclake.debezium import parse_connect_schema
from cdclake.exceptions import CommitConflictError, ConfigError, DecodeError
from cdclake.kafka import discover
from cdclake.merge import (
    DEAD_LETTERS,
    build_append_sql,
    build_merge_sql,
    commit_empty,
    commit_properties,
    committed_offsets,
    conflicts_reported,
    current_snapshot,
    deleted_keys_table,
    ensure_table,
    mark_truncated,
    record_deleted_keys,
    truncated_below,
    with_deleted_lsn,
    write_dead_letters,
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
    PlanMode,
    TopicPartition,
    encode_offsets,
)
from cdclake.reader import read_ranges
from cdclake.resolve import (
    changelog,
    find_invalid,
    find_truncate,
    invalid_reason,
    resolve_latest,
    toastable,
)

log = logging.getLogger(__name__)


@dataclass
class TableResult:
    table: str
    topic: str
    status: str  # committed | already_committed | skipped
    records: int = 0
    upserts: int = 0
    deletes: int = 0
    dead_letters: int = 0
    truncated: bool = False
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    snapshot_id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def run_batch(
    spark, pipeline: PipelineConfig, plan: BatchPlan, *, read: Callable = read_ranges
) -> list[TableResult]:
    """Load one planned batch. `read` makes the raw records DataFrame of the planned
    ranges (Kafka; benchmarks pass a recorded file instead)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if plan.mode not in PlanMode.ALL:
        raise ConfigError(f"batch {plan.batch_id}: unknown plan mode {plan.mode!r}")
    if not plan.ranges:
        return []
    pipeline = discover(pipeline, {r.topic for r in plan.ranges})
    if plan.mode == PlanMode.REBUILD:
        _drop_for_rebuild(spark, pipeline, plan)
    raw = read(spark, pipeline.kafka, plan.ranges).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        raw = _handle_broken_envelopes(spark, pipeline, plan, raw)
        schemas = _collect_schemas(raw)
        results = []
        for table in pipeline.tables:
            topic = pipeline.topic_for(table)
            ranges = [r for r in plan.ranges if r.topic == topic]
            if not ranges:
                continue
            table_raw = raw.where(F.col("topic") == topic)
            results.append(
                _load_table(spark, pipeline, plan, table, ranges, table_raw, schemas.get(topic, {}))
            )
        return results
    finally:
        raw.unpersist()


def _drop_for_rebuild(spark, pipeline: PipelineConfig, plan: BatchPlan) -> None:
    """Drop each table of a rebuild once: not when this backfill already committed to it
    (a retried or later batch of the same rebuild)."""
    topics = {r.topic for r in plan.ranges}
    for table in pipeline.tables:
        qualified = pipeline.qualified_target(table)
        if pipeline.topic_for(table) not in topics or not spark.catalog.tableExists(qualified):
            continue
        _, summary = current_snapshot(spark, qualified)
        last = (summary or {}).get(SUMMARY_BATCH, "")
        if last.startswith(plan.run_prefix + "/"):
            continue
        log.warning("%s: dropped for rebuild %s", qualified, plan.run_prefix)
        spark.sql(f"DROP TABLE {qualified} PURGE")
        spark.sql(f"DROP TABLE IF EXISTS {deleted_keys_table(qualified)} PURGE")


def _handle_broken_envelopes(spark, pipeline: PipelineConfig, plan: BatchPlan, raw):
    """Records that are not JSON-with-schema envelopes: fail, or dead-letter them."""
    from pyspark.sql import functions as F

    broken = raw.where(F.col("error").isNotNull())
    if pipeline.on_error is OnError.DEAD_LETTER:
        dead = broken.select(
            "topic", "partition", "offset",
            F.col("key_payload").alias("key"), F.col("value_payload").alias("value"), "error",
        )  # fmt: skip
        _dead_letters(spark, pipeline, plan, dead)
        return raw.where(F.col("error").isNull())
    bad = broken.orderBy("topic", "partition", "offset").limit(1).collect()
    if bad:
        b = bad[0]
        raise DecodeError(f"{b.topic} partition {b.partition} offset {b.offset}: {b.error}")
    return raw


def _dead_letters(spark, pipeline: PipelineConfig, plan: BatchPlan, rows) -> int:
    from pyspark.sql import functions as F

    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {pipeline.catalog.name}.{pipeline.namespace}")
    stamped = rows.select(
        F.lit(pipeline.name).alias("pipeline"),
        F.lit(plan.batch_id).alias("batch_id"),
        "topic", "partition", "offset", "key", "value", "error",
        F.current_timestamp().alias("recorded_at"),
    )  # fmt: skip
    count = write_dead_letters(spark, f"{pipeline.catalog.name}.{pipeline.namespace}", stamped)
    if count:
        log.warning("%d record(s) went to %s.%s", count, pipeline.namespace, DEAD_LETTERS)
    return count


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


def _check_plan_start(
    qualified: str, committed: dict[TopicPartition, int], ranges: list[OffsetRange]
) -> bool:
    """True when an earlier attempt of this batch already committed it; raise when another
    run moved the table's offsets since the plan was made."""
    ends = {(r.topic, r.partition): r.end for r in ranges}
    starts = {(r.topic, r.partition): r.start for r in ranges}
    if all(committed.get(tp) == end for tp, end in ends.items()):
        return True
    moved = {tp: c for tp in starts if (c := committed.get(tp)) is not None and c != starts[tp]}
    if moved:
        expected = {tp: starts[tp] for tp in moved}
        raise CommitConflictError(
            f"{qualified}: committed offsets {moved} differ from the plan's start {expected}; "
            "another run loaded this table meanwhile. Nothing was written; plan again."
        )
    return False


def _load_table(
    spark,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    table: TableConfig,
    ranges: list[OffsetRange],
    raw,
    schemas: dict[str, list[tuple[int, str]]],
) -> TableResult:
    qualified = pipeline.qualified_target(table)
    topic = pipeline.topic_for(table)
    records = sum(r.size for r in ranges)
    result = TableResult(table=qualified, topic=topic, status="skipped", records=records)
    exists = spark.catalog.tableExists(qualified)
    committed = committed_offsets(spark, qualified) if exists else {}
    if plan.mode == PlanMode.REPLAY:
        # re-applied records never regress newer rows (LSN check in the MERGE), and the
        # committed offsets never move backwards
        ends = {(r.topic, r.partition): max(r.end, committed.get((r.topic, r.partition), 0))
                for r in ranges}  # fmt: skip
    elif _check_plan_start(qualified, committed, ranges):
        log.info("%s: batch %s was already committed", qualified, plan.batch_id)
        result.status = "already_committed"
        return result
    known = (
        {f.name: f.dataType.simpleString() for f in spark.table(qualified).schema.fields}
        if exists
        else {}
    )
    schemas, raw = _set_aside_misfits(
        spark, pipeline, plan, table, topic, schemas, known, raw, result
    )
    if not schemas.get("value") and not exists:
        log.info("%s: only tombstones for a table that does not exist yet; skipped", qualified)
        return result

    schema = topic_schema(
        [s for _, s in schemas.get("key", [])],
        [s for _, s in schemas.get("value", [])],
        table.key,
        topic,
        table.exclude,
        known,
    )
    changes = decode_changes(
        raw, schema, dict(schemas.get("key", [])), dict(schemas.get("value", []))
    )
    resolved, truncate, counts, max_ts = _check_and_resolve(
        spark, pipeline, plan, topic, schema, changes, result
    )
    toast_columns = [c.name for c in toastable(schema)]
    try:
        result.upserts = counts.get(False, 0)
        result.deletes = counts.get(True, 0)
        with conflicts_reported(
            f"{qualified}: another run wrote to this table at the same time; this run's "
            "batch was not committed to it. Plan again."
        ):
            spark.sql(
                f"CREATE NAMESPACE IF NOT EXISTS {pipeline.catalog.name}.{pipeline.namespace}"
            )
            soft = table.delete_mode is DeleteMode.SOFT
            table_columns = ensure_table(
                spark, qualified, schema, table.properties, table.partition_by, soft
            )
            present = {c.name for c in schema.columns}
            dropped = [n for n in table_columns if n not in present]
            if plan.mode != PlanMode.REPLAY:
                ends = {(r.topic, r.partition): r.end for r in ranges}
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
            # hard deletes: a ledger of deleted keys keeps re-sent older changes out
            hard = bool(schema.key_names) and not soft
            source = with_deleted_lsn(spark, qualified, resolved, schema) if hard else resolved
            source.createOrReplaceTempView(view)
            if hard and result.deletes:
                record_deleted_keys(spark, qualified, view, schema)
            if truncate is not None and truncate.lsn is not None:
                mark_truncated(spark, qualified, truncate.lsn)
            if schema.key_names:
                merge_sql = build_merge_sql(
                    qualified, view, schema, toast_columns,
                    truncate_lsn=truncate.lsn if truncate else None, truncate=truncate is not None,
                    dropped_columns=dropped, soft_delete=soft, deleted_lsn=hard,
                    truncated_below=truncated_below(spark, qualified),
                )  # fmt: skip
            else:
                merge_sql = build_append_sql(qualified, view, schema, soft_delete=soft)
            with commit_properties(spark, props):
                spark.sql(merge_sql)
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
    result.truncated = truncate is not None
    result.snapshot_id = after_id
    for (t, p), o in sorted(new_offsets.items()):
        result.offsets.setdefault(t, {})[str(p)] = o
    log.info(
        "%s: committed %d records (%d upserts, %d deletes) in snapshot %s",
        qualified, records, result.upserts, result.deletes, after_id,
    )  # fmt: skip
    return result


def _set_aside_misfits(
    spark,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    table: TableConfig,
    topic: str,
    schemas: dict[str, list[tuple[int, str]]],
    known: dict[str, str],
    raw,
    result: TableResult,
):
    """Records whose schema version does not fit the table's columns (an incompatible
    type change in the source, e.g. text -> integer): fail naming the first of them, or
    dead-letter them all and go on with the rest. Returns the schemas and records left."""
    from pyspark.sql import functions as F

    rejected: dict[tuple[str, int], str] = {}
    for side in ("key", "value") if not table.key else ("value",):
        versions = [
            (sid, value_row_fields(parse_connect_schema(text), topic) if side == "value"
             else parse_connect_schema(text).fields)
            for sid, text in schemas.get(side, [])
        ]  # fmt: skip
        exclude = table.exclude if side == "value" else ()
        types = column_types([f for _, f in versions], known, exclude)
        for sid, fields in versions:
            if (reason := misfit(fields, types, exclude)) is not None:
                rejected[(side, sid)] = reason
    if not rejected:
        return schemas, raw
    reason = None
    for (side, sid), text in rejected.items():
        cond = F.col(f"{side}_schema_id") == F.lit(sid)
        reason = F.when(cond, F.lit(text)) if reason is None else reason.when(cond, F.lit(text))
    misfits = raw.withColumn("_misfit", reason).where(F.col("_misfit").isNotNull())
    if pipeline.on_error is OnError.DEAD_LETTER:
        dead = misfits.select(
            "topic", "partition", "offset",
            F.col("key_payload").alias("key"), F.col("value_payload").alias("value"),
            F.col("_misfit").alias("error"),
        )  # fmt: skip
        result.dead_letters += _dead_letters(spark, pipeline, plan, dead)
        left = {
            side: [(sid, t) for sid, t in versions if (side, sid) not in rejected]
            for side, versions in schemas.items()
        }
        kept = raw.withColumn("_misfit", reason).where(F.col("_misfit").isNull()).drop("_misfit")
        return left, kept
    first = misfits.orderBy("partition", "offset").limit(1).collect()[0]
    raise DecodeError(
        f"{topic} partition {first.partition} offset {first.offset}: {first._misfit}. "
        f"Nothing of this batch was written to {pipeline.qualified_target(table)}. To go on, "
        "set on_error: dead_letter (these records are set aside), or take the new type: "
        "drop the column from the lake table, load (records of the old type in the same "
        "batch are set aside or fail), and run an incremental snapshot of the table."
    )


def _check_and_resolve(
    spark,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    topic: str,
    schema: TopicSchema,
    changes,
    result: TableResult,
):
    """Check the decoded changes (fail, or dead-letter the bad ones), find the truncate,
    and resolve the latest change per key.

    Decoding (a JSON parse of every payload) is the costly part and the checks, the
    truncate lookup and the resolve are separate Spark jobs: the decoded rows are kept
    for all of them and dropped once the resolved rows are. Returns the resolved rows
    (persisted; the caller unpersists them), the truncate, the count of rows per
    deleted flag and the latest source timestamp.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    dead_letter = pipeline.on_error is OnError.DEAD_LETTER
    if dead_letter:
        changes = changes.withColumn("_reason", invalid_reason(schema))
    else:  # the payload text is only kept for dead letters
        changes = changes.drop("key_payload", "value_payload")
    changes = changes.persist(StorageLevel.MEMORY_AND_DISK)
    resolved = None
    try:
        if dead_letter:
            dead = changes.where(F.col("_reason").isNotNull()).select(
                F.lit(topic).alias("topic"), "partition", "offset",
                F.col("key_payload").alias("key"), F.col("value_payload").alias("value"),
                F.col("_reason").alias("error"),
            )  # fmt: skip
            result.dead_letters += _dead_letters(spark, pipeline, plan, dead)
            valid = changes.where(F.col("_reason").isNull()).drop("_reason")
        else:
            find_invalid(changes, schema, topic)
            valid = changes
        if schema.key_names:
            truncate = find_truncate(valid)
            resolved = resolve_latest(valid, schema, truncate)
        else:  # no key: every change is appended, truncates included
            truncate, resolved = None, changelog(valid, schema)
        resolved = resolved.persist(StorageLevel.MEMORY_AND_DISK)
        stats = (
            resolved.groupBy(DELETED)
            .agg(F.count(F.lit(1)).alias("n"), F.max(SOURCE_TS).alias("ts"))
            .collect()
        )
    except BaseException:
        if resolved is not None:
            resolved.unpersist()
        raise
    finally:
        changes.unpersist()
    counts = {r[DELETED]: r["n"] for r in stats}
    max_ts = max((r["ts"] for r in stats if r["ts"] is not None), default=None)
    return resolved, truncate, counts, max_ts
