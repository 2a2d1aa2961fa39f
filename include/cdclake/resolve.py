"""Transform: keep the latest change per key, in Kafka order, and say what it does.

Rules (the semantics the tests pin down):
- Per key, Kafka order decides. A record whose source LSN is not above an LSN already
  seen for its key is a re-sent duplicate (Debezium is at-least-once) and is skipped; a
  tombstone shares the fate of the delete just before it, and is a no-op when that
  delete was in an earlier batch. Records without an LSN
  (incremental snapshot reads) are never skipped.
- A truncate removes every row loaded before it: records of the batch before it are
  dropped and the MERGE deletes table rows whose LSN is below the truncate's.
- An unchanged TOASTed column arrives as a placeholder; it takes the last real value of
  the batch for that key, or else keeps the value already in the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdclake.changes import DELETED, LSN, OFFSET, OP, PARTITION, SOURCE_TS, Column, TopicSchema
from cdclake.exceptions import DecodeError

ROW_OPS = ("c", "u", "d", "r")
TRUNCATE = "t"
TOAST_PLACEHOLDER = "__debezium_unavailable_value"
TOAST_PREFIX = "_cdc_toast_"
STALE_CHECK_LSN = "_cdc_check_lsn"
# a keyed table's resolved row carries values of the batch: false only for a deleted key
# whose batch holds no row after of it (its columns are then NULL, and a soft delete keeps
# the values the table has)
HAS_VALUES = "_cdc_has_values"


@dataclass(frozen=True)
class Truncate:
    """The last truncate of a batch: where it is in Kafka and in the WAL."""

    partition: int
    offset: int
    lsn: int | None


def toast_test(value, column: Column):
    """Column is the placeholder, for the types Debezium can send one in; else None."""
    from pyspark.sql import functions as F

    if column.type == "string":
        return value == F.lit(TOAST_PLACEHOLDER)
    if column.type == "binary":
        return value == F.lit(bytearray(TOAST_PLACEHOLDER.encode()))
    if column.type == "array<string>":
        return (F.size(value) == 1) & (value[0] == F.lit(TOAST_PLACEHOLDER))
    return None


def toastable(schema: TopicSchema) -> list[Column]:
    keys = set(schema.key_names)
    return [c for c in schema.columns if c.name not in keys and toast_test_possible(c)]


def toast_test_possible(column: Column) -> bool:
    return column.type in ("string", "binary", "array<string>")


def invalid_reason(schema: TopicSchema):
    """Why a change record cannot be applied (NULL when it can)."""
    from pyspark.sql import functions as F

    key_missing = F.lit(len(schema.key_names) > 0)
    for k in schema.key_names:
        key_missing = (
            key_missing
            & F.coalesce(F.col("key")[k], F.col("after")[k], F.col("before")[k]).isNull()
        )
    return (
        F.when(
            ~F.col("is_tombstone") & F.col("op").isNull(),
            F.lit("value is not a Debezium envelope matching its schema"),
        )
        .when(
            ~F.col("is_tombstone") & ~F.col("op").isin(*ROW_OPS, TRUNCATE),
            F.concat(F.lit("unknown operation "), F.col("op")),
        )
        .when(
            F.coalesce(F.size("unfit"), F.lit(0)) > 0,
            F.concat(F.lit("value does not fit column(s) "), F.array_join("unfit", ", ")),
        )
        .when(
            ~F.col("is_tombstone") & (F.col("op") != TRUNCATE) & key_missing,
            F.lit("record has no key"),
        )
    )


REASON = "_reason"


@dataclass(frozen=True)
class ChangeCheck:
    """What the checks of a topic's decoded changes found."""

    first_invalid: tuple[int, int, str] | None  # partition, offset, reason
    invalid: int  # records that cannot be applied
    truncate: Truncate | None  # the last truncate among the records that can
    placeholders: int | None = None  # records with a TOAST placeholder, when counted

    def raise_invalid(self, topic: str) -> None:
        """Fail on the first record that cannot be applied, naming topic, partition,
        offset."""
        if self.first_invalid is not None:
            partition, offset, reason = self.first_invalid
            raise DecodeError(f"{topic} partition {partition} offset {offset}: {reason}")


CHECK_FIRST_TYPE = "struct<partition:int,offset:bigint,reason:string>"
CHECK_TRUNCATE_TYPE = "struct<partition:int,offset:bigint,lsn:bigint>"


