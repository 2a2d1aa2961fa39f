"""Records an Avro converter wrote in the Confluent wire format (a zero byte, the schema's
4-byte registry id, the Avro binary): the reader task turns each side of a record into
what the JSON converter would have written for the same Connect data, a `{"schema": S,
"payload": P}` envelope, and gathers those like JSON records (`RawRows`). Everything
after the reader is the JSON formats' (`json_records`, `json_flat`): the Connect schema
decides the lake types, whichever converter wrote the record.

The Avro schema carries the Connect schema (`AvroData`'s `connect.name`,
`connect.parameters`, `connect.type` and the logical types), so the translation is
lossless: the values the JSON converter writes as text (bytes and decimals as base64,
NaN and infinities) are written the same way here.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from cdclake.debezium.registry import RegistryConfig, UnknownSchema, schema_text
from cdclake.exceptions import DecodeError
from cdclake.raw_rows import RawRows, Values

if TYPE_CHECKING:
    import pyarrow as pa

_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
# Avro's logical types without a `connect.name`, as Connect's own logical types
_LOGICAL = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
}
_FLOAT_TEXTS = {math.inf: "Infinity", -math.inf: "-Infinity"}
Convert = Callable[[Any], Any]


class Translation:
    """One Avro schema (its registry text) as the JSON converter's Connect schema text
    and a decoder of its records into the JSON converter's payload values."""

    def __init__(self, text: str) -> None:
        import fastavro

        avro = json.loads(text)
        self.named: dict[str, tuple[dict[str, Any], Convert | None]] = {}
        connect, self.convert = self._schema(avro, "")
        self.schema = json.dumps(connect, separators=(",", ":")).encode()
        # logical types left out: values stay as the converter wrote them (days, millis,
        # the decimal's unscaled bytes), which is what the JSON converter writes too
        self.reader = fastavro.parse_schema(_without_logical(avro))

    def payload(self, data: bytes) -> Any:
        from fastavro import schemaless_reader

        value = schemaless_reader(io.BytesIO(data), self.reader, None)
        return value if self.convert is None else self.convert(value)

    def _schema(self, avro: Any, namespace: str) -> tuple[dict[str, Any], Convert | None]:
        """The Connect schema (JSON) of an Avro type, and what its values need to be
        written as the JSON converter does (None: nothing)."""
        if isinstance(avro, list):
            branches = [b for b in avro if b != "null"]
            if len(branches) != 1:
                raise DecodeError(f"Avro union {json.dumps(avro)[:200]} is not a Connect type")
            connect, convert = self._schema(branches[0], namespace)
            return {**connect, "optional": "null" in avro}, _optional(convert)
        if isinstance(avro, str):
            if avro in self.named:
                return self.named[avro]
            qualified = f"{namespace}.{avro}"
            if qualified in self.named:
                return self.named[qualified]
            avro = {"type": avro}
        kind = avro["type"]
        if isinstance(kind, (dict, list)):
            return self._schema(kind, namespace)
        connect = {"optional": False}
        name = avro.get("connect.name") or _LOGICAL.get(avro.get("logicalType", ""))
        params = dict(avro.get("connect.parameters") or {})
        if avro.get("logicalType") == "decimal" and "connect.parameters" not in avro:
            # not written from Connect data (an Avro converter writes its parameters, and
            # a precision of its own, 64, where Connect's decimal has none)
            params["scale"] = str(avro.get("scale", 0))
            if "precision" in avro:
                params["connect.decimal.precision"] = str(avro["precision"])
        convert = None
        if kind == "record":
            connect, convert, name = self._record(avro, namespace, connect, name)
        elif kind == "array":
            items, each = self._schema(avro["items"], namespace)
            connect.update(type="array", items=items)
            convert = None if each is None else (lambda v: [each(x) for x in v])
        elif kind == "map":
            values, member = self._schema(avro["values"], namespace)
            connect.update(type="map", keys={"type": "string", "optional": False}, values=values)
            convert = None if member is None else (lambda v: {k: member(x) for k, x in v.items()})
        elif kind in ("enum", "fixed"):
            connect["type"] = "string" if kind == "enum" else "bytes"
            convert = None if kind == "enum" else _base64
        elif kind in _PRIMITIVES:
            connect["type"] = avro.get("connect.type") or _PRIMITIVES[kind]
            primitive: dict[str, Convert] = {"bytes": _base64, "float": _number, "double": _number}
            convert = primitive.get(kind)
        else:
            raise DecodeError(f"Avro type {kind!r} is not a Connect type")
        if name:
            connect["name"] = name
        if "connect.version" in avro:
            connect["version"] = avro["connect.version"]
        if params:
            connect["parameters"] = params
        return connect, convert

    def _record(
        self, avro: dict[str, Any], namespace: str, connect: dict[str, Any], name: str | None
    ) -> tuple[dict[str, Any], Convert | None, str]:
        full = (
            avro["name"]
            if "." in avro["name"]
            else (f"{avro.get('namespace', namespace)}.{avro['name']}".lstrip("."))
        )
        inner = full.rpartition(".")[0]
        connect.update(type="struct", fields=[])
        converts: list[tuple[str, Convert]] = []
        self.named[full] = (connect, None)  # a record that names itself keeps its values
        for field in avro["fields"]:
            schema, convert = self._schema(field["type"], inner)
            connect["fields"].append({**schema, "field": field["name"]})
            if convert is not None:
                converts.append((field["name"], convert))
        convert = _fields(converts) if converts else None
        self.named[full] = (connect, convert)
        return connect, convert, name or full


