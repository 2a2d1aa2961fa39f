"""CDC semantics on the real connector: TOAST placeholders, truncates, key-less tables,
undecodable records."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake.exceptions import DecodeError
from cdclake.iceberg.catalog import load_catalog
from cdclake.iceberg.key_changes import key_changes_table
from cdclake.job import run_batch
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.placement import Placement
from cdclake.raw_rows import NEW_KEY_HEADER
from cdclake_control.catalog import table_state
from cdclake_control.planner import plan_pipeline
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.helpers import (
    assert_lake_equals_source,
    assert_resolved_in,
    concurrent_writes,
    load_all,
    make_pipeline,
)

pytestmark = pytest.mark.integration

BIG = "(select string_agg(md5(random()::text), '') from generate_series(1, 400))"


def sql(stack, *statements):
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def record_at(client_config: dict, topic: str, partition: int, offset: int) -> bytes | None:
    """The value of the record at `offset`."""
    consumer = Consumer({**client_config, "group.id": "t"})
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        msg = consumer.poll(10)
        assert msg is not None and not msg.error() and msg.offset() == offset, msg
        return msg.value()
    finally:
        consumer.close()


def topic_contains(client_config: dict, topic: str, needle: bytes) -> bool:
    consumer = Consumer({**client_config, "group.id": "t", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        while True:
            msg = consumer.poll(5)
            if msg is None or (msg.error() and msg.error().code() == -191):
                return False
            if msg.value() and needle in msg.value():
                return True
    finally:
        consumer.close()


def test_toast_truncate_and_keyless_tables(stack, spark, tmp_path, resolve_in):
    n = uuid.uuid4().hex[:6]  # fresh tables each run, also on a kept stack
    sql(
        stack,
        f"create table inventory.docs_{n} (id int primary key, title text, body text, meta jsonb, "
        "data bytea, tags text[])",
        f"alter table inventory.docs_{n} alter column body set storage external, "
        "alter column meta set storage external, alter column data set storage external, "
        "alter column tags set storage external",
        f"create table inventory.events_{n} "
        "(event_id int not null, kind text, amount numeric(12,3))",
        f"alter table inventory.events_{n} replica identity full",
    )
    insert_doc = (
        "insert into inventory.docs_{n} select {i}, 'title {i}', {big}, "
        "jsonb_build_object('k', {big}), convert_to({big}, 'UTF8'), array[{big}, 'x']"
    )
    sql(stack, *(insert_doc.format(n=n, i=i, big=BIG) for i in (1, 2, 3)))
    sql(
        stack,
        f"insert into inventory.events_{n} values (1, 'a', 1.5), (2, 'b', -2.25), (3, 'c', 0)",
    )
    pipeline = make_pipeline(
        tmp_path,
        f"it_sem_{n}",
        [f"inventory.docs_{n}", {"source": f"inventory.events_{n}", "key": ["event_id"]}],
    )
    # events has a configured key: in tasks, resolved in one task; range by range, as
    # docs (its topic has one partition)
    assert_resolved_in(load_all(stack, spark, pipeline, "sem-1", resolve_in), resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)

    # unchanged TOASTed columns: from the table (doc 1), from the same batch (doc 4)
    sql(
        stack,
        f"update inventory.docs_{n} set title = 'retitled' where id = 1",
        insert_doc.format(n=n, i=4, big=BIG),
        f"update inventory.docs_{n} set title = 'four, retitled' where id = 4",
        f"update inventory.docs_{n} set title = 'two a' where id = 2",
        f"update inventory.docs_{n} set title = 'two b' where id = 2",
        f"update inventory.events_{n} set amount = amount * 2 where event_id = 2",
        f"delete from inventory.events_{n} where event_id = 3",
    )
    assert_resolved_in(load_all(stack, spark, pipeline, "sem-2", resolve_in), resolve_in)
    assert topic_contains(
        stack.broker.client_config(), f"demo.inventory.docs_{n}", b"__debezium_unavailable"
    )
    assert_lake_equals_source(pipeline, stack.source_dsn)

    # a truncate in the middle of a batch: rows before it go, rows after it stay
    sql(
        stack,
        f"update inventory.docs_{n} set title = 'doomed' where id = 3",
        f"truncate inventory.docs_{n}",
        insert_doc.format(n=n, i=10, big=BIG),
        f"update inventory.docs_{n} set title = 'ten' where id = 10",
    )
    results = load_all(stack, spark, pipeline, "sem-3", resolve_in)
    assert any(r.truncated for r in results)
    # a truncate needs the whole topic: resolved in one task; a range starts its fold
    # again after it
    assert_resolved_in(results, resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)


def test_undecodable_record_fails_naming_it_or_goes_to_dead_letters(stack, spark, tmp_path):
    n = uuid.uuid4().hex[:6]
    sql(
        stack,
        f"create table inventory.notes_{n} (id int primary key, body text)",
        f"insert into inventory.notes_{n} values (1, 'one'), (2, 'two')",
    )
    stack.wait_for_capture()
    topic = f"demo.inventory.notes_{n}"
    producer = Producer(stack.broker.client_config())
    producer.produce(topic, key=b'{"id": 9}', value=b"\x00\x01 not json")
    producer.flush(10)
    sql(stack, f"insert into inventory.notes_{n} values (3, 'three')")
    stack.wait_for_capture()

    failing = make_pipeline(tmp_path, f"it_fail_{n}", [f"inventory.notes_{n}"])
    with pytest.raises(DecodeError, match=rf"{topic} partition 0 offset 2: .*envelope"):
        load_all(stack, spark, failing, "dl-fail")
    state = table_state(load_catalog(failing.catalog), failing, failing.tables[0])
    assert not state.exists  # nothing half-committed

    dead = make_pipeline(tmp_path, f"it_dead_{n}", [f"inventory.notes_{n}"], on_error="dead_letter")
    load_all(stack, spark, dead, "dl-dead")
    assert_lake_equals_source(dead, stack.source_dsn)
    rows = spark.sql(
        "select topic, `partition`, `offset`, error, batch_id "
        f"from lake.it_dead_{n}._cdclake_dead_letters"
    ).collect()
    assert [(r.topic, r.partition, r.offset) for r in rows] == [(topic, 0, 2)]
    assert "envelope" in rows[0].error
    # a retry of the same batch does not record it twice
    plan = plan_pipeline(dead, "dl-dead-again")
    assert plan.ranges == ()


def test_schema_changes_add_widen_drop_rename_and_incompatible_fail_or_dead_letter(
    stack, spark, tmp_path
):
    n = uuid.uuid4().hex[:6]
    t = f"inventory.evolve_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, qty int, score real, price numeric(6,2), "
        "label varchar(10), old text)",
        f"insert into {t} values (1, 1, 1.5, 10.25, 'a', 'x'), (2, 2, 2.5, 20.5, 'b', 'y')",
    )
    pipeline = make_pipeline(tmp_path, f"it_evo_{n}", [t])
    load_all(stack, spark, pipeline, "evo-1")
    assert_lake_equals_source(pipeline, stack.source_dsn)

    sql(
        stack,
        f"alter table {t} add column note text",  # ADD COLUMN
        f"alter table {t} alter column qty type bigint",  # int -> bigint
        f"alter table {t} alter column score type double precision",  # real -> double
        f"alter table {t} alter column price type numeric(12,2)",  # more digits
        f"alter table {t} alter column label type varchar(200)",  # longer varchar
        f"alter table {t} drop column old",  # DROP COLUMN
        f"alter table {t} rename column note to remark",  # rename = drop + add
        f"insert into {t} values (3, 5000000000, 3.25, 1234567890.12, repeat('z', 150), 'n3')",
        f"update {t} set qty = qty + 1 where id = 1",
    )
    load_all(stack, spark, pipeline, "evo-2")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    lake = {r["id"]: r for r in spark.table(f"lake.it_evo_{n}.evolve_{n}").collect()}
    assert lake[1]["old"] is None and lake[2]["old"] == "y"  # dropped: kept, NULL from then on
    assert lake[3]["remark"] == "n3" and lake[3]["qty"] == 5_000_000_000

    sql(
        stack, f"alter table {t} alter column label type integer using 7", f"update {t} set qty = 0"
    )
    stack.wait_for_capture()
    with pytest.raises(
        DecodeError,
        match=rf"evolve_{n} partition 0 offset \d+: column 'label' is "
        "string in the lake but int",
    ):
        load_all(stack, spark, pipeline, "evo-3")
    lake_table = f"lake.it_evo_{n}.evolve_{n}"
    before = {r["id"]: r["qty"] for r in spark.table(lake_table).collect()}
    assert before[1] != 0  # nothing of the refused batch was written

    # by configuration, the records of the new shape go to the dead letters instead
    dead = make_pipeline(tmp_path, f"it_evo_{n}", [t], on_error="dead_letter")
    load_all(stack, spark, dead, "evo-3-dead")
    letters = spark.sql(
        f"select offset, error from lake.it_evo_{n}._cdclake_dead_letters order by offset"
    ).collect()
    assert len(letters) == 3 and all("column 'label'" in r.error for r in letters)
    assert {r["id"]: r["qty"] for r in spark.table(lake_table).collect()} == before
    assert plan_pipeline(dead, "evo-3-again").ranges == ()  # the offsets moved past them

    # taking the new type: drop the lake column, then later changes re-add it as int
    spark.sql(f"alter table {lake_table} drop column label")
    sql(stack, f"update {t} set qty = qty + 1")
    load_all(stack, spark, dead, "evo-4")
    assert_lake_equals_source(dead, stack.source_dsn)
    assert dict(spark.table(lake_table).dtypes)["label"] == "int"


def test_per_table_options(stack, spark, tmp_path):
    n = uuid.uuid4().hex[:6]
    t = f"inventory.opts_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, name text, secret text)",
        f"insert into {t} select i, 'n' || i, 'pw' || i from generate_series(1, 20) i",
        f"delete from {t} where id in (3, 4)",
        f"update {t} set name = 'changed' where id = 5",
    )
    options = {
        "source": t,
        "target": f"renamed_{n}",
        "exclude": ["secret"],
        "delete_mode": "soft",
        "partition_by": ["bucket(4, id)"],
        "properties": {"write.target-file-size-bytes": "1048576"},
    }
    pipeline = make_pipeline(tmp_path, f"it_opt_{n}", [options])
    load_all(stack, spark, pipeline, "opt-1")
    assert_lake_equals_source(pipeline, stack.source_dsn)  # soft-deleted rows not counted
    lake = spark.table(f"lake.it_opt_{n}.renamed_{n}")
    assert "secret" not in lake.columns
    deleted = {r["id"] for r in lake.where("_cdc_deleted").collect()}
    assert deleted == {3, 4}
    ice = load_catalog(pipeline.catalog).load_table((f"it_opt_{n}", f"renamed_{n}"))
    assert [str(f.transform) for f in ice.spec().fields] == ["bucket[4]"]
    assert ice.properties["write.target-file-size-bytes"] == "1048576"

    sql(stack, f"insert into {t} values (3, 'back', 'pw')")  # a soft-deleted key returns
    load_all(stack, spark, pipeline, "opt-2")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    assert lake.where("id = 3 and not _cdc_deleted").count() == 1


def test_a_soft_deleted_row_keeps_its_toasted_values(stack, spark, tmp_path, resolve_in):
    """With soft deletes a key deleted in the batch is written with its last values: an
    unchanged TOASTed column in them takes its value from the batch, never the
    connector's placeholder."""
    n = uuid.uuid4().hex[:6]
    t = f"inventory.softdocs_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, title text, body text)",
        f"alter table {t} alter column body set storage external",
        f"insert into {t} select i, 'title ' || i, {BIG} from generate_series(1, 3) i",
        f"update {t} set title = 'retitled' where id in (1, 2)",
        f"delete from {t} where id = 1",
    )
    pipeline = make_pipeline(tmp_path, f"it_softdoc_{n}", [{"source": t, "delete_mode": "soft"}])
    assert_resolved_in(load_all(stack, spark, pipeline, "softdoc-1", resolve_in), resolve_in)
    assert topic_contains(stack.broker.client_config(), f"demo.{t}", b"__debezium_unavailable")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    rows = {r["id"]: r for r in spark.table(f"lake.it_softdoc_{n}.softdocs_{n}").collect()}
    assert rows[1]["_cdc_deleted"] and rows[1]["title"] == "retitled"
    assert len(rows[1]["body"]) == 400 * 32 and "__debezium" not in rows[1]["body"]
    assert not any("__debezium" in (r["body"] or "") for r in rows.values())


