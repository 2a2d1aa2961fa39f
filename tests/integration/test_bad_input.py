"""Bad input, the same wherever a batch is resolved: next to real Debezium records, each
kind of record that cannot be decoded or applied either fails its table naming topic,
partition and offset (`on_error: fail`), or goes to the dead letters with its raw key,
value and headers as bytes while the rest of the batch loads (`on_error: dead_letter`)."""

from __future__ import annotations

import json
import logging
import uuid

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

pytestmark = pytest.mark.integration

FLAT_SCHEMA = {"type": "struct", "optional": False, "name": "flat.Value", "fields": [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "body"}]}  # fmt: skip


def _payload_cut(value: bytes) -> int:
    return value.index(b',"payload":')


# kind -> (how to make the bad record from the first real record's key and value, the
# reason its error names)
BAD = {
    "random_bytes": (lambda k, v: (k, b"\x00\x01\xfe not json"), "envelope"),
    "truncated_json": (lambda k, v: (k, v[: len(v) // 2]), "envelope"),
    "plain_json": (lambda k, v: (k, b'{"id": 1, "body": "plain"}'), "envelope"),
    "no_schema": (lambda k, v: (k, v[_payload_cut(v) + 11 : -1]), "envelope"),
    "null_payload": (lambda k, v: (k, v[: _payload_cut(v)] + b',"payload":null}'), "envelope"),
    "flattened": (
        lambda k, v: (
            k,
            json.dumps(
                {"schema": FLAT_SCHEMA, "payload": {"id": 1, "body": "f"}}, separators=(",", ":")
            ).encode(),
        ),  # fmt: skip
        "not a Debezium change event",
    ),
    "unknown_op": (lambda k, v: (k, v.replace(b'"op":"c"', b'"op":"x"')), "operation"),
    # text where the schema says int32 (a value that does not convert to its column's type)
    "unfit_value": (
        lambda k, v: (k.replace(b'"id":1', b'"id":9'), v.replace(b'"id":1', b'"id":"nine"')),
        "'id'",
    ),  # fmt: skip
}
# records that are applied although they are not what Debezium sends: a change without a
# Kafka key on a keyed table takes its key from its row's key columns; any valid JSON is
# read (here the first change again, re-sent: dropped); schema and payload both null is
# the JsonConverter's null value, a tombstone
APPLIED = {
    "null_key": (lambda k, v: (None, v), None),
    "spaced_json": (lambda k, v: (k, json.dumps(json.loads(v), indent=1).encode()), None),
    "null_envelope": (lambda k, v: (k, b'{"schema": null, "payload": null}'), None),
}
HEADERS = [("origin", b"test"), ("__debezium.oldkey", None)]


def _first_record(client_config: dict, topic: str) -> tuple[bytes, bytes]:
    consumer = Consumer({**client_config, "group.id": f"t-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        msg = consumer.poll(30)
        assert msg is not None and not msg.error(), f"no record in {topic}"
        return msg.key(), msg.value()
    finally:
        consumer.close()


def _produce_bad(stack, topic: str, kind: str) -> tuple[int, bytes | None, bytes]:
    """Produce `kind`'s bad record after the topic's real ones: (offset, key, value)."""
    key, value = _first_record(stack.broker.client_config(), topic)
    assert b'"op":"c"' in value and b'"body":"one"' in value
    bad_key, bad_value = {**BAD, **APPLIED}[kind][0](key, value)
    assert bad_value != value or bad_key != key
    offsets = []
    producer = Producer(stack.broker.client_config())
    producer.produce(topic, key=bad_key, value=bad_value, headers=HEADERS,
                     on_delivery=lambda err, msg: offsets.append((err, msg.offset())))  # fmt: skip
    producer.flush(10)
    [(err, offset)] = offsets
    assert err is None, err
    return offset, bad_key, bad_value


@pytest.fixture(scope="module")
def bad_tables(stack):
    """A table per kind of bad record, its topic holding real changes, the bad record, and
    real changes after it: {kind: (table, topic, (offset, key, value))}."""
    n = uuid.uuid4().hex[:6]
    tables = {kind: f"inventory.bad_{kind}_{n}" for kind in {**BAD, **APPLIED}}
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for t in tables.values():
            conn.execute(f"create table {t} (id int primary key, body text)")
            conn.execute(f"insert into {t} values (1, 'one')")
            conn.execute(f"insert into {t} values (2, 'two')")
    stack.wait_for_capture()
    bad = {}
    for kind, t in tables.items():
        topic = f"demo.{t}"
        bad[kind] = (t, topic, _produce_bad(stack, topic, kind))
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for t in tables.values():
            conn.execute(f"insert into {t} values (3, 'three')")
            conn.execute(f"update {t} set body = 'uno' where id = 1")
    stack.wait_for_capture()
    return bad


def test_each_bad_record_fails_its_table_naming_topic_partition_and_offset(
    stack, spark, tmp_path, resolve_in, bad_tables, caplog
):
    name = f"it_bad_fail_{resolve_in}_{uuid.uuid4().hex[:4]}"
    pipeline = make_pipeline(tmp_path, name, [t for t, _, _ in bad_tables.values()])
    caplog.set_level(logging.ERROR, logger="cdclake.job")
    with pytest.raises(Exception):  # noqa: B017 - each table's own error is checked below
        load_all(stack, spark, pipeline, "bad-fail", resolve_in)
    failures = " | ".join(r.getMessage() for r in caplog.records if "load failed" in r.getMessage())
    for kind, (_, topic, (offset, _, _)) in bad_tables.items():
        if kind in APPLIED:
            assert topic not in failures, (kind, failures)
            continue
        reason = BAD[kind][1]
        want = f"{topic} partition 0 offset {offset}: "
        assert want in failures, (kind, failures)
        mine = failures.split(want, 1)[1].split(" | ")[0]
        assert reason in mine, (kind, mine)
    assert not spark.catalog.tableExists(f"lake.{name}.{next(iter(bad_tables.values()))[0]}")


def test_each_bad_record_goes_to_the_dead_letters_with_its_raw_bytes(
    stack, spark, tmp_path, resolve_in, bad_tables
):
    name = f"it_bad_dead_{resolve_in}_{uuid.uuid4().hex[:4]}"
    pipeline = make_pipeline(tmp_path, name, [t for t, _, _ in bad_tables.values()],
                             on_error="dead_letter")  # fmt: skip
    results = load_all(stack, spark, pipeline, "bad-dead", resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    rows = spark.sql(f"select * from lake.{name}._cdclake_dead_letters").collect()
    got = {(r.topic, r.offset): r for r in rows}
    assert len(rows) == len(BAD), sorted(got)
    # the run report counts every record the run set aside, whatever stage did it
    assert sum(r.dead_letters for r in results) == len(rows), [
        (r.table, r.dead_letters) for r in results if r.dead_letters
    ]
    for kind, (_, topic, (offset, key, value)) in bad_tables.items():
        if kind in APPLIED:
            assert (topic, offset) not in got, kind
            continue
        row = got[(topic, offset)]
        assert row.partition == 0 and BAD[kind][1] in row.error, (kind, row.error)
        assert (row.raw_key, row.raw_value) == (key, value), kind
        # the payload text as the README says: of a record refused for its schema, not
        # of one refused while its changes were resolved
        if kind in ("flattened", "unknown_op"):
            assert (row.value is None) is (kind == "unknown_op"), (kind, row.value)
        assert [(h.key, h.value) for h in row.headers] == HEADERS, kind
