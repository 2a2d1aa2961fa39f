"""The resolve of one topic's raw records (the reader's Arrow rows) into the rows the MERGE
reads (`resolve_rows`): decoded by DuckDB (`cdclake.debezium.json_decode.decoded`), then each
key's latest change in Kafka order (`cdclake.resolve.arrow_fold.resolve_table`, over the
rules of `cdclake.resolve.latest`), or for a table without a key every change
(`changelog_table`). It runs in the driver for a batch the driver read
(`Tuning.driver_read_records`); the range tasks of a bigger one (`cdclake.resolve.ranges`)
fold the same way in steps.

A record that cannot be applied (its payload is not a change event of its schema, its
operation is unknown, it has no key, a value does not fit its column) comes back in
`TopicResolved.bad` with its reason, to fail the table or go to the dead letters; the
other records resolve as if it were not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdclake.debezium.schema import TopicSchema
from cdclake.exceptions import DecodeError
from cdclake.resolve.rows import columns_ddl, result_columns, tally, typed_table
from cdclake.resolve.rules import Truncate

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class TopicResolved:
    """What the checks and the resolve of one topic's records found."""

    rows: pa.Table  # of `result_columns`
    ddl: str  # the rows' Spark schema
    truncate: Truncate | None
    counts: dict[bool, int]  # rows per deleted flag
    max_source_ms: int | None  # the latest source timestamp of the rows
    toast: bool  # the rows carry the TOAST flags (a placeholder was left for the table)
    # records that cannot be applied: (partition, offset, reason), in Kafka order
    bad: tuple[tuple[int, int, str], ...] = ()
    changes: pa.Table | None = None  # the decoded changes, those in `bad` left out


_SCALAR_KEYS = (
    "int",
    "bigint",
    "float",
    "double",
    "string",
    "binary",
    "boolean",
    "date",
    "timestamp",
    "timestamp_ntz",
)


def check_key_types(schema: TopicSchema) -> None:
    """A key column is a plain value (not an array, a map or a struct)."""
    for k in schema.key:
        if k.type not in _SCALAR_KEYS and not k.type.startswith("decimal("):
            raise DecodeError(
                f"key column {k.name!r} is {k.type}: a key column must hold "
                "plain values; set the table's `key` to other columns"
            )


def resolve_rows(
    rows: pa.Table,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
    cut: int | None = None,
) -> TopicResolved:
    """Raw rows of one topic -> the resolved rows, what the checks found and the records
    that cannot be applied; `cut`: the LSN of the last truncate the table applied."""
    import pyarrow.compute as pc

    from cdclake.debezium.json_decode import decoded
    from cdclake.resolve.arrow_fold import changelog_table, resolve_table

    check_key_types(schema)
    changes = decoded(rows, schema, key_schemas, value_schemas)
    bad: tuple[tuple[int, int, str], ...] = ()
    if changes is not None and changes["reason"].null_count != changes.num_rows:
        wrong = changes.filter(pc.is_valid(changes["reason"]))
        bad = tuple(
            sorted(
                zip(
                    wrong["partition"].to_pylist(),
                    wrong["offset"].to_pylist(),
                    wrong["reason"].to_pylist(),
                    strict=True,
                )
            )
        )
        changes = changes.filter(pc.is_null(changes["reason"]))
    keyed = bool(schema.key_names)
    if changes is None or not changes.num_rows:
        data: dict[str, Any]
        data, truncate, toast = {}, None, False
    elif keyed:
        data, truncate, toast = resolve_table(changes, schema, cut)
    else:
        data, truncate, toast = changelog_table(changes, schema), None, False
    columns = result_columns(schema, keyed, toast)
    table = typed_table(data, columns)
    counts: dict[bool, int] = {}
    latest_ms = tally(table, counts, None)
    ddl = columns_ddl(columns)
    return TopicResolved(table, ddl, truncate, counts, latest_ms, toast, bad, changes)
