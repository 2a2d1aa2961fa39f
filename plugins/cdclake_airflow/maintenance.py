"""A `cdclake_maintenance__<pipeline>` DAG per pipeline, on the pipeline's own
`maintenance.schedule`: Iceberg maintenance of its tables (jobs/maintain.py through
spark-submit), then a report of what it did.

A load committing to a table while maintenance rewrites it is safe: Iceberg's optimistic
concurrency refuses one of the two commits. A refused load fails with a commit conflict
and its Airflow retry loads the same plan again; a refused maintenance step fails this
DAG's task, which retries too. `max_active_runs=1` keeps two maintenance runs of a
pipeline apart.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task
from cdclake.config import PipelineConfig
from cdclake.pipeline_file import load_pipeline

from cdclake_airflow.factory import NO_DATE_BACKFILL, PROJECT_ROOT, spark_submit
from cdclake_airflow.isolation import build_isolated

log = logging.getLogger(__name__)

MAINTAIN_APPLICATION = PROJECT_ROOT / "jobs" / "maintain.py"


def report(pipeline_path: str, **context: Any) -> list[dict[str, Any]]:
    """Log the figures the job stored with each table, and check they are this run's."""
    from cdclake.kafka.topics import discover
    from cdclake_control.catalog import last_runs

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


def build_maintenance_dag(pipeline: PipelineConfig) -> DAG:
    """The pipeline's maintenance DAG, on its `maintenance.schedule`."""
    dag = DAG(
        dag_id=f"cdclake_maintenance__{pipeline.name}",
        description=f"Iceberg maintenance of pipeline {pipeline.name}'s tables",
        schedule=pipeline.maintenance.schedule,
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,
        # Airflow annotates its SDK's copy of the enum; its converter takes any run type's value
        allowed_run_types=NO_DATE_BACKFILL,  # type: ignore[arg-type]
        auto_register=False,  # collected from the DAG file's globals if it validates
        tags=["cdclake", "maintenance", pipeline.name],
        default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=2)},
        doc_md=(
            f"Pipeline `{pipeline.name}` from `{pipeline.path}`.\n\n"
            "**maintain** compacts data files and position delete files, expires "
            "snapshots and removes orphan files (settings: `maintenance:` in the pipeline "
            "YAML); **report** logs what it did. The snapshot holding the committed "
            "offsets is never expired."
        ),
    )
    path = str(pipeline.path)
    with dag:
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


def build_maintenance_dags(directory: Path | None = None) -> dict[str, DAG]:
    """A maintenance DAG per pipeline with `maintenance.enabled` whose DAG is valid."""
    return build_isolated(maintenance_dag, directory).dags


def maintenance_dag(pipeline: PipelineConfig) -> DAG | None:
    """The pipeline's maintenance DAG, None when `maintenance.enabled` is false."""
    return build_maintenance_dag(pipeline) if pipeline.maintenance.enabled else None
