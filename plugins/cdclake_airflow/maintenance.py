"""The `cdclake_maintenance` DAG: per pipeline, Iceberg maintenance of its tables
(jobs/maintain.py through spark-submit), then a report of what it did.

A load committing to a table while maintenance rewrites it is safe: Iceberg's optimistic
concurrency refuses one of the two commits. A refused load fails with a commit conflict
and its Airflow retry loads the same plan again; a refused maintenance step fails this
DAG's task, which retries too. `max_active_runs=1` keeps two maintenance runs apart.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from airflow.sdk import DAG, TaskGroup, task
from cdclake.config import PipelineConfig, load_pipeline
from cdclake.exceptions import ConfigError

from cdclake_airflow.factory import PROJECT_ROOT, pipelines_dir, spark_submit

log = logging.getLogger(__name__)

DAG_ID = "cdclake_maintenance"
MAINTAIN_APPLICATION = PROJECT_ROOT / "jobs" / "maintain.py"


def maintenance_schedule(pipelines: list[PipelineConfig]) -> str | None:
    """The one schedule of the DAG: every enabled pipeline must ask for the same."""
    schedules = {p.maintenance.schedule: p for p in pipelines if p.maintenance.enabled}
    if len(schedules) > 1:
        (s1, p1), (s2, p2) = list(schedules.items())[:2]
        raise ConfigError(
            f"{p2.path}: maintenance.schedule: {s2!r} differs from {s1!r} in {p1.path}; "
            f"the {DAG_ID} DAG runs every pipeline on one schedule"
        )
    return next(iter(schedules), None)


def report(pipeline_path: str, **context) -> list[dict]:
    """Log the figures the job stored with each table, and check they are this run's."""
    from cdclake.kafka import discover
    from cdclake.maintenance import last_runs

    pipeline = discover(load_pipeline(pipeline_path))
    run_id = context["run_id"]
    out = []
    for table, figures in zip(pipeline.tables, last_runs(pipeline), strict=True):
        if figures is None:
            log.info("%s: not created yet, nothing maintained", table.target)
            continue
        if figures.get("run_id") != run_id:
            raise RuntimeError(
                f"{pipeline.qualified_target(table)}: the last maintenance figures belong to "
                f"run {figures.get('run_id')!r}, not to this run {run_id!r}"
            )
        log.info("%s", json.dumps(figures, sort_keys=True))
        out.append(figures)
    return out


def build_maintenance_dag(pipelines: list[PipelineConfig]) -> DAG:
    dag = DAG(
        dag_id=DAG_ID,
        description="Iceberg maintenance of every cdclake pipeline's tables",
        schedule=maintenance_schedule(pipelines),
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,
        tags=["cdclake", "maintenance"],
        default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=2)},
        doc_md=(
            "Per pipeline: compact data files, compact position delete files, expire "
            "snapshots, remove orphan files (settings: `maintenance:` in the pipeline "
            "YAML). The snapshot holding the committed offsets is never expired."
        ),
    )
    with dag:
        for pipeline in pipelines:
            if not pipeline.maintenance.enabled:
                continue
            path = str(pipeline.path)
            with TaskGroup(group_id=pipeline.name):
                maintain = spark_submit(
                    pipeline,
                    task_id="maintain",
                    application=MAINTAIN_APPLICATION,
                    application_args=["--pipeline", path, "--run-id", "{{ run_id }}"],
                    name=f"cdclake-maintain-{pipeline.name}",
                    timeout=dt.timedelta(hours=6),
                )
                maintain >> task(task_id="report")(report)(path)
    return dag


def build_maintenance_dags() -> dict[str, DAG]:
    pipelines = [load_pipeline(p) for p in sorted(pipelines_dir().glob("*.yaml"))]
    dag = build_maintenance_dag(pipelines)
    return {dag.dag_id: dag}
