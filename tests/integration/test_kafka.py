"""What the real Kafka of the local stack does to a topic, and the load after it: records
deleted below a table's committed offsets (DeleteRecords, as retention does), a compacted
topic whose log cleaner removed superseded records, and producers that batch records."""

from __future__ import annotations

import re
import subprocess
import time
import uuid

import psycopg
import pytest
from cdclake.exceptions import DataLossError
from cdclake.iceberg.catalog import load_catalog
from cdclake_control.catalog import table_state
from cdclake_control.planner import plan_pipeline
from cdclake_control.watermarks import fetch_watermarks

from tests.integration.helpers import (
    assert_lake_equals_source,
    delete_records,
    load_all,
    make_pipeline,
)

pytestmark = pytest.mark.integration

BATCH_LINE = re.compile(r"baseOffset: (\d+) lastOffset: (\d+) count: (\d+)")


def new_table(dsn: str, name: str, rows: int) -> str:
    table = f"inventory.{name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        conn.execute(f"insert into {table} select i, 'v' || i from generate_series(1, {rows}) i")
    return table


def committed(pipeline) -> dict:
    return table_state(load_catalog(pipeline.catalog), pipeline, pipeline.tables[0]).offsets


def present_offsets(kafka, topic: str, timeout: float = 60) -> list[int]:
    """The offsets of every record partition 0 of `topic` holds, read by a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    (low, high) = next(iter((m.low, m.high) for m in fetch_watermarks(kafka, [topic]).values()))
    consumer = Consumer({**kafka.client_config(), "group.id": f"it-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, low)])
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191 and msg.offset() >= high:  # end of partition
                    return seen
                continue
            seen.append(msg.offset())
            if msg.offset() >= high - 1:
                return seen
        raise AssertionError(f"{topic}: read {len(seen)} records up to {high} in {timeout}s")
    finally:
        consumer.close()


def produce_batches(stack, topic: str) -> list[tuple[int, int, int]]:
    """(base offset, last offset, records) of each record batch of partition 0 in the
    broker's log, as Kafka's DumpLogSegments reads the segment files."""
    from cdclake_local import maven
    from cdclake_local.broker import java

    files = sorted(str(p) for p in (stack.broker.data / f"{topic}-0").glob("*.log"))
    done = subprocess.run(java("-cp", maven.classpath("kafka"),
                               "org.apache.kafka.tools.DumpLogSegments", "--files", *files),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(map(int, m.groups())) for m in BATCH_LINE.finditer(done.stdout)]


def test_records_deleted_below_the_committed_offsets_fail_the_plan_until_a_snapshot_rebuild(
    stack, spark, tmp_path, capsys
):
    """DeleteRecords (what retention does) removes records a table has not loaded: the plan
    fails naming topic, partition, offsets and the recovery, and nothing is loaded; a
    rebuild is refused until told a snapshot completed; after an incremental snapshot of
    the table, the rebuild makes the lake equal to the source again."""
    from cdclake_control.backfill import (
        BackfillError,
        parse_request,
        plan_pipeline_backfill,
        run_backfill,
    )
    from cdclake_control.cli import main
    from cdclake_control.signals import follow_snapshot, submit
    from cdclake_control.signals import parse_request as snapshot_request

    n = uuid.uuid4().hex[:6]
    table = new_table(stack.source_dsn, f"gap_{n}", 30)
    pipeline = make_pipeline(tmp_path, f"it_gap_{n}", [table])
    topic = pipeline.topic_for(pipeline.tables[0])
    load_all(stack, spark, pipeline, f"gap-{n}-a")
    (done,) = committed(pipeline).values()
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {table} set v = 'changed' where id <= 10")
        conn.execute(f"delete from {table} where id between 11 and 15")
        conn.execute(f"insert into {table} select i, 'new' from generate_series(31, 40) i")
    stack.wait_for_capture()
    high = fetch_watermarks(pipeline.kafka, [topic])[(topic, 0)].high
    cut = done + 8  # among the updates: the lake has not seen them
    assert high > cut
    delete_records(pipeline, topic, cut)
    assert fetch_watermarks(pipeline.kafka, [topic])[(topic, 0)].low == cut

    message = (
        f"{topic} partition 0: the last committed offset is {done} but the earliest "
        f"offset still in Kafka is {cut}; records {done}..{cut - 1} were deleted"
    )
    with pytest.raises(DataLossError, match=re.escape(message)) as err:
        plan_pipeline(pipeline, f"gap-{n}-b")
    assert "incremental snapshot of that table" in str(err.value)
    assert main(["run", "--pipeline", str(pipeline.path)]) == 2  # the CLI's run fails too
    assert message in capsys.readouterr().err
    assert committed(pipeline) == {(topic, 0): done}  # nothing skipped, nothing loaded

    rebuild = dict(tables=[table], mode="rebuild", start="earliest", end="latest")
    with pytest.raises(BackfillError, match=rf"offsets 0..{cut - 1} were deleted by retention"):
        plan_pipeline_backfill(pipeline, parse_request(pipeline, **rebuild), f"gap-{n}-r0")

    sent = submit(pipeline, stack.source_dsn, snapshot_request("execute", [table]), origin="test")
    start = {int(p): o for p, o in sent["notification_offsets"].items()}
    progress = follow_snapshot(pipeline.kafka, pipeline.notification_topic, sent["signal_id"],
                               300, start, sent["blocking"])  # fmt: skip
    assert progress.status == "COMPLETED" and progress.rows_scanned == {table: 35}
    stack.wait_for_capture()
    request = parse_request(pipeline, **rebuild, accept_retention_gap=True)
    plans = plan_pipeline_backfill(pipeline, request, f"gap-{n}-r1")
    assert plans and plans[0].ranges[0].start == cut
    run_backfill(spark, pipeline, plans)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    high = fetch_watermarks(pipeline.kafka, [topic])[(topic, 0)].high
    assert committed(pipeline) == {(topic, 0): high}
    assert plan_pipeline(pipeline, f"gap-{n}-c").ranges == ()  # scheduled loads go on


COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "1000",  # roll segments fast: the active one is never cleaned
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}


@pytest.fixture(scope="module")
def compacted(stack, spark, tmp_path_factory):
    """A table whose Debezium topic has cleanup.policy=compact: loaded by three pipelines
    (one for each place resolving changes), then changed (updates, deletes, inserts) until
    the log cleaner has removed most records. Returns those pipelines by place, the table
    and the topic's watermarks."""
    from confluent_kafka.admin import AdminClient, NewTopic

    n = uuid.uuid4().hex[:6]
    name = f"compact_{n}"
    folder = tmp_path_factory.mktemp("comp")
    places = ("driver", "ranges")
    befores = {p: make_pipeline(folder, f"it_comp_{p}_{n}", [f"inventory.{name}"]) for p in places}
    before = befores["driver"]
    topic = before.topic_for(before.tables[0])
    admin = AdminClient(before.kafka.client_config())
    admin.create_topics([NewTopic(topic, 1, 1, config=COMPACTED)])[topic].result(30)
    table = new_table(stack.source_dsn, name, 40)
    for pipeline in befores.values():
        load_all(stack, spark, pipeline, f"{pipeline.name}-a")
        assert_lake_equals_source(pipeline, stack.source_dsn)
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        # the inserts first: kept by the cleaner, they head the next batch with a row (a
        # head of tombstones only would send the batch past the range-by-range resolution)
        conn.execute(f"insert into {table} select i, 'new' from generate_series(41, 50) i")
        for r in range(5):
            conn.execute(f"update {table} set v = %s where id between 6 and 40", (f"r{r}",))
        conn.execute(f"delete from {table} where id <= 10")
    stack.wait_for_capture()
    # the cleaner takes rolled segments only: a change after segment.ms rolls the active one
    deadline = time.monotonic() + 180
    while True:
        time.sleep(1.5)
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
            conn.execute(f"update {table} set v = 'tick' where id = 40")
        stack.wait_for_capture()
        marks = fetch_watermarks(before.kafka, [topic])[(topic, 0)]
        present = present_offsets(before.kafka, topic)
        if len(present) < (marks.high - marks.low) * 0.5:  # most of the updates are gone
            break
        assert time.monotonic() < deadline, f"{topic} not compacted: {len(present)} records"
    assert marks.low == 0 and present[-1] == marks.high - 1
    return befores, table, marks