def test_a_soft_deleted_row_keeps_its_last_values_whether_or_not_the_lake_held_it(
    stack, spark, tmp_path, resolve_in
):
    """A soft-deleted row keeps the values it had last: those of the batch's last insert
    or update of the key before the delete when the batch has one (also for a key the
    lake already holds), else those the lake holds; an unchanged TOASTed column keeps the
    lake's value."""
    n = uuid.uuid4().hex[:6]
    t = f"inventory.softlast_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, title text, body text, qty int)",
        f"alter table {t} alter column body set storage external",
        f"insert into {t} select i, 'title ' || i, {BIG}, i from generate_series(1, 5) i",
    )
    pipeline = make_pipeline(tmp_path, f"it_softlast_{n}", [{"source": t, "delete_mode": "soft"}])
    load_all(stack, spark, pipeline, "softlast-1", resolve_in)
    lake_table = f"lake.it_softlast_{n}.softlast_{n}"
    assert spark.table(lake_table).count() == 5
    sql(
        stack,
        f"update {t} set title = 'retitled' where id = 1",  # body left alone: a placeholder
        f"update {t} set body = {BIG}, qty = 30 where id = 3",
        f"update {t} set qty = 40 where id = 4",
        f"insert into {t} values (6, 'new', 'short', 6)",
        f"update {t} set qty = 60 where id = 6",
    )
    with psycopg.connect(stack.source_dsn) as conn:
        last = {r[0]: r[1:] for r in conn.execute(f"select id, title, body, qty from {t}")}
    sql(stack, f"delete from {t} where id in (1, 2, 3, 6)")
    assert_resolved_in(load_all(stack, spark, pipeline, "softlast-2", resolve_in), resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)  # the live rows
    rows = {r["id"]: r for r in spark.table(lake_table).collect()}
    assert {k for k, r in rows.items() if r["_cdc_deleted"]} == {1, 2, 3, 6}
    got = {k: (r["title"], r["body"], r["qty"]) for k, r in rows.items()}
    assert got == last, {k: (v[0], len(v[1] or ""), v[2]) for k, v in got.items() if v != last[k]}
    # a deleted row's metadata columns describe its delete, not the tombstone after it
    for k in (1, 2, 3, 6):
        r = rows[k]
        value = record_at(stack.broker.client_config(), f"demo.{t}", r["_cdc_kafka_partition"],
                          r["_cdc_kafka_offset"])  # fmt: skip
        assert value is not None and b'"op":"d"' in value, (k, value)
        assert r["_cdc_op"] == "d" and r["_cdc_source_ts"] is not None, k


