"""JSON-with-schema records as an Avro converter writes them: the Avro schema `AvroData`
makes of a Connect schema (`avro_schema`), the value in Avro's terms (`avro_value`), and
a recording whose every record is written so, with its schemas registered in a
Confluent-compatible registry (`avro_recording`): the same events in another wire format."""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from pathlib import Path

_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long",
               "float": "float", "double": "double", "boolean": "boolean", "string": "string",
               "bytes": "bytes"}  # fmt: skip
DECIMAL = "org.apache.kafka.connect.data.Decimal"


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
    elif kind == "map":
        avro = {"type": "map", "values": avro_schema(connect["values"], named)}
    else:
        avro = {"type": _PRIMITIVES[kind]}
        if kind in ("int8", "int16"):
            avro["connect.type"] = kind
        if name:
            avro.update({"connect.version": 1, "connect.name": name})
        if connect.get("parameters"):
            avro["connect.parameters"] = connect["parameters"]
        if name == DECIMAL:  # the converter's precision when Connect's has none
            params = connect["parameters"]
            avro.update(logicalType="decimal", scale=int(params["scale"]),
                        precision=int(params.get("connect.decimal.precision", 64)))  # fmt: skip
        if len(avro) == 1:
            avro = avro["type"]
    return ["null", avro] if connect.get("optional") else avro


def avro_value(connect: dict, value):
    """A JSON converter's payload value as the Avro converter holds it (bytes, not base64)."""
    if value is None:
        return None
    kind = connect["type"]
    if kind == "struct":
        return {f["field"]: avro_value(f, value.get(f["field"])) for f in connect["fields"]}
    if kind == "array":
        return [avro_value(connect["items"], v) for v in value]
    if kind == "map":
        return {k: avro_value(connect["values"], v) for k, v in value.items()}
    return base64.b64decode(value) if kind == "bytes" else value


class AvroWriter:
    """JSON-with-schema records -> the Confluent wire format, each distinct schema given an
    id by `register` (text of the Avro schema -> id) once."""

    def __init__(self, register) -> None:
        self.register = register
        self.known: dict[str, tuple[int, object]] = {}

    def __call__(self, record: bytes | None, subject: str) -> bytes | None:
        import fastavro

        if record is None:
            return None
        envelope = json.loads(record)
        connect = {**envelope["schema"], "optional": False}
        text = json.dumps(connect, sort_keys=True)
        if text not in self.known:
            schema = avro_schema(connect)
            self.known[text] = (self.register(subject, schema), fastavro.parse_schema(schema))
        sid, parsed = self.known[text]
        out = io.BytesIO()
        out.write(b"\0" + sid.to_bytes(4, "big"))
        fastavro.schemaless_writer(out, parsed, avro_value(connect, envelope["payload"]))
        return out.getvalue()


def registry_register(url: str):
    """`register` of a Confluent-compatible registry at `url`: POST the schema to the
    subject, its id back."""

    def register(subject: str, schema: object) -> int:
        body = json.dumps({"schema": json.dumps(schema)}).encode()
        request = urllib.request.Request(
            f"{url}/subjects/{subject}/versions", data=body, method="POST",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())["id"]

    return register


def avro_recording(source: Path, out: Path, url: str) -> None:
    """A copy of the recording in `source` with every key and value as an Avro converter
    writes it, their schemas registered at `url`."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    write = AvroWriter(registry_register(url))
    for path in sorted(source.glob("*.parquet")):
        table = pq.read_table(path)
        topic = path.stem.rsplit("-", 1)[0]
        for side in ("key", "value"):
            data = [write(v, f"{topic}-{side}") for v in table.column(side).to_pylist()]
            table = table.set_column(table.schema.get_field_index(side), side,
                                     pa.array(data, pa.binary()))  # fmt: skip
        pq.write_table(table, out / path.name, compression="zstd")
    shutil.copy(source / "ranges.json", out / "ranges.json")
