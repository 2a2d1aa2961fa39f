"""The SQL text of a load's writes: CREATE TABLE, the MERGE of the resolved changes, the
append of a first load or a changelog, and the key filter that prunes a MERGE's scan.
Pure functions: no session, no catalog."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdclake.debezium.schema import DELETED, LSN, METADATA_COLUMNS, TopicSchema
from cdclake.resolved import HAS_VALUES, STALE_CHECK_LSN, TOAST_PREFIX, Truncate

TABLE_PROPERTIES = {
    # v3: a MERGE's deletes are deletion vectors, one per data file (docs/performance.md)
    "format-version": "3",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def build_create_sql(
    table: str,
    schema: TopicSchema,
    properties: Mapping[str, str],
    partition_by: Sequence[str] = (),
    soft_delete: bool = False,
) -> str:
    cols = [f"{quote(c.name)} {c.type}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns]
    cols += [f"{quote(name)} {kind}" for name, kind in METADATA_COLUMNS.items()]
    if soft_delete:
        cols.append(f"{DELETED} boolean")
    wanted = {**TABLE_PROPERTIES, **properties}
    props = _properties_sql({**wanted, PIPELINE_PROPERTIES: pipeline_properties_value(properties)})
    partitioned = f" PARTITIONED BY ({', '.join(partition_by)})" if partition_by else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(cols)}) USING iceberg{partitioned} "
        f"TBLPROPERTIES ({props})"
    )


def _sql_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _properties_sql(properties: Mapping[str, str]) -> str:
    return ", ".join(f"'{_sql_text(k)}'='{_sql_text(v)}'" for k, v in properties.items())


def written_columns(schema: TopicSchema) -> list[str]:
    """The columns a batch writes into its table: the source's, then the metadata ones."""
    return [c.name for c in schema.columns] + list(METADATA_COLUMNS)


def build_append_sql(
    table: str, source_view: str, schema: TopicSchema, soft_delete: bool = False
) -> str:
    """Append every change (tables without a key: an append-only changelog)."""
    names = written_columns(schema)
    if soft_delete:
        names.append(DELETED)
    cols = ", ".join(quote(n) for n in names)
    return f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {source_view}"


def build_merge_sql(
    table: str,
    source_view: str,
    schema: TopicSchema,
    toast_columns: Sequence[str] = (),
    truncate: Truncate | None = None,
    dropped_columns: Sequence[str] = (),
    soft_delete: bool = False,
    deleted_lsn: bool = False,
    truncated_below: int | None = None,
    key_values: Mapping[str, Sequence[Any]] | None = None,
) -> str:
    """MERGE the resolved changes. A change only replaces a row it is newer than (by LSN,
    when both have one); TOAST placeholders keep the table's value; a truncate deletes
    every row it did not see again. With `deleted_lsn` the source carries the LSN at
    which an earlier batch hard-deleted the key (`DELETED_AT`), and a change that is not
    newer than that delete (a re-sent one) does not insert the row again; likewise no
    change older than an already loaded truncate (`truncated_below`) writes a row.

    `key_values`, the values of key columns in the source (integer or text columns, no
    truncate), also go into the join condition as a filter on the table alone, one `IN`
    list per column, or for an integer column the range of its values (`KeyRange`):
    Spark pushes it into the table's scan, so only rows with those values reach the join
    instead of the whole table (a MERGE with inserts is an outer join that cannot
    broadcast the source). A row outside it matches no source row, as its value of some
    key column is in no source key, so the outcome is the same."""
    names = written_columns(schema)
    after_truncate, insert_when = _insert_conditions(truncated_below, deleted_lsn)
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in schema.key_names)
    if key_values is not None:
        if truncate is not None:  # WHEN NOT MATCHED BY SOURCE must see every row
            raise ValueError("a key filter cannot go with a truncate")
        on += key_filter_sql(schema, key_values)
    fresh = f"(s.{STALE_CHECK_LSN} IS NULL OR t.{LSN} IS NULL OR s.{STALE_CHECK_LSN} > t.{LSN})"
    if after_truncate:
        fresh = f"({fresh}{after_truncate})"

    def assign(n: str) -> str:
        return f"t.{quote(n)} = {_updated(n, toast_columns)}"

    # columns the source dropped stay in the table; rows written from now on hold NULL
    gone = [f"t.{quote(n)} = NULL" for n in dropped_columns]
    updates = ", ".join([assign(n) for n in names] + gone)
    insert_cols = ", ".join(quote(n) for n in names)
    insert_vals = ", ".join(f"s.{quote(n)}" for n in names)
    if soft_delete:
        on_delete = _soft_delete(schema, toast_columns, dropped_columns)
        updates += f", t.{DELETED} = false"
        insert_cols += f", {DELETED}"
        insert_vals += ", false"
    else:
        on_delete = "DELETE"
    sql = (
        f"MERGE INTO {table} t USING {source_view} s ON {on} "
        f"WHEN MATCHED AND s.{DELETED} AND {fresh} THEN {on_delete} "
        f"WHEN MATCHED AND {fresh} THEN UPDATE SET {updates} "
        f"WHEN NOT MATCHED AND {insert_when} THEN INSERT ({insert_cols}) VALUES ({insert_vals})"
    )
    if soft_delete:  # remember keys deleted before they were ever loaded, too
        sql += (
            f" WHEN NOT MATCHED AND s.{DELETED} THEN INSERT ({insert_cols}) "
            f"VALUES ({insert_vals.removesuffix(', false')}, true)"
        )
    if truncate is not None:
        sql += _truncated(truncate.lsn, soft_delete)
    return sql