def test_a_soft_deleted_key_the_lake_never_held_takes_the_row_before_its_delete(
    stack, spark, tmp_path, resolve_in
):
    """A delete carries the row before it: whole with REPLICA IDENTITY FULL, its key alone
    by default. A soft-deleted key the lake never held, whose batch holds only its delete
    (its insert was never loaded), is written with those values: into a table that holds
    other rows (a MERGE) and into a new one (an append, or its range tasks' files)."""
    n = uuid.uuid4().hex[:6]
    full, plain = f"inventory.softfull_{n}", f"inventory.softplain_{n}"
    sql(
        stack,
        f"create table {full} (id int primary key, title text, body text, qty int)",
        f"alter table {full} replica identity full",
        f"alter table {full} alter column body set storage external",
        f"insert into {full} select i, 'title ' || i, {BIG}, i from generate_series(1, 3) i",
        f"update {full} set qty = 20 where id = 2",
        f"create table {plain} (id int primary key, title text, qty int)",
        f"insert into {plain} select i, 'title ' || i, i from generate_series(1, 2) i",
    )
    soft = [{"source": t, "delete_mode": "soft"} for t in (full, plain)]
    pipeline = make_pipeline(tmp_path, f"it_softfull_{n}", soft)
    stack.wait_for_capture()
    with psycopg.connect(stack.source_dsn) as conn:
        last = {r[0]: r[1:] for r in conn.execute(f"select id, title, body, qty from {full}")}

    def ends(batch: str) -> dict:
        stack.wait_for_capture()
        return {(r.topic, r.partition): r.end for r in plan_pipeline(pipeline, batch).ranges}

    never_loaded = ends("softfull-0")  # the inserts: the lake never holds them
    sql(stack, f"insert into {full} values (9, 'nine', 'short', 9)")
    held = ends("softfull-1")
    sql(stack, f"delete from {full} where id in (1, 2)", f"delete from {plain} where id = 1")
    deleted = ends("softfull-2")
    for batch, (lo, hi) in enumerate([(never_loaded, held), (held, deleted)]):
        ranges = tuple(OffsetRange(t, p, lo[t, p], end) for (t, p), end in hi.items()
                       if end > lo[t, p])  # fmt: skip
        plan = BatchPlan(pipeline.name, f"softfull-b{batch}", ranges)
        results = run_batch(spark, pipeline, plan, placement=Placement(resolve_in))
        assert {r.status for r in results} == {"committed"}
    assert_resolved_in(results, resolve_in)
    written = {r.table: r.written_by for r in results}
    lake_full, lake_plain = (pipeline.qualified_target(t) for t in pipeline.tables)
    # a new table resolved range by range: its range tasks wrote its data files
    assert written == {lake_full: "merge", lake_plain: "append"}
    rows = {r["id"]: r for r in spark.table(lake_full).collect()}
    assert {k: r["_cdc_deleted"] for k, r in rows.items()} == {1: True, 2: True, 9: False}
    got = {k: (r["title"], r["body"], r["qty"]) for k, r in rows.items() if k != 9}
    assert got == {k: last[k] for k in (1, 2)}, got
    [row] = spark.table(lake_plain).collect()
    assert (row["id"], row["title"], row["qty"], row["_cdc_deleted"]) == (1, None, None, True)


