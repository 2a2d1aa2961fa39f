"""Transform: keep the latest change per key, in Kafka order, and say what it does."""

from __future__ import annotations

from cdclake.changes import DELETED, LSN, OFFSET, OP, PARTITION, SOURCE_TS, TopicSchema
from cdclake.exceptions import DecodeError

ROW_OPS = ("c", "u", "d", "r")


def find_invalid(changes, schema: TopicSchema, topic: str) -> None:
    """Fail on the first record that cannot be applied, naming topic, partition, offset."""
    from pyspark.sql import functions as F

    key_missing = F.lit(True)
    for k in schema.key_names:
        key_missing = (
            key_missing
            & F.coalesce(F.col("key")[k], F.col("after")[k], F.col("before")[k]).isNull()
        )
    reason = (
        F.when(~F.col("is_tombstone") & F.col("op").isNull(),
               F.lit("value is not a Debezium envelope matching its schema"))
        .when(F.col("op") == "t", F.lit("truncate events are not supported by this version"))
        .when(~F.col("is_tombstone") & ~F.col("op").isin(*ROW_OPS),
              F.concat(F.lit("unknown operation "), F.col("op")))
        .when(key_missing, F.lit("record has no key"))
    )  # fmt: skip
    bad = (
        changes.select("partition", "offset", reason.alias("reason"))
        .where(F.col("reason").isNotNull())
        .orderBy("partition", "offset")
        .limit(1)
        .collect()
    )
    if bad:
        row = bad[0]
        raise DecodeError(
            f"{topic} partition {row['partition']} offset {row['offset']}: {row['reason']}"
        )


def resolve_latest(changes, schema: TopicSchema):
    """One row per key: the change with the highest Kafka offset, flattened for MERGE."""
    from pyspark.sql import functions as F

    keys = [
        F.coalesce(F.col("key")[k], F.col("after")[k], F.col("before")[k]).alias(k)
        for k in schema.key_names
    ]
    payload = F.struct("offset", "partition", "is_tombstone", "op", "after", "source_ts_ms", "lsn")
    latest = (
        changes.select(*keys, payload.alias("p"))
        .groupBy(*schema.key_names)
        .agg(F.max_by("p", F.col("p.offset")).alias("r"))
    )
    deleted = F.col("r.is_tombstone") | (F.col("r.op") == "d")
    cols = []
    for c in schema.columns:
        if c.name in schema.key_names:
            cols.append(F.col(f"`{c.name}`"))
        else:
            cols.append(F.col("r.after")[c.name].alias(c.name))
    return latest.select(
        *cols,
        deleted.alias(DELETED),
        F.when(F.col("r.is_tombstone"), F.lit("d")).otherwise(F.col("r.op")).alias(OP),
        F.timestamp_millis(F.col("r.source_ts_ms")).alias(SOURCE_TS),
        F.col("r.lsn").alias(LSN),
        F.col("r.partition").alias(PARTITION),
        F.col("r.offset").alias(OFFSET),
    )
