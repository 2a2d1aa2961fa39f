"""An Avro schema's datums read together (`Translation.payloads`, rugo) give the payload
texts each datum read alone gives (`Translation.payload`, fastavro), over every Avro type
a Connect schema has; a datum with a float the columnar reader writes otherwise (NaN,
infinities, -0.0) and every datum of a run it refuses are left to the one-by-one read,
which names what is wrong; a schema that would loop a reader is refused."""

from __future__ import annotations

import io
import json
import math
import random

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from cdclake.debezium.avro import AvroRawRows, Translation, envelope
from cdclake.debezium.avro_rugo import payload_texts
from cdclake.exceptions import DecodeError

from tests.unit.test_avro import registry  # noqa: F401 (a fixture)
from tests.unit.test_resolve import TOPIC


def _opt(avro):
    return {"type": ["null", avro], "default": None}


_VALUE = {"type": "record", "name": "demo.x.Value", "fields": [
    {"name": "id", "type": "long"},
    {"name": "i8", **_opt({"type": "int", "connect.type": "int8"})},
    {"name": "f", **_opt("float")},
    {"name": "d", **_opt("double")},
    {"name": "s", **_opt("string")},
    {"name": "b", **_opt("bytes")},
    {"name": "dec", **_opt({"type": "bytes", "logicalType": "decimal", "precision": 10,
                            "scale": 2, "connect.name": "org.apache.kafka.connect.data.Decimal",
                            "connect.parameters": {"scale": "2"}})},
    {"name": "day", **_opt({"type": "int", "logicalType": "date",
                            "connect.name": "io.debezium.time.Date"})},
    {"name": "arr", **_opt({"type": "array", "items": ["null", "string"]})},
    {"name": "doubles", **_opt({"type": "array", "items": "double"})},
    {"name": "m", **_opt({"type": "map", "values": ["null", "long"]})},
    {"name": "e", **_opt({"type": "enum", "name": "demo.x.E", "symbols": ["A", "B"]})},
    {"name": "vsd", **_opt({"type": "record", "name": "io.debezium.data.VariableScaleDecimal",
                            "fields": [{"name": "scale", "type": "int"},
                                       {"name": "value", "type": "bytes"}]})},
    {"name": "ok", **_opt("boolean")},
]}  # fmt: skip
_ENVELOPE = {"type": "record", "name": "demo.x.Envelope", "fields": [
    {"name": "before", **_opt(_VALUE)}, {"name": "after", **_opt("demo.x.Value")},
    {"name": "op", "type": "string"}, {"name": "ts_ms", **_opt("long")},
]}  # fmt: skip
_SPECIAL = (math.nan, math.inf, -math.inf, -0.0)
_TEXTS = ("", 'quote" back\\ nl\n tab\t ctl\x01', "é 漢 😀", "plain")


def _value(rng: random.Random, i: int, special: bool) -> dict:
    def maybe(v):
        return None if rng.random() < 0.2 else v

    where = rng.randrange(3)  # the float, the double or an array's double
    floats = [rng.uniform(-1e6, 1e6), rng.choice((1e300, 1e-300, 0.1, 3.4e38))]
    if special:
        floats[min(where, 1)] = rng.choice(_SPECIAL)
    return {"id": i, "i8": maybe(rng.randint(-128, 127)),
            "f": floats[0] if where == 0 else maybe(0.5), "d": floats[1] if where != 2 else 2.5,
            "s": maybe(rng.choice(_TEXTS)), "b": maybe(rng.randbytes(rng.randrange(5))),
            "dec": maybe(rng.randbytes(3)), "day": maybe(rng.randint(-1000, 30000)),
            "arr": maybe([rng.choice((None, "a", "漢")) for _ in range(rng.randrange(3))]),
            "doubles": [floats[1]] if where == 2 else maybe([1.5, rng.random()]),
            "m": maybe({"k": maybe(rng.randint(-5, 5))}), "e": maybe(rng.choice("AB")),
            "vsd": maybe({"scale": 3, "value": rng.randbytes(2)}), "ok": maybe(True)}  # fmt: skip


