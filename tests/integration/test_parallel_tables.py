"""Tables of one batch loaded at the same time: a failing table does not stop the others,
the run fails naming it, and dead letters of several tables land once each."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake.exceptions import DecodeError
from cdclake.iceberg.catalog import load_catalog
from cdclake.job import run_batch
from cdclake_control.catalog import table_state
from cdclake_control.compare import compare_pipeline
from cdclake_control.planner import plan_pipeline
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

pytestmark = pytest.mark.integration


def first_value(client_config: dict, topic: str) -> tuple[bytes, bytes]:
    consumer = Consumer({**client_config, "group.id": "t"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        msg = consumer.poll(10)
        assert msg is not None and not msg.error()
        return msg.key(), msg.value()
    finally:
        consumer.close()


@pytest.fixture
def five_tables(stack):
    """Tables a..e of 3 rows each; c and d also hold a record with an unknown operation,
    e a record that is not a JSON envelope."""
    n = uuid.uuid4().hex[:6]
    names = [f"par_{x}_{n}" for x in "abcde"]
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"create table inventory.{name} (id int primary key, body text)")
            conn.execute(f"insert into inventory.{name} values (1, 'one'), (2, 'two')")
    stack.wait_for_capture()
    producer = Producer(stack.broker.client_config())
    for name in names[2:4]:
        topic = f"demo.inventory.{name}"
        key, value = first_value(stack.broker.client_config(), topic)
        assert b'"op":"c"' in value
        producer.produce(topic, key=key, value=value.replace(b'"op":"c"', b'"op":"x"'))
    producer.produce(f"demo.inventory.{names[4]}", key=b'{"id": 9}', value=b"\x00 not json")
    producer.flush(10)
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"insert into inventory.{name} values (3, 'three')")
    stack.wait_for_capture()
    return n, [f"inventory.{name}" for name in names]


def test_failed_tables_do_not_stop_the_others_and_are_named(stack, spark, tmp_path, five_tables):
    n, tables = five_tables
    pipeline = make_pipeline(tmp_path, f"it_par_fail_{n}", tables, parallel_tables=3)
    plan = plan_pipeline(pipeline, "par-fail")
    c, d, e = (pipeline.qualified_target(t) for t in pipeline.tables[2:])
    with pytest.raises(DecodeError) as failed:
        run_batch(spark, pipeline, plan)
    # the first failed table in the pipeline's order, naming the record; the others listed
    assert f"demo.{tables[2]} partition 0 offset 2: unknown operation x" in str(failed.value)
    assert f"also failed: {d}, {e}" in str(failed.value)

    cat = load_catalog(pipeline.catalog)
    states = [table_state(cat, pipeline, t) for t in pipeline.tables]
    assert [s.exists for s in states] == [True, True, False, False, False]
    equal = {r.source: r.equal for r in compare_pipeline(pipeline, stack.source_dsn)}
    assert equal[tables[0]] and equal[tables[1]]

    # the next run does not reload the committed tables and fails the same way
    again = plan_pipeline(pipeline, "par-fail-2")
    assert {r.topic for r in again.ranges} == {f"demo.{t}" for t in tables[2:]}
    with pytest.raises(DecodeError, match=f"also failed: {d}, {e}"):
        run_batch(spark, pipeline, again)
    assert not table_state(cat, pipeline, pipeline.tables[2]).exists, c


def test_dead_letters_of_several_tables_land_once_each(stack, spark, tmp_path, five_tables):
    n, tables = five_tables
    name = f"it_par_dead_{n}"
    pipeline = make_pipeline(tmp_path, name, tables, on_error="dead_letter", parallel_tables=5)
    plan = plan_pipeline(pipeline, "par-dead")
    results = run_batch(spark, pipeline, plan)
    assert [r.table for r in results] == [pipeline.qualified_target(t) for t in pipeline.tables]
    # e's record is not an envelope: set aside before the tables load, counted as e's
    assert [r.dead_letters for r in results] == [0, 0, 1, 1, 1]
    assert_lake_equals_source(pipeline, stack.source_dsn)

    def dead_letters():
        rows = spark.sql(
            f"select topic, `partition`, `offset`, error from lake.{name}._cdclake_dead_letters"
        ).collect()
        return sorted((r.topic, r.partition, r.offset, r.error.split(":")[0]) for r in rows)

    expected = sorted(
        [(f"demo.{t}", 0, 2, "unknown operation x") for t in tables[2:4]]
        + [(f"demo.{tables[4]}", 0, 2, "value")]
    )
    assert dead_letters() == expected
    # a retry of the batch (already committed) records nothing twice
    assert {r.status for r in run_batch(spark, pipeline, plan)} == {"already_committed"}
    assert dead_letters() == expected
    assert load_all(stack, spark, pipeline, "par-dead-next") == []
