"""A topic's changes resolved where they were read: range by range, in the driver, or in
Spark tasks over all of each key's records (`placement`); the same rules everywhere
(`fold`). Records that cannot be applied fail the table or go to the dead
letters."""

from __future__ import annotations

import logging

from cdclake.batch import Batch, Resolved, TableResult
from cdclake.config import OnError, TableConfig
from cdclake.debezium.schema import DELETED, LSN, OFFSET, PARTITION, SOURCE_TS, TopicSchema
from cdclake.exceptions import DecodeError
from cdclake.kafka.reader import arrow_frame
from cdclake.resolve.fold import (
    RAW_COLUMNS,
    REASON,
    TASK_RECORDS,
    TRUNCATE_MARK,
    grouped_by_kafka_key,
    resolve_rows,
    resolve_task,
    task_columns,
)
from cdclake.resolve.rows import columns_ddl
from cdclake.resolve.rules import FROM_KEY_PREFIX, TOAST_PREFIX, Truncate
from cdclake.spark import cache_level

log = logging.getLogger(__name__)


def resolve_table(batch: Batch, topic: str, table: TableConfig, schema: TopicSchema,
                   schemas: dict[str, list[tuple[int, str]]], whole: bool, raw,
                   result: TableResult) -> Resolved:  # fmt: skip
    """The topic's changes resolved where they were read: range by range, in the driver
    (`whole`: no record was set aside before, so the driver's rows are the topic's), or
    in Spark tasks."""
    key_schemas, value_schemas = dict(schemas.get("key", [])), dict(schemas.get("value", []))
    ranged = batch.ranged.get(topic)
    if ranged is not None:
        result.resolved_by = "ranges"
        got = ranged.accepted
        return Resolved(ranged.rows, got.truncate, got.counts, got.max_source_ms, got.toast)
    if whole and batch.rows is not None:  # read by the driver
        import pyarrow.compute as pc

        result.resolved_by = "driver"
        rows = batch.rows
        mine = rows.filter(pc.and_(pc.equal(rows["topic"], topic), pc.is_null(rows["error"])))
        done = resolve_rows(mine, schema, key_schemas, value_schemas)
        _bad_records(batch, topic, table, list(done.bad), result)
        frame = arrow_frame(batch.spark, done.rows, done.ddl)
        return Resolved(frame, done.truncate, done.counts, done.max_source_ms, done.toast)
    result.resolved_by = "tasks"
    return _resolve_in_tasks(batch, raw, topic, table, schema, key_schemas, value_schemas,
                             result)  # fmt: skip


def _resolve_in_tasks(batch: Batch, raw, topic: str, table: TableConfig, schema: TopicSchema,
                      key_schemas: dict, value_schemas: dict, result: TableResult,
                      one_task: bool = False) -> Resolved:  # fmt: skip
    """The topic's records resolved by Spark tasks, each over all the records of its keys.
    Every record of a key has the same Kafka key text when the key is the Kafka key with
    one schema in the batch: a shuffle by that text puts a key's records in one task. A
    table without a key needs no shuffle (each change is a row). Otherwise (a configured
    key, several key schemas, a truncate, which drops what came before it in every
    partition, or `one_task`) one task takes all the topic's records."""
    from pyspark.sql import functions as F

    columns = task_columns(schema)
    raw = raw.select(*RAW_COLUMNS)
    by_key = (not one_task and topic not in batch.scan.truncates
              and grouped_by_kafka_key(schema, key_schemas, table.key))  # fmt: skip
    if not schema.key_names:
        spread = raw
    elif by_key:
        spread = raw.repartition(max(1, -(-result.records // TASK_RECORDS)), "key_payload")
    else:
        log.info("%s: resolved in one task (a configured key, several key schemas, or a "
                 "truncate)", topic)  # fmt: skip
        spread = raw.coalesce(1)
    task = resolve_task(schema, key_schemas, value_schemas)
    out = spread.mapInArrow(task, columns_ddl(columns)).persist(cache_level(result.records))
    try:
        flags = [n for n, _ in columns if n.startswith(TOAST_PREFIX)]
        from_key = [n for n, _ in columns if n.startswith(FROM_KEY_PREFIX)]
        stats, marks = _stats_and_marks(out, flags)
        truncates = [Truncate(m[PARTITION], m[OFFSET], m[LSN]) for m in marks
                     if m[REASON] == TRUNCATE_MARK]  # fmt: skip
        truncate = max(truncates, key=lambda t: (t.offset, t.partition), default=None)
        if truncate is not None and by_key:  # the raw scan missed it: the whole topic
            log.warning("%s: a truncate the raw scan did not see; resolving again in one "
                        "task", topic)  # fmt: skip
            out.unpersist()
            return _resolve_in_tasks(batch, raw, topic, table, schema, key_schemas,
                                     value_schemas, result, one_task=True)  # fmt: skip
        bad = [(m[PARTITION], m[OFFSET], m[REASON]) for m in marks if m[REASON] != TRUNCATE_MARK]
        _bad_records(batch, topic, table, sorted(bad), result)
    except BaseException:
        out.unpersist()
        raise
    counts = {r[DELETED]: r["n"] for r in stats}
    max_ts = max((r["ts"] for r in stats if r["ts"] is not None), default=None)
    max_ms = None if max_ts is None else int(max_ts.timestamp() * 1000)
    rows = out.where(F.col(REASON).isNull()).drop(REASON)
    toast = any(r["toast"] for r in stats)
    if not toast:  # no placeholder: the MERGE keeps no table value
        rows = rows.drop(*flags, *from_key)
    return Resolved(rows, truncate, counts, max_ms, toast, cached=out)


def _stats_and_marks(out, flags: list[str]):
    """In one Spark job: the rows per deleted flag with their latest source time and
    whether any of them has a TOAST `flags` set, and the rows that report a record that
    cannot be applied or a truncate."""
    from functools import reduce

    from pyspark.sql import functions as F

    reported = F.col(REASON).isNotNull()
    flagged = reduce(lambda a, b: a | b, [F.col(f) for f in flags], F.lit(False))
    grouped = out.groupBy(
        F.when(reported, F.struct(PARTITION, OFFSET, LSN, REASON)).alias("mark"), DELETED
    ).agg(F.count(F.lit(1)).alias("n"), F.max(SOURCE_TS).alias("ts"),
          F.max(F.coalesce(flagged, F.lit(False))).alias("toast"))  # fmt: skip
    rows = grouped.collect()
    stats = [r for r in rows if r["mark"] is None]
    return stats, [r["mark"] for r in rows if r["mark"] is not None]


def _bad_records(batch: Batch, topic: str, table: TableConfig,
                 bad: list[tuple[int, int, str]], result: TableResult) -> None:  # fmt: skip
    """Records that cannot be applied ((partition, offset, reason), in Kafka order): fail
    the table naming the first, or set them all aside (`on_error`)."""
    if not bad:
        return
    if batch.pipeline.on_error is not OnError.DEAD_LETTER:
        partition, offset, reason = bad[0]
        raise DecodeError(
            f"{topic} partition {partition} offset {offset}: {reason}. Nothing of this batch "
            f"was written to {batch.pipeline.qualified_target(table)}; {len(bad)} record(s) "
            "cannot be applied. To go on, set on_error: dead_letter (they are set aside)."
        )
    frame = batch.spark.createDataFrame(
        [(topic, p, o, None, None, why) for p, o, why in bad],
        "topic string, partition int, offset bigint, key string, value string, error string",
    )
    result.dead_letters += batch.dead_letters(frame, len(bad))