def _updated(n: str, toast_columns: Sequence[str]) -> str:
    """What an update writes into column `n`."""
    if n in toast_columns:
        flag = f"s.{quote(TOAST_PREFIX + n)}"
        return f"CASE WHEN {flag} THEN t.{quote(n)} ELSE s.{quote(n)} END"
    if n == LSN:
        return f"coalesce(s.{LSN}, t.{LSN})"
    return f"s.{quote(n)}"


def _soft_delete(
    schema: TopicSchema, toast_columns: Sequence[str], dropped_columns: Sequence[str]
) -> str:
    """A soft delete of a matched row: it stays, flagged, with the last values it had:
    the batch's when it holds a row after of the key (an insert or update before the
    delete), else the table's (a delete alone carries no values)."""
    marks = [f"t.{quote(n)} = {_updated(n, toast_columns)}" for n in METADATA_COLUMNS]
    kept = [
        (c.name, _updated(c.name, toast_columns))
        for c in schema.columns
        if c.name not in schema.key_names
    ]
    kept += [(n, "NULL") for n in dropped_columns]
    values = [
        f"t.{quote(n)} = CASE WHEN s.{HAS_VALUES} THEN {v} ELSE t.{quote(n)} END" for n, v in kept
    ]
    return f"UPDATE SET t.{DELETED} = true, {', '.join(marks + values)}"


def _truncated(truncate_lsn: int | None, soft_delete: bool) -> str:
    """The clause for the rows a truncate removed (those it did not see again)."""
    gone_rows = f"UPDATE SET t.{DELETED} = true" if soft_delete else "DELETE"
    if truncate_lsn is None:
        return f" WHEN NOT MATCHED BY SOURCE THEN {gone_rows}"
    below = f"(t.{LSN} IS NULL OR t.{LSN} < {int(truncate_lsn)})"
    return f" WHEN NOT MATCHED BY SOURCE AND {below} THEN {gone_rows}"


# each integer type's SQL literal suffix: a key filter writes its values in their column's
# type, since Spark reads an untyped literal as an int and would cast each of a bigint
# column's thousands of them while planning (docs/performance.md)
LITERAL_SUFFIX = {"tinyint": "Y", "smallint": "S", "int": "", "bigint": "L"}
INTEGER_TYPES = tuple(LITERAL_SUFFIX)
KEY_FILTER_TYPES = (*INTEGER_TYPES, "string")


@dataclass(frozen=True)
class KeyRange:
    """The lowest and highest value of an integer key column among a batch's rows."""

    low: int
    high: int