def check_aggregates(
    changes, schema: TopicSchema, truncate: bool = True, placeholders: bool = False
) -> list:
    """The aggregates of the validity check (and, with `truncate`, the truncate lookup;
    with `placeholders`, the count of records with a TOAST placeholder) over decoded
    changes, to run alone (`check_changes`) or beside another aggregation.
    Uses the `_reason` column when the changes carry it (`invalid_reason`, computed once
    where they are cached)."""
    from pyspark.sql import functions as F

    reason = F.col(REASON) if REASON in changes.columns else invalid_reason(schema)
    bad = reason.isNotNull()
    where = F.struct("partition", "offset", reason.alias("reason"))
    aggs = [
        F.min(F.when(bad, where)).alias("first"),
        F.count(F.when(bad, F.lit(1))).alias("n"),
    ]
    if placeholders:
        # valid records holding a TOAST placeholder in their new values
        held = [t for c in toastable(schema) if (t := toast_test(F.col("after")[c.name], c))
                is not None]  # fmt: skip
        found = F.lit(False)
        for t in held:
            found = found | F.coalesce(t, F.lit(False))
        aggs.append(F.count(F.when(~bad & found, F.lit(1))).alias("placeholders"))
    if truncate:
        is_truncate = ~bad & (F.col("op") == TRUNCATE)
        # the truncate with the highest offset (orderings that are NULL do not count)
        aggs.append(
            F.max_by(F.struct("partition", "offset", "lsn"),
                     F.when(is_truncate, F.col("offset"))).alias("truncate")
        )  # fmt: skip
    return aggs


def read_check(row) -> ChangeCheck:
    """The ChangeCheck from a row of `check_aggregates`."""
    first = row["first"]
    trunc = row["truncate"] if "truncate" in row.__fields__ else None
    return ChangeCheck(
        first_invalid=(first["partition"], first["offset"], first["reason"]) if first else None,
        invalid=row["n"],
        truncate=Truncate(trunc["partition"], trunc["offset"], trunc["lsn"]) if trunc else None,
        placeholders=row["placeholders"] if "placeholders" in row.__fields__ else None,
    )


def check_changes(changes, schema: TopicSchema) -> ChangeCheck:
    """One Spark job over the decoded changes for the validity check, the count of
    invalid records and the truncate lookup."""
    return read_check(changes.agg(*check_aggregates(changes, schema)).collect()[0])


def find_invalid(changes, schema: TopicSchema, topic: str) -> None:
    """Fail on the first record that cannot be applied, naming topic, partition, offset."""
    check_changes(changes, schema).raise_invalid(topic)


def after_truncate(changes, truncate: Truncate | None):
    """Only the records that come after the truncate (Kafka order in its partition, WAL
    order in the others)."""
    from pyspark.sql import functions as F

    rows = changes.where((F.col("op") != TRUNCATE) | F.col("op").isNull())
    if truncate is None:
        return rows
    same = (F.col("partition") == truncate.partition) & (F.col("offset") > truncate.offset)
    other = F.col("partition") != truncate.partition
    if truncate.lsn is not None:
        other = other & (F.col("lsn").isNull() | (F.col("lsn") > truncate.lsn))
    return rows.where(same | other)


