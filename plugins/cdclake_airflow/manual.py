"""The manually triggered DAGs: `cdclake_backfill`, `cdclake_snapshot` and
`cdclake_dead_letters`, each with a
Params form covering every pipeline in include/pipelines/ (a broken config is left out
of the forms; dags/cdclake_configs.py names it).

They parse from the YAML files, and the Tables picker also offers the tables a pattern
(`inventory.*`) finds among the Kafka topics, asked with a short bound at parse time (the
YAML names alone when Kafka does not answer in time). Every optional field is nullable
(`type: ["null", ...]`, the Airflow UI's mark of an optional field), so each form can be
triggered with its defaults. The UI checks only a field's kind before Trigger: a JSON
field is an object, so its editor refuses invalid JSON at the field. Airflow checks the
schema's other constraints when the run is triggered, and the first task validates the
request against the chosen pipeline, Kafka and the source database before anything is
sent, loaded or written, and fails naming the field.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, TriggerRule, task
from cdclake.config import PipelineConfig
from cdclake_control.pipelines import read_pipelines

from cdclake_airflow.factory import PROJECT_ROOT, load_task, spark_submit, tables_alias

log = logging.getLogger(__name__)
DEAD_LETTERS_APPLICATION = PROJECT_ROOT / "jobs" / "dead_letters.py"

START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
DISCOVERY_TIMEOUT_S = 5.0  # at DAG parse time, for all pipelines together

_NAME = r"[A-Za-z_][A-Za-z0-9_$]*"
TABLE_PATTERN = rf"^{_NAME}\.{_NAME}$"  # schema.table
TABLE_OR_TARGET_PATTERN = rf"^{_NAME}(\.{_NAME})?$"  # schema.table, or the lake table's name
COLUMN_PATTERN = rf"^{_NAME}$"
TIMESTAMP_PATTERN = (
    r"^\s*(\d{1,16}|\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?)?"
    r"(Z|[+-]\d{2}(:?\d{2})?)?)\s*$"
)


def picker_tables(
    pipelines: Mapping[str, PipelineConfig], timeout_s: float = DISCOVERY_TIMEOUT_S
) -> dict[str, list[str]]:
    """Per pipeline, every table it loads: those listed, and those its patterns match among
    the Kafka topics (as the load DAG's plan finds them). All pipelines are asked at once
    and waited for at most `timeout_s`; a pipeline whose Kafka did not answer offers its
    listed tables, with a log line."""
    from cdclake.kafka.topics import list_topics

    tables = {name: [t.source for t in p.tables] for name, p in pipelines.items()}
    patterned = {name: p for name, p in pipelines.items() if p.patterns}
    if not patterned:
        return tables
    pool = ThreadPoolExecutor(max_workers=min(8, len(patterned)), thread_name_prefix="picker")

    def listed(p: PipelineConfig) -> PipelineConfig:
        return p.with_topics(list_topics(p.kafka, timeout=timeout_s))

    futures = {pool.submit(listed, p): name for name, p in patterned.items()}
    done, _ = wait(futures, timeout=timeout_s + 1.0)
    pool.shutdown(wait=False, cancel_futures=True)
    for future, name in futures.items():
        error = future.exception() if future in done else TimeoutError(f"{timeout_s:g}s")
        if error is None:
            tables[name] = [t.source for t in future.result().tables]
            continue
        log.warning(
            "pipeline %s: the tables its patterns %s match are not offered in the forms "
            "(Kafka did not answer: %s); its listed tables are",
            name,
            [t.source for t in patterned[name].patterns],
            error,
        )
    return tables


def _tables_params(
    choices: Mapping[str, Sequence[str]], what: str, pattern: str = TABLE_PATTERN
) -> dict[str, Param]:
    """Tables: a picker of the tables known when the DAG file was parsed (Airflow's
    multi-select takes no other value), and a box for any other table of the pipeline (one
    created since), one per line; the first task takes both, and refuses a name that is
    not a table of the chosen pipeline."""
    tables = sorted({t for names in choices.values() for t in names})
    return {
        "tables": Param(
            None,
            type=["null", "array"],
            items={"type": "string", "pattern": pattern},
            uniqueItems=True,
            examples=tables,
            title="Tables",
            description=f"{what} (schema.table). Must belong to the chosen pipeline.",
        ),
        "other_tables": Param(
            None,
            type=["null", "array"],
            items={"type": "string"},
            title="Other tables",
            description="Tables the picker does not offer (created since it was made), "
            "one schema.table per line",
        ),
    }


def _choices(
    pipelines: Mapping[str, PipelineConfig], choices: Mapping[str, Sequence[str]] | None
) -> Mapping[str, Sequence[str]]:
    return choices if choices is not None else picker_tables(pipelines)


def build_backfill_dag(
    pipelines: Mapping[str, PipelineConfig], choices: Mapping[str, Sequence[str]] | None = None
) -> DAG:
    """`choices`: the tables the picker offers per pipeline (default `picker_tables`)."""
    from cdclake_airflow import tasks

    names = sorted(pipelines) or ["-"]
    paths = {name: str(p.path) for name, p in pipelines.items()}
    tables = _tables_params(
        _choices(pipelines, choices),
        "Tables to backfill; empty means every table",
        TABLE_OR_TARGET_PATTERN,
    )
    params = {
        "pipeline": Param(names[0], type="string", enum=names, title="Pipeline"),
        **tables,
        "mode": Param(
            "replay",
            type="string",
            enum=["replay", "rebuild"],
            title="Mode",
            description="replay: re-apply [start, end), never regressing newer rows. "
            "rebuild: drop the tables and reload them from the earliest offset in Kafka.",
        ),
        "start": Param(
            "earliest",
            type="string",
            enum=["earliest", "committed", "offsets", "timestamp"],
            title="Start",
            description="rebuild always starts at earliest",
        ),
        "start_offsets": Param(
            None,
            type=["null", "object"],
            title="Start offsets",
            description='With start=offsets: {"<partition>": <offset>} for one table, or '
            '{"<schema.table>": {"<partition>": <offset>}}',
        ),
        "start_timestamp": Param(
            None,
            type=["null", "string"],
            pattern=TIMESTAMP_PATTERN,
            title="Start timestamp",
            description="With start=timestamp: ISO 8601 (UTC when no offset) or epoch ms; "
            "Kafka record time",
        ),
        "end": Param("latest", type="string", enum=["latest", "offsets", "timestamp"], title="End"),
        "end_offsets": Param(
            None,
            type=["null", "object"],
            title="End offsets (exclusive)",
            description="With end=offsets, as start offsets",
        ),
        "end_timestamp": Param(
            None,
            type=["null", "string"],
            pattern=TIMESTAMP_PATTERN,
            title="End timestamp",
            description="With end=timestamp, as start timestamp",
        ),
        "accept_retention_gap": Param(
            False,
            type="boolean",
            title="Accept retention gap",
            description="Rebuild although retention deleted a topic's first records: only "
            "after an incremental snapshot of the table has completed.",
        ),
    }
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
        choose = task.branch(task_id="choose_pipeline")(tasks.choose_load)(
            plan  # type: ignore[arg-type]  # an XComArg: its value at run time
        )
        report = task(
            task_id="report",
            outlets=[tables_alias(name) for name in sorted(pipelines)],
            trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
        )(tasks.backfill_report)(
            plan  # type: ignore[arg-type]  # an XComArg: its value at run time
        )
        for name, pipeline in sorted(pipelines.items()):
            load = load_task(
                pipeline,
                task_id=f"load__{name}",
                plans="{{ ti.xcom_pull(task_ids='plan')['plans_json'] }}",
                name=f"cdclake-backfill-{name}",
                timeout=dt.timedelta(hours=12),
                retries=1,
                retry_delay=dt.timedelta(seconds=30),  # a scheduled load took the table first
            )
            choose >> load >> report
    return dag


def build_snapshot_dag(
    pipelines: Mapping[str, PipelineConfig], choices: Mapping[str, Sequence[str]] | None = None
) -> DAG:
    """`choices`: the tables the picker offers per pipeline (default `picker_tables`)."""
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
        **_tables_params(
            _choices(pipelines, choices),
            "Tables to snapshot (execute) or stop; none for pause and resume",
        ),
        "filters": Param(
            None,
            type=["null", "object"],
            title="Filters",
            description="execute only. Per table, a read-only SQL condition, as JSON: "
            '{"inventory.orders": "quantity > 1"}. Only columns, literals, operators and '
            "immutable functions; checked against the source database before sending.",
        ),
        "surrogate_key": Param(
            None,
            type=["null", "string"],
            pattern=COLUMN_PATTERN,
            title="Surrogate key",
            description="execute only. Optional column (of every table) to chunk by instead "
            "of the primary key",
        ),
        "channel": Param(
            "source",
            type="string",
            enum=["source", "kafka"],
            title="Channel",
            description="source: insert into the signal table; kafka: the signal topic",
        ),
        "timeout_minutes": Param(
            60, type="integer", minimum=1, maximum=7 * 24 * 60, title="Timeout (minutes)"
        ),
        "trigger_load": Param(
            True,
            type="boolean",
            title="Load when done",
            description="Trigger the pipeline's load DAG once the snapshot completed",
        ),
    }
    dag = DAG(
        dag_id="cdclake_snapshot",
        description="Send a Debezium snapshot signal and follow it to the end",
        schedule=None,
        start_date=START,
        catchup=False,
        params=params,
        tags=["cdclake"],
        doc_md=(
            "Validates the request against the pipeline and the source database (a "
            "filter may only read: columns, literals, operators and functions the source "
            "marks immutable), sends the signal (bound parameters only, id derived from "
            "this run), then follows Debezium's notifications without holding a worker "
            "slot until the snapshot completes or aborts."
        ),
    )
    with dag:
        send = task(task_id="send_signal")(tasks.snapshot_send)(paths)
        follow = SnapshotSensor(task_id="wait_for_snapshot", signal_task="send_signal")
        should_load = task.short_circuit(task_id="should_load")(tasks.snapshot_should_load)(
            send  # type: ignore[arg-type]  # an XComArg: its value at run time
        )
        load = TriggerDagRunOperator(
            task_id="trigger_load",
            trigger_dag_id="cdclake__{{ params.pipeline }}",
            trigger_run_id="after-{{ run_id }}",
            wait_for_completion=False,
        )
        send >> follow >> should_load >> load
    return dag


def build_dead_letters_dag(pipelines: Mapping[str, PipelineConfig]) -> DAG:
    from cdclake_airflow import tasks

    names = sorted(pipelines) or ["-"]
    params = {
        "pipeline": Param(names[0], type="string", enum=names, title="Pipeline"),
        "action": Param(
            "list",
            type="string",
            enum=["list", "replay"],
            title="Action",
            description="list: the pending dead letters, as JSON in the task's log. replay: "
            "apply them again through the load (never regressing newer rows; no offsets "
            "move); those still refused stay pending with their new reason.",
        ),
        "table": Param(
            None,
            type=["null", "string"],
            pattern=TABLE_OR_TARGET_PATTERN,
            title="Table",
            description="One table (schema.table, or the lake table's name); empty: every table",
        ),
        "since": Param(
            None,
            type=["null", "string"],
            pattern=TIMESTAMP_PATTERN,
            title="Recorded since",
            description="ISO 8601 (UTC when no offset) or epoch ms; empty: any time",
        ),
    }
    dag = DAG(
        dag_id="cdclake_dead_letters",
        description="List a pipeline's dead letters, or replay them once the cause is fixed",
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        params=params,
        tags=["cdclake"],
        doc_md=(
            "The records a pipeline set aside (`on_error: dead_letter`) with their reasons, "
            "and their replay through the same load as any batch once the pipeline, the lake "
            "table or the source is fixed. Each replayed record is marked in the dead-letter "
            "table (`replayed_at`, `replayed_in`)."
        ),
    )
    with dag:
        choose = task.branch(task_id="choose_pipeline")(tasks.choose_dead_letters)()
        for name, pipeline in sorted(pipelines.items()):
            run = spark_submit(
                pipeline,
                task_id=f"dead_letters__{name}",
                application=DEAD_LETTERS_APPLICATION,
                application_args=[
                    "--pipeline",
                    str(pipeline.path),
                    "--action",
                    "{{ params.action }}",
                    "--table",
                    "{{ params.table or '' }}",
                    "--since",
                    "{{ params.since or '' }}",
                ],
                name=f"cdclake-dead-letters-{name}",
                timeout=dt.timedelta(hours=2),
            )
            choose >> run
    return dag


def build_manual_dags() -> dict[str, DAG]:
    pipelines = read_pipelines().pipelines
    choices = picker_tables(pipelines)
    dags = (
        build_backfill_dag(pipelines, choices),
        build_snapshot_dag(pipelines, choices),
        build_dead_letters_dag(pipelines),
    )
    return {d.dag_id: d for d in dags}
