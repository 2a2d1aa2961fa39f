"""A pipeline whose loads run on a Spark Connect server (`spark.connect_conn_id`), through
the real scheduler (`airflow standalone`): two runs with changes load the lake to equal
the source, each batch's load task a Spark Connect client of the server, not spark-submit.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from cdclake_local.airflow_home import connections, setup_airflow_home
from cdclake_local.airflow_server import AirflowServer, free_port

from tests.conftest import ROOT
from tests.integration.helpers import assert_lake_equals_source, make_pipeline

pytestmark = pytest.mark.e2e
CONN = "cdclake_spark_connect_e2e"


@pytest.fixture
def connected(stack, spark_connect, tmp_path):
    """A new source table, its pipeline loading on the server, and Airflow running it."""
    table = f"inventory.sc_dag_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, note text)")
        conn.execute(f"insert into {table} select g, 'first' from generate_series(1, 50) g")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    name = f"sc_dag_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(pipelines, name, [table], schedule=None,
                             spark={"connect_conn_id": CONN})  # fmt: skip
    home, port = tmp_path / "airflow", free_port()
    conns = connections(stack.s.pg_port, stack.broker.client_config(), stack.s.source_db)
    conns[CONN] = spark_connect.airflow_connection()
    setup_airflow_home(ROOT, home, conns, port)
    env = {k: v for k, v in stack.env().items() if k != "AIRFLOW_HOME"}
    env["CDCLAKE_PIPELINES_DIR"] = str(pipelines)
    airflow = AirflowServer(home, port, env, tmp_path / "standalone.log").start()
    try:
        yield pipeline, table, airflow
    finally:
        airflow.stop()


def run_once(airflow: AirflowServer, dag_id: str, timeout: float = 300) -> dict:
    run = airflow.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = airflow.request("GET", path)
        if found["state"] in ("success", "failed"):
            return found
        time.sleep(3)
    raise AssertionError(f"{dag_id}: run not done within {timeout:.0f}s\n{airflow.tail()}")


def test_the_dag_loads_on_the_spark_connect_server(stack, connected):
    pipeline, table, airflow = connected
    dag_id = f"cdclake__{pipeline.name}"
    deadline = time.monotonic() + 180
    while airflow.dag(dag_id) is None and time.monotonic() < deadline:
        time.sleep(2)
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