def drop_stale(changes, key_names: tuple[str, ...]):
    """Skip re-sent records: LSN not above one already seen for the key in this batch."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*key_names).orderBy("partition", "offset")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    seen = F.max("lsn").over(before)
    stale = F.col("lsn").isNotNull() & seen.isNotNull() & (F.col("lsn") <= seen)
    marked = changes.withColumn("_stale", stale)
    prev_stale = F.lag("_stale").over(order)
    marked = marked.withColumn(
        "_stale",
        # a tombstone with no record before it in the batch: its delete came in an earlier
        # batch and was applied (the row is gone) or was a re-sent one (the row is newer)
        F.when(F.col("is_tombstone"), F.coalesce(prev_stale, F.lit(True))).otherwise(
            F.col("_stale")
        ),
    )
    return marked.where(~F.col("_stale")).drop("_stale")


def changelog(changes, schema: TopicSchema):
    """Every change as a row, in Kafka order, for tables without a key: the row's values
    (the old ones for a delete), the operation and where it came from. A truncate is a row
    of NULLs with op `t`; tombstones carry nothing. An unchanged TOASTed value takes the
    value before the change when the connector sent one (REPLICA IDENTITY FULL), else NULL:
    the placeholder never reaches the table."""
    from pyspark.sql import functions as F

    rows = changes.where(~F.col("is_tombstone") & F.col("op").isin(*ROW_OPS, TRUNCATE))
    deleted = F.col("op") == "d"
    data = F.when(deleted, F.col("before")).when(F.col("op") != TRUNCATE, F.col("after"))
    cols = []
    for c in schema.columns:
        value = data[c.name]
        test = toast_test(value, c) if toast_test_possible(c) else None
        if test is not None:
            value = F.when(F.coalesce(test, F.lit(False)), F.col("before")[c.name]).otherwise(value)
        cols.append(value.alias(c.name))
    return rows.select(
        *cols,
        deleted.alias(DELETED),
        F.col("op").alias(OP),
        F.timestamp_millis(F.col("source_ts_ms")).alias(SOURCE_TS),
        F.col("lsn").alias(LSN),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
    )


def resolve_latest(
    changes, schema: TopicSchema, truncate: Truncate | None = None, toast: bool = True
):
    """One row per key: the change with the highest Kafka offset, flattened for MERGE.
    With `toast=False` (the batch has no TOAST placeholder) the per-column aggregates that
    fill placeholders in are left out."""
    from pyspark.sql import functions as F

    keys = [
        F.coalesce(F.col("key")[k], F.col("after")[k], F.col("before")[k]).alias(k)
        for k in schema.key_names
    ]
    rows = after_truncate(changes, truncate).select(
        *keys, "partition", "offset", "is_tombstone", "op", "after", "before", "source_ts_ms",
        "lsn",
    )  # fmt: skip
    # a tombstone without key (table without primary key) carries nothing: the delete
    # event before it already holds the row
    no_key = F.lit(True)
    for k in schema.key_names:
        no_key = no_key & F.col(k).isNull()
    rows = rows.where(~(F.col("is_tombstone") & no_key))
    rows = drop_stale(rows, schema.key_names)
    payload = F.struct("offset", "partition", "is_tombstone", "op", "after", "source_ts_ms", "lsn")
    aggs = [
        F.max_by(payload, F.col("offset")).alias("r"),
        F.max("lsn").alias("lsn_max"),
        # the last values a deleted row had in this batch (kept by soft deletes), else
        # its last delete's row before (whole with REPLICA IDENTITY FULL)
        F.max_by("after", F.when(F.col("after").isNotNull(), F.col("offset"))).alias("last_after"),
        F.max_by("before", F.when(F.col("op") == "d", F.col("offset"))).alias("last_before"),
        # the LSN of the change a latest tombstone follows (its delete)
        F.max_by("lsn", F.when(~F.col("is_tombstone"), F.col("offset"))).alias("change_lsn"),
        # that delete, which describes a latest tombstone's row
        F.max_by(
            F.struct("partition", "offset", "source_ts_ms"),
            F.when(~F.col("is_tombstone"), F.col("offset")),
        ).alias("change"),  # fmt: skip
    ]
    toasty = toastable(schema) if toast else []
    for c in toasty:
        real = F.col("after").isNotNull() & ~toast_test(F.col("after")[c.name], c)
        aggs.append(
            F.max_by(F.col("after")[c.name], F.when(real, F.col("offset"))).alias(f"v_{c.name}")
        )
        aggs.append(F.max(F.when(real, F.col("offset"))).alias(f"o_{c.name}"))
    latest = rows.groupBy(*schema.key_names).agg(*aggs)

    deleted = F.col("r.is_tombstone") | (F.col("r.op") == "d")
    cols, flags = [], []
    toast_names = {c.name for c in toasty}
    after = F.when(deleted, F.coalesce("last_after", "last_before")).otherwise(F.col("r.after"))
    for c in schema.columns:
        if c.name in schema.key_names:
            cols.append(F.col(f"`{c.name}`"))
            continue
        value = after[c.name]
        if c.name not in toast_names:
            cols.append(value.alias(c.name))
            continue
        # a deleted key's row (written with soft deletes) takes the value too; the flag
        # tells the MERGE to keep the table's value
        placeholder = F.coalesce(toast_test(value, c), F.lit(False))
        from_batch = F.col(f"o_{c.name}").isNotNull()
        unresolved = placeholder & ~from_batch
        cols.append(
            F.when(unresolved, F.lit(None))
            .when(placeholder, F.col(f"v_{c.name}"))
            .otherwise(value)
            .alias(c.name)
        )
        flags.append(unresolved.alias(f"{TOAST_PREFIX}{c.name}"))
    at = F.when(F.col("r.is_tombstone") & F.col("change").isNotNull(), F.col("change"))
    at = at.otherwise(F.struct("r.partition", "r.offset", "r.source_ts_ms"))
    return latest.select(
        *cols,
        deleted.alias(DELETED),
        F.when(F.col("r.is_tombstone"), F.lit("d")).otherwise(F.col("r.op")).alias(OP),
        F.timestamp_millis(at["source_ts_ms"]).alias(SOURCE_TS),
        F.coalesce(F.col("r.lsn"), F.col("lsn_max")).alias(LSN),
        # a re-sent delete must not remove a newer row: a tombstone is checked with the
        # LSN of its delete
        F.when(F.col("r.is_tombstone"), F.col("change_lsn"))
        .otherwise(F.col("r.lsn"))
        .alias(STALE_CHECK_LSN),
        (~deleted | F.col("last_after").isNotNull()).alias(HAS_VALUES),
        at["partition"].alias(PARTITION),
        at["offset"].alias(OFFSET),
        *flags,
    )
