"""A pipeline's maintenance DAG run by Airflow (dag.test) through spark-submit."""

from __future__ import annotations

import os

import pytest
from cdclake_control.catalog import last_runs
from cdclake_control.planner import plan_pipeline

from tests.e2e.test_demo_dag import run_dag
from tests.integration.helpers import assert_lake_equals_source, load_all
from tests.integration.test_maintenance import (
    build_fragmented_table,
    committed,
    plant_orphan,
    sql,
)

pytestmark = pytest.mark.e2e


def test_maintenance_dag_compacts_and_the_next_load_continues(stack, spark, tmp_path, monkeypatch):
    pipeline, source = build_fragmented_table(stack, spark, tmp_path, "e2e_maint", rounds=2)
    monkeypatch.setenv("CDCLAKE_PIPELINES_DIR", str(tmp_path))  # this pipeline only
    before = committed(pipeline)
    orphan = plant_orphan(spark, pipeline)

    run = run_dag(f"cdclake_maintenance__{pipeline.name}")

    [figures] = last_runs(pipeline)
    assert figures["run_id"] == run.run_id  # written by this run's spark-submit job
    assert figures["data_files_after"] < figures["data_files_before"]
    assert figures["delete_files_after"] < figures["delete_files_before"]
    assert figures["snapshots_expired"] > 0
    assert figures["orphan_files_removed"] >= 1 and not os.path.exists(orphan)
    assert committed(pipeline) == before
    assert_lake_equals_source(pipeline, stack.source_dsn)

    sql(stack.source_dsn, f"update {source} set label = 'after maintenance' where id = 1")
    stack.wait_for_capture()
    plan = plan_pipeline(pipeline, "e2e-maint-next")
    assert plan.total == 1
    assert all(r.start == before[(r.topic, r.partition)] for r in plan.ranges)
    load_all(stack, spark, pipeline, "e2e-maint-next")
    assert_lake_equals_source(pipeline, stack.source_dsn)
