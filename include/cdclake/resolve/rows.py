"""The resolved rows as Arrow tables of the lake's columns (what the MERGE reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cdclake.debezium.connect import arrow_type
from cdclake.debezium.schema import (
    DELETED,
    LSN,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    TopicSchema,
)
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    FROM_LSN,
    HAS_VALUES,
    LINEAGE_OPS,
    STALE_CHECK_LSN,
    TOAST_PREFIX,
    toastable,
)

if TYPE_CHECKING:
    import pyarrow as pa


# ---- the table the MERGE reads -----------------------------------------------------------


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
        cols += [(FROM_LSN, "bigint")]
    return cols


def typed_table(data: Mapping[str, Any], columns: Sequence[tuple[str, str]]) -> pa.Table:
    """Arrow arrays by name (a missing one `absent`) as a table of (name, Spark type)
    columns, each cast to its type."""
    import pyarrow as pa

    n = len(next(iter(data.values()))) if data else 0
    return pa.table(
        [
            data[name].cast(arrow_type(t)) if name in data else absent(name, arrow_type(t), n)
            for name, t in columns
        ],
        names=[name for name, _ in columns],
    )


def absent(name: str, type_: pa.DataType, n: int) -> pa.Array:
    """`n` values of a column resolved rows lack (of Arrow type `type_`): False for a TOAST
    flag (no placeholder left to the table), else NULL."""
    import pyarrow as pa

    if name.startswith(TOAST_PREFIX):
        return pa.array([False] * n, pa.bool_())
    return pa.nulls(n, type_)


def tally(table: pa.Table, counts: dict[bool, int], latest_ms: int | None) -> int | None:
    """Counts the resolved rows (not `LINEAGE_OPS` ones) by their deleted flag into
    `counts`; returns the latest source time (ms) among them and `latest_ms`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = table_rows(table)
    deleted = pc.sum(table.column(DELETED)).as_py() or 0
    for flag, n in ((False, table.num_rows - deleted), (True, deleted)):
        if n:
            counts[flag] = counts.get(flag, 0) + n
    ts = pc.max(table.column(SOURCE_TS).cast(pa.int64())).as_py()
    if ts is not None and (latest_ms is None or ts // 1000 > latest_ms):
        latest_ms = ts // 1000
    return latest_ms


def table_rows(table: pa.Table) -> pa.Table:
    """The resolved rows that are rows of the table (not `LINEAGE_OPS` ones)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    moved = pc.fill_null(pc.is_in(table.column(OP), pa.array(LINEAGE_OPS)), False)
    return table.filter(pc.invert(moved)) if pc.any(moved).as_py() else table
