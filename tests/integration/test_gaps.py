"""Retention gaps that heal themselves (`on_gap: resnapshot`), on the local stack: the
real connector's incremental snapshot, Kafka's DeleteRecords, writes going on."""

from __future__ import annotations

import json
import re
import time
import uuid

import psycopg
from cdclake.job import run_batch
from cdclake.offsets import SUMMARY_HEAL, SUMMARY_HEALED
from cdclake_control.freshness import pipeline_freshness
from cdclake_control.planner import plan_pipeline
from cdclake_control.watermarks import fetch_watermarks

from tests.integration.helpers import (
    assert_lake_equals_source,
    concurrent_writes,
    delete_records,
    load_all,
    make_pipeline,
)


def test_a_retention_gap_heals_by_a_snapshot_and_the_rows_deleted_in_it_go(stack, spark, tmp_path):
    """Retention deletes every change since the last load (updates, deletes, inserts):
    the plan sends an incremental snapshot of the table and loads on from the log start
    while the table is written; once the snapshot is done and loaded, the batch that reads
    past it removes the rows the source deleted during the gap, and the lake equals the
    source. Until then every commit carries the heal; the one that sweeps says so."""
    n = uuid.uuid4().hex[:6]
    table = f"inventory.heal_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v int, note text)")
        conn.execute(f"insert into {table} select i, i, 'start' from generate_series(1, 300) i")
    pipeline = make_pipeline(tmp_path, f"it_heal_{n}", [table], on_gap="resnapshot")
    topic = pipeline.topic_for(pipeline.tables[0])
    target = pipeline.qualified_target(pipeline.tables[0])
    load_all(stack, spark, pipeline, f"heal-{n}-a")
    done = fetch_watermarks(pipeline.kafka, [topic])[(topic, 0)].high
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {table} set note = 'changed' where id <= 20")
        conn.execute(f"delete from {table} where id between 21 and 60")
        conn.execute(f"insert into {table} select i, i, 'new' from generate_series(301, 320) i")
    stack.wait_for_capture()
    high = fetch_watermarks(pipeline.kafka, [topic])[(topic, 0)].high
    delete_records(pipeline, topic, high)

    reports, summaries = [], []
    with concurrent_writes(stack.source_dsn, table, 400, 500, seed=5):
        for i in range(90):
            plan = plan_pipeline(pipeline, f"heal-{n}-{i}", stack.source_dsn)
            if i == 0:
                assert plan.heal[table].lost == ((0, done, high),) and not plan.heal[table].sweep
                assert [r.start for r in plan.ranges] == [high]  # from the log start
            reports += [r.heal for r in run_batch(spark, pipeline, plan)]
            if i == 0:  # `cdclake status` and the freshness page say so
                (row,) = pipeline_freshness(pipeline, int(time.time() * 1000))
                assert row.gap.startswith("healing since"), row
            last = f"SELECT summary FROM {target}.snapshots ORDER BY committed_at DESC LIMIT 1"
            summaries.append(spark.sql(last).collect()[0].summary)
            if reports[-1].startswith("healed"):
                break
            time.sleep(2)
        else:
            raise AssertionError(f"not healed after {i + 1} batches: {reports[-3:]}")
    assert all(r.startswith("healing since") for r in reports[:-1]), reports
    assert re.search(r"snapshot \S+ done, 40 rows deleted in the gap removed", reports[-1])
    assert all(SUMMARY_HEAL in s for s in summaries[:-1]) and SUMMARY_HEAL not in summaries[-1]
    assert json.loads(summaries[-1][SUMMARY_HEALED])["lost"] == [[0, done, high]]
    (row,) = pipeline_freshness(pipeline, int(time.time() * 1000))
    assert row.gap.startswith("healed at"), row
    load_all(stack, spark, pipeline, f"heal-{n}-z")  # what the writes sent last
    assert_lake_equals_source(pipeline, stack.source_dsn)
