"""Decode and per-key resolution in Spark, on records shaped like the connector's."""

import base64
import datetime as dt
from decimal import Decimal, localcontext

import pytest
from cdclake.changes import decode_changes, topic_schema
from cdclake.exceptions import DecodeError
from cdclake.reader import RAW_SCHEMA, SchemaIds, record_row
from cdclake.resolve import check_changes, find_invalid, resolve_latest
from cdclake.scan import scan_raw
from cdclake.spark import SMALL_BATCH_CONF, batch_settings

from tests.debezium_records import decimal_b64, key_record, unscaled_b64, value_record

TOPIC = "pg.public.items"


def item(i, name, price="1.00"):
    return {
        "id": i, "name": name, "price": decimal_b64(Decimal(price), 2), "day": 19000 + i,
        "at": 1_700_000_000_123_456, "at_tz": "2024-01-02T03:04:05.678901Z",
        "blob": base64.b64encode(bytes([i, 0, 255])).decode(),
    }  # fmt: skip


def raw_frame(spark, records):
    seen = SchemaIds()
    rows = [record_row(seen, TOPIC, 0, off, 0, k, v) for off, (k, v) in enumerate(records)]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def decode(spark, records):
    raw = raw_frame(spark, records)
    schemas = scan_raw(raw).schemas[TOPIC]
    schema = topic_schema([s for _, s in schemas["key"]], [s for _, s in schemas.get("value", [])],
                          (), TOPIC)  # fmt: skip
    changes = decode_changes(raw, schema, dict(schemas["key"]), dict(schemas.get("value", [])))
    return schema, changes


def test_latest_change_per_key_in_kafka_order(spark):
    v = value_record
    records = [
        (key_record(1), v("c", None, item(1, "a"), lsn=100)),  # 0
        (key_record(1), v("u", item(1, "a"), item(1, "b", "-2.50"), lsn=101)),  # 1
        (key_record(2), v("c", None, item(2, "x"), lsn=102)),  # 2
        (key_record(2), v("d", item(2, "x"), None, lsn=103)),  # 3
        (key_record(2), None),  # 4 tombstone
        (key_record(3), v("d", item(3, "old"), None, lsn=104)),  # 5
        (key_record(3), None),  # 6
        (key_record(3), v("c", None, item(3, "new", "99999999.99"), lsn=105)),  # 7
        (key_record(4), v("r", None, item(4, "snap"), lsn=None)),  # 8 incremental read
        (key_record(5), None),  # 9 lone tombstone: its delete was in an earlier batch
        (key_record(1), v("u", item(1, "b"), item(1, "final", "0.01"), lsn=106)),  # 10
    ]
    schema, changes = decode(spark, records)
    find_invalid(changes, schema, TOPIC)
    out = {r["id"]: r for r in resolve_latest(changes, schema).collect()}
    assert sorted(out) == [1, 2, 3, 4]  # nothing to do for 5
    assert (out[1]["name"], out[1]["price"], out[1]["_cdc_kafka_offset"]) == (
        "final",
        Decimal("0.01"),
        10,
    )
    assert out[2]["_cdc_deleted"] and out[2]["_cdc_op"] == "d"
    assert not out[3]["_cdc_deleted"] and out[3]["price"] == Decimal("99999999.99")
    assert out[4]["_cdc_op"] == "r" and out[4]["_cdc_lsn"] is None
    row = out[3]
    assert row["day"] == dt.date(1970, 1, 1) + dt.timedelta(days=19003)
    assert row["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert row["at_tz"].astimezone(dt.UTC) == dt.datetime(
        2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC
    )
    assert bytes(row["blob"]) == bytes([3, 0, 255])


def test_a_batch_of_tombstones_only_decodes_and_resolves_to_nothing(spark):
    """A batch cut between a delete and its tombstone starts with the tombstone alone."""
    raw = raw_frame(spark, [(key_record(7), None), (key_record(8), None)])
    schemas = scan_raw(raw).schemas[TOPIC]
    assert "value" not in schemas
    known = {"id": "int", "name": "string"}
    schema = topic_schema([s for _, s in schemas["key"]], [], (), TOPIC, known=known)
    changes = decode_changes(raw, schema, dict(schemas["key"]), {})
    assert [(r["key"]["id"], r["is_tombstone"]) for r in changes.collect()] == [
        (7, True),
        (8, True),
    ]
    find_invalid(changes, schema, TOPIC)
    assert resolve_latest(changes, schema).count() == 0


