"""Callables of the pipeline DAG's Python tasks (kept out of the DAG file)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from cdclake.config import PipelineConfig, TableConfig
    from cdclake_control.report import TableReport

log = logging.getLogger(__name__)

# the XCom of the plan task the load task's spark-submit takes its driver's Java options from
DRIVER_OPTIONS_XCOM = "driver_java_options"


def plan(pipeline_path: str, **context: Any) -> str:
    """Next batch plan as JSON; the batch id names the DAG run so commits can be traced."""
    from cdclake.config import OnGap
    from cdclake.jvm import driver_java_options, resolves_by_range
    from cdclake.pipeline_file import load_pipeline
    from cdclake_control.planner import plan_pipeline

    pipeline = load_pipeline(pipeline_path)
    run_id = context["run_id"]
    heals = pipeline.on_gap is OnGap.RESNAPSHOT  # the source is signalled to heal a gap
    dsn = source_dsn(pipeline) if heals else None
    batch = plan_pipeline(pipeline, f"{context['dag'].dag_id}/{run_id}", dsn)
    for r in batch.ranges:
        log.info(
            "plan %s[%d]: offsets %d..%d (%d records)",
            r.topic,
            r.partition,
            r.start,
            r.end - 1,
            r.size,
        )
    # the load's driver JVM: the archive when there is one, the JIT for the batch's size
    options = driver_java_options(batch.total, resolves_by_range(pipeline, batch.ranges))
    context["ti"].xcom_push(key=DRIVER_OPTIONS_XCOM, value=options)
    return batch.to_json()


def has_work(plan_json: str) -> bool:
    from cdclake.offsets import plans_from_json

    [batch] = plans_from_json(plan_json)
    return bool(batch.ranges)


def emit_changed(
    outlet_events: Any, pipeline: PipelineConfig, reports: Sequence[TableReport]
) -> list[str]:
    """One asset event (the table's figures in `extra`) for each table the run changed,
    through the pipeline's asset alias; tables it did not change get none. The tables a
    pattern found get theirs as well (the alias creates their assets)."""
    from cdclake_airflow.factory import table_asset, tables_alias

    events = outlet_events[tables_alias(pipeline.name)]
    changed = []
    for rep in reports:  # what happened first, in words
        log.info("%s", rep.summary())
    for table, rep in zip(pipeline.tables, reports, strict=True):
        if rep.changed:
            events.add(table_asset(pipeline, table.target), extra=rep.to_dict())
            changed.append(rep.table)
    log.info("asset events for %d changed table(s): %s", len(changed), ", ".join(changed) or "-")
    for rep in reports:
        log.info("%s", json.dumps(rep.to_dict(), sort_keys=True))
    return changed


def report(pipeline_path: str, plan_json: str, **context: Any) -> list[dict[str, Any]]:
    """Per-table figures, and an asset event for each table the batch changed."""
    from cdclake.kafka.topics import discover
    from cdclake.offsets import plans_from_json
    from cdclake.pipeline_file import load_pipeline
    from cdclake_control.report import report_pipeline

    pipeline = discover(load_pipeline(pipeline_path))  # the figures' tables and the events'
    [batch] = plans_from_json(plan_json)
    reports = report_pipeline(pipeline, [batch], int(time.time() * 1000))
    emit_changed(context["outlet_events"], pipeline, reports)
    return [r.to_dict() for r in reports]


# ---- cdclake_backfill -----------------------------------------------------------------


def _pipeline_path(paths: dict[str, str], name: str) -> str:
    from cdclake.exceptions import ConfigError

    if name not in paths:
        raise ConfigError(f"pipeline {name!r} is not one of {sorted(paths)}")
    return paths[name]


def form_tables(params: Mapping[str, Any]) -> list[str]:
    """The tables a form names: those picked, then those typed under Other tables (one
    per line; blank lines left out)."""
    typed = [t.strip() for t in params.get("other_tables") or [] if t and t.strip()]
    return list(dict.fromkeys([*(params.get("tables") or []), *typed]))


def backfill_plan(paths: dict[str, str], **context: Any) -> dict[str, Any]:
    """Validate the form against the pipeline and Kafka; the plans of the backfill."""
    from cdclake.pipeline_file import load_pipeline
    from cdclake_control.backfill import describe, parse_request, plan_pipeline_backfill

    params = context["params"]
    path = _pipeline_path(paths, params["pipeline"])
    pipeline = load_pipeline(path)
    request = parse_request(
        pipeline,
        tables=form_tables(params),
        mode=params["mode"],
        start=params["start"],
        end=params["end"],
        start_offsets=params.get("start_offsets"),
        end_offsets=params.get("end_offsets"),
        start_timestamp=params.get("start_timestamp"),
        end_timestamp=params.get("end_timestamp"),
        accept_retention_gap=params.get("accept_retention_gap", False),
    )
    plans = plan_pipeline_backfill(
        pipeline, request, f"{context['dag'].dag_id}/{context['run_id']}"
    )
    log.info("%s", describe(plans))
    return {
        "pipeline": pipeline.name,
        "pipeline_path": path,
        "tables": list(request.tables),
        "mode": request.mode.value,
        "batches": len(plans),
        "records": sum(p.total for p in plans),
        "plans_json": json.dumps([p.to_dict() for p in plans], separators=(",", ":")),
    }


def choose_load(plan: dict[str, Any]) -> list[str]:
    if not plan["batches"]:
        log.info("nothing to backfill")
        return []
    return [f"load__{plan['pipeline']}"]


def choose_dead_letters(**context: Any) -> list[str]:
    return [f"dead_letters__{context['params']['pipeline']}"]


def backfill_report(plan: dict[str, Any], **context: Any) -> list[dict[str, Any]]:
    """The backfilled tables' figures, and an asset event for each table it changed."""
    from cdclake.kafka.topics import discover
    from cdclake.offsets import plans_from_json
    from cdclake.pipeline_file import load_pipeline
    from cdclake_control.report import report_pipeline

    pipeline = discover(load_pipeline(plan["pipeline_path"]))
    plans = plans_from_json(plan["plans_json"]) if plan["batches"] else []
    reports = report_pipeline(pipeline, plans, int(time.time() * 1000))
    # the plan's tables were found in the pipeline when it was made (`backfill_plan`)
    asked = {cast("TableConfig", pipeline.table_named(t)).target for t in plan["tables"]}
    emit_changed(context["outlet_events"], pipeline, reports)
    return [r.to_dict() for t, r in zip(pipeline.tables, reports, strict=True) if t.target in asked]


# ---- cdclake_snapshot -----------------------------------------------------------------


def source_dsn(pipeline: PipelineConfig) -> str:
    """libpq connection string of the pipeline's source database: the Airflow connection
    `source.conn_id`, else `source.dsn`. Never logged."""
    from airflow.sdk import BaseHook
    from cdclake.exceptions import ConfigError
    from psycopg.conninfo import make_conninfo

    try:
        conn = BaseHook.get_connection(pipeline.source.conn_id)
    except Exception:
        if pipeline.source.dsn:
            return pipeline.source.dsn
        raise ConfigError(
            f"{pipeline.path}: source.conn_id: Airflow connection "
            f"{pipeline.source.conn_id!r} does not exist and source.dsn is not set"
        ) from None
    params = {
        "host": conn.host,
        "port": conn.port,
        "user": conn.login,
        "password": conn.password,
        "dbname": conn.schema,
    }
    return make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})


