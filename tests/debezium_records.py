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


def avro_schema(connect: dict, named: set[str] | None = None) -> object:
    """The Avro schema an Avro converter (`AvroData`) writes for a Connect schema (its
    JSON-converter form): Connect's names and parameters as `connect.*` properties, an
    optional type as a union with null, a record named twice referred to by name."""
    named = set() if named is None else named
    kind, name = connect["type"], connect.get("name")
    if kind == "struct":
        full = name or "io.confluent.connect.avro.ConnectDefault"
        if full in named:
            avro: object = full
        else:
            named.add(full)
            fields = [{"name": f["field"], "type": avro_schema(f, named),
                       **({"default": None} if f.get("optional") else {})}
                      for f in connect["fields"]]  # fmt: skip
            avro = {"type": "record", "name": full, "fields": fields}
    elif kind == "array":
        avro = {"type": "array", "items": avro_schema(connect["items"], named)}
    else:
        primitive = {"int8": "int", "int16": "int", "int32": "int", "int64": "long",
                     "float": "float", "double": "double", "boolean": "boolean",
                     "string": "string", "bytes": "bytes"}[kind]  # fmt: skip
        avro = {"type": primitive}
        if kind in ("int8", "int16"):
            avro["connect.type"] = kind
        if name:
            avro.update({"connect.version": 1, "connect.name": name})
        if connect.get("parameters"):
            avro["connect.parameters"] = connect["parameters"]
        if name == "org.apache.kafka.connect.data.Decimal":
            params = connect["parameters"]
            avro.update(logicalType="decimal", scale=int(params["scale"]),
                        precision=int(params.get("connect.decimal.precision", 64)))  # fmt: skip
        if len(avro) == 1:
            avro = primitive
    return ["null", avro] if connect.get("optional") else avro


def avro_value(connect: dict, value):
    """A JSON converter's payload value as the Avro converter holds it (bytes, not base64)."""
    if value is None:
        return None
    if connect["type"] == "struct":
        return {f["field"]: avro_value(f, value.get(f["field"])) for f in connect["fields"]}
    if connect["type"] == "array":
        return [avro_value(connect["items"], v) for v in value]
    return base64.b64decode(value) if connect["type"] == "bytes" else value


def avro_record(record: bytes | None, schema_id: int) -> tuple[bytes | None, object]:
    """A JSON-with-schema record as an Avro converter writes it in the Confluent wire
    format with that registry id, and its Avro schema."""
    import io

    import fastavro

    if record is None:
        return None, None
    envelope = json.loads(record)
    connect = {**envelope["schema"], "optional": False}
    schema = avro_schema(connect)
    out = io.BytesIO()
    out.write(b"\0" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema),
                               avro_value(connect, envelope["payload"]))  # fmt: skip
    return out.getvalue(), schema
