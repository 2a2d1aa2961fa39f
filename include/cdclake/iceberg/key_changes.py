"""A keyed table's ledger of key changes (`_cdclake_key_changes__<table>`): the old key's
TOAST values as of a primary-key change whose delete was loaded before the create of
the new key (a batch cut between them, or the new key in another partition), for the
batch that loads that create (`cdclake.resolve.lineage`).

Entries are appended before the table's commit (a retried batch appends the same values
again; readers take one of each key and LSN) and removed once a batch that holds their
create is committed. An entry whose create was loaded before it (the new key's
partition read ahead of the old key's) is never read and stays, one row per such change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdclake.debezium.schema import LSN, TopicSchema
from cdclake.iceberg.merge_sql import TABLE_PROPERTIES, _properties_sql, quote
from cdclake.iceberg.tables import _create, table_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KEY_CHANGES_PREFIX = "_cdclake_key_changes__"  # + the table's name


def key_changes_table(table: str) -> str:
    head, _, name = table.rpartition(".")
    return f"{head}.{KEY_CHANGES_PREFIX}{name}"


def read_key_changes(spark: SparkSession, table: str) -> DataFrame | None:
    """The ledger's entries (None: no ledger)."""
    ledger = key_changes_table(table)
    return spark.table(ledger) if spark.catalog.tableExists(ledger) else None


def record_key_changes(
    spark: SparkSession, table: str, kept: DataFrame | None, schema: TopicSchema
) -> None:
    """Append `kept` (key columns, `LSN`, TOAST columns; None: nothing) to the ledger,
    made or given the columns it lacks first."""
    if kept is None:
        return
    ledger = key_changes_table(table)
    types = {c.name: c.type for c in schema.columns}
    wanted = {n: types.get(n, "bigint") for n in kept.columns}
    if not spark.catalog.tableExists(ledger):
        cols = ", ".join(f"{quote(n)} {t}" for n, t in wanted.items())
        props = _properties_sql(TABLE_PROPERTIES)
        _create(
            spark,
            ledger,
            f"CREATE TABLE {ledger} ({cols}) USING iceberg TBLPROPERTIES ({props})",
            of=table,
        )
    else:
        have = table_columns(spark, ledger)
        for n, t in wanted.items():
            if n not in have:
                spark.sql(f"ALTER TABLE {ledger} ADD COLUMN {quote(n)} {t}")
    have = table_columns(spark, ledger)
    kept.select(*(quote(n) if n in kept.columns else f"NULL AS {quote(n)}" for n in have)).writeTo(
        ledger
    ).append()


def forget_key_changes(
    spark: SparkSession, table: str, taken: DataFrame | None, schema: TopicSchema
) -> None:
    """Remove the ledger's entries of the changes `taken` (from-key columns, then the
    change's LSN) names: their creates are loaded."""
    ledger = key_changes_table(table)
    if taken is None or not spark.catalog.tableExists(ledger):
        return
    keys = schema.key_names
    names = [*(f"_cdc_t{i}" for i in range(len(keys))), "_cdc_tlsn"]
    view = f"cdclake_taken_{table.replace('.', '_')}"
    taken.toDF(*names).createOrReplaceTempView(view)
    try:
        on = " AND ".join(
            [
                *(f"l.{quote(k)} = t.{n}" for k, n in zip(keys, names[:-1], strict=True)),
                f"l.{LSN} = t._cdc_tlsn",
            ]
        )
        if not spark.sql(f"SELECT 1 FROM {ledger} l JOIN {view} t ON {on}").take(1):
            return  # no entry of them: nothing to commit
        spark.sql(f"MERGE INTO {ledger} l USING {view} t ON {on} WHEN MATCHED THEN DELETE")
    finally:
        spark.catalog.dropTempView(view)
