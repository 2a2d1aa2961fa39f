"""A pipeline with a served driver (`spark.served`): its DAG's load task sends the plan to
`cdclake serve` instead of starting spark-submit, run by Airflow (dag.test), twice; the
backfill DAG's load task for it is the same kind of task."""

from __future__ import annotations

import os
import subprocess
import uuid

import psycopg
import pytest
import yaml
from cdclake.config import load_pipeline

from tests.conftest import DEMO_PIPELINE
from tests.e2e.helpers import run_dag, xcom_of
from tests.integration.helpers import assert_lake_equals_source
from tests.integration.test_served import health, start_driver

pytestmark = pytest.mark.e2e

N = uuid.uuid4().hex[:6]
NAME = f"e2e_served_{N}"
TABLE = f"inventory.e2e_served_{N}"


def sql(dsn: str, *statements):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


@pytest.fixture(scope="module")
def served(stack, tmp_path_factory):
    """A served driver, and a pipelines directory (read by the DAG files) whose one
    pipeline names it."""
    directory = tmp_path_factory.mktemp("pipelines")
    proc, url = start_driver(directory.parent / "driver.log")
    raw = yaml.safe_load(DEMO_PIPELINE.read_text())
    raw.update(name=NAME, namespace=NAME, tables=[TABLE])
    raw["catalog"]["warehouse"] = "${CDCLAKE_WAREHOUSE}"
    raw["spark"]["served"] = url
    (directory / f"{NAME}.yaml").write_text(yaml.safe_dump(raw))
    old = os.environ.get("CDCLAKE_PIPELINES_DIR")
    os.environ["CDCLAKE_PIPELINES_DIR"] = str(directory)
    yield load_pipeline(directory / f"{NAME}.yaml"), url
    if old is None:
        os.environ.pop("CDCLAKE_PIPELINES_DIR")
    else:
        os.environ["CDCLAKE_PIPELINES_DIR"] = old
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_the_dag_loads_through_the_served_driver(stack, served):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from tests.conftest import ROOT

    pipeline, url = served
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    for dag_id, task_id in ((f"cdclake__{NAME}", "load"), ("cdclake_backfill", f"load__{NAME}")):
        assert not isinstance(bag.dags[dag_id].get_task(task_id), SparkSubmitOperator)

    sql(stack.source_dsn,
        f"create table {TABLE} (id int primary key, v int, note text)",
        f"insert into {TABLE} select i, i, 'first' from generate_series(1, 200) i",
        f"update {TABLE} set v = v + 1000 where id % 3 = 0",
        f"delete from {TABLE} where id % 7 = 0")  # fmt: skip
    stack.wait_for_capture()
    before = health(url)
    first = run_dag(f"cdclake__{NAME}")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    sql(stack.source_dsn,
        f"update {TABLE} set note = 'second' where id % 5 = 0",
        f"delete from {TABLE} where id < 20")  # fmt: skip
    stack.wait_for_capture()
    second = run_dag(f"cdclake__{NAME}")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    for run in (first, second):
        (batch,) = xcom_of(run, "load")
        assert batch["batch_id"] == f"cdclake__{NAME}/{run.run_id}"
        assert [t["status"] for t in batch["tables"]] == ["committed"]
    after = health(url)  # one application loaded both
    assert after["pid"] == before["pid"] and after["batches"] == before["batches"] + 2