def _fields(converts: list[tuple[str, Convert]]) -> Convert:
    def convert(row: dict[str, Any]) -> dict[str, Any]:
        for name, fn in converts:
            row[name] = fn(row[name])
        return row

    return convert


def _optional(convert: Convert | None) -> Convert | None:
    return None if convert is None else (lambda v: None if v is None else convert(v))


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _number(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else _FLOAT_TEXTS[value]


def _without_logical(avro: Any) -> Any:
    if isinstance(avro, list):
        return [_without_logical(a) for a in avro]
    if not isinstance(avro, dict):
        return avro
    return {k: _without_logical(v) for k, v in avro.items() if k != "logicalType"}


# (registry url, id) -> the schema's translation, or why there is none
_TRANSLATIONS: dict[tuple[str, int], Translation | str] = {}


def translation(registry: RegistryConfig, sid: int) -> Translation:
    """The translation of the registry's schema `sid` (made once per process);
    `ValueError` saying why there is none."""
    key = (registry.url, sid)
    found = _TRANSLATIONS.get(key)
    if found is None:
        try:
            found = Translation(schema_text(registry, sid))
        except UnknownSchema as exc:
            found = str(exc)
        except (DecodeError, ValueError, KeyError, TypeError) as exc:
            found = f"schema id {sid} is not a Connect schema: {exc}"
        _TRANSLATIONS[key] = found
    if isinstance(found, str):
        raise ValueError(found)
    return found


def envelope(registry: RegistryConfig, data: bytes) -> bytes:
    """One side of a record, as the JSON converter would have written it; `ValueError`
    saying why it cannot be read."""
    if len(data) < 5 or data[0] != 0:
        raise ValueError(
            f"not Avro in the Confluent wire format (it starts {data[:5]!r}, "
            "not with a zero byte and a schema id)"
        )
    sid = int.from_bytes(data[1:5], "big")
    found = translation(registry, sid)
    try:
        payload = found.payload(data[5:])
    except Exception as exc:  # fastavro's errors of bytes that do not match the schema
        why = str(exc) or ("it ends early" if isinstance(exc, EOFError) else "")
        raise ValueError(f"not Avro of schema id {sid} ({type(exc).__name__}: {why})") from None
    return b'{"schema":' + found.schema + b',"payload":' + msgspec.json.encode(payload) + b"}"


class AvroRawRows:
    """`RawRows` of Avro records: each side as the JSON converter's envelope, or the
    record kept with why it could not be read."""

    def __init__(self, topic: str, partition: int, registry: RegistryConfig | None) -> None:
        if registry is None:
            raise DecodeError("Avro records need kafka.schema_registry.url")
        self.registry = registry
        self.rows = RawRows(topic, partition)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self) -> pa.RecordBatch:
        return self.rows.batch()

    def add_many(
        self,
        offsets: Values,
        timestamps: Values,
        keys: Values,
        values: Values,
        headers: Values | None = None,
    ) -> None:
        """`RawRows.add_many` of the records as envelopes, in order; a record a side of
        which cannot be read is kept with why (`RawRows.add_error`)."""
        offsets, timestamps = _list(offsets), _list(timestamps)
        heads = [None] * len(offsets) if headers is None else _list(headers)
        run: list[tuple[int, bytes | None, bytes | None]] = []  # read, not yet added
        for i, (key, value) in enumerate(zip(_list(keys), _list(values), strict=True)):
            try:
                run.append((i, self._side("key", key), self._side("value", value)))
            except ValueError as exc:
                self._add(run, offsets, timestamps, heads)
                run = []
                self.rows.add_error(offsets[i], timestamps[i], value is None, str(exc), heads[i])
        self._add(run, offsets, timestamps, heads)

    def _side(self, side: str, data: bytes | None) -> bytes | None:
        try:
            return None if data is None else envelope(self.registry, data)
        except ValueError as exc:
            raise ValueError(f"{side}: {exc}") from None

    def _add(
        self,
        run: list[tuple[int, bytes | None, bytes | None]],
        offsets: list[int],
        timestamps: list[int],
        heads: list[Any],
    ) -> None:
        if run:
            at, keys, values = zip(*run, strict=True)
            self.rows.add_many(
                [offsets[i] for i in at],
                [timestamps[i] for i in at],
                list(keys),
                list(values),
                [heads[i] for i in at],
            )


def _list(values: Values) -> list[Any]:
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)