@pytest.mark.parametrize(
    "script, expected",
    [
        # re-sent after a connector restart: same LSNs again, later offsets -> skipped
        ([("c", 1, "a", 10), ("u", 1, "b", 20), ("c", 1, "a", 10), ("u", 1, "b", 20)], "b"),
        ([("c", 1, "a", 10), ("u", 1, "b", 20), ("c", 1, "a", 10)], "b"),
        # a replayed delete and its tombstone do not remove a row re-created later
        (
            [
                ("c", 1, "a", 10),
                ("d", 1, None, 20),
                ("T", 1, None, None),
                ("c", 1, "z", 30),
                ("d", 1, None, 20),
                ("T", 1, None, None),
            ],
            "z",
        ),
        # an incremental snapshot read has no LSN and is never skipped
        ([("c", 1, "a", 10), ("r", 1, "snap", None)], "snap"),
        ([("c", 1, "a", 10), ("r", 1, "snap", None), ("u", 1, "later", 40)], "later"),
        # a real delete wins
        ([("c", 1, "a", 10), ("d", 1, None, 20), ("T", 1, None, None)], None),
    ],
)
def test_resent_records_never_regress_a_key(spark, script, expected):
    records = []
    for op, i, name, lsn in script:
        if op == "T":
            records.append((key_record(i), None))
        elif op == "d":
            records.append((key_record(i), value_record("d", item(i, "x"), None, lsn=lsn)))
        else:
            records.append((key_record(i), value_record(op, None, item(i, name), lsn=lsn)))
    schema, changes = decode(spark, records)
    [row] = resolve_latest(changes, schema).collect()
    assert (None if row["_cdc_deleted"] else row["name"]) == expected


TOAST = "__debezium_unavailable_value"


def test_toast_placeholder_takes_the_last_real_value_or_keeps_the_table_value(spark):
    blob_ph = base64.b64encode(TOAST.encode()).decode()
    records = [
        (key_record(1), value_record("c", None, item(1, "long text"), lsn=10)),
        (key_record(1), value_record("u", None, {**item(1, TOAST), "blob": blob_ph}, lsn=11)),
        (key_record(2), value_record("u", None, {**item(2, TOAST), "blob": blob_ph}, lsn=12)),
    ]
    schema, changes = decode(spark, records)
    out = {r["id"]: r for r in resolve_latest(changes, schema).collect()}
    assert out[1]["name"] == "long text" and bytes(out[1]["blob"]) == bytes([1, 0, 255])
    assert not out[1]["_cdc_toast_name"] and not out[1]["_cdc_toast_blob"]
    # key 2 has no earlier value in the batch: NULL here, the MERGE keeps the table's
    assert out[2]["name"] is None and out[2]["_cdc_toast_name"] and out[2]["_cdc_toast_blob"]


def test_small_batches_evaluated_interpreted_resolve_like_compiled_ones(spark):
    v = value_record
    records = [
        (key_record(1), v("c", None, item(1, "a"), lsn=100)),
        (key_record(2), v("c", None, item(2, "x", "-12.34"), lsn=101)),
        (key_record(1), v("u", item(1, "a"), item(1, "b", "99999999.99"), lsn=102)),
        (key_record(2), v("d", item(2, "x"), None, lsn=103)),
        (key_record(2), None),
        (key_record(3), v("r", None, item(3, "snap"), lsn=None)),
        (key_record(1), v("u", item(1, "b"), item(1, "b"), lsn=101)),  # re-sent, stale
    ]
    schema, changes = decode(spark, records)

    def rows():
        check = check_changes(changes, schema)
        out = resolve_latest(changes, schema, check.truncate).collect()
        return check, sorted((r.asDict(recursive=True) for r in out), key=lambda r: r["id"])

    compiled = rows()
    with batch_settings(spark, SMALL_BATCH_CONF):
        assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
        interpreted = rows()
    assert spark.conf.get("spark.sql.codegen.factoryMode") != "NO_CODEGEN"  # put back
    assert interpreted == compiled
    # a deleted row keeps the last values it had in the batch
    assert [(r["name"], r["_cdc_deleted"]) for r in compiled[1]] == [
        ("b", False), ("x", True), ("snap", False),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "records, pipeline_conf, expected",
    [
        (100, {}, SMALL_BATCH_CONF),  # small: interpreted
        (10_000, {}, SMALL_BATCH_CONF),  # the limit is still small
        (10_001, {}, {}),  # big: compiled
        (  # the pipeline's own setting wins
            100,
            {"spark.sql.codegen.wholeStage": "true"},
            {k: v for k, v in SMALL_BATCH_CONF.items() if k != "spark.sql.codegen.wholeStage"},
        ),
    ],
)
def test_batch_conf_by_size(records, pipeline_conf, expected):
    from cdclake.spark import batch_conf

    assert batch_conf(records, pipeline_conf) == expected


def test_truncate_drops_what_came_before_it(spark):
    records = [
        (key_record(1), value_record("c", None, item(1, "gone"), lsn=10)),
        (key_record(2), value_record("c", None, item(2, "gone too"), lsn=11)),
        (None, value_record("t", None, None, lsn=12)),
        (key_record(2), value_record("c", None, item(2, "after"), lsn=13)),
    ]
    schema, changes = decode(spark, records)
    check = check_changes(changes, schema)
    assert (check.first_invalid, check.invalid) == (None, 0)
    truncate = check.truncate
    assert (truncate.partition, truncate.offset, truncate.lsn) == (0, 2, 12)
    out = {r["id"]: r["name"] for r in resolve_latest(changes, schema, truncate).collect()}
    assert out == {2: "after"}


