"""Transform: raw Kafka records of one topic -> typed change rows.

The schemas seen in the batch are known on the driver (they are few), so each record's
payload is parsed by `from_json` with its own schema's type and decoded into one unified
row type for the topic: the latest schema's columns, plus columns that only older
records carry. A column keeps the lake table's type; widening changes (int -> bigint,
float -> double, more decimal digits) promote it. Records whose schema does not fit
(e.g. text -> integer) fail with the column and the two types, or go to the dead letters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdclake.debezium import (
    ConnectField,
    decode_column,
    lake_type,
    parse_connect_schema,
    parse_type,
)
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
        raise DecodeError(f"{where}: value is not a Debezium change event envelope")
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
) -> TopicSchema:
    """Schemas are given oldest first (by the last offset that used them); `known` holds
    the lake table's column types when it exists."""
    value_fields = [value_row_fields(parse_connect_schema(s), where) for s in value_schemas]
    columns = unify_columns(value_fields, where, known, exclude)
    if key_override:
        by_name = {c.name: c for c in columns}
        missing = [k for k in key_override if k not in by_name]
        if missing:
            raise DecodeError(f"{where}: key column(s) {missing} are not columns of the table")
        key = tuple(Column(k, by_name[k].type, False) for k in key_override)
    else:
        key_fields = [parse_connect_schema(s).fields for s in key_schemas]
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
    return TopicSchema(key=key, columns=columns)


def _struct_ddl(fields: Sequence[ConnectField]) -> str:
    return ",".join(f"`{f.name}`:{parse_type(f)}" for f in fields)


def _decoded_row(parsed, fields: Sequence[ConnectField], columns: Sequence[Column]):
    """Struct of all unified columns from a parsed row struct (null stays null)."""
    from pyspark.sql import functions as F

    by_name = {f.name: f for f in fields}
    parts = []
    for c in columns:
        f = by_name.get(c.name)
        if f is None:
            parts.append(F.lit(None).cast(c.type).alias(c.name))
        else:
            parts.append(decode_column(parsed[f.name], f).cast(c.type).alias(c.name))
    return F.when(parsed.isNull(), F.lit(None)).otherwise(F.struct(*parts))


def _unfit_columns(present, decoded, fields: Sequence[ConnectField], columns: Sequence[Column]):
    """Names of columns whose value was in the payload (`present`: the row parsed with
    every field as text, which any JSON value but null gives) but did not survive
    parsing or decoding (`decoded`: a value of another JSON type, which `from_json`
    turns into NULL, an overflow, malformed text): such a record must fail or go to the
    dead letters, never load NULL."""
    from pyspark.sql import functions as F

    by_name = {f.name: f for f in fields}
    checks = []
    for c in columns:
        f = by_name.get(c.name)
        if f is None:
            continue
        checks.append(F.when(present[f.name].isNotNull() & decoded[c.name].isNull(), F.lit(c.name)))
    if not checks:
        return F.array().cast("array<string>")
    return F.filter(F.array(*checks), lambda x: x.isNotNull())


