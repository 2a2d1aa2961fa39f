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

from collections.abc import Iterable

from cdclake.debezium.connect import ConnectField, parse_connect_schema
from cdclake.debezium.json_records import key_fields
from cdclake.exceptions import DecodeError
from cdclake.raw_rows import header_values

__all__ = ["key_fields", "lost", "tombstone_deletes", "value_fields"]
META = "__"  # the transform's prefix of the fields (and headers) it adds
NO_OP = (
    "has no __op field or header: flattened records need the transform's "
    "add.fields=op,lsn,source.ts_ms or add.headers=op,lsn,source.ts_ms"
)


def value_fields(text: str, where: str) -> tuple[ConnectField, ...]:
    """The row's own fields of a flattened value schema (the transform's left out)."""
    value = parse_connect_schema(text)
    if value.type != "struct":
        raise DecodeError(f"{where}: value is a {value.type}, not a flattened row")
    if value.child("op") and (value.child("after") or value.child("before")):
        raise DecodeError(
            f"{where}: value is a whole change event envelope, not a flattened "
            "row: set kafka.format to json (or avro)"
        )
    return tuple(f for f in value.fields if not f.name.startswith(META))


def lost(value_schema: str, headers: str | None) -> list[str]:
    """What the CDC rules lack in a stream whose records have this value schema and
    headers (`kept_headers`), each as a sentence for the user; [] for nothing."""
    value, found = parse_connect_schema(value_schema), header_values(headers)

    def has(name: str) -> bool:
        return value.child(f"{META}{name}") is not None or f"{META}{name}" in found

    lacks = []
    if not has("op"):
        lacks.append(f"records {NO_OP}; they cannot be loaded")
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


def tombstone_deletes(value_schemas: Iterable[str]) -> bool:
    """Whether the transform writes deletes as tombstones only: its value schema has no
    `__deleted` field (`delete.tombstone.handling.mode` tombstone, the default, or drop),
    so a tombstone is the delete of its key. With `__deleted` (rewrite modes) a delete is
    a record of its own, and a tombstone follows it as in whole envelopes."""
    return not any(parse_connect_schema(text).child(f"{META}deleted") for text in value_schemas)
