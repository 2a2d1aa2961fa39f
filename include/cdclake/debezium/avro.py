"""Records an Avro converter wrote in the Confluent wire format (a zero byte, the schema's
4-byte registry id, the Avro binary): the reader task turns each side of a record into
what the JSON converter would have written for the same Connect data, a `{"schema": S,
"payload": P}` envelope, and gathers those like JSON records (`RawRows`). Everything
after the reader is the JSON formats' (`json_records`, `json_flat`): the Connect schema
decides the lake types, whichever converter wrote the record.

A task's datums of one schema are read together by `rugo` (C++), framed as an Avro
container file whose record has the datum as its one field, which rugo gives as JSON
text: the payload. rugo writes NaN and infinities as null and -0.0 as 0, so a datum with
such a float, and a run rugo refuses (it does not say which datum), are read datum by
datum by fastavro (`Translation.payload`), which names what is wrong.

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

from cdclake.debezium.avro_rugo import container, payload_texts
from cdclake.debezium.registry import RegistryConfig, UnknownSchema, schema_text
from cdclake.exceptions import DecodeError
from cdclake.raw_rows import RawRows, Split, Values, arrow_array

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
_NO_DATA, _NOT_WIRE = -1, -2  # a side's schema id when it has no data, or not the wire format
_MAX_BYTES = (1 << 31) - 1  # an end past any record (binary_slice wants one)
Convert = Callable[[Any], Any]


class Translation:
    """One Avro schema (its registry text) as the JSON converter's Connect schema text
    and a decoder of its records into the JSON converter's payload texts."""

    def __init__(self, text: str) -> None:
        import fastavro

        avro = json.loads(text)
        self.named: dict[str, tuple[dict[str, Any], Convert | None]] = {}
        connect, self.convert = self._schema(avro, "")
        self.schema = json.dumps(connect, separators=(",", ":")).encode()
        # logical types left out: values stay as the converter wrote them (days, millis,
        # the decimal's unscaled bytes), which is what the JSON converter writes too
        plain = _without_logical(avro)
        self.reader = fastavro.parse_schema(plain)
        self.container, self.floats = container(plain)

    def payload(self, data: bytes) -> bytes:
        """One datum's payload text, read by fastavro; `ValueError` saying why the
        datum is not of this schema."""
        from fastavro import schemaless_reader

        stream = io.BytesIO(data)
        try:
            value = schemaless_reader(stream, self.reader, None)
        except Exception as exc:  # fastavro's errors of bytes that do not match the schema
            why = "it ends early" if isinstance(exc, EOFError) else str(exc)
            raise ValueError(f"{type(exc).__name__}: {why}") from None
        if stream.tell() != len(data):
            raise ValueError(f"{len(data) - stream.tell()} bytes left after the datum")
        return msgspec.json.encode(value if self.convert is None else self.convert(value))

    def payloads(self, datums: pa.Array) -> tuple[pa.Array, dict[int, str]]:
        """The datums' payload texts, read together (`avro_rugo`) and each it leaves
        alone (`payload`); null for a datum that is not of this schema, with why (by
        position)."""
        import numpy as np
        import pyarrow as pa

        texts = (
            pa.nulls(len(datums), pa.string())
            if self.container is None
            else payload_texts(self.container, self.floats, datums)
        )
        alone = np.flatnonzero(texts.is_null().to_numpy(zero_copy_only=False))
        if not len(alone):
            return texts, {}
        errors: dict[int, str] = {}
        read: list[str | None] = []
        for j in alone.tolist():
            try:
                read.append(self.payload(datums[j].as_py()).decode("utf-8"))
            except ValueError as exc:
                errors[j] = str(exc)
                read.append(None)
        order = np.arange(len(texts))
        order[alone] = len(texts) + np.arange(len(alone))
        return pa.concat_arrays([texts, pa.array(read, pa.string())]).take(order), errors

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
            if _empty(items):  # a count of such items is read without reading a byte
                raise DecodeError("an Avro array of items that take no bytes")
            connect.update(type="array", items=items)
            convert = None if each is None else (lambda v: [each(x) for x in v])
        elif kind == "map":
            values, member = self._schema(avro["values"], namespace)
            connect.update(type="map", keys={"type": "string", "optional": False}, values=values)
            convert = None if member is None else (lambda v: {k: member(x) for k, x in v.items()})
        elif kind in ("enum", "fixed"):
            if kind == "fixed" and not avro.get("size"):
                raise DecodeError("an Avro fixed of no bytes")
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


def _empty(connect: dict[str, Any]) -> bool:
    """Whether a value of the Connect schema is written in no bytes (a struct of
    such fields only)."""
    if connect.get("optional") or connect.get("type") != "struct":
        return False
    return all(_empty(field) for field in connect["fields"])


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


