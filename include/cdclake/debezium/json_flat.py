"""Records flattened by Debezium's `ExtractNewRecordState` transform, written by the JSON
converter with schemas (`WireFormat.JSON_FLAT`, the `Codec` of
`cdclake.debezium.formats`).

Each value is the row itself, with the change's metadata as fields the transform adds:
`add.fields=op,lsn,source.ts_ms` gives `__op`, `__lsn` and `__source_ts_ms`, which the
CDC rules need (the operation; the LSN for the re-send guard; the source time for the
metadata columns). A delete stays in the stream as its row before with the rewrite modes
(`delete.tombstone.handling.mode=rewrite` or `rewrite-with-tombstone`: `__op` is `d`);
otherwise the tombstone is the delete (`tombstone_deletes`). Every other field whose name
starts with `__` is metadata and not loaded. A record without `__op` is a bad record
naming the setting; without `__lsn` there is no re-send guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from cdclake.debezium.connect import ConnectField, parse_connect_schema
from cdclake.debezium.formats import BadRecord, Change
from cdclake.debezium.json_records import (
    RECORD_COLUMNS,
    KeyRows,
    changed_from,
    check_change,
    decode_key,
    identifier,
    key_fields,
    parse_json,
)
from cdclake.debezium.json_values import row_decoder
from cdclake.debezium.schema import TopicSchema
from cdclake.exceptions import DecodeError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["decode_records", "key_fields", "row_decoders", "value_fields"]
META = "__"  # the transform's prefix of the fields it adds
_NO_OP = ("has no __op field: flattened records need the transform's "
          "add.fields=op,lsn,source.ts_ms (whole envelopes: kafka.format json)")  # fmt: skip


def value_fields(text: str, where: str) -> tuple[ConnectField, ...]:
    """The row's own fields of a flattened value schema (the transform's left out)."""
    value = parse_connect_schema(text)
    if value.type != "struct" or value.child(f"{META}op") is None:
        raise DecodeError(f"{where}: value {_NO_OP}")
    return tuple(f for f in value.fields if not f.name.startswith(META))


def row_decoders(schema: TopicSchema, key_schemas: Mapping[int, str],
                 value_schemas: Mapping[int, str]) -> tuple[dict, dict, bool]:  # fmt: skip
    """The row decoders of each key and value schema, and whether a tombstone is a delete
    (`tombstone_deletes`)."""
    keys = {sid: KeyRows(key_fields(text), schema.key) for sid, text in key_schemas.items()}
    values = {sid: row_decoder(value_fields(text, "value"), schema.columns)
              for sid, text in value_schemas.items()}  # fmt: skip
    return keys, values, tombstone_deletes(value_schemas.values())


def tombstone_deletes(value_schemas: Iterable[str]) -> bool:
    """Whether the transform writes deletes as tombstones only: its value schema has no
    `__deleted` field (`delete.tombstone.handling.mode` tombstone, the default, or drop),
    so a tombstone is the delete of its key. With `__deleted` (rewrite modes) a delete is
    a record of its own, and a tombstone follows it as in whole envelopes."""
    return not any(parse_connect_schema(text).child(f"{META}deleted") for text in value_schemas)


def decode_records(
    rows: pa.Table | pa.RecordBatch,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
    decoders: tuple[dict, dict] | None = None,
    headers_only: bool = False,
) -> list[Change]:
    """Raw rows of one topic -> changes, one per record, each decoded whole (a delete's
    row is its row before); `BadRecord` for a record that cannot be applied."""
    keys, values, deletes = decoders or row_decoders(schema, key_schemas, value_schemas)
    cols = rows.select(RECORD_COLUMNS).to_pydict()
    ident = identifier(schema.key_names)
    changes: list[Change] = []
    for partition, offset, tombstone, key_sid, key_text, value_sid, value_text in zip(
        *(cols[c] for c in RECORD_COLUMNS), strict=True
    ):
        key = None if key_sid is None else decode_key(keys, key_sid, key_text, partition, offset)
        after = before = op = ts = lsn = None
        if value_sid is not None:
            decode = values.get(value_sid)
            if decode is None:
                raise BadRecord(f"value schema {value_sid} is not among the batch's")
            payload = parse_json(value_text)
            if not isinstance(payload, dict):
                raise BadRecord("value is not a flattened row")
            op, lsn, ts = _meta(payload)
            row = decode(payload)
            after, before = (None, row) if op == "d" else (row, None)
        if tombstone and deletes:  # the delete itself: no LSN, no row before
            tombstone, op = False, "d"
        change = Change(partition, offset, bool(tombstone), key, after, before, op, ts, lsn,
                        ident(key, after, before))  # fmt: skip
        if not tombstone:
            check_change(change)
        changes.append(change)
    if "old_key" in rows.column_names and rows.column("old_key").null_count < rows.num_rows:
        changed_from(changes, rows.column("old_key").to_pylist(), cols["key_schema_id"], keys,
                     ident)  # fmt: skip
    return changes


def _meta(payload: dict) -> tuple[str, int | None, int | None]:
    """A flattened row's operation, LSN and source time."""
    op = payload.get(f"{META}op")
    if op is None:
        raise BadRecord(f"record {_NO_OP}")
    found = []
    for name in ("lsn", "source_ts_ms"):
        value = payload.get(f"{META}{name}")
        if value is not None and type(value) is not int:
            raise BadRecord(f"field {META}{name} is not an integer")
        found.append(value)
    return op, found[0], found[1]