def key_filter_sql(schema: TopicSchema, key_values: Mapping[str, Sequence[Any] | KeyRange]) -> str:
    """` AND t.<column> IN (...)` for each key column of `key_values` with its values
    (NULLs match nothing and are left out), or ` AND t.<column> BETWEEN <low> AND
    <high>` for an integer one with a `KeyRange`. Any of the key columns will do: a row
    whose value of one of them is outside the batch's matches no change."""
    types = {k.name: k.type for k in schema.key}
    if not key_values or not set(key_values) <= set(types):
        raise ValueError(
            f"a key filter takes some of the key columns {sorted(types)}, not {sorted(key_values)}"
        )
    parts = []
    for name, values in key_values.items():
        kind = types[name]
        if kind not in KEY_FILTER_TYPES:
            raise ValueError(f"no key filter on {name!r} of type {kind}")
        if isinstance(values, KeyRange):
            if kind not in INTEGER_TYPES:
                raise ValueError(f"no key range on {name!r} of type {kind}")
            parts.append(f" AND t.{quote(name)} BETWEEN {int(values.low)} AND {int(values.high)}")
            continue
        if kind == "string":
            items = [_string_literal(v) for v in values if v is not None]
        else:
            suffix = LITERAL_SUFFIX[kind]
            items = [f"{int(v)}{suffix}" for v in values if v is not None]
        if not items:
            raise ValueError(f"a key filter needs a value of {name!r}")
        parts.append(f" AND t.{quote(name)} IN ({', '.join(items)})")
    return "".join(parts)


def _string_literal(value: str) -> str:
    """A SQL literal of `value`: quoted, or where a backslash or quote is in it (whose
    reading depends on `spark.sql.parser.escapedStringLiterals`) its UTF-8 bytes in hex,
    cast to a string."""
    data = value.encode("utf-8")  # a lone surrogate: ValueError, no filter
    if "\\" in value or "'" in value:
        return f"CAST(X'{data.hex()}' AS STRING)"
    return f"'{value}'"


def _insert_conditions(truncated_below: int | None, deleted_lsn: bool) -> tuple[str, str]:
    """What a change must pass to write a row: newer than an already loaded truncate
    (`AND …`, or empty), and the whole condition for a key the table does not hold (not a
    delete, and newer than an earlier hard delete of the key)."""
    after_truncate = ""
    if truncated_below is not None:
        after_truncate = (
            f" AND (s.{STALE_CHECK_LSN} IS NULL OR s.{STALE_CHECK_LSN} > {int(truncated_below)})"
        )
    insert_when = f"NOT s.{DELETED}{after_truncate}"
    if deleted_lsn:
        insert_when += (
            f" AND (s.{STALE_CHECK_LSN} IS NULL OR s.{DELETED_AT} IS NULL "
            f"OR s.{STALE_CHECK_LSN} > s.{DELETED_AT})"
        )
    return after_truncate, insert_when


def build_first_load_sql(
    source_view: str,
    schema: TopicSchema,
    soft_delete: bool = False,
    deleted_lsn: bool = False,
    truncated_below: int | None = None,
) -> str:
    """The rows `build_merge_sql`'s MERGE writes into a table that holds no row: every
    change is then not matched, so only its inserts apply (a truncate's `NOT MATCHED BY
    SOURCE` has nothing to delete). A query of the table's columns, for
    `append_to_empty`."""
    names = written_columns(schema)
    _, insert_when = _insert_conditions(truncated_below, deleted_lsn)
    cols = ", ".join(f"s.{quote(n)}" for n in names)
    if soft_delete:  # deleted keys are written too, flagged
        return (
            f"SELECT {cols}, s.{DELETED} AS {DELETED} FROM {source_view} s "
            f"WHERE ({insert_when}) OR s.{DELETED}"
        )
    return f"SELECT {cols} FROM {source_view} s WHERE {insert_when}"


DELETED_AT = "_cdc_deleted_at_lsn"  # the deleted-keys ledger's column: the delete's LSN


# What Iceberg keeps in a table's metadata rather than among its properties: a table
# created with one of them does not list it, and setting it means something else (an
# upgrade of the format, say). The pipeline's value of one takes effect at creation only.
# (Iceberg's `TableProperties.RESERVED_PROPERTIES`.)
RESERVED_PROPERTIES = frozenset(
    {
        "format-version",
        "uuid",
        "snapshot-count",
        "current-snapshot-id",
        "current-snapshot-summary",
        "current-snapshot-timestamp-ms",
        "current-schema",
        "default-partition-spec",
        "default-sort-order",
    }
)


# Which table properties the pipeline file set (a JSON list of their names), kept on the
# table so that one removed from the file can be unset at the next load; properties set
# any other way are never touched.
PIPELINE_PROPERTIES = "cdclake.pipeline-properties"


def pipeline_properties_value(wanted: Mapping[str, str]) -> str:
    """`PIPELINE_PROPERTIES`'s value for a pipeline's table properties (`wanted`)."""
    return json.dumps(sorted(k for k in wanted if k not in RESERVED_PROPERTIES))
