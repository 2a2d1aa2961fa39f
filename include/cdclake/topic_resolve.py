"""A topic's changes resolved where they were read: range by range, in the driver, in Spark
tasks grouped by key, or by the Spark SQL jobs (`placement`)."""

from __future__ import annotations

import logging

from cdclake.batch import Batch, Resolved, TableResult
from cdclake.changes import DELETED, SOURCE_TS, TopicSchema, decode_changes
from cdclake.config import OnError, TableConfig
from cdclake.driver_resolve import (
    RAW_COLUMNS,
    TASK_RECORDS,
    UNSUPPORTED_MARK,
    DriverResolved,
    Unsupported,
    resolve_rows,
    resolve_task,
    task_ddl,
    tasks_can_resolve,
)
from cdclake.reader import arrow_frame
from cdclake.resolve import (
    CHECK_FIRST_TYPE,
    CHECK_TRUNCATE_TYPE,
    REASON,
    changelog,
    check_aggregates,
    check_changes,
    invalid_reason,
    read_check,
    resolve_latest,
)
from cdclake.spark import cache_level

log = logging.getLogger(__name__)


def resolve_table(batch: Batch, topic: str, table: TableConfig, schema: TopicSchema,
                   schemas: dict[str, list[tuple[int, str]]], whole: bool, raw,
                   result: TableResult) -> Resolved:  # fmt: skip
    """The topic's changes resolved where they were read: range by range, in the driver,
    in Spark tasks grouped by key, or by the Spark SQL jobs."""
    key_schemas, value_schemas = dict(schemas.get("key", [])), dict(schemas.get("value", []))
    ranged = batch.ranged.get(topic)
    local = in_tasks = None
    if ranged is not None:
        got = ranged.accepted
        in_tasks = ranged.rows, got.counts, got.max_source_ms, got.toast
    elif whole and batch.rows is not None:  # read by the driver
        local = _resolve_in_driver(batch.rows, topic, schema, key_schemas, value_schemas)
    elif whole:
        in_tasks = _resolve_in_tasks(batch, raw, topic, table, schema, key_schemas,
                                     value_schemas, result.records)  # fmt: skip
    result.resolved_by = ("ranges" if ranged else "driver" if local else "tasks" if in_tasks
                          else "spark")  # fmt: skip
    if local is not None:
        rows = arrow_frame(batch.spark, local.rows, local.ddl)
        return Resolved(rows, local.truncate, local.counts, local.max_source_ms, local.toast)
    if in_tasks is not None:
        truncate = ranged.accepted.truncate if ranged is not None else None
        rows, counts, max_ms, toast = in_tasks
        return Resolved(rows, truncate, counts, max_ms, toast)
    changes = decode_changes(raw, schema, key_schemas, value_schemas)
    return Resolved(*_check_and_resolve(batch, topic, schema, changes, result))


def _resolve_in_driver(rows, topic: str, schema: TopicSchema, key_schemas: dict,
                       value_schemas: dict) -> DriverResolved | None:  # fmt: skip
    """The topic's records resolved in the driver, or None when the Spark jobs must do it
    (a record that cannot be applied, a value the driver does not decode as Spark does)."""
    import pyarrow.compute as pc

    mine = rows.filter(pc.and_(pc.equal(rows["topic"], topic), pc.is_null(rows["error"])))
    try:
        return resolve_rows(mine, schema, key_schemas, value_schemas)
    except Unsupported as why:
        log.info("%s: resolved by Spark jobs: %s", topic, why)
        return None


