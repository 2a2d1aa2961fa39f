"""The raw scan of rows the driver holds, and of a DataFrame in Spark tasks (tallies of
parts of the batch added up)."""

import base64

import pyarrow as pa
import pytest
from cdclake.kafka.reader import arrow_frame
from cdclake.kafka.scan import scan_rows
from cdclake.raw_rows import RawRows
from cdclake.resolve.rules import TOAST_PLACEHOLDER

from tests.debezium_records import ITEM_COLUMNS, key_record, value_record

ITEMS, USERS = "pg.public.items", "pg.public.users"
WIDER = [*ITEM_COLUMNS, {"type": "string", "optional": True, "field": "note"}]


def item(i: int, name: str, blob: str | None = None) -> dict:
    return {"id": i, "name": name, "price": None, "day": None, "at": None, "at_tz": None,
            "blob": blob}  # fmt: skip


def raw_table(parts: dict[tuple[str, int], list]) -> pa.Table:
    """The reader's rows of records (key, value) per topic-partition, offsets from 0."""
    batches = []
    for (topic, partition), records in parts.items():
        rows = RawRows(topic, partition)
        for offset, (key, value) in enumerate(records):
            rows.add(offset, 1000 + offset, key, value)
        batches.append(rows.batch())
    return pa.Table.from_batches(batches)


def batch() -> pa.Table:
    v = value_record
    toast_bytes = base64.b64encode(TOAST_PLACEHOLDER.encode()).decode()
    return raw_table({
        (ITEMS, 0): [
            (key_record(1), v("c", None, item(1, "a"), lsn=10)),
            (key_record(2), v("c", None, item(2, "b"), lsn=11, columns=WIDER)),  # newer schema
            (key_record(3), v("u", None, item(3, "c"), lsn=12)),  # the old one is back
            (key_record(4), b'{"payload":{}}'),  # not an envelope
            (key_record(2), None),  # tombstone
            (None, v("t", None, None, lsn=13)),  # truncate, no key
        ],
        (ITEMS, 1): [
            (key_record(5), b"\x00garbage"),  # broken, in another partition
            (key_record(6), v("u", None, item(6, "x", blob=toast_bytes), lsn=14)),
        ],
        (USERS, 0): [
            (key_record(7), v("u", None, item(7, TOAST_PLACEHOLDER), lsn=20)),
            (key_record(8), v("c", None, item(8, 'say "op":"t" here'), lsn=21)),
        ],
    })  # fmt: skip


def test_the_scan_names_schemas_oldest_first_and_the_broken_records():
    got = scan_rows(batch())
    items = got.schemas[ITEMS]
    assert len(items["value"]) == 2 and len(items["key"]) == 1
    newest = items["value"][-1][1]  # oldest first: the schema of offset 2 is the last used
    assert '"note"' not in newest and '"note"' in items["value"][0][1]
    assert got.broken[ITEMS][:2] == (0, 3) and got.broken_count == 2
    assert "value" in got.broken[ITEMS][2]


@pytest.mark.parametrize("topic_has", ["nothing", "tombstones only"])
def test_the_scan_of_quiet_topics(topic_has):
    records = [(key_record(1), value_record("c", None, item(1, "a")))]
    if topic_has == "tombstones only":
        records = [(key_record(1), None), (key_record(2), None)]
    got = scan_rows(raw_table({(ITEMS, 0): records}))
    assert not got.broken
    assert ("value" in got.schemas[ITEMS]) is (topic_has == "nothing")


def test_arrow_frame_holds_the_rows(spark):
    rows = batch()
    frame = arrow_frame(spark, rows)
    assert frame.collect() and [r.asDict() for r in frame.collect()] == rows.to_pylist()
    assert frame._jdf.queryExecution().analyzed().getClass().getSimpleName() == "LocalRelation"
