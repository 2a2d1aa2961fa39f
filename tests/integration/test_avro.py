"""Avro with a schema registry, from the real connector: a second connector on the source
writes with Apicurio's Avro converter (the Confluent wire format) to the local stack's
registry, whole envelopes or flattened (the metadata as fields with deletes rewritten, or
as headers with deletes as tombstones); a pipeline with `kafka.format: avro` (or
`avro-flat`) loads type_zoo, TOAST, a primary-key change, deletes and a new column (a new
registry id), and the lake equals the source."""

from __future__ import annotations

import uuid

import psycopg
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import DEMO_PIPELINE
from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline
from tests.integration.test_flattened import flattening
from tests.integration.test_types import zoo_equal

pytestmark = pytest.mark.integration


def start_avro_capture(stack, registry, prefix: str, table: str, flat: str | None) -> str:
    """A capture of `table` in Avro; `flat`: flattened, its metadata as "fields" or as
    "headers" (`tests.integration.test_flattened.VARIANTS`)."""
    overrides = {"table.include.list": table, **registry.converter_config("key"),
                 **registry.converter_config("value")}  # fmt: skip
    if flat:
        overrides.update(flattening(prefix, table, flat))
    return stack.start_capture(prefix, overrides)


def avro_pipeline(tmp_path, name: str, table: str, prefix: str, registry, fmt: str, **fields):
    kafka = {**yaml.safe_load(DEMO_PIPELINE.read_text())["kafka"], "format": fmt,
             "schema_registry": {"url": registry.url}}  # fmt: skip
    return make_pipeline(tmp_path, name, [table], topic_prefix=prefix, kafka=kafka, **fields)


def first_value(stack, topic: str) -> bytes:
    consumer = Consumer({**stack.broker.client_config(), "group.id": f"t-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        msg = consumer.poll(30)
        assert msg is not None and not msg.error(), f"no record in {topic}"
        return msg.value()
    finally:
        consumer.close()


@pytest.mark.parametrize(("fmt", "flat"), [("avro", None), ("avro-flat", "fields"),
                                           ("avro-flat", "headers")])  # fmt: skip
def test_avro_records_from_the_connector_load_what_postgresql_holds(
    stack, spark, tmp_path, registry, fmt, flat
):
    n = uuid.uuid4().hex[:6]
    prefix, table = f"avro{n}", f"inventory.avro_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(
            f"create table {table} (id int primary key, v text, big text, "
            "amount numeric(10,2), raw bytea, at timestamptz, ratio double precision)"
        )
        conn.execute(f"alter table {table} alter column big set storage external")
        conn.execute(f"insert into {table} select i, 'v' || i, repeat('x', 10000) || i, "
                     "i * 1.25, '\\x00ff'::bytea, '2026-11-27 10:00+01', i / 3.0 "
                     "from generate_series(1, 6) i")  # fmt: skip
    capture = start_avro_capture(stack, registry, prefix, table, flat)
    try:
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
            conn.execute(f"update {table} set v = 'w' where id = 1")  # big: unchanged TOAST
            conn.execute(f"delete from {table} where id = 2")
            conn.execute(f"update {table} set big = 'changed', v = null where id = 3")
            conn.execute(f"update {table} set id = 40 where id = 4")  # key change, TOAST kept
            conn.execute(f"update {table} set ratio = 'NaN', amount = -0.01 where id = 5")
            conn.execute(f"alter table {table} add column note text")  # a new schema id
            conn.execute(f"insert into {table} (id, v, note) values (7, 'seven', 'new')")
        stack.wait_for_capture(prefix=prefix)
        assert first_value(stack, f"{prefix}.{table}")[:1] == b"\0"  # the wire format
        pipeline = avro_pipeline(tmp_path, f"it_avro_{n}", table, prefix, registry, fmt)
        results = load_all(stack, spark, pipeline, f"avro-{n}")
        assert sum(r.deletes for r in results) >= 1
        assert_lake_equals_source(pipeline, stack.source_dsn)
        lake = {r.id: r.big[:3] for r in spark.table(pipeline.qualified_target(
            pipeline.tables[0])).collect() if r.big}  # fmt: skip
        assert lake == {1: "xxx", 3: "cha", 40: "xxx", 5: "xxx", 6: "xxx"}
    finally:
        stack.stop_capture(capture)


def test_type_zoo_through_avro_equals_the_source(stack, spark, tmp_path, registry):
    n = uuid.uuid4().hex[:6]
    prefix = f"avrozoo{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute("delete from inventory.type_zoo where id >= 100")  # an earlier run's
    capture = start_avro_capture(stack, registry, prefix, "inventory.type_zoo", None)
    try:
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
            conn.execute(
                "update inventory.type_zoo set c_num = -c_num, c_text = c_text || ' ✓', "
                "c_bytea = '\\xdeadbeef', c_interval = c_interval * 2 where id = 1"
            )
        stack.wait_for_capture(prefix=prefix)
        pipeline = avro_pipeline(tmp_path, f"it_avro_zoo_{n}", "inventory.type_zoo", prefix,
                                 registry, "avro")  # fmt: skip
        load_all(stack, spark, pipeline, f"avro-zoo-{n}")
        assert zoo_equal(pipeline, stack.source_dsn)
    finally:
        stack.stop_capture(capture)
