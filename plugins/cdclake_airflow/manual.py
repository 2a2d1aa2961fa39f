"""The manually triggered DAGs: `cdclake_backfill` and `cdclake_snapshot`, each with a
Params form covering every pipeline in include/pipelines/ (a broken config is left out
of the forms; dags/cdclake_configs.py names it).

Like the pipeline DAGs they parse from the YAML files only. The form offers choices; the
first task validates the request against the chosen pipeline, Kafka and the source
database before anything is loaded or written, and fails with the reason.
"""

from __future__ import annotations

import datetime as dt

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, TriggerRule, task
from cdclake.config import PipelineConfig, read_pipelines

from cdclake_airflow.factory import load_task

START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _tables_param(pipelines: dict[str, PipelineConfig], what: str) -> Param:
    tables = sorted({t.source for p in pipelines.values() for t in p.tables})
    return Param(
        [],
        type="array",
        items={"type": "string"},
        examples=tables,
        title="Tables",
        description=f"{what} (schema.table). Must belong to the chosen pipeline.",
    )


def build_backfill_dag(pipelines: dict[str, PipelineConfig]) -> DAG:
    from cdclake_airflow import tasks

    names = sorted(pipelines) or ["-"]
    paths = {name: str(p.path) for name, p in pipelines.items()}
    params = {
        "pipeline": Param(names[0], type="string", enum=names, title="Pipeline"),
        "tables": _tables_param(pipelines, "Tables to backfill; empty means every table"),
        "mode": Param(
            "replay", type="string", enum=["replay", "rebuild"], title="Mode",
            description="replay: re-apply [start, end), never regressing newer rows. "
            "rebuild: drop the tables and reload them from the earliest offset in Kafka.",
        ),
        "start": Param(
            "earliest", type="string", enum=["earliest", "committed", "offsets", "timestamp"],
            title="Start", description="rebuild always starts at earliest",
        ),
        "start_offsets": Param(
            "", type="string", title="Start offsets",
            description='With start=offsets: {"<partition>": <offset>} for one table, or '
            '{"<schema.table>": {"<partition>": <offset>}}',
        ),
        "start_timestamp": Param(
            "", type="string", title="Start timestamp",
            description="With start=timestamp: ISO 8601 (UTC when no offset) or epoch ms; "
            "Kafka record time",
        ),
        "end": Param(
            "latest", type="string", enum=["latest", "offsets", "timestamp"], title="End"
        ),
        "end_offsets": Param("", type="string", title="End offsets (exclusive)"),
        "end_timestamp": Param("", type="string", title="End timestamp"),
        "accept_retention_gap": Param(
            False, type="boolean", title="Accept retention gap",
            description="Rebuild although retention deleted a topic's first records: only "
            "after an incremental snapshot of the table has completed.",
        ),
    }  # fmt: skip
    dag = DAG(
        dag_id="cdclake_backfill",
        description="Replay a range of offsets, or rebuild tables from Kafka",
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        params=params,
        tags=["cdclake"],
        doc_md=(
            "Manual backfill of one pipeline's tables, run by the same load job as the "
            "scheduled loads. **replay** re-applies a range of Kafka offsets and never "
            "regresses newer rows; **rebuild** drops the tables and reloads them from the "
            "earliest offset, refusing when retention has deleted the start of a topic."
        ),
    )
    with dag:
        plan = task(task_id="plan")(tasks.backfill_plan)(paths)
        choose = task.branch(task_id="choose_pipeline")(tasks.choose_load)(plan)
        report = task(task_id="report", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)(
            tasks.backfill_report
        )(plan)
        for name, pipeline in sorted(pipelines.items()):
            load = load_task(
                pipeline,
                task_id=f"load__{name}",
                plans="{{ ti.xcom_pull(task_ids='plan')['plans_json'] }}",
                name=f"cdclake-backfill-{name}",
                timeout=dt.timedelta(hours=12),
                retries=1,
            )
            choose >> load >> report
    return dag


def build_snapshot_dag(pipelines: dict[str, PipelineConfig]) -> DAG:
    from cdclake_airflow import tasks
    from cdclake_airflow.snapshot import SnapshotSensor

    names = sorted(pipelines) or ["-"]
    paths = {name: str(p.path) for name, p in pipelines.items()}
    params = {
        "pipeline": Param(names[0], type="string", enum=names, title="Pipeline"),
        "action": Param(
            "execute", type="string", enum=["execute", "stop", "pause", "resume"], title="Action"
        ),
        "type": Param("incremental", type="string", enum=["incremental", "blocking"], title="Type"),
        "tables": _tables_param(pipelines, "Tables to snapshot (execute) or stop"),
        "filters": Param(
            {}, type="object", title="Filters",
            description='Per table, a SQL condition: {"inventory.orders": "quantity > 1"}. Sent '
            "as Debezium's additional-conditions.",
        ),
        "surrogate_key": Param(
            "", type="string", title="Surrogate key",
            description="Optional column (of every table) to chunk by instead of the primary key",
        ),
        "channel": Param(
            "source", type="string", enum=["source", "kafka"], title="Channel",
            description="source: insert into the signal table; kafka: the signal topic",
        ),
        "timeout_minutes": Param(60, type="integer", minimum=1, title="Timeout (minutes)"),
        "trigger_load": Param(
            True, type="boolean", title="Load when done",
            description="Trigger the pipeline's load DAG once the snapshot completed",
        ),
    }  # fmt: skip
    dag = DAG(
        dag_id="cdclake_snapshot",
        description="Send a Debezium snapshot signal and follow it to the end",
        schedule=None,
        start_date=START,
        catchup=False,
        params=params,
        tags=["cdclake"],
        doc_md=(
            "Validates the request against the pipeline and the source database, sends "
            "the signal (bound parameters only, id derived from this run), then follows "
            "Debezium's notifications without holding a worker slot until the snapshot "
            "completes or aborts."
        ),
    )
    with dag:
        send = task(task_id="send_signal")(tasks.snapshot_send)(paths)
        follow = SnapshotSensor(task_id="wait_for_snapshot", signal_task="send_signal")
        should_load = task.short_circuit(task_id="should_load")(tasks.snapshot_should_load)(send)
        load = TriggerDagRunOperator(
            task_id="trigger_load",
            trigger_dag_id="cdclake__{{ params.pipeline }}",
            trigger_run_id="after-{{ run_id }}",
            wait_for_completion=False,
        )
        send >> follow >> should_load >> load
    return dag


def build_manual_dags() -> dict[str, DAG]:
    pipelines = read_pipelines().pipelines
    return {d.dag_id: d for d in (build_backfill_dag(pipelines), build_snapshot_dag(pipelines))}