def load_on_connect(pipeline_path: str, plans_json: str, **context: Any) -> list[dict[str, Any]]:
    """Load `plans_json` (a plan, or a list of them run in order) on the pipeline's Spark
    Connect server (`spark.connect_conn_id`) in this task's session: the per-table
    results of each batch."""
    from cdclake.job import run_batch
    from cdclake.offsets import plans_from_json
    from cdclake.pipeline_file import load_pipeline
    from cdclake.spark import connect_session

    pipeline = load_pipeline(pipeline_path)
    plans = plans_from_json(plans_json)
    if not plans:
        return []
    ti = context["ti"]
    spark = connect_session(pipeline, connect_remote(pipeline), f"{ti.dag_id}/{ti.task_id}")
    done = []
    for batch in plans:
        results = [r.to_dict() for r in run_batch(spark, pipeline, batch)]
        log.info("batch %s: %s", batch.batch_id, json.dumps(results))
        done.append({"batch_id": batch.batch_id, "tables": results})
    return done


def connect_remote(pipeline: PipelineConfig) -> str:
    """The URL of the pipeline's Spark Connect server, from its Airflow connection
    (`spark.connect_conn_id`: host, port, the server's token as password). Never logged."""
    from airflow.sdk import BaseHook
    from cdclake.exceptions import ConfigError
    from cdclake.spark import remote_url

    name = pipeline.spark.connect_conn_id
    try:
        conn = BaseHook.get_connection(name)
    except Exception:
        raise ConfigError(
            f"{pipeline.path}: spark.connect_conn_id: Airflow connection {name!r} does not exist"
        ) from None
    if not conn.host or not conn.password:
        raise ConfigError(
            f"{pipeline.path}: spark.connect_conn_id: Airflow connection {name!r} needs the "
            "server's host and its token as password"
        )
    return remote_url(conn.host, conn.port or 15002, conn.password)


def snapshot_send(paths: dict[str, str], **context: Any) -> dict[str, Any]:
    """Validate everything, then send the signal; what the sensor needs to follow it."""
    from cdclake.pipeline_file import load_pipeline
    from cdclake_control.signals import parse_request, submit

    params = context["params"]
    pipeline = load_pipeline(_pipeline_path(paths, params["pipeline"]))
    request = parse_request(
        params["action"],
        form_tables(params),
        params.get("type", "incremental"),
        params.get("filters") or {},
        params.get("surrogate_key"),
    )
    sent = submit(
        pipeline,
        source_dsn(pipeline),
        request,
        channel=params.get("channel", "source"),
        origin=f"{context['dag'].dag_id}-{context['run_id']}",
    )
    sent["timeout_s"] = int(params.get("timeout_minutes", 60)) * 60
    sent["trigger_load"] = bool(params.get("trigger_load")) and sent["follow"]
    return sent


def snapshot_should_load(sent: dict[str, Any]) -> bool:
    return bool(sent.get("trigger_load"))
