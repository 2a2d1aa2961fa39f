"""Records flattened by Debezium's `ExtractNewRecordState` transform, written by the JSON
converter with schemas (`WireFormat.JSON_FLAT`, the `Codec` of
`cdclake.debezium.formats`).

Each value is the row itself, with the change's metadata as fields the transform adds:
`add.fields=op,lsn,source.ts_ms` gives `__op`, `__lsn` and `__source_ts_ms`, which the
CDC rules need (the operation; the LSN for the re-send guard; the source time for the
metadata columns), or as headers of the same names (`add.headers`; a field wins). A
delete stays in the stream as its row before with the rewrite modes
(`delete.tombstone.handling.mode=rewrite` or `rewrite-with-tombstone`: `__op` is `d`);
otherwise the tombstone is the delete (`tombstone_deletes`), and so is a value whose
payload is null (the JSON converter's form of the transform's tombstone). Every other
field whose name starts with `__` is metadata and not loaded. A record without `__op` is
a bad record naming the setting; without `__lsn` there is no re-send guard (`lost` says
what a stream's records lack).
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
from cdclake.kafka.raw_rows import header_values

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["decode_records", "key_fields", "lost", "row_decoders", "value_fields"]
META = "__"  # the transform's prefix of the fields (and headers) it adds
_NO_OP = ("has no __op field or header: flattened records need the transform's "
          "add.fields=op,lsn,source.ts_ms or add.headers=op,lsn,source.ts_ms")  # fmt: skip


def value_fields(text: str, where: str) -> tuple[ConnectField, ...]:
    """The row's own fields of a flattened value schema (the transform's left out)."""
    value = parse_connect_schema(text)
    if value.type != "struct":
        raise DecodeError(f"{where}: value is a {value.type}, not a flattened row")
    if value.child("op") and (value.child("after") or value.child("before")):
        raise DecodeError(f"{where}: value is a whole change event envelope, not a flattened "
                          "row: set kafka.format to json (or avro)")  # fmt: skip
    return tuple(f for f in value.fields if not f.name.startswith(META))


def lost(value_schema: str, headers: str | None) -> list[str]:
    """What the CDC rules lack in a stream whose records have this value schema and
    headers (`kept_headers`), each as a sentence for the user; [] for nothing."""
    value, found = parse_connect_schema(value_schema), header_values(headers)

    def has(name: str) -> bool:
        return value.child(f"{META}{name}") is not None or f"{META}{name}" in found

    lacks = []
    if not has("op"):
        lacks.append(f"records {_NO_OP}; they cannot be loaded")
    if not has("lsn"):
        lacks.append(
            "records have no __lsn (add.fields or add.headers lsn): no re-send "
            "guard, a change re-sent after a connector restart can undo a newer one"
        )
    if not has("source_ts_ms"):
        lacks.append("records have no __source_ts_ms: _cdc_source_ts stays empty")
    if not has("deleted"):
        lacks.append(
            "records have no __deleted (delete.tombstone.handling.mode rewrite): a "
            "tombstone is the delete; with drop.tombstones or mode drop, deletes "
            "never reach the lake"
        )
    return lacks


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
    headers = ([header_values(h) for h in rows.column("headers").to_pylist()]
               if "headers" in rows.column_names else [{}] * rows.num_rows)  # fmt: skip
    ident = identifier(schema.key_names)
    changes: list[Change] = []
    for partition, offset, tombstone, key_sid, key_text, value_sid, value_text, head in zip(
        *(cols[c] for c in RECORD_COLUMNS), headers, strict=True
    ):
        key = None if key_sid is None else decode_key(keys, key_sid, key_text, partition, offset)
        after = before = op = ts = lsn = None
        if value_sid is not None:
            decode = values.get(value_sid)
            if decode is None:
                raise BadRecord(f"value schema {value_sid} is not among the batch's")
            payload = parse_json(value_text)
            if payload is None:  # the transform's delete as a tombstone, with its schema
                op = "d"
            elif not isinstance(payload, dict):
                raise BadRecord("value is not a flattened row")
            else:
                op, lsn, ts = _meta(payload, head)
                row = decode(payload)
                after, before = (None, row) if op == "d" else (row, None)
        if tombstone and deletes:  # the delete itself: no LSN, no row before
            tombstone, op = False, "d"
        change = Change(partition, offset, bool(tombstone), key, after, before, op, ts, lsn,
                        ident(key, after, before))  # fmt: skip
        if not tombstone:
            check_change(change)
        changes.append(change)
    if any(headers):
        changed_from(changes, headers, cols["key_schema_id"], keys, ident)
    return changes


def _meta(payload: dict, found: dict[str, str]) -> tuple[str, int | None, int | None]:
    """A flattened row's operation, LSN and source time: each the transform's field,
    else its header (`found`: the record's `header_values`)."""
    meta: list = []
    for name in ("op", "lsn", "source_ts_ms"):
        value = payload.get(f"{META}{name}")
        if value is None and f"{META}{name}" in found:
            value = _header(found[f"{META}{name}"], name != "op")
        if name == "op":
            if value is None:
                raise BadRecord(f"record {_NO_OP}")
        elif value is not None and type(value) is not int:
            raise BadRecord(f"{META}{name} is not an integer: {str(value)[:40]!r}")
        meta.append(value)
    return meta[0], meta[1], meta[2]


def _header(text: str, number: bool):
    """A header's value: as Connect's SimpleHeaderConverter writes it (text), or as its
    JsonConverter does (an envelope with its payload)."""
    if text[:1] == "{":
        data = parse_json(text)
        text = data.get("payload") if isinstance(data, dict) else text
    if number and isinstance(text, str) and text.lstrip("-").isdigit():
        return int(text)
    return text