def test_a_compacted_topic_loads_the_latest_row_of_each_key(stack, spark, tmp_path, compacted):
    """A table loaded from scratch out of a compacted topic equals the source: latest row
    per key, deleted keys absent (of those only the tombstone is left)."""
    befores, table, marks = compacted
    before = befores["driver"]
    pipeline = make_pipeline(tmp_path, f"{before.name}_new", [table])
    load_all(stack, spark, pipeline, f"{pipeline.name}-a")
    assert committed(pipeline) == {(before.topic_for(before.tables[0]), 0): marks.high}
    assert_lake_equals_source(pipeline, stack.source_dsn)


def test_a_table_loaded_before_compaction_drops_the_rows_deleted_since(
    stack, spark, compacted, resolve_in
):
    """A table loaded before the cleaner ran goes on from its offsets: rows deleted since
    go, though their `d` records were compacted away and only tombstones are left (the
    reader makes a tombstone right after a gap stand in for its delete)."""
    befores, _, marks = compacted
    before = befores[resolve_in]
    results = load_all(stack, spark, before, f"{before.name}-b", resolve_in)
    used = {r.resolved_by for r in results if r.resolved_by}
    assert used == {resolve_in}, used
    assert committed(before) == {(before.topic_for(before.tables[0]), 0): marks.high}
    assert_lake_equals_source(before, stack.source_dsn)


