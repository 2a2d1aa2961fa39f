"""A topic's changes resolved where they were read: range by range, in the driver, or in
Spark tasks over all of each key's records (`placement`); the same rules everywhere
(`fold`). Records that cannot be applied fail the table or go to the dead
letters."""

from __future__ import annotations

import logging

from cdclake.batch import Batch, Resolved
from cdclake.config import OnError, TableConfig
from cdclake.debezium.schema import TopicSchema
from cdclake.exceptions import DecodeError
from cdclake.kafka.reader import arrow_frame
from cdclake.resolve.fold import resolve_rows
from cdclake.resolve.placement import Placement
from cdclake.resolve.rows import columns_ddl
from cdclake.resolve.rules import FROM_KEY_PREFIX, FROM_LSN, TOAST_PREFIX
from cdclake.resolve.tasks import (
    RAW_COLUMNS,
    REASON,
    TASK_RECORDS,
    TaskReports,
    grouped_by_kafka_key,
    resolve_task,
    task_columns,
)
from cdclake.spark import cache_level

log = logging.getLogger(__name__)


def resolve_table(batch: Batch, topic: str, table: TableConfig, schema: TopicSchema,
                   schemas: dict[str, list[tuple[int, str]]], whole: bool, raw,
                   records: int, cut: int | None) -> Resolved:  # fmt: skip
    """The topic's changes (`records` of them in the batch) resolved where they were
    read: range by range, in the driver (`whole`: no record was set aside before, so the
    driver's rows are the topic's), or in Spark tasks. `cut`: the LSN of the last
    truncate the table applied (a truncate not above it is re-sent)."""
    key_schemas, value_schemas = dict(schemas.get("key", [])), dict(schemas.get("value", []))
    ranged = batch.ranged.get(topic)
    if ranged is not None:
        got = ranged.accepted
        dead = _bad_records(batch, topic, table, list(got.bad))
        return Resolved(ranged.rows, got.truncate, got.counts, got.max_source_ms, got.toast,
                        Placement.RANGES.value, dead)  # fmt: skip
    if whole and batch.rows is not None:  # read by the driver
        import pyarrow.compute as pc

        rows = batch.rows
        mine = rows.filter(pc.and_(pc.equal(rows["topic"], topic), pc.is_null(rows["error"])))
        done = resolve_rows(mine, schema, key_schemas, value_schemas, cut)
        dead = _bad_records(batch, topic, table, list(done.bad))
        frame = arrow_frame(batch.spark, done.rows, done.ddl)
        return Resolved(frame, done.truncate, done.counts, done.max_source_ms, done.toast,
                        Placement.DRIVER.value, dead)  # fmt: skip
    return _resolve_in_tasks(batch, raw, topic, table, schema, key_schemas, value_schemas,
                             records, cut)  # fmt: skip


def _resolve_in_tasks(batch: Batch, raw, topic: str, table: TableConfig, schema: TopicSchema,
                      key_schemas: dict, value_schemas: dict, records: int, cut: int | None,
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
        spread = raw.repartition(max(1, -(-records // TASK_RECORDS)), "key_payload")
    else:
        log.info("%s: resolved in one task (a configured key, several key schemas, or a "
                 "truncate)", topic)  # fmt: skip
        spread = raw.coalesce(1)
    task = resolve_task(schema, key_schemas, value_schemas, cut)
    out = spread.mapInArrow(task, columns_ddl(columns)).persist(cache_level(records))
    try:
        reports = out.where(F.col(REASON).isNotNull()).select(REASON).collect()
        found = TaskReports.of(r[0] for r in reports)
        if found.truncate is not None and by_key:  # the raw scan missed it: the whole topic
            log.warning("%s: a truncate the raw scan did not see; resolving again in one "
                        "task", topic)  # fmt: skip
            out.unpersist()
            return _resolve_in_tasks(batch, raw, topic, table, schema, key_schemas,
                                     value_schemas, records, cut, one_task=True)  # fmt: skip
        dead = _bad_records(batch, topic, table, found.bad)
    except BaseException:
        out.unpersist()
        raise
    rows = out.where(F.col(REASON).isNull()).drop(REASON)
    if not found.toast:  # no placeholder: the MERGE keeps no table value
        rows = rows.drop(
            *(
                n
                for n, _ in columns
                if n.startswith((TOAST_PREFIX, FROM_KEY_PREFIX)) or n == FROM_LSN
            )
        )
    return Resolved(rows, found.truncate, found.counts, found.max_source_ms, found.toast,
                    Placement.TASKS.value, dead, cached=out)  # fmt: skip


def _bad_records(batch: Batch, topic: str, table: TableConfig,
                 bad: list[tuple[int, int, str]]) -> int:  # fmt: skip
    """Records that cannot be applied ((partition, offset, reason), in Kafka order): fail
    the table naming the first, or set them all aside (`on_error`); how many were."""
    if not bad:
        return 0
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
    return batch.dead_letters(frame, len(bad))