def test_incremental_snapshot_while_the_table_is_written(stack, spark, tmp_path):

    from cdclake_control.signals import (
        Action,
        SnapshotRequest,
        follow_snapshot,
        new_signal_id,
        send_to_signal_table,
        validate,
    )

    n = uuid.uuid4().hex[:6]
    t = f"inventory.snap_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, v int, note text)",
        f"insert into {t} select i, i, 'start' from generate_series(1, 400) i",
    )
    pipeline = make_pipeline(tmp_path, f"it_snap_{n}", [t])
    load_all(stack, spark, pipeline, "snap-0")

    with concurrent_writes(stack.source_dsn, t, 100, 450, seed=3):  # ids < 100: snapshot only
        request = SnapshotRequest(Action.EXECUTE, (t,), filters={t: "id <= 300"})
        validate(request, [tc.source for tc in pipeline.tables])
        signal_id = new_signal_id(f"test-{n}")
        send_to_signal_table(stack.source_dsn, "public.debezium_signal", signal_id, request)
        progress = follow_snapshot(pipeline.kafka, stack.s.notification_topic, signal_id, 300)
    assert progress.status == "COMPLETED"
    load_all(stack, spark, pipeline, "snap-1")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    lake = spark.table(pipeline.qualified_target(pipeline.tables[0]))
    assert lake.where("_cdc_op = 'r' and id < 100").count() == 99  # snapshot reads loaded
    assert lake.where("_cdc_op = 'r' and id > 300").count() == 0  # the filter was applied


