"""The cdclake__demo DAG run by Airflow (dag.test) on the local stack: twice with changes,
then once with none; the asset events each run left in Airflow's metadata DB."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from cdclake.iceberg.catalog import load_catalog
from cdclake.jvm import QUICK_JIT_RECORDS
from cdclake.offsets import BatchPlan
from cdclake_airflow.tasks import DRIVER_OPTIONS_XCOM
from cdclake_control.catalog import table_state
from cdclake_control.compare import compare_pipeline
from cdclake_control.watermarks import fetch_watermarks
from cdclake_local.workload import apply_workload

from tests.e2e.helpers import asset_events, run_dag, xcom_of

pytestmark = pytest.mark.e2e


def plan_of(run) -> BatchPlan:
    value = xcom_of(run, "plan")
    return BatchPlan.from_dict(value if isinstance(value, dict) else json.loads(value))


def loaded_by(pipeline, plan: BatchPlan) -> dict[str, int]:
    """The tables a plan loads records into, with their numbers of records."""
    sizes: dict[str, int] = {}
    for r in plan.ranges:
        sizes[r.topic] = sizes.get(r.topic, 0) + r.size
    return {
        pipeline.qualified_target(t): sizes[pipeline.topic_for(t)]
        for t in pipeline.tables
        if sizes.get(pipeline.topic_for(t))
    }


def assert_events_for_the_changed_tables(pipeline, run) -> dict[str, dict]:
    events = asset_events(run)
    expected = loaded_by(pipeline, plan_of(run))
    assert {name: extra["records"] for name, extra in events.items()} == expected
    for extra in events.values():
        assert extra["loaded_this_batch"] and extra["offsets_behind"] == 0
        at = dt.datetime.fromisoformat(extra["committed_at"])  # a time a reader can read
        assert at.timestamp() * 1000 == pytest.approx(extra["committed_at_ms"], abs=1)
    return events


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
    first = run_dag("cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    assert assert_events_for_the_changed_tables(pipeline, first)
    after_first = committed(pipeline)
    marks = fetch_watermarks(pipeline.kafka, [pipeline.topic_for(t) for t in pipeline.tables])
    assert after_first == {tp: m.high for tp, m in marks.items()}

    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    second = run_dag("cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    events = assert_events_for_the_changed_tables(pipeline, second)
    # the workload changes four tables; the type zoo, unchanged, gets no event
    assert len(events) == 4 and "lake.demo.type_zoo" not in events
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

    # nothing new: the run succeeds, loads nothing and emits no asset event
    third = run_dag("cdclake__demo")
    assert not plan_of(third).ranges
    assert asset_events(third) == {}
    assert committed(pipeline) == after_second
