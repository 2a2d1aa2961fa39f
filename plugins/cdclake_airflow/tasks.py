"""Callables of the pipeline DAG's Python tasks (kept out of the DAG file)."""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger(__name__)


def plan(pipeline_path: str, **context) -> str:
    """Next batch plan as JSON; the batch id names the DAG run so commits can be traced."""
    from cdclake.config import load_pipeline
    from cdclake.planner import plan_pipeline

    pipeline = load_pipeline(pipeline_path)
    run_id = context["run_id"]
    batch = plan_pipeline(pipeline, batch_id=f"{context['dag'].dag_id}/{run_id}")
    for r in batch.ranges:
        log.info("plan %s[%d]: offsets %d..%d (%d records)", r.topic, r.partition, r.start,
                 r.end - 1, r.size)  # fmt: skip
    return batch.to_json()


def has_work(plan_json: str) -> bool:
    from cdclake.offsets import BatchPlan

    return bool(BatchPlan.from_json(plan_json).ranges)


def report(pipeline_path: str, plan_json: str, **context) -> list[dict]:
    """Per-table figures, and one asset event per table with them in `extra`."""
    from cdclake.config import load_pipeline
    from cdclake.offsets import BatchPlan
    from cdclake.report import report_pipeline

    from cdclake_airflow.factory import table_asset

    pipeline = load_pipeline(pipeline_path)
    batch = BatchPlan.from_json(plan_json)
    reports = report_pipeline(pipeline, batch.batch_id, int(time.time() * 1000))
    outlet_events = context["outlet_events"]
    for table, rep in zip(pipeline.tables, reports, strict=True):
        extra = rep.to_dict()
        outlet_events[table_asset(pipeline, table.target)].extra = extra
        log.info("%s", json.dumps(extra, sort_keys=True))
    return [r.to_dict() for r in reports]