def _datums(n: int, specials: set[int]) -> list[bytes]:
    rng = random.Random(n)
    parsed = fastavro.parse_schema(json.loads(json.dumps(_ENVELOPE)))
    out = []
    for i in range(n):
        after = _value(rng, i, i in specials)
        record = {"before": after if i % 2 else None, "after": after, "op": "u", "ts_ms": i}
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, parsed, record)
        out.append(stream.getvalue())
    return out


def _same(a, b) -> bool:
    """JSON values equal, a float equal to the other's or as a float32 (the converter's
    float32 text against its widening to a double)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == b or np.float32(a) == np.float32(b)
    return type(a) is type(b) and a == b


def test_datums_read_together_equal_each_read_alone():
    specials = {3, 17, 18, 40}
    datums = _datums(60, specials)
    found = Translation(json.dumps(_ENVELOPE))
    together = payload_texts(found.container, found.floats, pa.array(datums, pa.binary()))
    assert {i for i, text in enumerate(together.to_pylist()) if text is None} == specials
    texts, errors = found.payloads(pa.array(datums, pa.binary()))
    assert errors == {} and texts.null_count == 0
    for text, datum in zip(together.to_pylist(), datums, strict=True):
        alone = json.loads(found.payload(datum))
        assert text is None or _same(json.loads(text), alone), (text, alone)
    for i in specials:  # as the JSON converter writes them
        assert any(t in found.payload(datums[i]) for t in (b'"NaN"', b"Infinity", b"-0.0"))


def test_bad_datums_are_kept_with_why_and_the_others_read(registry):  # noqa: F811
    server, config = registry
    server.schemas[7] = _ENVELOPE
    datums = _datums(200, set())
    bad = {1: datums[1] + b"\x02\x04", 2: datums[2][:9], 4: datums[4][:6] + b"\xff" * 8,
           150: datums[150][:-1]}  # fmt: skip
    datums = [bad.get(i, d) for i, d in enumerate(datums)]
    rows = AvroRawRows(TOPIC, 0, config)
    rows.add_many(list(range(200)), [0] * 200, [None] * 200,
                  [b"\x00" + (7).to_bytes(4, "big") + d for d in datums])  # fmt: skip
    got = rows.batch().to_pylist()
    assert [r["offset"] for r in got] == list(range(200))
    errors = {r["offset"]: r["error"] for r in got if r["error"]}
    assert errors.keys() == bad.keys()
    assert errors[1] == "value: not Avro of schema id 7 (2 bytes left after the datum)"
    assert all(e.startswith("value: not Avro of schema id 7 (") for e in errors.values())
    for r in got:
        if r["offset"] not in bad:
            payload = json.loads(r["value_payload"])
            assert payload["after"]["id"] == payload["ts_ms"] == r["offset"]
    # the refused run is read again in halves: the datums far from a bad one together
    found = Translation(json.dumps(_ENVELOPE))
    together = payload_texts(found.container, found.floats, pa.array(datums, pa.binary()))
    assert together.null_count <= 100 and together[60].is_valid


@pytest.mark.parametrize("items", [{"type": "record", "name": "e", "fields": []},
                                   {"type": "fixed", "name": "f0", "size": 0}])  # fmt: skip
def test_a_schema_whose_datums_can_loop_a_reader_is_refused(items):
    """A count of array items that take no bytes is read without reading a byte: a
    datum of a few bytes would hold 2^62 of them."""
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "xs", "type": {"type": "array", "items": items}}]}  # fmt: skip
    with pytest.raises(DecodeError, match="no bytes"):
        Translation(json.dumps(schema))


def test_one_record_as_the_json_converters_envelope(registry):  # noqa: F811
    """What the transaction-consistent cut reads of a record (`cdclake_control.consistency`)."""
    server, config = registry
    server.schemas[7] = _ENVELOPE
    datum = _datums(1, set())[0]
    doc = json.loads(envelope(config, b"\x00" + (7).to_bytes(4, "big") + datum))
    assert doc["schema"]["type"] == "struct" and doc["payload"]["op"] == "u"
    assert doc["payload"]["after"]["id"] == 0 and doc["payload"]["ts_ms"] == 0
    with pytest.raises(ValueError, match="value: not Avro of schema id 7 \\("):
        envelope(config, b"\x00" + (7).to_bytes(4, "big") + datum[:3])