def decode_changes(
    raw, schema: TopicSchema, key_schemas: Mapping[int, str], value_schemas: Mapping[int, str]
):
    """Raw records of one topic -> one row per record with key, after, before and metadata.

    Output columns: `key` (struct of key columns), `after`, `before` (structs of all
    columns), `op`, `is_tombstone`, source timestamp and LSN, Kafka partition and offset.
    """
    from pyspark.sql import functions as F

    key_cols = schema.key
    # Parse each payload once, into a column per schema (NULL unless it is the record's):
    # the decoding below refers to the parsed struct many times, inside CASE branches,
    # where Spark does not share a common subexpression, so an inline from_json would
    # parse the same text again for every reference.
    parsed_cols = []
    for i, (sid, text) in enumerate(value_schemas.items()):
        fields = value_row_fields(parse_connect_schema(text), "value")
        ddl = (
            f"struct<before:struct<{_struct_ddl(fields)}>,after:struct<{_struct_ddl(fields)}>,"
            "op:string,ts_ms:bigint,source:struct<ts_ms:bigint,lsn:bigint>>"
        )
        cond = F.col("value_schema_id") == F.lit(sid)
        parsed_cols.append(F.when(cond, F.from_json(F.col("value_payload"), ddl)).alias(f"_v{i}"))
        # the row after with every field as text: which values the payload holds
        texts = ",".join(f"`{f.name}`:string" for f in fields)
        present = F.from_json(F.col("value_payload"), f"struct<after:struct<{texts}>>")
        parsed_cols.append(F.when(cond, present["after"]).alias(f"_a{i}"))
    for i, (sid, text) in enumerate(key_schemas.items()):
        fields = parse_connect_schema(text).fields
        cond = F.col("key_schema_id") == F.lit(sid)
        ddl = f"struct<{_struct_ddl(fields)}>"
        parsed_cols.append(F.when(cond, F.from_json(F.col("key_payload"), ddl)).alias(f"_k{i}"))
    raw = raw.select(
        "partition", "offset", "timestamp", "is_tombstone", "key_payload", "value_payload",
        "key_schema_id", "value_schema_id", *parsed_cols,
    )  # fmt: skip

    value_cases = None
    for i, (sid, text) in enumerate(value_schemas.items()):
        env = parse_connect_schema(text)
        fields = value_row_fields(env, "value")
        parsed = F.col(f"_v{i}")
        decoded = F.struct(
            _decoded_row(parsed["before"], fields, schema.columns).alias("before"),
            _decoded_row(parsed["after"], fields, schema.columns).alias("after"),
            parsed["op"].alias("op"),
            parsed["source"]["ts_ms"].alias("source_ts_ms"),
            parsed["source"]["lsn"].alias("lsn"),
        )
        cond = F.col("value_schema_id") == F.lit(sid)
        value_cases = (F.when(cond, decoded) if value_cases is None
                       else value_cases.when(cond, decoded))  # fmt: skip

    key_cases = None
    for i, (sid, text) in enumerate(key_schemas.items()):
        fields = parse_connect_schema(text).fields
        parsed = F.col(f"_k{i}")
        decoded = _decoded_row(parsed, fields, key_cols)
        cond = F.col("key_schema_id") == F.lit(sid)
        key_cases = F.when(cond, decoded) if key_cases is None else key_cases.when(cond, decoded)

    if value_cases is None:  # tombstones only: a typed NULL
        row = ",".join(f"`{c.name}`:{c.type}" for c in schema.columns)
        value_cases = F.lit(None).cast(
            f"struct<before:struct<{row}>,after:struct<{row}>,op:string,source_ts_ms:bigint,"
            "lsn:bigint>"
        )
    value_expr = value_cases
    if key_cases is None:  # no Kafka key (table without primary key): a typed NULL
        key_type = ",".join(f"`{k.name}`:{k.type}" for k in key_cols)
        key_cases = F.lit(None).cast(f"struct<{key_type}>")
    parsed_names = [f"_{side}{i}" for i in range(len(value_schemas)) for side in "va"]
    df = raw.select(
        "partition", "offset", "timestamp", "is_tombstone", "key_payload", "value_payload",
        "value_schema_id", *parsed_names,
        (key_cases if key_cases is not None else F.lit(None)).alias("key"),
        value_expr.alias("value"),
    )  # fmt: skip
    # which columns did not survive decoding: the parsed value against the decoded one,
    # computed once above (decoding again here would double its cost)
    unfit = None
    for i, (sid, text) in enumerate(value_schemas.items()):
        fields = value_row_fields(parse_connect_schema(text), "value")
        check = _unfit_columns(F.col(f"_a{i}"), F.col("value.after"), fields, schema.columns)
        cond = F.col("value_schema_id") == F.lit(sid)
        unfit = F.when(cond, check) if unfit is None else unfit.when(cond, check)
    if unfit is None:
        unfit = F.lit(None).cast("array<string>")
    return df.select(
        "partition",
        "offset",
        "timestamp",
        "is_tombstone",
        "key_payload",
        "value_payload",
        "key",
        F.col("value.after").alias("after"),
        F.col("value.before").alias("before"),
        F.col("value.op").alias("op"),
        F.col("value.source_ts_ms").alias("source_ts_ms"),
        F.col("value.lsn").alias("lsn"),
        unfit.alias("unfit"),
    )
