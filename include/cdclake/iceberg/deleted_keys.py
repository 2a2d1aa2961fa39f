"""A hard-delete table's ledger of deleted keys (`_cdclake_deleted_keys__<table>`): the LSN
of each key's delete, so that a re-sent older change of the key, loaded in a later batch,
does not bring the row back (the MERGE compares it, `DELETED_AT`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdclake.debezium.schema import DELETED, LSN, TopicSchema, widens
from cdclake.iceberg.merge_sql import DELETED_AT, TABLE_PROPERTIES, _properties_sql, quote
from cdclake.iceberg.snapshots import live_rows
from cdclake.iceberg.tables import _create, current_snapshot, table_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DELETED_KEYS_PREFIX = "_cdclake_deleted_keys__"  # + the table's name


def deleted_keys_table(table: str) -> str:
    """The table that remembers, for a hard-delete table, the LSN of each key's delete."""
    head, _, name = table.rpartition(".")
    return f"{head}.{DELETED_KEYS_PREFIX}{name}"


def with_deleted_lsn(
    spark: SparkSession, table: str, resolved: DataFrame, schema: TopicSchema
) -> DataFrame:
    """The resolved rows with the LSN of an earlier hard delete of their key (or NULL).
    Only the ledger's rows of the batch's keys are grouped (a semi join first): the
    ledger holds a row per delete ever loaded, the batch a few of its keys."""
    from pyspark.sql import functions as F

    ledger = deleted_keys_table(table)
    if not spark.catalog.tableExists(ledger):
        return resolved.withColumn(DELETED_AT, F.lit(None).cast("bigint"))
    keys = list(schema.key_names)
    deletes = (
        spark.table(ledger)
        .join(resolved.select(*keys), keys, "left_semi")
        .groupBy(*keys)
        .agg(F.max(LSN).alias(DELETED_AT))
    )
    return resolved.join(deletes, keys, "left")


def prune_deleted_keys(spark: SparkSession, table: str) -> int:
    """Remove the rows of `table`'s deleted-keys ledger that no load can need any more,
    and return how many. Exactly those: a key's row below the highest LSN the ledger
    holds for it (a load takes the highest), and a key's row below the LSN of the row the
    table now holds for the key (a re-sent change older than the ledger's LSN is older than
    that row too, and loses to it; a later delete of the row writes its own ledger row
    first). The row of a key that stays deleted stays."""
    ledger = deleted_keys_table(table)
    keys = [n for n in table_columns(spark, ledger) if n != LSN]

    def newer_in(source: str) -> str:
        same = " AND ".join(f"s.{quote(k)} = l.{quote(k)}" for k in keys)
        return f"EXISTS (SELECT 1 FROM {source} s WHERE {same} AND s.{LSN} > l.{LSN})"

    gone = newer_in(ledger)
    if set(keys) <= set(table_columns(spark, table)):  # else the key changed since
        gone += f" OR {newer_in(table)}"
    before = live_rows(current_snapshot(spark, ledger)[1])
    spark.sql(f"DELETE FROM {ledger} l WHERE {gone}")
    after = live_rows(current_snapshot(spark, ledger)[1])
    return 0 if before is None or after is None else max(0, before - after)


def record_deleted_keys(
    spark: SparkSession, table: str, resolved: DataFrame, schema: TopicSchema
) -> None:
    """Remember the LSN of every key this batch hard-deletes (the deleted rows of
    `resolved`, the batch's resolved rows), so that a re-sent older change of the key,
    loaded in a later batch, does not bring the row back. The ledger only grows by
    deleted keys (a retried batch may add the same rows again, harmlessly); it is written
    before the table (a crash in between leaves facts the stream already holds). It
    reads the resolved rows themselves, not the MERGE's source with the ledger joined."""
    ledger = deleted_keys_table(table)
    wanted = {k.name: k.type for k in schema.key}
    exists = spark.catalog.tableExists(ledger)
    if exists:
        have = table_columns(spark, ledger)
        if set(have) != {*wanted, LSN}:  # the key changed: start a new ledger
            spark.sql(f"DROP TABLE {ledger} PURGE")
            exists = False
        else:
            for name, type_ in wanted.items():
                if have[name] != type_ and widens(have[name], type_):
                    spark.sql(f"ALTER TABLE {ledger} ALTER COLUMN {quote(name)} TYPE {type_}")
    if not exists:
        cols = ", ".join(f"{quote(n)} {t} NOT NULL" for n, t in wanted.items())
        props = _properties_sql(TABLE_PROPERTIES)
        _create(
            spark,
            ledger,
            f"CREATE TABLE {ledger} ({cols}, {LSN} bigint NOT NULL) "
            f"USING iceberg TBLPROPERTIES ({props})",
            of=table,
        )
    # an append (no join with what the ledger holds): readers take each key's highest LSN
    deleted = resolved.where(f"{DELETED} AND {LSN} IS NOT NULL")
    deleted.select(*(quote(k) for k in wanted), LSN).writeTo(ledger).append()
