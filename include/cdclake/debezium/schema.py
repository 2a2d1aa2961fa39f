"""The shape of one topic's changes: the lake columns its schemas in the batch decode into.

The schemas seen in the batch are known on the driver (they are few). They unify into one
row type for the topic: the latest schema's columns, plus columns that only older records
carry. A column keeps the lake table's type; widening changes (int -> bigint, float ->
double, more decimal digits) promote it. Records whose schema does not fit (e.g. text ->
integer) fail with the column and the two types, or go to the dead letters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdclake.debezium.connect import ConnectField, lake_type
from cdclake.debezium.formats import WireFormat
from cdclake.exceptions import DecodeError

OP = "_cdc_op"
DELETED = "_cdc_deleted"
SOURCE_TS = "_cdc_source_ts"
LSN = "_cdc_lsn"
PARTITION = "_cdc_kafka_partition"
OFFSET = "_cdc_kafka_offset"
METADATA_COLUMNS = {
    OP: "string",
    SOURCE_TS: "timestamp",
    LSN: "bigint",
    PARTITION: "int",
    OFFSET: "bigint",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # Spark DDL type of the lake column
    nullable: bool = True


@dataclass(frozen=True)
class TopicSchema:
    """The unified shape of one topic's rows in this batch."""

    key: tuple[Column, ...]
    columns: tuple[Column, ...]  # source columns, latest schema's order first
    format: WireFormat = WireFormat.JSON  # what the topic's records are written in

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.key)


_WIDENING = {("int", "bigint"), ("float", "double")}


def widens(old: str, new: str) -> bool:
    """Can Iceberg promote a column of type `old` to `new` without rewriting data?"""
    if old == new or (old, new) in _WIDENING:
        return True
    if old.startswith("decimal(") and new.startswith("decimal("):
        p0, s0 = (int(x) for x in old[8:-1].split(","))
        p1, s1 = (int(x) for x in new[8:-1].split(","))
        return s1 == s0 and p1 >= p0
    return False


def value_row_fields(envelope: ConnectField, where: str) -> tuple[ConnectField, ...]:
    after = envelope.child("after") or envelope.child("before")
    if envelope.type != "struct" or envelope.child("op") is None or after is None:
        raise DecodeError(
            f"{where}: value is not a Debezium change event envelope (no op and before/after "
            "fields: a record flattened by ExtractNewRecordState? See kafka.format json-flat)"
        )
    return after.fields


def column_types(
    versions: Sequence[tuple[ConnectField, ...]],
    known: Mapping[str, str] | None = None,
    exclude: Sequence[str] = (),
) -> dict[str, str]:
    """The lake type of each column: the table's type where the table has the column,
    else the newest schema version's; raised to a wider type when a version widens it
    (versions are given oldest first)."""
    types = dict(known or {})
    for fields in reversed(versions):
        for f in fields:
            if f.name in exclude:
                continue
            t = lake_type(f)
            if types.get(f.name) is None or (types[f.name] != t and widens(types[f.name], t)):
                types[f.name] = t
    return types


def misfit(
    fields: Sequence[ConnectField], types: Mapping[str, str], exclude: Sequence[str] = ()
) -> str | None:
    """Why records of this schema version cannot go into columns of these types, or None."""
    for f in fields:
        if f.name in exclude:
            continue
        t, lake = lake_type(f), types[f.name]
        if not widens(t, lake):
            return (
                f"column {f.name!r} is {lake} in the lake but {t} in this record's schema, "
                "which is not a widening cdclake can apply"
            )
    return None


def unify_columns(
    schemas_oldest_first: Sequence[tuple[ConnectField, ...]],
    where: str,
    known: Mapping[str, str] | None = None,
    exclude: Sequence[str] = (),
) -> tuple[Column, ...]:
    """One column list for many schema versions of the same table (and the table's own
    column types, `known`, when it exists). A version that does not fit is an error."""
    types = column_types(schemas_oldest_first, known, exclude)
    nullable: dict[str, bool] = {}
    order: list[str] = []
    for fields in schemas_oldest_first:
        if (reason := misfit(fields, types, exclude)) is not None:
            raise DecodeError(f"{where}: {reason}")
        for f in fields:
            if f.name in exclude:
                continue
            if f.name not in nullable:
                order.append(f.name)
            nullable[f.name] = f.optional
    last = schemas_oldest_first[-1] if schemas_oldest_first else ()
    newest = [f.name for f in last if f.name in nullable]
    ordered = newest + [n for n in order if n not in newest]
    return tuple(Column(n, types[n], nullable[n]) for n in ordered)


def topic_schema(
    key_schemas: Sequence[str],
    value_schemas: Sequence[str],
    key_override: Sequence[str],
    where: str,
    exclude: Sequence[str] = (),
    known: Mapping[str, str] | None = None,
    fmt: WireFormat = WireFormat.JSON,
) -> TopicSchema:
    """Schemas (their texts in `fmt`) are given oldest first (by the last offset that used
    them); `known` holds the lake table's column types when it exists."""
    codec = fmt.codec
    value_fields = [codec.value_fields(s, where) for s in value_schemas]
    columns = unify_columns(value_fields, where, known, exclude)
    if key_override:
        by_name = {c.name: c for c in columns}
        missing = [k for k in key_override if k not in by_name]
        if missing:
            raise DecodeError(f"{where}: key column(s) {missing} are not columns of the table")
        key = tuple(Column(k, by_name[k].type, False) for k in key_override)
    else:
        key_fields = [codec.key_fields(s) for s in key_schemas]
        if not key_fields:  # a table without primary key and no `key:`: an append-only changelog
            key = ()
        else:
            key = tuple(
                Column(c.name, c.type, False) for c in unify_columns(key_fields, where, known)
            )
    key_names = {k.name for k in key}
    present = {c.name for c in columns}
    columns = tuple(k for k in key if k.name not in present) + tuple(
        Column(c.name, c.type, c.name not in key_names) for c in columns
    )
    return TopicSchema(key=key, columns=columns, format=fmt)
