"""Decode and per-key resolution in Spark, on records shaped like the connector's."""

import base64
import datetime as dt
from decimal import Decimal

import pytest
from cdclake.changes import decode_changes, topic_schema
from cdclake.exceptions import DecodeError
from cdclake.job import _collect_schemas
from cdclake.reader import RAW_SCHEMA, record_row
from cdclake.resolve import find_invalid, resolve_latest

from tests.debezium_records import decimal_b64, key_record, value_record

TOPIC = "pg.public.items"


def item(i, name, price="1.00"):
    return {
        "id": i, "name": name, "price": decimal_b64(Decimal(price), 2), "day": 19000 + i,
        "at": 1_700_000_000_123_456, "at_tz": "2024-01-02T03:04:05.678901Z",
        "blob": base64.b64encode(bytes([i, 0, 255])).decode(),
    }  # fmt: skip


def raw_frame(spark, records):
    seen: set[int] = set()
    rows = [record_row(seen, TOPIC, 0, off, 0, k, v) for off, (k, v) in enumerate(records)]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def decode(spark, records):
    raw = raw_frame(spark, records)
    schemas = _collect_schemas(raw)[TOPIC]
    schema = topic_schema([s for _, s in schemas["key"]], [s for _, s in schemas.get("value", [])],
                          (), TOPIC)  # fmt: skip
    changes = decode_changes(raw, schema, dict(schemas["key"]), dict(schemas.get("value", [])))
    return schema, changes


def test_latest_change_per_key_in_kafka_order(spark):
    records = [
        (key_record(1), value_record("c", None, item(1, "a"))),  # 0
        (key_record(1), value_record("u", item(1, "a"), item(1, "b", "-2.50"))),  # 1
        (key_record(2), value_record("c", None, item(2, "x"))),  # 2
        (key_record(2), value_record("d", item(2, "x"), None)),  # 3
        (key_record(2), None),  # 4 tombstone
        (key_record(3), value_record("d", item(3, "old"), None)),  # 5
        (key_record(3), None),  # 6
        (key_record(3), value_record("c", None, item(3, "new", "99999999.99"))),  # 7
        (key_record(4), value_record("r", None, item(4, "snap"), lsn=None)),  # 8 snapshot read
        (key_record(5), None),  # 9 lone tombstone
        (key_record(1), value_record("u", item(1, "b"), item(1, "final", "0.01"))),  # 10
    ]
    schema, changes = decode(spark, records)
    find_invalid(changes, schema, TOPIC)
    out = {r["id"]: r for r in resolve_latest(changes, schema).collect()}
    assert sorted(out) == [1, 2, 3, 4, 5]
    assert (out[1]["name"], out[1]["price"], out[1]["_cdc_kafka_offset"]) == (
        "final",
        Decimal("0.01"),
        10,
    )
    assert out[2]["_cdc_deleted"] and out[2]["_cdc_op"] == "d"
    assert not out[3]["_cdc_deleted"] and out[3]["price"] == Decimal("99999999.99")
    assert out[4]["_cdc_op"] == "r" and out[4]["_cdc_lsn"] is None
    assert out[5]["_cdc_deleted"]
    row = out[3]
    assert row["day"] == dt.date(1970, 1, 1) + dt.timedelta(days=19003)
    assert row["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert row["at_tz"].astimezone(dt.UTC) == dt.datetime(
        2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC
    )
    assert bytes(row["blob"]) == bytes([3, 0, 255])


def test_truncate_is_refused_naming_the_offset(spark):
    truncate = value_record("t", None, None)
    schema, changes = decode(spark, [(key_record(1), value_record("c", None, item(1, "a"))),
                                     (None, truncate)])  # fmt: skip
    with pytest.raises(DecodeError, match=f"{TOPIC} partition 0 offset 1: truncate"):
        find_invalid(changes, schema, TOPIC)


def test_payload_not_matching_its_schema_is_refused(spark):
    good = value_record("c", None, item(1, "a"))
    broken = good.replace(b'"payload":{', b'"payload":[{', 1)[:-1] + b"]}"
    schema, changes = decode(spark, [(key_record(1), good), (key_record(1), broken)])
    with pytest.raises(DecodeError, match="offset 1: value is not a Debezium envelope"):
        find_invalid(changes, schema, TOPIC)