def test_batched_records_load_with_dense_offsets_and_right_end_offsets(stack, spark, tmp_path):
    """A producer with Kafka's default batching (librdkafka's linger.ms, Debezium's Connect
    producer alike) writes several records per batch: the end offset Kafka reports is one
    past the last record, offsets are dense, and a load ends with exactly those offsets
    committed and the lake equal to what was written."""
    from confluent_kafka import Producer

    from tests.debezium_records import key_record, value_record

    n = uuid.uuid4().hex[:6]
    pipeline = make_pipeline(tmp_path, f"it_batch_{n}", [f"public.batched_{n}"])
    topic = pipeline.topic_for(pipeline.tables[0])
    producer = Producer(pipeline.kafka.client_config())  # linger.ms, batch.size: defaults
    expected: dict[int, str] = {}
    lsn, sent = 1000, 0

    def item(i: int, name: str) -> dict:
        return {"id": i, "name": name, "price": None, "day": None, "at": None, "at_tz": None,
                "blob": None}  # fmt: skip

    for r in range(4):
        for i in range(r * 100, 600):
            lsn += 1
            op = "c" if r == 0 else "u"
            before = None if op == "c" else item(i, expected[i])
            expected[i] = f"r{r}-{i}"
            value = value_record(op, before, item(i, expected[i]), lsn=lsn)
            producer.produce(topic, key=key_record(i), value=value)
            sent += 1
        for i in range(r * 100, r * 100 + 30):  # then a delete and its tombstone
            lsn += 1
            value = value_record("d", item(i, expected.pop(i)), None, lsn=lsn)
            producer.produce(topic, key=key_record(i), value=value)
            producer.produce(topic, key=key_record(i), value=None)
            sent += 2
        assert producer.flush(30) == 0
    batches = produce_batches(stack, topic)
    assert sum(count for _, _, count in batches) == sent
    assert max(count for _, _, count in batches) > 10 and len(batches) < sent / 5, batches[:5]

    marks = fetch_watermarks(pipeline.kafka, [topic])
    assert {tp: (m.low, m.high) for tp, m in marks.items()} == {(topic, 0): (0, sent)}
    assert present_offsets(pipeline.kafka, topic) == list(range(sent))
    plan = plan_pipeline(pipeline, f"batch-{n}-0")
    assert [(r.start, r.end) for r in plan.ranges] == [(0, sent)]
    load_all(stack, spark, pipeline, f"batch-{n}")
    assert committed(pipeline) == {(topic, 0): sent}
    lake = spark.table(pipeline.qualified_target(pipeline.tables[0])).select("id", "name")
    assert {r["id"]: r["name"] for r in lake.collect()} == expected


def test_debezium_batches_records_and_the_load_ends_at_the_end_offset(stack, spark, tmp_path):
    """Debezium's producer (Kafka Connect's, default batching) sends a big transaction in
    multi-record batches; the plan reads up to Kafka's end offset and commits it."""
    n = uuid.uuid4().hex[:6]
    table = new_table(stack.source_dsn, f"dbzbatch_{n}", 3000)
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {table} set v = 'u' where id % 3 = 0")
        conn.execute(f"delete from {table} where id % 7 = 0")
    pipeline = make_pipeline(tmp_path, f"it_dbzb_{n}", [table])
    topic = pipeline.topic_for(pipeline.tables[0])
    stack.wait_for_capture()
    high = fetch_watermarks(pipeline.kafka, [topic])[(topic, 0)].high
    batches = produce_batches(stack, topic)
    assert sum(count for _, _, count in batches) == high
    assert max(count for _, _, count in batches) > 1, batches[:5]
    assert present_offsets(pipeline.kafka, topic) == list(range(high))
    load_all(stack, spark, pipeline, f"dbzb-{n}")
    assert committed(pipeline) == {(topic, 0): high}
    assert_lake_equals_source(pipeline, stack.source_dsn)
