"""Build one `cdclake__<pipeline>` DAG per pipeline YAML: plan -> load -> report.

Parsing reads the YAML files only (no network, database or Spark), so DAG files load
fast. A broken config, or a DAG Airflow refuses, gets no DAG; the other pipelines' DAGs load
as always (cdclake_airflow.isolation), and dags/cdclake_configs.py fails to import with the
error naming its file and field, which Airflow shows among its import errors.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import (
    DAG,
    Asset,
    AssetAlias,
    AssetOrTimeSchedule,
    CronTriggerTimetable,
    TriggerRule,
    task,
)
from airflow.utils.types import DagRunType
from cdclake.config import PipelineConfig
from cdclake.config_fields import ORPHAN_MIN_HOURS
from cdclake.jvm import DRIVER_OPTIONS
from cdclake.spark import launch_conf

from cdclake_airflow.isolation import build_isolated

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOAD_APPLICATION = PROJECT_ROOT / "jobs" / "load.py"
# Every cdclake Spark task writes data files, which maintenance's orphan removal deletes
# once unreferenced and older than `orphan_older_than_hours` (at least ORPHAN_MIN_HOURS):
# a task ends before that, so no file it may still commit is ever that old.
WRITER_TIMEOUT_LIMIT = dt.timedelta(hours=ORPHAN_MIN_HOURS)
# the runs a scheduled DAG of a pipeline takes: not Airflow's date-range backfill, which
# means nothing to a run that loads offsets (the cdclake_backfill form replays those)
NO_DATE_BACKFILL = (
    DagRunType.SCHEDULED,
    DagRunType.MANUAL,
    DagRunType.OPERATOR_TRIGGERED,
    DagRunType.ASSET_TRIGGERED,
    DagRunType.ASSET_MATERIALIZATION,
)


def table_asset(pipeline: PipelineConfig, target: str) -> Asset:
    name = f"{pipeline.catalog.name}.{pipeline.namespace}.{target}"
    return Asset(name=name, uri=f"iceberg://{pipeline.catalog.name}/{pipeline.namespace}/{target}")


def tables_alias(pipeline_name: str) -> AssetAlias:
    """The outlet of the tasks that report a pipeline's runs (its load DAG, the backfill):
    through it they emit an asset event for each table a run changed and none for the
    others, which a task's plain Asset outlets cannot (Airflow emits an event for every
    one of those whenever the task succeeds)."""
    return AssetAlias(name=f"cdclake__{pipeline_name}__tables")


def _spark_binary() -> str | None:
    """spark-submit of this environment when there is one; else the connection decides."""
    local = Path(sys.executable).parent / "spark-submit"
    return str(local) if local.exists() else None


def spark_submit(
    pipeline: PipelineConfig,
    *,
    task_id: str,
    application: Path,
    application_args: list[str],
    name: str,
    timeout: dt.timedelta,
    driver_options: str | None = None,
    **kwargs: Any,
) -> SparkSubmitOperator:
    """The stock SparkSubmitOperator running a cdclake job for `pipeline`: its Spark
    connection and launch settings (`launch_conf`; the driver sets the others), this
    environment's Python on the driver and the executors. `driver_options` (a template)
    sets the driver's Java options at run time, unless the pipeline sets them itself;
    else they are chosen when the DAG file is parsed. `timeout` (the task's execution
    timeout) must stay below `WRITER_TIMEOUT_LIMIT`."""
    if not dt.timedelta(0) < timeout < WRITER_TIMEOUT_LIMIT:
        raise ValueError(
            f"{task_id}: execution timeout {timeout} is not below {WRITER_TIMEOUT_LIMIT}: "
            "maintenance removes unreferenced files older than orphan_older_than_hours "
            f"(at least {ORPHAN_MIN_HOURS} h), which a task still at work may commit"
        )
    conf = launch_conf(pipeline)
    if driver_options is not None and DRIVER_OPTIONS not in pipeline.spark.conf:
        conf[DRIVER_OPTIONS] = driver_options
    return SparkSubmitOperator(
        task_id=task_id,
        application=str(application),
        application_args=application_args,
        conn_id=pipeline.spark.conn_id,
        conf=conf,
        name=name,
        spark_binary=_spark_binary(),
        env_vars={"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        execution_timeout=timeout,
        **kwargs,
    )


def load_task(
    pipeline: PipelineConfig,
    *,
    task_id: str,
    plans: str,
    name: str,
    timeout: dt.timedelta,
    driver_options: str | None = None,
    **kwargs: Any,
) -> SparkSubmitOperator | PythonOperator:
    """The task that loads `plans` (a template of a plan's JSON, or of a list of them):
    on the pipeline's Spark Connect server (`spark.connect_conn_id`), else spark-submit
    of jobs/load.py."""
    if pipeline.spark.connect_conn_id:
        from cdclake_airflow import tasks

        return PythonOperator(
            task_id=task_id,
            python_callable=tasks.load_on_connect,
            op_kwargs={"pipeline_path": str(pipeline.path), "plans_json": plans},
            execution_timeout=timeout,
            **kwargs,
        )
    return spark_submit(
        pipeline,
        driver_options=driver_options,
        task_id=task_id,
        application=LOAD_APPLICATION,
        application_args=["--pipeline", str(pipeline.path), "--plan", plans],
        name=name,
        timeout=timeout,
        **kwargs,
    )


def load_schedule(pipeline: PipelineConfig) -> str | None | list[Asset] | AssetOrTimeSchedule:
    """The load DAG's schedule: `schedule` (cron, a preset or None), or with `watch:` the
    pipeline's records asset, or both (runs on either)."""
    if pipeline.watch is None:
        return pipeline.schedule
    from cdclake_airflow.watch import records_asset

    records = records_asset(pipeline)
    if pipeline.schedule is None:
        return [records]
    return AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(pipeline.schedule, timezone="UTC"), assets=records
    )


