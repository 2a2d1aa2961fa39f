"""Loads through the real scheduler and triggerer, under one `airflow standalone`:

- event-driven: a pipeline with `watch:` and no cron schedule runs when records arrive on
  its topic, one run at a time; a burst of records queues no burst of runs, a backlog
  does not keep waking it, and the lake equals the source;
- on a Spark Connect server (`spark.connect_conn_id`): each run's load task is a Spark
  Connect client in the worker, not spark-submit, and the lake equals the source.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from cdclake_control.freshness import pipeline_freshness
from cdclake_control.watermarks import fetch_watermarks
from cdclake_local.airflow_home import connections, kafka_connection, setup_airflow_home
from cdclake_local.airflow_server import AirflowServer, free_port

from tests.conftest import ROOT
from tests.integration.helpers import assert_lake_equals_source, make_pipeline

pytestmark = pytest.mark.e2e

CONNECT_CONN = "cdclake_spark_connect_e2e"
WAKE_S = 240  # from the first record after the DAG is switched on to its first run
IDLE_S = 600  # the burst loaded
BURST = 5_000


def wait(what: str, check, timeout: float, server: AirflowServer, step: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout:.0f}s\n{server.tail()}")


def active(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r["state"] in ("queued", "running")]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    return tmp_path_factory.mktemp("pipelines")


@pytest.fixture(scope="module")
def watched(stack, pipelines):
    """A new source table with one row already in its topic, and a pipeline that watches
    it."""
    tag = uuid.uuid4().hex[:6]
    table = f"watch_{tag}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table inventory.{table} (id int primary key, note text)")
        conn.execute(f"insert into inventory.{table} values (0, 'before the watch')")
    pipeline = make_pipeline(pipelines, f"watched_{tag}", [f"inventory.{table}"],
                             schedule=None, watch={"conn_id": "cdclake_kafka_watch"})  # fmt: skip
    topic = pipeline.topic_for(pipeline.tables[0])
    stack.wait_for_capture()
    marks = fetch_watermarks(pipeline.kafka, [topic])
    assert sum(m.high for m in marks.values()) >= 1, f"{topic}: the first row not captured"
    return pipeline, table


@pytest.fixture(scope="module")
def connected(stack, pipelines):
    """A new source table and its pipeline, loading on the Spark Connect server."""
    table = f"inventory.sc_dag_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, note text)")
        conn.execute(f"insert into {table} select g, 'first' from generate_series(1, 50) g")
    pipeline = make_pipeline(pipelines, f"sc_dag_{uuid.uuid4().hex[:6]}", [table],
                             schedule=None, spark={"connect_conn_id": CONNECT_CONN})  # fmt: skip
    return pipeline, table


@pytest.fixture(scope="module")
def airflow(stack, spark_connect, watched, connected, pipelines, tmp_path_factory):
    pipeline, _ = watched
    home, port = tmp_path_factory.mktemp("airflow"), free_port()
    conns = connections(stack.s.pg_port, stack.broker.client_config(), stack.s.source_db)
    conns["cdclake_kafka_watch"] = kafka_connection(stack.broker.client_config(),
                                                    f"cdclake-watch-{pipeline.name}")  # fmt: skip
    conns[CONNECT_CONN] = spark_connect.airflow_connection()
    setup_airflow_home(ROOT, home, conns, port)
    env = {k: v for k, v in stack.env().items() if k != "AIRFLOW_HOME"}
    env["CDCLAKE_PIPELINES_DIR"] = str(pipelines)
    server = AirflowServer(home, port, env, home / "standalone.log").start()
    try:
        yield server
    finally:
        server.stop()


def test_records_wake_the_dag_one_run_at_a_time(stack, watched, airflow):
    pipeline, table = watched
    dag_id = f"cdclake__{pipeline.name}"
    wait(f"{dag_id} parsed", lambda: airflow.dag(dag_id), 180, airflow)
    airflow.unpause(dag_id)
    time.sleep(15)
    assert airflow.runs(dag_id) == [], "a run without a record arriving after the switch-on"

    samples: list[list[dict]] = []
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:

        def wake() -> None:
            conn.execute(f"insert into inventory.{table} values "
                         f"((select max(id) + 1 from inventory.{table}), 'wake')")  # fmt: skip

        def woken():  # the watcher starts at the end of the topic: a record wakes the DAG
            wake()
            return airflow.runs(dag_id)

        first = wait("a run woken by a record", woken, WAKE_S, airflow, step=3)
        assert first[0]["run_type"] == "asset_triggered", first[0]
        with conn.transaction():  # a burst while the first run is queued or running
            conn.execute(f"insert into inventory.{table} select g, md5(g::text) "
                         f"from generate_series(100000, 100000 + {BURST - 1}) g")  # fmt: skip
        for step in range(5):
            conn.execute(f"update inventory.{table} set note = %s where id %% 5 = %s",
                         (f"round {step}", step))  # fmt: skip

        def settled():
            """Every record loaded and no run active; while records wait with no run
            active (they came before the watcher listened again), one more record, as
            a live source sends, wakes the DAG."""
            runs = airflow.runs(dag_id)
            samples.append(active(runs))
            if active(runs):
                return None
            if _unloaded(pipeline) == 0:
                return runs
            wake()
            return None

        stack.wait_for_capture()
        runs = wait("the burst loaded", settled, IDLE_S, airflow, step=5)

    busiest = max(samples, key=len)
    assert len(busiest) <= 2, f"more than one run queued behind the running one: {busiest}"
    assert all(len([r for r in s if r["state"] == "running"]) <= 1 for s in samples)
    failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    assert not failed, f"runs failed: {failed}\n{airflow.tail()}"
    assert {r["run_type"] for r in runs} == {"asset_triggered"}, runs

    events = airflow.asset_events(f"cdclake__{pipeline.name}__records")
    topic = pipeline.topic_for(pipeline.tables[0])
    assert events and all(e["extra"]["payload"]["topic"] == topic for e in events), events
    assert len(runs) <= len(events) < BURST / 100, (len(runs), len(events))
    print(f"{BURST:,} records: {len(events)} asset events, {len(runs)} runs")

    # no record waits, so the DAG rests: at most the one run an event pending from the
    # last records starts, not one per record of the backlog the watcher skipped
    time.sleep(30)
    assert len(airflow.runs(dag_id)) <= len(runs) + 1, "runs without new records"
    assert_lake_equals_source(pipeline, stack.source_dsn)


def run_once(airflow: AirflowServer, dag_id: str, timeout: float = 300) -> dict:
    run = airflow.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}"
    return wait(f"{dag_id}: run done", lambda: _finished(airflow.request("GET", path)),
                timeout, airflow, step=3)  # fmt: skip


def _finished(run: dict) -> dict | None:
    return run if run["state"] in ("success", "failed") else None


def test_the_dag_loads_on_the_spark_connect_server(stack, connected, airflow):
    pipeline, table = connected
    dag_id = f"cdclake__{pipeline.name}"
    wait(f"{dag_id} parsed", lambda: airflow.dag(dag_id), 180, airflow)
    airflow.unpause(dag_id)
    for step in range(3):
        if step:  # updates, a delete and a primary-key change since the last run
            with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
                conn.execute(f"update {table} set note = 'round {step}' where id % 3 = {step}")
                conn.execute(f"delete from {table} where id = {10 + step}")
                conn.execute(f"update {table} set id = id + 100 where id = {20 + step}")
        stack.wait_for_capture()
        run = run_once(airflow, dag_id)
        assert run["state"] == "success", airflow.tail()
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances"
        load = next(t for t in airflow.request("GET", path)["task_instances"]
                    if t["task_id"] == "load")  # fmt: skip
        assert load["state"] == "success" and load["operator"] == "PythonOperator", load
        assert_lake_equals_source(pipeline, stack.source_dsn)


def _unloaded(pipeline) -> int:
    """Records in Kafka past the lake's committed offsets."""
    rows = pipeline_freshness(pipeline, int(time.time() * 1000))
    return sum(r.offsets_behind for r in rows)
