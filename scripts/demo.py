"""`make demo`: bring the local stack up, apply a workload, run the cdclake__demo DAG
through Airflow, and show each lake table beside its source table with a verdict."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from cdclake.exceptions import CdclakeError
from cdclake.jvm import archive_path
from cdclake.pipeline_file import load_pipeline
from cdclake_bench.jvm_archive import build_archive

# cdclake's own modules do not import Airflow (which reads AIRFLOW_HOME when first
# imported, below): imported here so that a moved name fails the demo's import test
from cdclake_control.compare import compare_pipeline, render_comparison
from cdclake_control.freshness import render_freshness, status_rows
from cdclake_local.stack import LocalStack, StackSettings
from cdclake_local.workload import apply_workload

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stack = LocalStack(StackSettings.from_env())
    print("==> bringing the local stack up (PostgreSQL, Kafka, Kafka Connect, catalog, Airflow)")
    status = stack.up()
    os.environ.update(stack.env())  # Airflow reads AIRFLOW_HOME when first imported
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    print(f"    source  {status['postgres']['source_dsn']}")
    print(f"    kafka   {status['kafka']['bootstrap']}")
    print(f"    catalog {status['catalog']['uri']}  warehouse {status['catalog']['warehouse']}")

    if (archive := archive_path()) is not None:
        print("==> the Spark driver's class-data-sharing archive (built once, ~40 s)")
        try:
            print(f"    {build_archive(archive)}")
        except (CdclakeError, OSError) as exc:  # only slower starts without it
            print(f"    not built, the loads run without it: {exc}")

    print("==> applying a workload: inserts, updates, deletes, a primary-key change")
    done = apply_workload(stack.source_dsn)
    print(f"    round {done['round']}: {done}")
    stack.wait_for_capture()
    print("    Debezium has sent every change to Kafka")

    print("==> running the cdclake__demo DAG (plan -> spark-submit load -> report)")
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    if bag.import_errors:
        for path, err in bag.import_errors.items():
            print(f"DAG import error in {path}:\n{err}", file=sys.stderr)
        return 1
    if not run_dag(bag, "cdclake__demo"):
        return 1

    table, condition = "inventory.products", "id <= 105"
    print(f"==> cdclake_snapshot: incremental snapshot of {table} where {condition}")
    conf = {"pipeline": "demo", "action": "execute", "tables": [table], "trigger_load": False,
            "filters": {table: condition}, "timeout_minutes": 10}  # fmt: skip
    run = run_dag(bag, "cdclake_snapshot", conf)
    if not run:
        return 1
    sent, progress = xcom(run, "send_signal"), xcom(run, "wait_for_snapshot")
    print(f"    signal {sent['signal_id']} sent to public.debezium_signal")
    print(f"    Debezium: {progress['status']}, {progress['chunks']} chunk(s), rows scanned "
          f"{progress['rows_scanned']}")  # fmt: skip
    stack.wait_for_capture()
    print("==> running cdclake__demo again: loads the snapshot's read events")
    if not run_dag(bag, "cdclake__demo"):
        return 1

    print("==> cdclake status: how fresh each lake table is")
    print(render_freshness(status_rows(str(ROOT / "include" / "pipelines" / "demo.yaml"),
                                       int(time.time() * 1000))))  # fmt: skip

    print("==> the lake beside the source")
    pipeline = load_pipeline(ROOT / "include" / "pipelines" / "demo.yaml")
    results = compare_pipeline(pipeline, stack.source_dsn)
    print(render_comparison(results))
    print("\nStop the stack with `make down`.")
    return 0 if all(r.equal for r in results) else 1


def run_dag(bag, dag_id: str, conf: dict | None = None):
    run = bag.dags[dag_id].test(run_conf=conf)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print(f"    {dag_id} run {run.run_id}: {run.state} {states}")
    return run if str(run.state) == "success" else None


def xcom(run, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    query = XComModel.get_many(
        run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value"
    )
    with create_session() as session:
        return XComModel.deserialize_value(session.scalars(query).first())


if __name__ == "__main__":
    sys.exit(main())