def test_table_without_key_is_an_append_only_changelog(stack, spark, tmp_path, resolve_in):
    n = uuid.uuid4().hex[:6]
    t = f"inventory.log_{n}"
    sql(
        stack,
        f"create table {t} (a int, note text, body text)",
        f"alter table {t} alter column body set storage external",
        f"alter table {t} replica identity full",
        f"insert into {t} values (1, 'one', {BIG}), (2, 'two', 'short'), (3, 'three', 'x')",
        f"update {t} set note = 'two!' where a = 2",
        f"update {t} set note = 'one!' where a = 1",  # body unchanged and TOASTed
        f"delete from {t} where a = 3",
        f"truncate {t}",
        f"insert into {t} values (4, 'four', null)",
    )
    pipeline = make_pipeline(tmp_path, f"it_log_{n}", [t])
    # no key: a row per change, the truncate's too
    assert_resolved_in(load_all(stack, spark, pipeline, "log-1", resolve_in), resolve_in)
    lake = spark.table(pipeline.qualified_target(pipeline.tables[0]))
    rows = [
        (r["_cdc_op"], r["a"], r["note"], None if r["body"] is None else len(r["body"]))
        for r in lake.orderBy("_cdc_kafka_offset").collect()
    ]
    with psycopg.connect(stack.source_dsn) as conn:
        big = conn.execute(f"select length({BIG})").fetchone()[0]
    assert rows == [
        ("c", 1, "one", big), ("c", 2, "two", 5), ("c", 3, "three", 1),
        ("u", 2, "two!", 5), ("u", 1, "one!", big), ("d", 3, "three", 1),
        ("t", None, None, None), ("c", 4, "four", None),
    ]  # fmt: skip
    assert "__debezium_unavailable" not in str(lake.collect())

    sql(stack, f"insert into {t} values (5, 'five', 'y')")  # the next batch appends only it
    again = load_all(stack, spark, pipeline, "log-2", resolve_in)
    assert [r.records for r in again] == [1] and lake.count() == 9