def test_value_that_does_not_fit_its_column_is_refused(spark):
    too_big = {**item(1, "a"), "price": decimal_b64(Decimal("123456789012.34"), 2)}
    schema, changes = decode(spark, [(key_record(1), value_record("c", None, too_big))])
    with pytest.raises(DecodeError, match="offset 0: value does not fit column.s. price"):
        find_invalid(changes, schema, TOPIC)


@pytest.mark.parametrize("field, value", [("day", "a day"), ("at", {"t": 1}), ("id", [1])])
def test_value_of_another_json_type_is_refused_not_loaded_as_null(spark, field, value):
    """`from_json` turns a field it cannot read as its type into NULL, keeping the rest.
    (A field it reads as text takes any JSON scalar as its text: not checked here.)"""
    wrong = {**item(1, "a"), field: value}
    schema, changes = decode(spark, [(key_record(1), value_record("u", None, wrong))])
    with pytest.raises(DecodeError, match=f"offset 0: value does not fit column.s. {field}$"):
        find_invalid(changes, schema, TOPIC)


def test_payload_not_matching_its_schema_is_refused(spark):
    good = value_record("c", None, item(1, "a"))
    broken = good.replace(b'"payload":{', b'"payload":[{', 1)[:-1] + b"]}"
    schema, changes = decode(spark, [(key_record(1), good), (key_record(1), broken)])
    with pytest.raises(DecodeError, match="offset 1: value is not a Debezium envelope"):
        find_invalid(changes, schema, TOPIC)


def _decimal_cases():
    """Unscaled values at the byte-length edges of the Connect Decimal encoding (1, 8, 9
    and 16 bytes, both signs), with the decimal type they are read as."""
    out = []
    edges = (0, 1, -1, 127, 128, -128, -129, 32767, -32768, 2**63 - 1, -(2**63), 2**63,
             -(2**63) - 1, 10**18, -(10**18), 10**37 + 12345, -(10**37) - 1)  # fmt: skip
    for unscaled in edges:
        out.append((unscaled, 38, 2))
    out += [(-123456789, 18, 0), (999999999999999999, 18, 6), (-5, 10, -2)]
    return out


@pytest.mark.parametrize("interpreted", [False, True])
def test_connect_decimals_decode_exactly_at_every_byte_length(spark, interpreted):
    from cdclake.debezium import decimal_from_base64
    from pyspark.sql import functions as F

    cases = _decimal_cases()
    df = spark.createDataFrame([(unscaled_b64(u),) for u, _, _ in cases], "b string")
    exprs = [
        decimal_from_base64(F.col("b"), p, s).cast("string").alias(f"c{i}")
        for i, (_, p, s) in enumerate(cases)
    ]
    conf = SMALL_BATCH_CONF if interpreted else {}
    with batch_settings(spark, conf):
        got = df.select(*exprs).collect()
    for i, (unscaled, precision, scale) in enumerate(cases):
        value = got[i][f"c{i}"]
        with localcontext(prec=100):
            expected = Decimal(unscaled).scaleb(-scale)
            kept = max(scale, 0)
            if abs(expected) >= Decimal(10) ** (precision - kept):  # does not fit: NULL
                assert value is None, (unscaled, precision, scale, value)
                continue
            assert value == format(expected.quantize(Decimal(1).scaleb(-kept)), "f"), (
                unscaled, precision, scale, value,
            )  # fmt: skip


def test_a_small_batch_compiles_from_its_first_big_merge_target_on(spark, monkeypatch):
    """A small batch evaluates interpreted, but a MERGE scans every row of its target:
    from the first table above `COMPILE_TARGET_ROWS` on, the batch compiles again (the
    settings before it back), one way only; a batch that compiled anyway changes nothing."""
    import cdclake.batch
    from cdclake.batch import Batch

    monkeypatch.setattr(cdclake.batch, "COMPILE_TARGET_ROWS", 100)
    mode = "spark.sql.codegen.factoryMode"
    outside = {k: spark.conf.get(k, None) for k in SMALL_BATCH_CONF}
    with batch_settings(spark, SMALL_BATCH_CONF) as before:
        assert dict(before) == outside
        batch = Batch(spark, None, None, None, None, 0.0, before=before)
        batch.compile_for("lake.small", 100)  # not above the threshold
        assert spark.conf.get(mode) == "NO_CODEGEN"
        batch.compile_for("lake.big", 101)
        assert {k: spark.conf.get(k, None) for k in SMALL_BATCH_CONF} == outside
        batch.compile_for("lake.small", 1)  # nothing switches back
        assert spark.conf.get(mode, None) == outside[mode]
    assert {k: spark.conf.get(k, None) for k in SMALL_BATCH_CONF} == outside
    with batch_settings(spark, {}) as before:  # a big batch: compiled already
        batch = Batch(spark, None, None, None, None, 0.0, before=before)
        spark.conf.set(mode, "NO_CODEGEN")  # (set by hand: compile_for leaves it)
        batch.compile_for("lake.big", 10**9)
        assert spark.conf.get(mode) == "NO_CODEGEN"
    spark.conf.unset(mode)
