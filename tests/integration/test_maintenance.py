"""Iceberg maintenance on real tables: compaction, delete compaction, expiry and orphan
removal shrink the table's files and history but never what it says it has consumed."""

from __future__ import annotations

import json
import os
import time
import uuid

import psycopg
import pytest
from cdclake.exceptions import DataLossError
from cdclake.iceberg.catalog import load_catalog
from cdclake.iceberg.maintenance import SUMMARY_MAINTENANCE, run_maintenance
from cdclake.iceberg.tables import load_iceberg_table
from cdclake.offsets import SUMMARY_OFFSETS
from cdclake_control import cli
from cdclake_control.catalog import last_runs, table_state
from cdclake_control.planner import plan_pipeline

from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

pytestmark = pytest.mark.integration

# expire everything the offsets do not need; compact from two files on
AGGRESSIVE = {
    "expire_older_than_hours": 0,
    "retain_last": 1,
    "min_input_files": 2,
    "delete_file_threshold": 1,
}


def sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def build_fragmented_table(stack, spark, tmp_path, prefix: str, rounds: int = 2):
    """A table loaded in several batches of inserts, updates and deletes (merge-on-read),
    so it has many snapshots, small data files and position delete files."""
    n = uuid.uuid4().hex[:6]
    source = f"inventory.{prefix}_{n}"
    sql(
        stack.source_dsn,
        f"create table {source} (id int primary key, label text, qty int)",
        f"insert into {source} select i, 'row ' || i, i from generate_series(1, 60) i",
    )
    pipeline = make_pipeline(tmp_path, f"{prefix}_{n}", [source], maintenance=AGGRESSIVE)
    load_all(stack, spark, pipeline, f"{prefix}-0")
    for r in range(1, rounds + 1):
        sql(
            stack.source_dsn,
            f"update {source} set qty = qty + {r} where id % 5 = {r % 5}",
            f"delete from {source} where id = {r * 7}",
            f"insert into {source} values ({1000 + r}, 'new {r}', {r})",
        )
        load_all(stack, spark, pipeline, f"{prefix}-{r}")
    return pipeline, source


def committed(pipeline) -> dict:
    cat = load_catalog(pipeline.catalog)
    out: dict = {}
    for t in pipeline.tables:
        out.update(table_state(cat, pipeline, t).offsets)
    return out


def plant_orphan(spark, pipeline) -> str:
    """An unreferenced file in the table's data folder, written ten days ago."""
    ice = load_iceberg_table(spark, pipeline.qualified_target(pipeline.tables[0]))
    folder = ice.location().removeprefix("file:") + "/data"
    path = os.path.join(folder, f"orphan-{uuid.uuid4().hex}.parquet")
    with open(path, "wb") as f:
        f.write(b"not referenced by any snapshot")
    old = time.time() - 10 * 24 * 3600
    os.utime(path, (old, old))
    return path


def test_maintenance_prunes_the_ledger_rows_no_load_needs(stack, spark, tmp_path):
    """A hard-delete table's deleted-keys ledger loses the rows of keys the table holds
    again with a newer LSN and the older rows of keys deleted twice; the row of a key that
    stays deleted stays, and still keeps a re-sent older insert out."""
    from cdclake.iceberg.deleted_keys import deleted_keys_table

    n = uuid.uuid4().hex[:6]
    source = f"inventory.ledger_{n}"
    sql(
        stack.source_dsn,
        f"create table {source} (id int primary key, label text)",
        f"insert into {source} select i, 'row ' || i from generate_series(1, 4) i",
    )
    pipeline = make_pipeline(tmp_path, f"it_ledger_{n}", [source], maintenance=AGGRESSIVE)
    for i, statements in enumerate(
        [
            [],
            [f"delete from {source} where id in (1, 2, 3)"],
            [f"insert into {source} values (1, 'back'), (3, 'back')"],
            [f"delete from {source} where id = 3"],
        ]
    ):
        sql(stack.source_dsn, *statements)
        load_all(stack, spark, pipeline, f"it-ledger-{i}")
    ledger = deleted_keys_table(pipeline.qualified_target(pipeline.tables[0]))

    def ledger_rows():
        return sorted((r["id"], r["_cdc_lsn"]) for r in spark.table(ledger).collect())

    before = ledger_rows()
    assert [k for k, _ in before] == [1, 2, 3, 3]
    summary = run_maintenance(pipeline, spark, run_id="it-ledger-1")
    [figures] = summary["tables"]
    assert figures["ledger_rows_pruned"] == 2
    assert ledger_rows() == [before[1], before[3]]  # key 2, and key 3's last delete
    assert_lake_equals_source(pipeline, stack.source_dsn)
    sql(stack.source_dsn, f"insert into {source} values (2, 'again')")
    load_all(stack, spark, pipeline, "it-ledger-4")
    assert_lake_equals_source(pipeline, stack.source_dsn)