def _resolve_in_tasks(batch: Batch, raw, topic: str, table: TableConfig, schema: TopicSchema,
                      key_schemas: dict, value_schemas: dict, records: int):  # fmt: skip
    """(resolved rows, persisted; counts; latest source ms; TOAST flags) from Spark tasks
    running the driver's resolve over each key's records, or None when the Spark SQL jobs
    must do it. Every record of a key has the same Kafka key text, so a shuffle by that
    text puts all of a key's records of the batch in one task."""
    if not batch.placement.in_tasks:
        return None
    why = tasks_can_resolve(schema, key_schemas, table.key)
    if why is None and topic in batch.scan.truncates:
        why = "the topic may hold a truncate"
    if why is not None:
        log.info("%s: resolved by Spark jobs: %s", topic, why)
        return None
    toast = topic in batch.scan.toasts
    task = resolve_task(schema, key_schemas, value_schemas, toast)
    resolved = (
        raw.select(*RAW_COLUMNS)
        .repartition(max(1, -(-records // TASK_RECORDS)), "key_payload")
        .mapInArrow(task, task_ddl(schema, toast))
        .persist(cache_level(records))
    )
    try:
        counts, max_ms = _summary(_stats(resolved).collect())
    except Exception as exc:
        resolved.unpersist()
        if UNSUPPORTED_MARK not in str(exc):
            raise
        reason = str(exc).split(UNSUPPORTED_MARK, 1)[1].splitlines()[0]
        log.info("%s: resolved by Spark jobs: %s", topic, reason)
        return None
    return resolved, counts, max_ms, toast


def _summary(stats) -> tuple[dict[bool, int], int | None]:
    """Rows per deleted flag and the latest source timestamp (epoch ms) from `_stats`."""
    counts = {r[DELETED]: r["n"] for r in stats}
    max_ts = max((r["ts"] for r in stats if r["ts"] is not None), default=None)
    return counts, None if max_ts is None else int(max_ts.timestamp() * 1000)


def _check_and_resolve(batch: Batch, topic: str, schema: TopicSchema, changes, result):
    """Check the decoded changes (fail, or dead-letter the bad ones), find the truncate,
    and resolve the latest change per key.

    Decoding (a JSON parse of every payload) is the costly part: the decoded rows, with
    the reason each one cannot be applied, are kept for the check and the resolve and
    dropped once the resolved rows are. The resolved rows are cached by the aggregation
    that counts them and finds the latest source timestamp. The check (first invalid
    record, how many, the last truncate) runs in that same job when the batch's raw scan
    says the topic has no truncate; else it is a job of its own before the resolve,
    which needs the truncate's position. Nothing is written before both are known.
    Returns the resolved rows (persisted; the caller unpersists them), the truncate, the
    count of rows per deleted flag and the latest source timestamp (epoch milliseconds).
    """
    from pyspark.sql import functions as F

    level = cache_level(result.records)
    dead_letter = batch.pipeline.on_error is OnError.DEAD_LETTER
    changes = changes.withColumn(REASON, invalid_reason(schema))
    if not dead_letter:  # the payload text is only kept for dead letters
        changes = changes.drop("key_payload", "value_payload")
    changes = changes.persist(level)
    resolved = None
    try:
        valid = changes.where(F.col(REASON).isNull()).drop(REASON)
        together = bool(schema.key_names) and topic not in batch.scan.truncates
        toast, check = True, None
        if together:
            truncate, toast = None, topic in batch.scan.toasts
            resolved = resolve_latest(valid, schema, None, toast=toast)
            resolved = resolved.persist(level)
            check, stats = _check_with_stats(changes, resolved, schema, placeholders=not toast)
            if check.truncate is not None or check.placeholders:
                # the raw scan missed a truncate or a placeholder: resolve again with them
                # (the check already found the truncate)
                log.warning("%s: a truncate or TOAST placeholder the raw scan did not see; "
                            "resolving again", topic)  # fmt: skip
                resolved.unpersist()
                together, toast = False, True
        if not together:
            if check is None:
                check = check_changes(changes, schema)
            if schema.key_names:
                truncate = check.truncate
                resolved = resolve_latest(valid, schema, truncate)
            else:  # no key: every change is appended, truncates included
                truncate, resolved = None, changelog(valid, schema)
            resolved = resolved.persist(level)
        if not dead_letter:
            check.raise_invalid(topic)
        elif check.invalid:
            dead = changes.where(F.col(REASON).isNotNull()).select(
                F.lit(topic).alias("topic"), "partition", "offset",
                F.col("key_payload").alias("key"), F.col("value_payload").alias("value"),
                F.col(REASON).alias("error"),
            )  # fmt: skip
            result.dead_letters += batch.dead_letters(dead, check.invalid)
        if not together:
            stats = _stats(resolved).collect()
    except BaseException:
        if resolved is not None:
            resolved.unpersist()
        raise
    finally:
        changes.unpersist()
    counts, max_ms = _summary(stats)
    return resolved, truncate, counts, max_ms, toast


def _stats(resolved):
    """Rows per deleted flag, and the latest source timestamp of each."""
    from pyspark.sql import functions as F

    return resolved.groupBy(DELETED).agg(F.count(F.lit(1)).alias("n"), F.max(SOURCE_TS).alias("ts"))


def _check_with_stats(changes, resolved, schema: TopicSchema, placeholders: bool = False):
    """The check of the changes and the stats of the resolved rows, in one Spark job:
    (ChangeCheck, stats rows)."""
    from pyspark.sql import functions as F

    stats = _stats(resolved).select(
        F.lit(False).alias("is_check"), DELETED, "n", "ts",
        F.lit(None).cast(CHECK_FIRST_TYPE).alias("first"),
        F.lit(None).cast(CHECK_TRUNCATE_TYPE).alias("truncate"),
        F.lit(None).cast("bigint").alias("placeholders"),
    )  # fmt: skip
    aggs = check_aggregates(changes, schema, placeholders=placeholders)
    check = changes.agg(*aggs).select(
        F.lit(True).alias("is_check"), F.lit(None).cast("boolean").alias(DELETED), "n",
        F.lit(None).cast("timestamp").alias("ts"), "first", "truncate",
        F.col("placeholders") if placeholders else F.lit(None).cast("bigint").alias("placeholders"),
    )  # fmt: skip
    rows = stats.unionByName(check).collect()
    found = next(r for r in rows if r["is_check"])
    return read_check(found), [r for r in rows if not r["is_check"]]
