"""Records flattened by Debezium's ExtractNewRecordState, from the real connector: a
second connector on the same source writes them (JSON with schemas,
add.fields=op,lsn,source.ts_ms, deletes rewritten), a pipeline with
`kafka.format: json-flat` loads them, and the lake equals the source."""

from __future__ import annotations

import uuid

import psycopg
import yaml

from tests.conftest import DEMO_PIPELINE
from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline


def flattening(prefix: str, table: str) -> dict[str, str]:
    """The connector settings that flatten the table's change records (and only those:
    the message topic the capture waits on keeps its envelope)."""
    return {
        "table.include.list": table,
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.add.fields": "op,lsn,source.ts_ms",
        "transforms.unwrap.delete.tombstone.handling.mode": "rewrite-with-tombstone",
        "transforms.unwrap.predicate": "changes",
        "predicates": "changes",
        "predicates.changes.type":
            "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
        "predicates.changes.pattern": rf"{prefix}\.inventory\..*",
    }  # fmt: skip


def test_flattened_records_from_the_connector_load_what_postgresql_holds(stack, spark, tmp_path):
    n = uuid.uuid4().hex[:6]
    prefix, table = f"flat{n}", f"inventory.flat_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text, big text)")
        conn.execute(f"alter table {table} alter column big set storage external")
        conn.execute(f"insert into {table} select i, 'v' || i, repeat('x', 10000) || i "
                     "from generate_series(1, 5) i")  # fmt: skip
    capture = stack.start_capture(prefix, flattening(prefix, table))
    try:
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
            conn.execute(f"update {table} set v = 'w' where id = 1")  # big: unchanged TOAST
            conn.execute(f"delete from {table} where id = 2")
            conn.execute(f"insert into {table} values (6, 'six', 'small')")
            conn.execute(f"update {table} set big = 'changed', v = null where id = 3")
        stack.wait_for_capture(prefix=prefix)
        kafka = {**yaml.safe_load(DEMO_PIPELINE.read_text())["kafka"], "format": "json-flat"}
        pipeline = make_pipeline(tmp_path, f"it_flat_{n}", [table], topic_prefix=prefix,
                                 kafka=kafka)  # fmt: skip
        results = load_all(stack, spark, pipeline, f"flat-{n}")
        assert sum(r.deletes for r in results) >= 1
        assert_lake_equals_source(pipeline, stack.source_dsn)
        lake = spark.table(pipeline.qualified_target(pipeline.tables[0]))
        assert not [c for c in lake.columns if c.startswith("__")]
        assert {r.id: r.big[:3] for r in lake.collect()} == {
            1: "xxx",
            3: "cha",
            4: "xxx",
            5: "xxx",
            6: "sma",
        }
    finally:
        stack.stop_capture(capture)