def test_maintenance_shrinks_files_and_history_and_keeps_the_offsets(
    stack, spark, tmp_path, capsys
):
    pipeline, source = build_fragmented_table(stack, spark, tmp_path, "it_maint")
    before = committed(pipeline)
    assert before
    orphan = plant_orphan(spark, pipeline)

    summary = run_maintenance(pipeline, spark, run_id="it-maint-1")

    [figures] = summary["tables"]
    assert figures["status"] == "maintained"
    assert figures["data_files_after"] < figures["data_files_before"]
    assert figures["delete_files_before"] > 0
    assert figures["delete_files_after"] < figures["delete_files_before"]
    assert figures["data_files_rewritten"] > 0
    assert figures["snapshots_expired"] > 0
    assert figures["orphan_files_removed"] >= 1 and not os.path.exists(orphan)
    # the deleted-keys ledger the hard deletes wrote is kept short too
    [(ledger, expired)] = figures["side_tables"].items()
    assert ledger.endswith("._cdclake_deleted_keys__" + source.split(".")[1]) and expired > 0
    # the figures are stored with the table, for the report task
    assert last_runs(pipeline)[0]["run_id"] == "it-maint-1"

    # what the planner reads is unchanged, and the snapshot holding it survived expiry
    assert committed(pipeline) == before
    ice = load_iceberg_table(spark, pipeline.qualified_target(pipeline.tables[0]))
    ice.refresh()
    kept = ice.snapshot(figures["offsets_snapshot_id"])
    assert kept is not None and SUMMARY_OFFSETS in dict(kept.summary())
    current = dict(ice.currentSnapshot().summary())
    assert SUMMARY_MAINTENANCE in current and SUMMARY_OFFSETS not in current
    assert figures["snapshots_after"] == len(list(ice.snapshots()))
    assert_lake_equals_source(pipeline, stack.source_dsn)

    # the next load starts where the last one stopped, not at the earliest offset
    sql(stack.source_dsn, f"insert into {source} values (5000, 'after', 1)")
    stack.wait_for_capture()
    plan = plan_pipeline(pipeline, "it-maint-next")
    assert plan.ranges
    for r in plan.ranges:
        assert r.start == before[(r.topic, r.partition)]
    assert plan.total == 1
    load_all(stack, spark, pipeline, "it-maint-next")
    assert_lake_equals_source(pipeline, stack.source_dsn)

    # maintenance again, through the CLI (same process, so the same SparkSession): its
    # history is cut below the last load now, and still nothing is lost
    assert cli.main(["maintain", "--pipeline", str(pipeline.path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["tables"][0]["status"] == "maintained"
    assert printed["run_id"] == last_runs(pipeline)[0]["run_id"]
    after_next = {**before, **{(r.topic, r.partition): r.end for r in plan.ranges}}
    assert committed(pipeline) == after_next

    # expiry done outside cdclake that removes the snapshot holding the offsets cuts the
    # planner's walk: that is an error naming the table, never a replay from the earliest
    ice.refresh()
    ice.newAppend().commit()  # a snapshot without offsets on top, as any other writer makes
    holder = next(s.snapshotId() for s in ice.snapshots() if SUMMARY_OFFSETS in dict(s.summary()))
    ice.expireSnapshots().expireSnapshotId(holder).commit()
    with pytest.raises(DataLossError, match="expired before a snapshot carrying"):
        plan_pipeline(pipeline, "it-maint-cut")
    with pytest.raises(DataLossError, match=pipeline.tables[0].target):
        run_maintenance(pipeline, spark, run_id="it-maint-3")
