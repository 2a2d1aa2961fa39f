"""The cdclake__demo DAG run by Airflow (dag.test) on the local stack, twice."""

from __future__ import annotations

import pytest
from cdclake.catalog import load_catalog, table_state
from cdclake.compare import compare_pipeline
from cdclake.jvm import QUICK_JIT_RECORDS
from cdclake.kafka import fetch_watermarks
from cdclake.local.workload import apply_workload
from cdclake.offsets import BatchPlan
from cdclake_airflow.tasks import DRIVER_OPTIONS_XCOM

from tests.e2e.helpers import run_dag, xcom_of

pytestmark = pytest.mark.e2e


def plan_of(run) -> BatchPlan:
    value = xcom_of(run, "plan")
    return BatchPlan.from_dict(value) if isinstance(value, dict) else BatchPlan.from_json(value)


def committed(pipeline):
    cat = load_catalog(pipeline.catalog)
    out = {}
    for t in pipeline.tables:
        out.update(table_state(cat, pipeline, t).offsets)
    return out


def assert_lake_equals_source(pipeline, dsn):
    results = compare_pipeline(pipeline, dsn)
    diffs = [(r.source, r.missing[:3], r.extra[:3]) for r in results if not r.equal]
    assert not diffs
    assert sum(len(r.source_rows) for r in results) > 20


def test_dag_runs_load_the_lake_and_the_second_reads_only_new_offsets(stack, pipeline):
    apply_workload(stack.source_dsn)  # inserts, updates, deletes, a primary-key change
    stack.wait_for_capture()
    run_dag("cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    after_first = committed(pipeline)
    marks = fetch_watermarks(pipeline.kafka, [pipeline.topic_for(t) for t in pipeline.tables])
    assert after_first == {tp: m.high for tp, m in marks.items()}

    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    second = run_dag("cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    plan = plan_of(second)
    assert plan.ranges
    # the plan chose the load's driver JVM options for its size (a small batch here)
    options = xcom_of(second, "plan", key=DRIVER_OPTIONS_XCOM)
    assert plan.total <= QUICK_JIT_RECORDS and "-XX:TieredStopAtLevel=1" in options
    for r in plan.ranges:  # started exactly where the first run committed
        assert r.start == after_first[(r.topic, r.partition)]
    after_second = committed(pipeline)
    assert after_second == {(r.topic, r.partition): r.end for r in plan.ranges} | {
        tp: o
        for tp, o in after_first.items()
        if tp not in {(r.topic, r.partition) for r in plan.ranges}
    }
