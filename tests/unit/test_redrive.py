"""The dead-letter replay's pure parts: when `--since` starts, and the raw rows of dead
letters (split as the reader splits records read from Kafka)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from cdclake.exceptions import ConfigError
from cdclake.raw_rows import RawRows
from cdclake.redrive import describe, parse_since, raw_rows

from tests.conftest import DEMO_PIPELINE
from tests.debezium_records import key_record, value_record
from tests.unit.test_json_flat import item


@pytest.mark.parametrize(("text", "want"), [
    ("2026-11-27", dt.datetime(2026, 11, 27, tzinfo=dt.UTC)),
    ("2026-11-27T08:30:00+01:00", dt.datetime(2026, 11, 27, 7, 30, tzinfo=dt.UTC)),
    ("1764232200000", dt.datetime(2025, 11, 27, 8, 30, tzinfo=dt.UTC)),
])  # fmt: skip
def test_since_is_an_iso_time_utc_unless_it_says_or_epoch_ms(text, want):
    assert parse_since(text) == want


def test_a_since_that_is_no_time_is_refused_naming_it():
    with pytest.raises(ConfigError, match="since: 'yesterday' is not an ISO date"):
        parse_since("yesterday")


def test_dead_letters_split_as_their_records_were_read():
    from cdclake.pipeline_file import load_pipeline
    from pyspark.sql import Row  # a dead letter's header, as Spark reads it

    pipeline = load_pipeline(DEMO_PIPELINE)
    records = [(5, key_record(1), value_record("c", None, item(1, "a"))),
               (3, key_record(2), None), (9, b"\x00junk", b"junk")]  # fmt: skip
    letters = [SimpleNamespace(topic="t", partition=0, offset=o, raw_key=k, raw_value=v,
                               headers=[Row(key="__debezium.oldkey", value=b'{"id": 7}')])
               for o, k, v in records]  # fmt: skip
    got = raw_rows(pipeline, letters).to_pylist()
    reader = RawRows("t", 0)
    for offset, key, value in sorted(records):
        reader.add(offset, 0, key, value, '{"__debezium.oldkey":"{\\"id\\": 7}"}')
    assert got == reader.batch().to_pylist()
    assert [r["offset"] for r in got] == [3, 5, 9] and got[2]["error"] is not None


def test_a_listing_answers_in_words_first():
    at = dt.datetime(2026, 11, 29, 8, 5, 1)
    row = {"topic": "demo.inventory.orders", "partition": 0, "offset": 7, "recorded_at": at,
           "error": "column 'v' is int in the lake\nmore detail"}  # fmt: skip
    other = {**row, "topic": "demo.inventory.customers", "offset": 9}
    assert describe("demo", []) == "0 pending dead letters for demo"
    assert describe("demo", [row]).splitlines() == [
        "1 pending dead letter for demo (demo.inventory.orders: 1)",
        "  demo.inventory.orders[0] offset 7, 2026-11-29 08:05:01: column 'v' is int in the lake",
    ]
    lines = describe("demo", [row, other, row], pending=False, shown=2).splitlines()
    assert lines[0] == (
        "3 dead letters for demo (demo.inventory.customers: 1, demo.inventory.orders: 2)"
    )
    assert len(lines) == 4 and lines[-1] == "  ... and 1 more"