def read_side(registry: RegistryConfig, side: str, datas: Values) -> tuple[Split, dict[int, str]]:
    """Each record's side (`side`: key or value) as the JSON converter would have split
    it, and why each that cannot be read cannot (by position). The datums of each schema
    are read together (`avro_rugo`), those it leaves one by one (`Translation.payload`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    datas = arrow_array(datas, pa.binary())
    sids = _schema_ids(datas)
    errors = {
        int(i): f"{side}: not Avro in the Confluent wire format (it starts "
        f"{datas[int(i)].as_py()[:5]!r}, not with a zero byte and a schema id)"
        for i in np.flatnonzero(sids == _NOT_WIRE)
    }
    parts: list[pa.Array] = []
    schemas: dict[int, bytes] = {}
    where, taken = np.full(len(datas), -1), 0  # each datum's row in `parts` joined
    for sid in np.unique(sids[sids >= 0]).tolist():
        at = np.flatnonzero(sids == sid)
        try:
            found = translation(registry, sid)
        except ValueError as exc:
            errors.update((int(i), f"{side}: {exc}") for i in at)
            continue
        texts, bad = found.payloads(pc.binary_slice(datas.take(at), 5, _MAX_BYTES))
        why = f"{side}: not Avro of schema id {sid}"
        errors.update((int(at[j]), f"{why} ({reason})") for j, reason in bad.items())
        where[at] = taken + np.arange(len(at))
        taken += len(at)
        parts.append(texts)
        schemas[sid] = found.schema
    at_all = pa.array(where, mask=where < 0)
    payloads = (pa.concat_arrays(parts) if parts else pa.nulls(0, pa.string())).take(at_all)
    keys = pa.array(np.where(where < 0, 0, sids), mask=where < 0)
    return (payloads, keys, schemas), errors


def _schema_ids(datas: pa.Array) -> Any:
    """Each datum's registry id (numpy), `_NO_DATA` or `_NOT_WIRE`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(datas)
    valid = datas.is_valid().to_numpy(zero_copy_only=False)
    long = pc.fill_null(pc.greater_equal(pc.binary_length(datas), 5), False)
    start = pc.if_else(long, pc.binary_slice(datas, 0, 5), pa.scalar(b"\x01" * 5, pa.binary()))
    heads = start.cast(pa.binary(5))
    raw = np.frombuffer(heads.buffers()[1], np.uint8)[: n * 5].reshape(n, 5).astype(np.int64)
    sids = (raw[:, 1] << 24) | (raw[:, 2] << 16) | (raw[:, 3] << 8) | raw[:, 4]
    sids[raw[:, 0] != 0] = _NOT_WIRE
    sids[~valid] = _NO_DATA
    return sids


def envelope(registry: RegistryConfig, data: bytes) -> bytes:
    """A record's value as the JSON converter's envelope; `ValueError` saying why it
    cannot be read."""
    (payloads, keys, schemas), errors = read_side(registry, "value", [data])
    if errors:
        raise ValueError(errors[0])
    payload: str = payloads[0].as_py()
    return b'{"schema":' + schemas[keys[0].as_py()] + b',"payload":' + payload.encode() + b"}"


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
        """The records' raw rows, in order (`RawRows.add_split`); a record a side of
        which cannot be read is kept with why (`RawRows.add_error`)."""
        import pyarrow as pa

        offsets, timestamps = arrow_array(offsets, pa.int64()), arrow_array(timestamps, pa.int64())
        values = arrow_array(values, pa.binary())
        heads = (
            pa.nulls(len(offsets), pa.string())
            if headers is None
            else arrow_array(headers, pa.string())
        )
        keys_read, key_errors = read_side(self.registry, "key", keys)
        values_read, errors = read_side(self.registry, "value", values)
        errors.update(key_errors)  # a record's key is told first
        tombstones = values.is_null()
        start = 0
        for i in [*sorted(errors), len(offsets)]:
            if i > start:
                run = slice(start, i)
                sides = {"key": _sliced(keys_read, run), "value": _sliced(values_read, run)}
                self.rows.add_split(
                    offsets[run], timestamps[run], sides, tombstones[run], heads[run]
                )
            if i < len(offsets):
                self.rows.add_error(
                    offsets[i].as_py(),
                    timestamps[i].as_py(),
                    tombstones[i].as_py(),
                    errors[i],
                    heads[i].as_py(),
                )
            start = i + 1


def _sliced(split: Split, run: slice) -> Split:
    payloads, keys, schemas = split
    return payloads[run], keys[run], schemas