def build_pipeline_dag(pipeline: PipelineConfig) -> DAG:
    from cdclake_airflow import tasks

    dag = DAG(
        dag_id=f"cdclake__{pipeline.name}",
        description=f"Load Debezium changes of pipeline {pipeline.name} into Iceberg",
        schedule=load_schedule(pipeline),
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,
        # Airflow annotates its SDK's copy of the enum; its converter takes any run type's value
        allowed_run_types=NO_DATE_BACKFILL,  # type: ignore[arg-type]
        auto_register=False,  # collected from the DAG file's globals if it validates
        tags=["cdclake", pipeline.name],
        default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
        doc_md=(
            f"Pipeline `{pipeline.name}` from `{pipeline.path}`.\n\n"
            "**plan** reads the committed offsets from each Iceberg table and Kafka's end "
            "offsets; **load** runs the Spark job on exactly that range and commits the "
            "offsets with the data; **report** emits an asset event for each table the "
            "batch changed."
        ),
    )
    path = str(pipeline.path)
    with dag:
        plan = task(task_id="plan")(tasks.plan)(path)
        has_work = task.short_circuit(task_id="has_work", ignore_downstream_trigger_rules=False)(
            tasks.has_work
        )(
            plan  # type: ignore[arg-type]  # an XComArg: its value at run time
        )
        load = load_task(
            pipeline,
            driver_options=(
                f"{{{{ ti.xcom_pull(task_ids='plan', key='{tasks.DRIVER_OPTIONS_XCOM}') or '' }}}}"
            ),
            task_id="load",
            plans="{{ ti.xcom_pull(task_ids='plan') }}",
            name=f"cdclake-{pipeline.name}",
            timeout=dt.timedelta(hours=2),
        )
        report = task(
            task_id="report",
            outlets=[tables_alias(pipeline.name)],
            trigger_rule=TriggerRule.NONE_FAILED,
        )(tasks.report)(
            path,
            plan,  # type: ignore[arg-type]  # an XComArg: its value at run time
        )
        has_work >> load >> report
    return dag


def build_pipeline_dags(directory: Path | None = None) -> dict[str, DAG]:
    """The load DAG of each pipeline whose config and DAG are valid."""
    return build_isolated(build_pipeline_dag, directory).dags
