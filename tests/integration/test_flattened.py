"""Records flattened by Debezium's ExtractNewRecordState, from the real connector: a
second connector on the same source writes them (JSON with schemas; the metadata as
fields, add.fields=op,lsn,source.ts_ms, with deletes rewritten; or as headers,
add.headers=op,lsn,source.ts_ms, with deletes as tombstones only), a pipeline with
`kafka.format: json-flat` loads them, the lake equals the source, and `cdclake plan`
warns of what the stream lacks."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
import yaml

from tests.conftest import DEMO_PIPELINE, ROOT
from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

# the transform's settings: the metadata as fields with deletes rewritten, or as headers
# with deletes as tombstones only
VARIANTS = {
    "fields": {"add.fields": "op,lsn,source.ts_ms",
               "delete.tombstone.handling.mode": "rewrite-with-tombstone"},
    "headers": {"add.headers": "op,lsn,source.ts_ms",
                "delete.tombstone.handling.mode": "tombstone"},
}  # fmt: skip


def flattening(prefix: str, table: str, variant: str = "fields") -> dict[str, str]:
    """The connector settings that flatten the table's change records (and only those:
    the message topic the capture waits on keeps its envelope)."""
    return {
        "table.include.list": table,
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        **{f"transforms.unwrap.{k}": v for k, v in VARIANTS[variant].items()},
        "transforms.unwrap.predicate": "changes",
        "predicates": "changes",
        "predicates.changes.type":
            "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
        "predicates.changes.pattern": rf"{prefix}\.inventory\..*",
    }  # fmt: skip


def plan_warnings(pipeline_file) -> list[str]:
    """The warnings `cdclake plan` prints for the pipeline."""
    done = subprocess.run(
        [sys.executable, "-m", "cdclake", "plan", "--pipeline", str(pipeline_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if "topic " in line]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_flattened_records_from_the_connector_load_what_postgresql_holds(
    stack, spark, tmp_path, variant
):
    n = uuid.uuid4().hex[:6]
    prefix, table = f"flat{n}", f"inventory.flat_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text, big text)")
        conn.execute(f"alter table {table} alter column big set storage external")
        conn.execute(f"insert into {table} select i, 'v' || i, repeat('x', 10000) || i "
                     "from generate_series(1, 5) i")  # fmt: skip
    capture = stack.start_capture(prefix, flattening(prefix, table, variant))
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
        warned = plan_warnings(tmp_path / f"it_flat_{n}.yaml")
        deleted = [w.split(" cdclake_control.planner: ")[1] for w in warned if "__deleted" in w]
        assert deleted == ([] if variant == "fields" else [
            f"topic {prefix}.{table}: records have no __deleted (delete.tombstone.handling.mode "
            "rewrite): a tombstone is the delete; with drop.tombstones or mode drop, deletes "
            "never reach the lake"])  # fmt: skip
        assert not [w for w in warned if "__lsn" in w or "__op" in w], warned
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