def test_replica_identity_nothing_loads_inserts_and_truncates(stack, spark, tmp_path, resolve_in):
    """Under pgoutput with a publication that publishes updates and deletes (the connector's
    `all_tables`), PostgreSQL refuses UPDATE and DELETE of a REPLICA IDENTITY NOTHING table:
    only inserts and truncates reach the stream, and the lake still equals the source."""
    n = uuid.uuid4().hex[:6]
    t = f"inventory.nothing_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, body text)",
        f"alter table {t} replica identity nothing",
        f"insert into {t} select g, 'v' || g from generate_series(1, 5) g",
    )
    for change in (f"update {t} set body = 'x' where id = 1", f"delete from {t} where id = 2"):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replica identity"):
            sql(stack, change)
    pipeline = make_pipeline(tmp_path, f"it_nothing_{n}", [t])
    assert_resolved_in(load_all(stack, spark, pipeline, "nothing-1", resolve_in), resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    lake_table = f"lake.it_nothing_{n}.nothing_{n}"
    assert sorted(r.id for r in spark.table(lake_table).collect()) == [1, 2, 3, 4, 5]

    sql(stack, f"truncate {t}", f"insert into {t} values (10, 'after')")
    results = load_all(stack, spark, pipeline, "nothing-2", resolve_in)
    assert any(r.truncated for r in results)
    assert_resolved_in(results, resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    assert [(r.id, r.body) for r in spark.table(lake_table).collect()] == [(10, "after")]


def test_a_table_left_without_its_key_gets_it_back(stack, spark, tmp_path):
    """A run killed between CREATE TABLE and setting the identifier fields: the next load
    sets them."""
    from cdclake.iceberg.tables import load_iceberg_table

    n = uuid.uuid4().hex[:6]
    t = f"inventory.keyback_{n}"
    sql(stack, f"create table {t} (id int primary key, v text)", f"insert into {t} values (1, 'a')")
    pipeline = make_pipeline(tmp_path, f"it_keyback_{n}", [t])
    load_all(stack, spark, pipeline, "keyback-1")
    lake_table = f"lake.it_keyback_{n}.keyback_{n}"
    spark.sql(f"alter table {lake_table} drop identifier fields id")
    assert list(load_iceberg_table(spark, lake_table).schema().identifierFieldNames()) == []

    sql(stack, f"insert into {t} values (2, 'b')")
    load_all(stack, spark, pipeline, "keyback-2")
    assert list(load_iceberg_table(spark, lake_table).schema().identifierFieldNames()) == ["id"]
    assert_lake_equals_source(pipeline, stack.source_dsn)


def test_a_pattern_loads_every_matching_table_and_picks_up_new_ones(stack, spark, tmp_path):
    from cdclake_control.freshness import pipeline_freshness

    n = uuid.uuid4().hex[:6]
    for name in ("a", "b"):
        sql(
            stack,
            f"create table inventory.disc_{n}_{name} (id int primary key, v text)",
            f"insert into inventory.disc_{n}_{name} values (1, '{name}1'), (2, '{name}2')",
        )
    pipeline = make_pipeline(tmp_path, f"it_disc_{n}", [f"inventory.disc_{n}_*"])
    assert pipeline.tables == () and len(pipeline.patterns) == 1
    load_all(stack, spark, pipeline, "disc-1")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    lake = {r.tableName for r in spark.sql(f"show tables in lake.it_disc_{n}").collect()}
    assert lake == {f"disc_{n}_a", f"disc_{n}_b"}

    # a table created later is found and created in the lake on its first load
    sql(
        stack,
        f"create table inventory.disc_{n}_c (id int primary key, v text)",
        f"insert into inventory.disc_{n}_c values (7, 'c7')",
        f"delete from inventory.disc_{n}_a where id = 1",
    )
    load_all(stack, spark, pipeline, "disc-2")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    fresh = pipeline_freshness(pipeline, now_ms=0)
    assert sorted(f.table.rsplit(".", 1)[1] for f in fresh) == [
        f"disc_{n}_a", f"disc_{n}_b", f"disc_{n}_c"
    ]  # fmt: skip
    assert all(f.offsets_behind == 0 for f in fresh)


def key_change_cuts(client_config: dict, plan) -> list[int]:
    """The offsets just after each delete of a primary-key change (its
    `__debezium.newkey` header) in the plan's one range: before its tombstone."""
    (r,) = plan.ranges
    consumer = Consumer({**client_config, "group.id": "t"})
    consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
    cuts = []
    try:
        while True:
            msg = consumer.poll(10)
            assert msg is not None and not msg.error(), msg
            moved = any(name == NEW_KEY_HEADER for name, _ in msg.headers() or ())
            if moved and msg.value() is not None:  # its tombstone carries the header too
                cuts.append(msg.offset() + 1)
            if msg.offset() + 1 >= r.end:
                return cuts
    finally:
        consumer.close()


@pytest.mark.parametrize(
    # FULL sends no placeholder: the way a batch takes matters not; the random replay test
    # runs key changes in tasks too
    "identity, resolve_in",
    [("default", "driver"), ("default", "ranges"), ("full", "driver")],
)
def test_a_key_change_keeps_its_unchanged_toast_value(stack, spark, tmp_path, resolve_in,
                                                      identity):  # fmt: skip
    """`UPDATE … SET id = …` of a row whose TOASTed column is unchanged: Debezium sends the
    new key's create with a placeholder for it and the old key in its `__debezium.oldkey`
    header. The lake takes the old key's value as of the change: the old row in the lake
    or in the batch, through chains (back to the first key), with the old key inserted
    again after, loaded in one batch and in batches cut between each change's delete and
    its create; never the value of a row the new key had before."""
    n = uuid.uuid4().hex[:6]
    t = f"inventory.keyed_{n}"
    sql(
        stack,
        f"create table {t} (id int primary key, note text, body text)",
        f"alter table {t} alter column body set storage external",
        *([f"alter table {t} replica identity full"] if identity == "full" else []),
        f"insert into {t} select g, 'n' || g, {BIG} from generate_series(1, 6) g",
    )
    whole = make_pipeline(tmp_path, f"it_pk_{identity}_{n}", [t])
    split = make_pipeline(tmp_path, f"it_pksplit_{identity}_{n}", [t])
    for pipeline in (whole, split):
        load_all(stack, spark, pipeline, "pk-1", resolve_in)
    assert_lake_equals_source(whole, stack.source_dsn)
    sql(
        stack,
        f"update {t} set id = 11 where id = 1",  # the old row only in the lake
        f"insert into {t} values (20, 'twenty', {BIG})",
        f"update {t} set id = 21 where id = 20",  # the old row in the same batch
        f"insert into {t} values (20, 'again', {BIG})",  # the old key inserted again
        f"delete from {t} where id = 3",
        f"update {t} set id = 3 where id = 4",  # a key a row deleted in the batch had
        f"update {t} set note = 'five', id = 15 where id = 5",
        f"update {t} set id = 30 where id = 2",  # a chain back to its first key
        f"update {t} set id = 31 where id = 30",
        f"update {t} set id = 2 where id = 31",
        f"update {t} set body = {BIG} where id = 6",  # a new value, then the key changes
        f"update {t} set id = 16 where id = 6",
    )
    load_all(stack, spark, whole, "pk-2", resolve_in)
    # with REPLICA IDENTITY FULL Debezium sends the value itself
    topic = whole.topic_for(whole.tables[0])
    placeholders = topic_contains(stack.broker.client_config(), topic, b"__debezium_unavail")
    assert placeholders == (identity == "default")
    assert_lake_equals_source(whole, stack.source_dsn)
    plan = plan_pipeline(split, "pk-2")
    cuts = key_change_cuts(stack.broker.client_config(), plan)
    assert len(cuts) == 8, cuts
    (r,) = plan.ranges
    for i, (start, end) in enumerate(zip([r.start, *cuts[:-1]], cuts, strict=True)):
        part = BatchPlan(split.name, f"pk-2-{i}", (OffsetRange(r.topic, r.partition, start, end),))
        run_batch(spark, split, part, placement=Placement(resolve_in))
    load_all(stack, spark, split, "pk-2-rest", resolve_in)
    assert_lake_equals_source(split, stack.source_dsn)
    # every change the ledger kept between a delete and its create was taken, and removed
    ledger = key_changes_table(split.qualified_target(split.tables[0]))
    assert spark.table(ledger).count() == 0
    sql(stack, f"update {t} set note = 'again' where id in (3, 11, 21)")  # placeholders again
    for pipeline in (whole, split):
        load_all(stack, spark, pipeline, "pk-3", resolve_in)
        assert_lake_equals_source(pipeline, stack.source_dsn)
