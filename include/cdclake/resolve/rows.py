"""The resolved rows as Arrow tables of the lake's columns (what the MERGE reads), and the
Arrow forms of the lake's Spark types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cdclake.debezium.schema import (
    DELETED,
    LSN,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    TopicSchema,
)
from cdclake.exceptions import DecodeError
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    HAS_VALUES,
    STALE_CHECK_LSN,
    TOAST_PREFIX,
    toastable,
)

if TYPE_CHECKING:
    import pyarrow as pa


# ---- the table the MERGE reads -----------------------------------------------------------


def _split_top(text: str) -> list[str]:
    """Split at the commas outside <> and ()."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def arrow_type(ddl: str) -> pa.DataType:
    """The Arrow type Spark reads as the Spark type `ddl` (the lake's types)."""
    import pyarrow as pa

    ddl = ddl.strip()
    simple = {
        "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(),
        "boolean": pa.bool_(), "string": pa.string(), "binary": pa.binary(),
        "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }  # fmt: skip
    if ddl in simple:
        return simple[ddl]
    if ddl.startswith("decimal("):
        precision, scale = (int(x) for x in ddl[8:-1].split(","))
        return pa.decimal128(precision, scale)
    if ddl.startswith("array<"):
        return pa.list_(arrow_type(ddl[6:-1]))
    if ddl.startswith("map<"):
        key, value = _split_top(ddl[4:-1])
        return pa.map_(arrow_type(key), arrow_type(value))
    if ddl.startswith("struct<"):
        fields = []
        for part in _split_top(ddl[7:-1]):
            name, _, type_ = part.partition(":")
            fields.append(pa.field(name.strip("`"), arrow_type(type_)))
        return pa.struct(fields)
    raise DecodeError(f"type {ddl} has no Arrow form here")


def columns_ddl(columns: Sequence[tuple[str, str]]) -> str:
    """The Spark schema (DDL) of (name, Spark type) columns."""
    return ", ".join(f"`{name}` {type_}" for name, type_ in columns)


def result_columns(schema: TopicSchema, keyed: bool, toast: bool) -> list[tuple[str, str]]:
    """(name, Spark type) of the resolved rows: the table's columns, then the change's
    metadata, with the TOAST flags and the key changed from when `toast`."""
    cols = [(c.name, c.type) for c in schema.columns]
    cols += [(DELETED, "boolean"), (OP, "string"), (SOURCE_TS, "timestamp"), (LSN, "bigint")]
    if keyed:
        cols += [(STALE_CHECK_LSN, "bigint"), (HAS_VALUES, "boolean")]
    cols += [(PARTITION, "int"), (OFFSET, "bigint")]
    if keyed and toast:
        cols += [(f"{TOAST_PREFIX}{c.name}", "boolean") for c in toastable(schema)]
        cols += [(f"{FROM_KEY_PREFIX}{c.name}", c.type) for c in schema.key]
    return cols


def rows_table(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> pa.Table:
    """Rows (dicts) as an Arrow table of (name, Spark type) columns."""
    return columns_table({name: [r[name] for r in rows] for name, _ in columns}, columns)


def typed_table(data: Mapping, columns: Sequence[tuple[str, str]]) -> pa.Table:
    """Arrow arrays by name (a missing one: nulls) as a table of (name, Spark type)
    columns, each cast to its type."""
    import pyarrow as pa

    n = len(next(iter(data.values()))) if data else 0
    return pa.table([data[name].cast(arrow_type(t)) if name in data else pa.nulls(n, arrow_type(t))
                     for name, t in columns], names=[name for name, _ in columns])  # fmt: skip


def columns_table(data: Mapping[str, list], columns: Sequence[tuple[str, str]]) -> pa.Table:
    """Columns' values (lists by name) as an Arrow table of (name, Spark type) columns."""
    import pyarrow as pa

    arrays, fields = [], []
    for name, type_ in columns:
        kind = arrow_type(type_)
        values = data[name]
        try:
            arrays.append(pa.array(values, type=kind))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise DecodeError(f"column {name!r} ({type_}): {exc}") from None
        fields.append(pa.field(name, kind))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def tally(table: pa.Table, counts: dict[bool, int], latest_ms: int | None) -> int | None:
    """Counts the resolved rows by their deleted flag into `counts`; returns the latest
    source time (ms) among them and `latest_ms`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    deleted = pc.sum(table.column(DELETED)).as_py() or 0
    for flag, n in ((False, table.num_rows - deleted), (True, deleted)):
        if n:
            counts[flag] = counts.get(flag, 0) + n
    ts = pc.max(table.column(SOURCE_TS).cast(pa.int64())).as_py()
    if ts is not None and (latest_ms is None or ts // 1000 > latest_ms):
        latest_ms = ts // 1000
    return latest_ms
