"""Debezium PostgreSQL JSON-with-schema records, shaped as the connector writes them
(envelope, source block, key struct), for tests that need records without a database."""

from __future__ import annotations

import base64
import json
from decimal import Decimal

SOURCE_SCHEMA = {
    "type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source",
    "field": "source",
    "fields": [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "field": "snapshot"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
    ],
}  # fmt: skip

ITEM_COLUMNS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "at"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp",
     "field": "at_tz"},
    {"type": "bytes", "optional": True, "field": "blob"},
]  # fmt: skip


def key_record(item_id: int) -> bytes:
    schema = {
        "type": "struct", "optional": False, "name": "pg.public.items.Key",
        "fields": [{"type": "int32", "optional": False, "field": "id"}],
    }  # fmt: skip
    return json.dumps({"schema": schema, "payload": {"id": item_id}},
                      separators=(",", ":")).encode()  # fmt: skip


def decimal_b64(value: Decimal, scale: int) -> str:
    return unscaled_b64(int(value.scaleb(scale)))


def unscaled_b64(unscaled: int) -> str:
    """A Connect Decimal's value: the unscaled integer as minimal big-endian two's
    complement bytes, base64."""
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def value_record(
    op: str,
    before: dict | None,
    after: dict | None,
    lsn: int | None = 100,
    columns: list[dict] = ITEM_COLUMNS,
    ts_ms: int = 1_700_000_000_000,
) -> bytes:
    row = {"type": "struct", "optional": True, "name": "pg.public.items.Value", "fields": columns}
    schema = {
        "type": "struct", "optional": False, "name": "pg.public.items.Envelope",
        "fields": [
            {**row, "field": "before"}, {**row, "field": "after"}, SOURCE_SCHEMA,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }  # fmt: skip
    payload = {
        "before": before, "after": after, "op": op, "ts_ms": ts_ms,
        "source": {"version": "3.6.3.Final", "ts_ms": ts_ms, "snapshot": "false",
                   "schema": "public", "table": "items", "txId": 1, "lsn": lsn},
    }  # fmt: skip
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


# a table keyed by text, or by a text and an integer column
PAIR_COLUMNS = [{"type": "string", "optional": False, "field": "region"},
                {"type": "int64", "optional": False, "field": "n"},
                {"type": "string", "optional": True, "field": "note"}]  # fmt: skip


def pair_key(row: dict, names: list[str]) -> bytes:
    fields = [c for c in PAIR_COLUMNS if c["field"] in names]
    schema = {"type": "struct", "optional": False, "name": "pg.public.pairs.Key",
              "fields": fields}  # fmt: skip
    payload = {n: row[n] for n in names}
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def flat_record(op: str, row: dict, lsn: int | None = 100, columns: list[dict] = ITEM_COLUMNS,
                ts_ms: int = 1_700_000_000_000, rewrite: bool = True) -> bytes:  # fmt: skip
    """The record `value_record` gives, flattened as ExtractNewRecordState writes it with
    add.fields=op,lsn,source.ts_ms and deletes rewritten (`row`: the row after, or for a
    delete the row before); `rewrite=False`: without `__deleted` (deletes are tombstones
    only)."""
    meta = [{"type": "string", "optional": True, "field": "__op"},
            {"type": "int64", "optional": True, "field": "__lsn"},
            {"type": "int64", "optional": True, "field": "__source_ts_ms"},
            {"type": "string", "optional": True, "field": "__deleted"}]  # fmt: skip
    schema = {"type": "struct", "optional": False, "name": "pg.public.items.Value",
              "fields": columns + meta[: 4 if rewrite else 3]}  # fmt: skip
    payload = {**row, "__op": op, "__lsn": lsn, "__source_ts_ms": ts_ms}
    if rewrite:
        payload["__deleted"] = str(op == "d").lower()
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()
